//! Read-your-writes: the objects this operator wrote last, until its caches have caught up with them.
//! They are kept compact (see [`compact`](super::compact)): a burst of creations keeps thousands of them
//! for as long as the watches lag behind the writes, and a decoded Deployment takes 12 kB.
//!
//! The caches are fed by watches, so right after a write a reconcile can still read the object as it was
//! before (or not at all, right after creating it). At scale that costs a repeated apply of every child
//! and a second status write, each time another watch event triggers the instance before the cache has
//! seen the operator's own write. Every write answers with the object as stored; that answer is kept here
//! and preferred over an older cached copy, until the watch brings that version into the cache.
//!
//! Which copy is newer is told by `resourceVersion`. Kubernetes API servers use etcd revisions, which
//! grow with every write; where both versions are integers the larger one wins. A version that is not an
//! integer is only compared for equality, and a kept answer is trusted for [`TRUST`] at most, so that a
//! missed watch event (or an object deleted right after it was written) is seen again after that.
//!
//! Kept because a measurement says so (issue "simpler inside"): `make bench-real`, 300 new instances on a
//! real v1.28.7 API server (2 shared cores, 2026-11-26, the same build switched by a temporary variable):
//! with read-your-writes 7.03 requests per instance (600 status writes, 300 `Created` events); without it
//! 7.54 (742 status writes, 4 instances with a second `Created` event, duplicate Service and ConfigMap
//! applies); without it but with kube's `Config::debounce` of 1 s, 7.72 (746 status writes, 28 second
//! `Created` events). Debouncing delays the reconcile, not the cache it reads, so it saves nothing here.

use std::any::Any;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kube::Resource;

use super::compact::{Compact, Compactable};

/// How long a kept answer may stand in for the cache.
pub const TRUST: Duration = Duration::from_secs(10);

/// Least time between two passes of [`Written::prune`].
const PRUNE_EVERY: Duration = Duration::from_secs(1);

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct Key {
    kind: String,
    namespace: String,
    name: String,
}

struct Entry {
    version: String,
    /// The answer to the write; `None` after a deletion of the object at `version`.
    object: Option<Arc<dyn Any + Send + Sync>>,
    at: Instant,
}

/// The answers to this operator's latest writes, per object.
#[derive(Default)]
pub struct Written {
    entries: Mutex<HashMap<Key, Entry>>,
    /// When [`Written::prune`] last went through the entries.
    pruned: Mutex<Option<Instant>>,
}

/// What [`Written::fresher`] chose.
pub struct Fresher<K> {
    pub object: Option<Arc<K>>,
    /// Whether the cache lagged behind this operator's own write, and the kept answer was used.
    pub from_write: bool,
}

impl Written {
    /// Keeps `object`, the API server's answer to a write of it.
    pub fn remember<K>(&self, object: Arc<Compact<K>>, dt: &K::DynamicType)
    where
        K: Compactable + Send + Sync,
    {
        let Some(key) = key_of(object.as_ref(), dt) else {
            return;
        };
        let Some(version) = object.meta().resource_version.clone() else {
            return;
        };
        let entry = Entry {
            version,
            object: Some(object),
            at: Instant::now(),
        };
        self.lock().insert(key, entry);
    }

    /// Keeps that this operator deleted `object` (as the cache showed it): until the cache drops it, or
    /// shows a newer version of it, it counts as gone.
    pub fn remember_deleted<K: Resource>(&self, object: &K, dt: &K::DynamicType) {
        let (Some(key), Some(version)) =
            (key_of(object, dt), object.meta().resource_version.clone())
        else {
            return;
        };
        let entry = Entry {
            version,
            object: None,
            at: Instant::now(),
        };
        self.lock().insert(key, entry);
    }

    /// The newer of the `cached` copy of object `name` and the answer to this operator's last write of it.
    /// A kept answer is dropped as soon as the cache has caught up with it, or once [`TRUST`] has passed.
    pub fn fresher<K>(
        &self,
        namespace: &str,
        name: &str,
        dt: &K::DynamicType,
        cached: Option<Arc<K>>,
    ) -> Fresher<K>
    where
        K: Compactable + Send + Sync,
    {
        let key = Key {
            kind: K::kind(dt).into_owned(),
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        };
        let mut entries = self.lock();
        let Some(entry) = entries.get(&key) else {
            return Fresher {
                object: cached,
                from_write: false,
            };
        };
        let cache_caught_up = match &cached {
            Some(c) => entry.caught_up_with(c.meta().resource_version.as_deref()),
            // After a deletion the cache has caught up once the object is gone.
            None => entry.object.is_none(),
        };
        if cache_caught_up || entry.at.elapsed() >= TRUST {
            entries.remove(&key);
            return Fresher {
                object: cached,
                from_write: false,
            };
        }
        let kept = entry.object.clone().map(|o| {
            o.downcast::<Compact<K>>()
                .ok()
                .and_then(|compact| compact.decode().ok())
        });
        match kept {
            None => Fresher {
                object: None,
                from_write: true,
            },
            Some(Some(object)) => Fresher {
                object: Some(Arc::new(object)),
                from_write: true,
            },
            // Kept as another type, or not decodable (neither can happen): the cache it is.
            Some(None) => Fresher {
                object: cached,
                from_write: false,
            },
        }
    }

    /// Follows a deletion the watch saw: what this operator wrote of the object before it was deleted no
    /// longer stands in for the cache (else a child someone deleted right after the operator applied it
    /// would be taken for present until [`TRUST`] passed). A write after the deletion (a newer version)
    /// stays.
    pub fn observe_deleted<K: Resource>(&self, object: &K, dt: &K::DynamicType) {
        let (Some(key), Some(version)) = (
            key_of(object, dt),
            object.meta().resource_version.as_deref(),
        ) else {
            return;
        };
        let mut entries = self.lock();
        if entries
            .get(&key)
            .is_some_and(|entry| !older(version, &entry.version))
        {
            entries.remove(&key);
        }
    }

    /// Follows an object the cache now holds (called once the watch's event is in the cache): a kept
    /// answer the cache has caught up with is dropped at once. Without this, answers stayed until the
    /// instance's next reconcile read them or [`TRUST`] passed: during a burst of creations, every child
    /// written in the last seconds (14 MB of decoded objects at 3000 instances, in a `make bench` run slowed
    /// down by a heap profiler).
    pub fn observe_cached<K: Resource>(&self, object: &K, dt: &K::DynamicType) {
        let mut entries = self.lock();
        if entries.is_empty() {
            return;
        }
        let Some(key) = key_of(object, dt) else {
            return;
        };
        if entries
            .get(&key)
            .is_some_and(|entry| entry.caught_up_with(object.meta().resource_version.as_deref()))
        {
            entries.remove(&key);
        }
    }

    /// Drops every kept answer older than [`TRUST`], which bounds the memory this takes. Goes through the
    /// entries at most once a second: it is called by every reconcile, and a burst of creations keeps
    /// thousands of answers for a moment.
    pub fn prune(&self) {
        {
            let mut pruned = self.pruned.lock().unwrap_or_else(|e| e.into_inner());
            if pruned.is_some_and(|at| at.elapsed() < PRUNE_EVERY) {
                return;
            }
            *pruned = Some(Instant::now());
        }
        self.lock().retain(|_, entry| entry.at.elapsed() < TRUST);
    }

    /// How many answers are kept.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Key, Entry>> {
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Entry {
    /// Whether a cache showing the object at `version` has caught up with this entry: with a write once it
    /// shows that version or a newer one; with a deletion once it shows a newer one (created again).
    fn caught_up_with(&self, version: Option<&str>) -> bool {
        version.is_some_and(|v| match self.object {
            Some(_) => !older(v, &self.version),
            None => older(&self.version, v),
        })
    }
}

fn key_of<K: Resource>(object: &K, dt: &K::DynamicType) -> Option<Key> {
    Some(Key {
        kind: K::kind(dt).into_owned(),
        namespace: object.meta().namespace.clone()?,
        name: object.meta().name.clone()?,
    })
}

/// Whether resource version `cached` is older than `written`: by number where both are numbers (etcd
/// revisions), else only "not the same version" counts as older.
fn older(cached: &str, written: &str) -> bool {
    match (cached.parse::<u64>(), written.parse::<u64>()) {
        (Ok(cached), Ok(written)) => cached < written,
        _ => cached != written,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;

    fn cm(version: &str, data: &str) -> Arc<ConfigMap> {
        let mut cm = ConfigMap::default();
        cm.metadata.name = Some("cache-servers".into());
        cm.metadata.namespace = Some("ns".into());
        cm.metadata.resource_version = Some(version.into());
        cm.data = Some([("servers".to_owned(), data.to_owned())].into());
        Arc::new(cm)
    }

    fn compact(cm: Arc<ConfigMap>) -> Arc<Compact<ConfigMap>> {
        Arc::new(Compact::encode(cm.as_ref()).unwrap())
    }

    fn pick(written: &Written, cached: Option<Arc<ConfigMap>>) -> (Option<String>, bool) {
        let f = written.fresher("ns", "cache-servers", &(), cached);
        (
            f.object.and_then(|o| o.metadata.resource_version.clone()),
            f.from_write,
        )
    }

    #[test]
    fn the_answer_stands_in_for_a_cache_that_has_not_seen_the_write() {
        let written = Written::default();
        assert_eq!(pick(&written, None), (None, false));
        written.remember(compact(cm("12", "a")), &());
        assert_eq!(
            pick(&written, None),
            (Some("12".into()), true),
            "not cached yet"
        );
        assert_eq!(
            pick(&written, Some(cm("9", ""))),
            (Some("12".into()), true),
            "cache behind"
        );
        assert_eq!(written.len(), 1);
    }

    #[test]
    fn the_cache_wins_once_it_has_caught_up() {
        let written = Written::default();
        written.remember(compact(cm("12", "a")), &());
        assert_eq!(
            pick(&written, Some(cm("12", "a"))),
            (Some("12".into()), false)
        );
        assert!(written.is_empty(), "dropped once the cache caught up");

        written.remember(compact(cm("12", "a")), &());
        assert_eq!(
            pick(&written, Some(cm("15", "b"))),
            (Some("15".into()), false),
            "a later edit"
        );
        assert!(written.is_empty());
    }

    #[test]
    fn a_deletion_the_watch_saw_ends_what_was_written_before_it() {
        let written = Written::default();
        written.remember(compact(cm("12", "a")), &());
        written.observe_deleted(cm("11", "old").as_ref(), &());
        assert_eq!(
            written.len(),
            1,
            "the deletion of an older version: the write stands"
        );
        written.observe_deleted(cm("14", "a").as_ref(), &());
        assert!(written.is_empty());
        assert_eq!(pick(&written, None), (None, false), "gone: applied again");
    }

    #[test]
    fn the_watch_ends_what_its_cache_has_caught_up_with() {
        let written = Written::default();
        written.remember(compact(cm("12", "a")), &());
        written.observe_cached(cm("11", "old").as_ref(), &());
        assert_eq!(written.len(), 1, "the cache is still behind");
        written.observe_cached(
            Compact::encode(cm("12", "a").as_ref()).as_ref().unwrap(),
            &(),
        );
        assert!(written.is_empty(), "the cache holds the write now");

        written.remember_deleted(cm("12", "a").as_ref(), &());
        written.observe_cached(cm("12", "a").as_ref(), &());
        assert_eq!(written.len(), 1, "the deletion is not in the cache yet");
        written.observe_cached(cm("13", "b").as_ref(), &());
        assert!(written.is_empty(), "created again");
    }

    #[test]
    fn an_answer_is_kept_compact_and_read_whole() {
        let written = Written::default();
        let mut mc = crate::resources::testing::memcached(
            "cache",
            serde_json::from_value(serde_json::json!({"size": 2})).unwrap(),
        );
        mc.metadata.resource_version = Some("7".into());
        mc.metadata.annotations = Some(
            [(
                "kubectl.kubernetes.io/last-applied-configuration".to_owned(),
                "{}".to_owned(),
            )]
            .into(),
        );
        written.remember(Arc::new(Compact::encode(&mc).unwrap()), &());
        let kept = written
            .fresher::<crate::api::Memcached>("default", "cache", &(), None)
            .object
            .expect("kept");
        assert_eq!(kept.spec, mc.spec);
        assert!(
            kept.metadata.annotations.is_none(),
            "dropped, as in the cache"
        );
    }

    #[test]
    fn versions_that_are_not_numbers_compare_by_equality() {
        assert!(older("x", "y") && !older("y", "y"));
        assert!(older("9", "12") && !older("12", "9") && !older("12", "12"));
    }

    #[test]
    fn a_deleted_object_is_gone_until_the_cache_drops_it_or_shows_a_newer_one() {
        let written = Written::default();
        written.remember(compact(cm("12", "a")), &());
        written.remember_deleted(cm("12", "a").as_ref(), &());
        assert_eq!(
            pick(&written, Some(cm("12", "a"))),
            (None, true),
            "cache still shows it"
        );
        assert_eq!(pick(&written, None), (None, false), "the cache dropped it");
        assert!(written.is_empty());

        written.remember_deleted(cm("12", "a").as_ref(), &());
        assert_eq!(
            pick(&written, Some(cm("20", "b"))),
            (Some("20".into()), false),
            "created again"
        );
        written.remember_deleted(cm("12", "a").as_ref(), &());
        written.prune();
        assert_eq!(written.len(), 1, "still trusted");
    }
}
