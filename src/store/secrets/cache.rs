//! The one cache of what the operator read of Secrets' values, by Secret; and which instances name each
//! Secret, so that what only a forgotten instance named goes with it.
//!
//! Per Secret it keeps the version read, the hash of every key's value (never the value), the values of
//! the keys the stats collector and warm handover asked for (TLS material: never the user's auth file),
//! and the hash of the user's file the operator last wrote into a served auth file. An entry goes when
//! no instance names its Secret any more (an instance forgotten, or naming other Secrets since), and
//! when the Secret watch sees the Secret deleted ([`SecretCache::observer`]).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};

use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::api::PartialObjectMeta;
use kube::runtime::watcher;
use zeroize::Zeroizing;

use crate::resources::secrets::KeyDigest;

/// (namespace, name) of a Secret.
pub type SecretKey = (String, String);
/// (namespace, name) of an instance.
pub type InstanceKey = (String, String);

/// Value digests per key of one Secret version.
pub type KeyHashes = BTreeMap<String, KeyDigest>;
/// The kept keys of one Secret version (those asked for that it has).
pub type Values = Arc<BTreeMap<String, Zeroizing<Vec<u8>>>>;

/// What is kept of one Secret.
#[derive(Default)]
pub(super) struct Entry {
    /// The `resourceVersion` read (or written, for a served auth file).
    pub(super) version: String,
    /// Every key's digest at `version`, once the Secret was read.
    pub(super) hashes: Option<KeyHashes>,
    /// The keys whose values are kept: those asked for so far, kept across versions so that a read of a
    /// new version for the hashes keeps them too.
    pub(super) wanted: BTreeSet<String>,
    pub(super) values: Values,
    /// Of a served auth file this process wrote at `version`: the hash of the user's file it holds.
    pub(super) served: Option<String>,
}

#[derive(Default)]
struct Inner {
    entries: HashMap<SecretKey, Entry>,
    /// The Secrets each instance named when last read for.
    named: HashMap<InstanceKey, BTreeSet<SecretKey>>,
    /// How many instances name each Secret.
    users: HashMap<SecretKey, usize>,
}

/// The Secrets read so far and who names them. Cloning shares the cache.
#[derive(Clone, Default)]
pub struct SecretCache {
    inner: Arc<Mutex<Inner>>,
}

impl SecretCache {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records that `instance` names exactly `secrets` now; a Secret no instance names any more is
    /// dropped (its values wiped with it).
    pub fn name(&self, instance: &InstanceKey, secrets: BTreeSet<SecretKey>) {
        let mut inner = self.lock();
        let before = inner.named.remove(instance).unwrap_or_default();
        for added in secrets.difference(&before) {
            *inner.users.entry(added.clone()).or_default() += 1;
        }
        for gone in before.difference(&secrets) {
            let users = inner.users.entry(gone.clone()).or_default();
            *users = users.saturating_sub(1);
            if *users == 0 {
                inner.users.remove(gone);
                inner.entries.remove(gone);
            }
        }
        if !secrets.is_empty() {
            inner.named.insert(instance.clone(), secrets);
        }
    }

    /// Drops what was kept for `instance`, which is gone: the Secrets no other instance names.
    pub fn forget(&self, instance: &InstanceKey) {
        self.name(instance, BTreeSet::new());
    }

    /// Runs `f` on the entry of `key`, if kept.
    pub(super) fn with<T>(&self, key: &SecretKey, f: impl FnOnce(&Entry) -> T) -> Option<T> {
        self.lock().entries.get(key).map(f)
    }

    /// Runs `f` on the entry of `key` (a new one if none is kept), when an instance names `key`: a read
    /// that ends after its instance was forgotten keeps nothing.
    pub(super) fn update(&self, key: &SecretKey, f: impl FnOnce(&mut Entry)) {
        let mut inner = self.lock();
        if inner.users.contains_key(key) {
            f(inner.entries.entry(key.clone()).or_default());
        }
    }

    /// How many Secrets are kept.
    pub fn len(&self) -> usize {
        self.lock().entries.len()
    }

    /// Whether none are kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether anything of Secret `namespace/name` is kept.
    pub fn holds(&self, namespace: &str, name: &str) -> bool {
        let key = (namespace.to_owned(), name.to_owned());
        self.lock().entries.contains_key(&key)
    }

    /// The observer of the Secret watch: a Secret seen deleted takes what was kept of it with it, and a
    /// relist (after a watch expired, or the API server came back) keeps only the Secrets it lists, since
    /// one deleted meanwhile sends no deletion.
    pub fn observer(&self) -> impl Fn(&watcher::Event<PartialObjectMeta<Secret>>) + Send + 'static {
        let cache = self.clone();
        // The Secrets of the relist in progress, if one is.
        let relisted: Mutex<Option<HashSet<SecretKey>>> = Mutex::default();
        move |event| {
            let key = |secret: &PartialObjectMeta<Secret>| {
                (secret.namespace().unwrap_or_default(), secret.name_any())
            };
            let mut relisted = relisted.lock().unwrap_or_else(|e| e.into_inner());
            match event {
                watcher::Event::Delete(secret) => {
                    cache.lock().entries.remove(&key(secret));
                }
                watcher::Event::Init => *relisted = Some(HashSet::new()),
                watcher::Event::InitApply(secret) => {
                    if let Some(listed) = relisted.as_mut() {
                        listed.insert(key(secret));
                    }
                }
                watcher::Event::InitDone => {
                    if let Some(listed) = relisted.take() {
                        cache.lock().entries.retain(|key, _| listed.contains(key));
                    }
                }
                watcher::Event::Apply(_) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(namespace: &str, name: &str) -> SecretKey {
        (namespace.to_owned(), name.to_owned())
    }

    fn secret(namespace: &str, name: &str) -> PartialObjectMeta<Secret> {
        let mut secret = PartialObjectMeta::<Secret>::default();
        secret.metadata.name = Some(name.into());
        secret.metadata.namespace = Some(namespace.into());
        secret
    }

    /// Keeps Secret `namespace/name`, named by the instance `a` of its namespace.
    fn keep(cache: &SecretCache, namespace: &str, name: &str) {
        let instance = key(namespace, "a");
        let mut named = cache
            .lock()
            .named
            .get(&instance)
            .cloned()
            .unwrap_or_default();
        named.insert(key(namespace, name));
        cache.name(&instance, named);
        cache.update(&key(namespace, name), |entry| entry.version = "1".into());
    }

    /// A cache keeping every one of `names`.
    fn cache_of(names: &[(&str, &str)]) -> SecretCache {
        let cache = SecretCache::default();
        for (namespace, name) in names {
            keep(&cache, namespace, name);
        }
        cache
    }

    #[test]
    fn a_forgotten_instance_takes_the_secrets_only_it_names_with_it() {
        let cache = SecretCache::default();
        let (a, b) = (key("ns", "a"), key("ns", "b"));
        cache.name(&a, BTreeSet::from([key("ns", "tls"), key("ns", "auth")]));
        cache.name(&b, BTreeSet::from([key("ns", "tls")]));
        for name in ["tls", "auth"] {
            cache.update(&key("ns", name), |entry| entry.version = "1".into());
        }
        assert_eq!(cache.len(), 2);

        cache.forget(&a);
        assert!(!cache.holds("ns", "auth"), "only a named it");
        assert!(cache.holds("ns", "tls"), "b still names it");

        cache.name(&b, BTreeSet::new());
        assert!(cache.is_empty(), "no longer named by b's spec");
        cache.update(&key("ns", "tls"), |entry| entry.version = "2".into());
        assert!(
            cache.is_empty(),
            "a read for a forgotten instance keeps nothing"
        );
    }

    #[test]
    fn a_deleted_secret_takes_what_was_kept_with_it() {
        let cache = cache_of(&[("ns", "auth"), ("ns", "tls"), ("other", "auth")]);
        let observe = cache.observer();
        observe(&watcher::Event::Delete(secret("ns", "auth")));
        assert!(!cache.holds("ns", "auth"));
        assert!(cache.holds("ns", "tls"), "another Secret stays");
        assert!(
            cache.holds("other", "auth"),
            "the same name elsewhere stays"
        );
        observe(&watcher::Event::Apply(secret("ns", "tls")));
        assert!(cache.holds("ns", "tls"), "a change is found by its version");
    }

    #[test]
    fn a_relist_keeps_only_the_secrets_it_lists() {
        let cache = cache_of(&[("ns", "auth"), ("ns", "gone")]);
        let observe = cache.observer();
        observe(&watcher::Event::Init);
        observe(&watcher::Event::InitApply(secret("ns", "auth")));
        assert!(
            cache.holds("ns", "gone"),
            "nothing goes before the list is complete"
        );
        observe(&watcher::Event::InitDone);
        assert!(cache.holds("ns", "auth"));
        assert!(
            !cache.holds("ns", "gone"),
            "deleted while the watch was down"
        );
        // Read after the relist: not dropped by a later, unrelated InitDone without an Init.
        keep(&cache, "ns", "new");
        observe(&watcher::Event::InitDone);
        assert!(cache.holds("ns", "new"));
    }
}
