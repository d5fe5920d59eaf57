//! One cached watch: a retried watch of one kind that fills its cache and streams the objects it
//! touched, served from the API server's watch cache, and the observers that end read-your-writes.

use std::fmt::Debug;
use std::sync::Arc;

use futures::TryStreamExt;
use futures::stream::BoxStream;
use kube::runtime::reflector;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;

use super::watch_retry::{Retries, retrying};
use crate::store::cache::{Cache, cache};
use crate::store::compact::{Compact, Compactable};
use crate::store::written::Written;

/// A watch's stream of touched objects (its errors are retried, not passed on: see `watch_retry`).
pub(super) type Watched<K> = BoxStream<'static, Result<K, watcher::Error>>;

/// Lists served from the API server's watch cache (`resourceVersion=0`) instead of etcd. kube leaves
/// `resourceVersion=0` out of paginated lists, and the server ignores the page size for them anyway, so
/// pagination is off.
pub(super) fn from_cache(config: watcher::Config) -> watcher::Config {
    let mut config = config.any_semantic();
    config.page_size = None;
    config
}

pub(super) fn api<K>(client: &Client, namespace: Option<&str>) -> Api<K>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// A compact, cached watch of `K` (the watch of `api`; what is kept is [`Compactable`]'s to say): its
/// cache, and the stream of touched objects (deletions included, so a deleted child triggers its owner and
/// is recreated). `observe` sees every event just before the cache does, `settled` just after.
pub(super) fn cached<K>(
    retries: &Retries,
    resource: &'static str,
    api: Api<Compact<K>>,
    config: watcher::Config,
    (observe, settled): (
        impl Fn(&watcher::Event<Compact<K>>) + Send + 'static,
        impl Fn(&watcher::Event<Compact<K>>) + Send + 'static,
    ),
) -> (
    Cache<K>,
    impl futures::Stream<Item = Result<Compact<K>, watcher::Error>> + Send + 'static,
)
where
    K: Compactable + Send + Sync,
    K::DynamicType: Clone + Eq + std::hash::Hash + Send + Sync,
{
    let (cache, mut writer) = cache::<K>();
    let (objects, bytes) = retries.metrics.cache_gauges(resource);
    let stream = retrying(retries, resource, watcher(api, config))
        .inspect_ok(observe)
        .inspect_ok(move |event| {
            writer.apply_watcher_event(event);
            let footprint = writer.footprint();
            objects.set(i64::try_from(footprint.objects).unwrap_or(i64::MAX));
            bytes.set(i64::try_from(footprint.bytes).unwrap_or(i64::MAX));
        })
        .inspect_ok(settled)
        .touched_objects();
    (cache, stream)
}

/// A trimmed, cached watch of `K` as it is (the Secrets' metadata): its store, and the stream of touched
/// objects. `observe` sees every event (trimmed) just before the cache does.
pub(super) fn reflected<K>(
    retries: &Retries,
    resource: &'static str,
    api: Api<K>,
    config: watcher::Config,
    trim: fn(&mut K),
    dyntype: K::DynamicType,
    observe: impl Fn(&watcher::Event<K>) + Send + 'static,
) -> (
    reflector::Store<K>,
    impl futures::Stream<Item = Result<K, watcher::Error>> + Send + 'static,
)
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Clone + Eq + std::hash::Hash + Send + Sync,
{
    let writer = reflector::store::Writer::new(dyntype);
    let store = writer.as_reader();
    let stream = retrying(retries, resource, watcher(api, config))
        .modify(trim)
        .inspect_ok(observe)
        .reflect(writer)
        .touched_objects();
    (store, stream)
}

/// The observers of a child watch (before and after its cache sees an event) that end what `written` kept
/// of an object (read-your-writes): a deletion ends it before the cache drops the object; a version the
/// cache holds ends a kept answer it has caught up with, once the cache can stand in for it.
pub(super) fn forgets_seen<K>(
    written: &Arc<Written>,
    dt: &K::DynamicType,
) -> (
    impl Fn(&watcher::Event<K>) + Send + 'static,
    impl Fn(&watcher::Event<K>) + Send + 'static,
)
where
    K: Resource + 'static,
    K::DynamicType: Clone + Send + 'static,
{
    let (deleted, dt_deleted) = (written.clone(), dt.clone());
    let (cached, dt) = (written.clone(), dt.clone());
    (
        move |event: &watcher::Event<K>| {
            if let watcher::Event::Delete(object) = event {
                deleted.observe_deleted(object, &dt_deleted);
            }
        },
        move |event: &watcher::Event<K>| {
            if let watcher::Event::Apply(object) = event {
                cached.observe_cached(object, &dt);
            }
        },
    )
}
