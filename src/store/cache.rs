//! The caches of the operator's children and pods: each object kept packed whole (see [`compact`]), by
//! namespace and name.
//!
//! A reflector store would hold each object as a [`Compact`] behind an `Arc`, with its metadata in a
//! 360-byte `ObjectMeta` and a key that copies its name, namespace, version and uid: 1.5-3.5 kB per
//! object, where the text itself packs into 0.1-0.2 kB. Here an object takes its packed metadata and
//! text and its place in the map: about 0.23 kB (`make bench`'s objects). The watch streams still carry
//! [`Compact`] objects, with the metadata the owner mapping and the pod index read; only what stays is
//! packed.
//!
//! The measurement that keeps these caches instead of kube's reflector stores: `make bench-caches`
//! (`examples/cache_memory.rs`) fills both from the same objects, a default instance's Deployment, two
//! Services, server list and pod as a real v1.28.7 API server returned them, the stores fed trimmed objects
//! the way kube-rs recommends (no `managedFields`; of a pod, no spec and only the annotation read). On
//! 2026-11-26: kube's stores held 25.6 kB per instance (7.3 MiB at 300 instances, 72.8 MiB at 3000), these
//! caches 1.4 kB (0.4 MiB and 3.9 MiB). The operator peaks at about 17-18 MiB at 300 instances and 30 MiB at
//! 3000 with these caches (`make bench`), so the stores would take it past the 20 MiB and 64 MiB it is
//! held to.
//!
//! [`compact`]: super::compact

use std::collections::HashMap;
use std::fmt;
use std::marker::PhantomData;
use std::sync::{Arc, RwLock, RwLockReadGuard};

use kube::ResourceExt;
use kube::runtime::watcher;
use tokio::sync::watch;
use tracing::warn;

use super::compact::{Compact, Compactable, Stored};

type Objects = HashMap<Box<str>, HashMap<Box<str>, Stored>>;

/// A cache of objects of kind `K`, read as whole ones.
pub struct Cache<K> {
    objects: Arc<RwLock<Objects>>,
    /// Turns true with the first complete list; closed once the writer is gone.
    ready: watch::Receiver<bool>,
    kind: PhantomData<fn() -> K>,
}

impl<K> Clone for Cache<K> {
    fn clone(&self) -> Self {
        Self {
            objects: self.objects.clone(),
            ready: self.ready.clone(),
            kind: PhantomData,
        }
    }
}

impl<K> fmt::Debug for Cache<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cache")
            .field("objects", &self.len())
            .finish()
    }
}

/// The writer of a [`Cache`] went away before the cache had its first complete list.
#[derive(Debug, thiserror::Error)]
#[error("the cache's watch ended before its first complete list")]
pub struct WriterDropped;

/// A new, empty cache of `K` and the writer that feeds it the events of a watch.
pub fn cache<K: Compactable>() -> (Cache<K>, CacheWriter<K>) {
    let objects = Arc::new(RwLock::new(Objects::new()));
    let (ready_tx, ready) = watch::channel(false);
    let cache = Cache {
        objects: objects.clone(),
        ready,
        kind: PhantomData,
    };
    let writer = CacheWriter {
        objects,
        buffer: None,
        ready: ready_tx,
        footprint: Footprint::default(),
        kind: PhantomData,
    };
    (cache, writer)
}

impl<K: Compactable> Cache<K> {
    /// Object `name` in `namespace`, decoded; `Ok(None)` when the cache has none.
    pub fn get(&self, namespace: &str, name: &str) -> Result<Option<Arc<K>>, serde_json::Error> {
        self.read()
            .get(namespace)
            .and_then(|names| names.get(name))
            .map(|stored| stored.decode().map(Arc::new))
            .transpose()
    }

    /// Every cached object that decodes.
    pub fn state(&self) -> Vec<Arc<K>> {
        self.read()
            .values()
            .flat_map(HashMap::values)
            .filter_map(|stored| stored.decode().ok().map(Arc::new))
            .collect()
    }

    /// Resolves once the cache holds its first complete list; fails if its watch ends before that.
    pub async fn wait_until_ready(&self) -> Result<(), WriterDropped> {
        let mut ready = self.ready.clone();
        ready
            .wait_for(|ready| *ready)
            .await
            .map(|_| ())
            .map_err(|_| WriterDropped)
    }
}

impl<K> Cache<K> {
    /// How many objects the cache holds.
    pub fn len(&self) -> usize {
        self.read().values().map(HashMap::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn read(&self) -> RwLockReadGuard<'_, Objects> {
        self.objects.read().unwrap_or_else(|e| e.into_inner())
    }
}

/// What a cache holds: its objects, and the bytes they take (see [`CacheWriter::footprint`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Footprint {
    pub objects: usize,
    pub bytes: usize,
}

impl Footprint {
    fn add(&mut self, bytes: usize) {
        self.objects += 1;
        self.bytes += bytes;
    }

    fn remove(&mut self, bytes: usize) {
        self.objects = self.objects.saturating_sub(1);
        self.bytes = self.bytes.saturating_sub(bytes);
    }

    fn of(objects: &Objects) -> Self {
        let mut footprint = Self::default();
        for (namespace, names) in objects {
            footprint.bytes += namespace_bytes(namespace);
            for (name, stored) in names {
                footprint.add(entry_bytes(name.len(), stored));
            }
        }
        footprint
    }
}

/// The bytes one object takes in a cache: its packed texts, its name and its map entry. Spare capacity
/// of the maps is not counted (at most as much again as the entries, by the maps' growth rule).
fn entry_bytes(name_len: usize, stored: &Stored) -> usize {
    name_len + std::mem::size_of::<(Box<str>, Stored)>() + stored.heap_bytes()
}

/// The bytes a namespace's own entry takes (its name and its empty map).
fn namespace_bytes(namespace: &str) -> usize {
    namespace.len() + std::mem::size_of::<(Box<str>, HashMap<Box<str>, Stored>)>()
}

/// Feeds a [`Cache`] the events of a watch, as a reflector feeds its store: changes one by one, and a
/// (re)list as a whole, swapped in when complete.
pub struct CacheWriter<K> {
    objects: Arc<RwLock<Objects>>,
    /// The objects of a list in progress.
    buffer: Option<Objects>,
    ready: watch::Sender<bool>,
    /// What `objects` holds, kept up to date with each event (only the writer changes `objects`).
    footprint: Footprint,
    kind: PhantomData<fn() -> K>,
}

impl<K: Compactable> CacheWriter<K> {
    pub fn apply_watcher_event(&mut self, event: &watcher::Event<Compact<K>>) {
        match event {
            watcher::Event::Apply(object) => {
                if let Some((namespace, name, stored)) = entry(object) {
                    let mut objects = self.objects.write().unwrap_or_else(|e| e.into_inner());
                    insert(&mut objects, &mut self.footprint, namespace, name, stored);
                }
            }
            watcher::Event::Delete(object) => {
                let mut objects = self.objects.write().unwrap_or_else(|e| e.into_inner());
                let namespace = object.namespace().unwrap_or_default();
                if let Some(names) = objects.get_mut(namespace.as_str()) {
                    let name = object.name_any();
                    if let Some(stored) = names.remove(name.as_str()) {
                        self.footprint.remove(entry_bytes(name.len(), &stored));
                    }
                    if names.is_empty() {
                        objects.remove(namespace.as_str());
                        self.footprint.bytes = self
                            .footprint
                            .bytes
                            .saturating_sub(namespace_bytes(&namespace));
                    }
                }
            }
            watcher::Event::Init => self.buffer = Some(Objects::new()),
            watcher::Event::InitApply(object) => {
                if let Some((namespace, name, stored)) = entry(object) {
                    let buffer = self.buffer.get_or_insert_default();
                    insert(buffer, &mut Footprint::default(), namespace, name, stored);
                }
            }
            watcher::Event::InitDone => {
                let listed = self.buffer.take().unwrap_or_default();
                self.footprint = Footprint::of(&listed);
                *self.objects.write().unwrap_or_else(|e| e.into_inner()) = listed;
                self.ready.send_replace(true);
            }
        }
    }

    /// What the cache holds now: its objects and their bytes (packed texts, names, map entries), counted
    /// as events change it, so that reading it costs nothing.
    pub fn footprint(&self) -> Footprint {
        self.footprint
    }
}

/// Where `object` goes and what is kept of it; `None` (logged) for an object that cannot be kept.
fn entry<K: Compactable>(object: &Compact<K>) -> Option<(String, String, Stored)> {
    match Stored::new(object) {
        Ok(stored) => Some((
            object.namespace().unwrap_or_default(),
            object.name_any(),
            stored,
        )),
        Err(error) => {
            let kind = std::any::type_name::<K>();
            warn!(kind, name = %object.name_any(), %error, "cannot cache the object");
            None
        }
    }
}

fn insert(
    objects: &mut Objects,
    footprint: &mut Footprint,
    namespace: String,
    name: String,
    stored: Stored,
) {
    let names = objects
        .entry(namespace.into_boxed_str())
        .or_insert_with_key(|namespace| {
            footprint.bytes += namespace_bytes(namespace);
            HashMap::new()
        });
    let name_len = name.len();
    footprint.add(entry_bytes(name_len, &stored));
    if let Some(replaced) = names.insert(name.into_boxed_str(), stored) {
        footprint.remove(entry_bytes(name_len, &replaced));
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::apps::v1::Deployment;
    use k8s_openapi::api::core::v1::Pod;
    use serde_json::json;

    use super::*;

    fn deployment(name: &str, version: &str, replicas: i32) -> Compact<Deployment> {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ns", "resourceVersion": version, "uid": format!("uid-{name}"),
                         "labels": {"app.kubernetes.io/instance": name},
                         "ownerReferences": [{"apiVersion": "cache.example.com/v1alpha1", "kind": "Memcached",
                                              "name": name, "uid": "owner", "controller": true}]},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"a": "b"}},
                     "template": {"spec": {"containers": [{"name": "memcached"}]}}}
        }))
        .unwrap()
    }

    fn replicas(cache: &Cache<Deployment>, name: &str) -> Option<i32> {
        cache
            .get("ns", name)
            .unwrap()
            .and_then(|d| d.spec.as_ref().and_then(|s| s.replicas))
    }

    #[test]
    fn an_object_comes_back_whole_with_its_metadata() {
        let (cache, mut writer) = cache::<Deployment>();
        let applied = deployment("a", "3", 2);
        writer.apply_watcher_event(&watcher::Event::Apply(applied.clone()));
        let read = cache.get("ns", "a").unwrap().expect("cached");
        assert_eq!(*read, applied.decode().unwrap());
        let meta = &read.metadata;
        assert_eq!(
            (meta.resource_version.as_deref(), meta.uid.as_deref()),
            (Some("3"), Some("uid-a"))
        );
        assert_eq!(meta.owner_references.as_ref().unwrap()[0].uid, "owner");
        assert!(cache.get("other", "a").unwrap().is_none());
        assert!(cache.get("ns", "b").unwrap().is_none());
    }

    #[test]
    fn changes_replace_and_deletions_remove() {
        let (cache, mut writer) = cache::<Deployment>();
        writer.apply_watcher_event(&watcher::Event::Apply(deployment("a", "3", 2)));
        writer.apply_watcher_event(&watcher::Event::Apply(deployment("b", "4", 1)));
        writer.apply_watcher_event(&watcher::Event::Apply(deployment("a", "5", 3)));
        assert_eq!((replicas(&cache, "a"), cache.len()), (Some(3), 2));
        writer.apply_watcher_event(&watcher::Event::Delete(deployment("a", "6", 3)));
        assert_eq!((replicas(&cache, "a"), cache.len()), (None, 1));
        assert_eq!(cache.state().len(), 1);
    }

    #[tokio::test]
    async fn a_list_is_swapped_in_whole_once_complete() {
        let (cache, mut writer) = cache::<Deployment>();
        let waiting = tokio::spawn({
            let cache = cache.clone();
            async move { cache.wait_until_ready().await.is_ok() }
        });
        writer.apply_watcher_event(&watcher::Event::Apply(deployment("gone", "1", 1)));
        writer.apply_watcher_event(&watcher::Event::Init);
        writer.apply_watcher_event(&watcher::Event::InitApply(deployment("a", "7", 2)));
        assert_eq!(
            (replicas(&cache, "gone"), replicas(&cache, "a")),
            (Some(1), None),
            "the old content stands while the list is read"
        );
        assert!(!waiting.is_finished());
        writer.apply_watcher_event(&watcher::Event::InitDone);
        assert_eq!(
            (replicas(&cache, "gone"), replicas(&cache, "a")),
            (None, Some(2)),
            "an object the list did not bring is gone"
        );
        assert!(waiting.await.unwrap(), "ready with the first complete list");
    }

    #[test]
    fn the_footprint_follows_the_objects_through_changes_deletions_and_lists() {
        let (_cache, mut writer) = cache::<Deployment>();
        assert_eq!(writer.footprint(), Footprint::default());
        writer.apply_watcher_event(&watcher::Event::Apply(deployment("a", "3", 2)));
        let one = writer.footprint();
        assert_eq!(one.objects, 1);
        assert!(one.bytes > 0);
        writer.apply_watcher_event(&watcher::Event::Apply(deployment("a", "4", 2)));
        assert_eq!(
            writer.footprint(),
            one,
            "a change replaces, it does not add"
        );
        writer.apply_watcher_event(&watcher::Event::Apply(deployment("b", "5", 1)));
        let two = writer.footprint();
        assert_eq!(two.objects, 2);
        writer.apply_watcher_event(&watcher::Event::Delete(deployment("a", "6", 2)));
        writer.apply_watcher_event(&watcher::Event::Delete(deployment("b", "7", 1)));
        assert_eq!(writer.footprint(), Footprint::default(), "nothing left");

        // A list counts what it swaps in, the same as the events would have.
        writer.apply_watcher_event(&watcher::Event::Init);
        writer.apply_watcher_event(&watcher::Event::InitApply(deployment("a", "8", 2)));
        writer.apply_watcher_event(&watcher::Event::InitApply(deployment("b", "9", 1)));
        assert_eq!(
            writer.footprint(),
            Footprint::default(),
            "not until it is done"
        );
        writer.apply_watcher_event(&watcher::Event::InitDone);
        assert_eq!(writer.footprint(), two);
    }

    #[tokio::test]
    async fn a_cache_whose_watch_ended_before_its_list_is_never_ready() {
        let (cache, writer) = cache::<Deployment>();
        drop(writer);
        assert!(cache.wait_until_ready().await.is_err());
    }

    #[test]
    fn a_pod_keeps_the_labels_its_index_reads() {
        let (cache, mut writer) = cache::<Pod>();
        let pod: Compact<Pod> = serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "ns", "labels": {"app.kubernetes.io/instance": "cache"}},
            "spec": {"containers": [{"name": "memcached"}]},
            "status": {"podIP": "10.0.0.1"}
        }))
        .unwrap();
        writer.apply_watcher_event(&watcher::Event::Apply(pod));
        let pod = cache.get("ns", "p").unwrap().unwrap();
        assert_eq!(pod.labels()["app.kubernetes.io/instance"], "cache");
        assert_eq!(
            pod.status.as_ref().unwrap().pod_ip.as_deref(),
            Some("10.0.0.1")
        );
        assert!(pod.spec.is_none());
    }
}
