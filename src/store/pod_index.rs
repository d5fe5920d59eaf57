//! The pods of each instance (its servers, and its proxy's pods apart), by name: an index beside the pod
//! cache, fed by the same watch.
//!
//! The reconciler and the stats collector each need one instance's pods. Filtering the whole pod cache
//! for them costs a pass over every pod in scope, once per reconcile and once per instance per
//! collection: at 3000 instances that is millions of label lookups where a few map lookups do.
//!
//! The index follows the watch's events as the reflector does: applies and deletes at once, and a
//! re-list (after a watch expired) replaces it whole when the list is complete.

use std::collections::{BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::{Arc, RwLock};

use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};

use super::cache::Cache;
use super::compact::Compact;
use crate::connection::PodCheck;
use crate::resources::labels;

/// A pod as the pod watch delivers it.
type Cached = Compact<Pod>;

/// (namespace, instance name).
type Instance = (String, String);

/// Which pods of an instance: its servers, or its proxy's pods (`spec.proxy`).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
enum Tier {
    Servers,
    Proxy,
}
/// (namespace, pod name).
type PodKey = (String, String);

#[derive(Default)]
struct Index {
    by_instance: HashMap<(Tier, Instance), BTreeSet<String>>,
    instance_of: HashMap<PodKey, (Tier, Instance)>,
}

impl Index {
    fn apply(&mut self, pod: &Cached) {
        let Some(key) = pod_key(pod) else { return };
        self.remove(&key);
        if let Some(instance) = instance_of(pod) {
            self.by_instance
                .entry(instance.clone())
                .or_default()
                .insert(key.1.clone());
            self.instance_of.insert(key, instance);
        }
    }

    fn remove(&mut self, key: &PodKey) {
        let Some(instance) = self.instance_of.remove(key) else {
            return;
        };
        if let Some(names) = self.by_instance.get_mut(&instance) {
            names.remove(&key.1);
            if names.is_empty() {
                self.by_instance.remove(&instance);
            }
        }
    }
}

/// The index, shared by the watch that feeds it and the readers.
#[derive(Clone, Default)]
pub struct PodIndex {
    index: Arc<RwLock<Index>>,
    /// The re-list under way, replacing the index at its end.
    relisting: Arc<RwLock<Option<Index>>>,
}

impl PodIndex {
    /// Follows one event of the pod watch.
    pub fn observe(&self, event: &watcher::Event<Cached>) {
        match event {
            watcher::Event::Apply(pod) => write(&self.index).apply(pod),
            watcher::Event::Delete(pod) => {
                if let Some(key) = pod_key(pod) {
                    write(&self.index).remove(&key);
                }
            }
            watcher::Event::Init => *write(&self.relisting) = Some(Index::default()),
            watcher::Event::InitApply(pod) => {
                if let Some(relisting) = write(&self.relisting).as_mut() {
                    relisting.apply(pod);
                }
            }
            watcher::Event::InitDone => {
                if let Some(listed) = write(&self.relisting).take() {
                    *write(&self.index) = listed;
                }
            }
        }
    }

    /// The cached pods of instance `name` in `namespace`, in name order (one that cannot be decoded, which
    /// only text that is not a pod could cause, is left out).
    pub fn pods(&self, store: &Cache<Pod>, namespace: &str, name: &str) -> Vec<Arc<Pod>> {
        self.tier(Tier::Servers, store, namespace, name)
    }

    /// The cached pods of the proxy (`spec.proxy`) of instance `name` in `namespace`, in name order.
    pub fn proxy_pods(&self, store: &Cache<Pod>, namespace: &str, name: &str) -> Vec<Arc<Pod>> {
        self.tier(Tier::Proxy, store, namespace, name)
    }

    fn tier(&self, tier: Tier, store: &Cache<Pod>, namespace: &str, name: &str) -> Vec<Arc<Pod>> {
        let index = self.index.read().unwrap_or_else(|e| e.into_inner());
        let Some(names) = index
            .by_instance
            .get(&(tier, (namespace.to_owned(), name.to_owned())))
        else {
            return Vec::new();
        };
        names
            .iter()
            .filter_map(|pod| store.get(namespace, pod).ok().flatten())
            .collect()
    }
}

fn write<T>(lock: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(|e| e.into_inner())
}

fn pod_key(pod: &Cached) -> Option<PodKey> {
    Some((pod.namespace()?, pod.meta().name.clone()?))
}

/// The instance a pod belongs to, and as what: a memcached server or proxy pod labelled with its instance.
fn instance_of(pod: &Cached) -> Option<(Tier, Instance)> {
    let labels = pod.labels();
    let tier = match labels.get(labels::NAME_KEY).map(String::as_str) {
        Some(labels::APP_NAME) => Tier::Servers,
        Some(labels::PROXY_APP_NAME) => Tier::Proxy,
        _ => return None,
    };
    let instance = (pod.namespace()?, labels.get(labels::INSTANCE_KEY)?.clone());
    Some((tier, instance))
}

/// The check a connection makes before it sends credentials in the clear (see
/// [`crate::connection::Target::still_the_pod`]): pod `name` of `namespace` is in `pods` now, with IP `ip`,
/// and not terminating. One lookup in the cache by name, when the connection is made.
pub fn still_at(pods: &Cache<Pod>, namespace: &str, name: &str, ip: IpAddr) -> PodCheck {
    let (pods, namespace, name) = (pods.clone(), namespace.to_owned(), name.to_owned());
    Arc::new(move || {
        pods.get(&namespace, &name)
            .ok()
            .flatten()
            .is_some_and(|pod| at(&pod, ip))
    })
}

/// Whether `pod` has IP `ip` and is not terminating.
fn at(pod: &Pod, ip: IpAddr) -> bool {
    pod.metadata.deletion_timestamp.is_none()
        && pod
            .status
            .as_ref()
            .and_then(|s| s.pod_ip.as_deref())
            .and_then(|a| a.parse::<IpAddr>().ok())
            == Some(ip)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(name: &str, instance: &str, app: &str) -> Cached {
        serde_json::from_value(
            json!({"metadata": {"name": name, "namespace": "ns", "labels": {
            "app.kubernetes.io/name": app, "app.kubernetes.io/instance": instance}}}),
        )
        .unwrap()
    }

    /// Feeds `events` to the index and the store alike, as the watch does.
    fn feed(events: Vec<watcher::Event<Cached>>) -> (PodIndex, Cache<Pod>) {
        let (store, mut writer) = super::super::cache::cache::<Pod>();
        let index = PodIndex::default();
        for event in events {
            index.observe(&event);
            writer.apply_watcher_event(&event);
        }
        (index, store)
    }

    fn names(index: &PodIndex, store: &Cache<Pod>, instance: &str) -> Vec<String> {
        index
            .pods(store, "ns", instance)
            .iter()
            .map(|p| p.name_any())
            .collect()
    }

    #[test]
    fn credentials_in_the_clear_wait_for_the_pod_the_address_was_read_for() {
        use watcher::Event::{Apply, Delete};
        let with_ip = |ip: &str, terminating: bool| -> Cached {
            let mut pod: Pod = serde_json::from_value(json!({
                "metadata": {"name": "a-1", "namespace": "ns"}, "status": {"podIP": ip}}))
            .unwrap();
            if terminating {
                pod.metadata.deletion_timestamp =
                    Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                        k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
                    ));
            }
            serde_json::from_value(serde_json::to_value(pod).unwrap()).unwrap()
        };
        let ip: IpAddr = "10.0.0.1".parse().unwrap();
        let (store, mut writer) = super::super::cache::cache::<Pod>();
        let check = still_at(&store, "ns", "a-1", ip);
        assert!(!check(), "not in the cache");
        writer.apply_watcher_event(&Apply(with_ip("10.0.0.1", false)));
        assert!(check(), "the pod, at its IP");
        writer.apply_watcher_event(&Apply(with_ip("10.0.0.1", true)));
        assert!(!check(), "terminating");
        writer.apply_watcher_event(&Apply(with_ip("10.0.0.2", false)));
        assert!(!check(), "another IP");
        writer.apply_watcher_event(&Delete(with_ip("10.0.0.2", false)));
        assert!(!check(), "gone");
    }

    #[test]
    fn pods_are_found_by_instance() {
        use watcher::Event::{Apply, Delete};
        let (index, store) = feed(vec![
            Apply(pod("a-2", "a", "memcached")),
            Apply(pod("a-1", "a", "memcached")),
            Apply(pod("b-1", "b", "memcached")),
            Apply(pod("x", "a", "redis")),
            Apply(pod("a-proxy-1", "a", "memcached-proxy")),
            Delete(pod("a-2", "a", "memcached")),
        ]);
        assert_eq!(
            names(&index, &store, "a"),
            ["a-1"],
            "a proxy pod is no server"
        );
        assert_eq!(names(&index, &store, "b"), ["b-1"]);
        assert!(names(&index, &store, "c").is_empty());
        let proxies: Vec<String> = index
            .proxy_pods(&store, "ns", "a")
            .iter()
            .map(|p| p.name_any())
            .collect();
        assert_eq!(proxies, ["a-proxy-1"]);
        assert!(index.proxy_pods(&store, "ns", "b").is_empty());
    }

    #[test]
    fn a_relabelled_pod_moves_and_a_relist_replaces_everything() {
        use watcher::Event::{Apply, Init, InitApply, InitDone};
        let (index, store) = feed(vec![
            Apply(pod("p", "a", "memcached")),
            Apply(pod("p", "b", "memcached")),
        ]);
        assert!(names(&index, &store, "a").is_empty());
        assert_eq!(names(&index, &store, "b"), ["p"]);

        let (index, store) = feed(vec![
            Apply(pod("gone", "a", "memcached")),
            Init,
            InitApply(pod("kept", "a", "memcached")),
            InitDone,
        ]);
        assert_eq!(names(&index, &store, "a"), ["kept"]);
    }
}
