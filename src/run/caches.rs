//! The watches that fill the caches the reconciler reads, and the streams of what changed in them.
//!
//! - Deployments, StatefulSets, Services, the server-list ConfigMaps, PodDisruptionBudgets,
//!   NetworkPolicies, HorizontalPodAutoscalers and (where the cluster serves them) ServiceMonitors: only
//!   those labelled `app.kubernetes.io/managed-by=memcached-operator`; a change or deletion triggers the
//!   owning instance through its controller owner reference. They are cached compact but complete (see
//!   `store::compact`): the drift check compares their spec.
//! - Pods: same label scope, cached compact without their spec (the largest part of a pod, never read)
//!   and with only the one annotation read (the drained pod-deletion cost); a change triggers the
//!   instance named by the `app.kubernetes.io/instance` label.
//! - Secrets: every one in scope (users name their own), metadata only, since only existence and version
//!   matter until one an instance references changes; a change triggers the instances that name it.
//! - For each kind of the table, the same-named objects the operator does not manage (`store::foreign`).
//!
//! [`watch`] starts them all and hands back their caches ([`Watches::stores`], which the stats collector
//! reads too); `controller_loop::run` starts the instances' own watch and drives the controller with them.
//!
//! `managedFields` are dropped from everything cached. Initial lists come from the API server's watch
//! cache. Failed watches are retried within seconds and expired ones (410 Gone) re-listed at once (see
//! [`super::watch_retry`]).

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::Arc;

use futures::future::{BoxFuture, Shared};
use futures::stream::BoxStream;
use futures::{FutureExt, StreamExt};
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{DynamicObject, PartialObjectMeta};
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::watcher;
use kube::{Api, Client, Resource};
use tokio::sync::watch;

use super::cached_watch::{Watched, api, cached, forgets_seen, from_cache, reflected};
use super::first_lists::{Synced, children_synced};
use super::permissions;
use super::service_monitors::watch_service_monitors;
use super::triggers::owners;
use super::watch_retry::retrying;
use crate::api::Memcached;
use crate::controller::SecretHashes;
use crate::metrics::Metrics;
use crate::resources::labels;
use crate::store::Stores;
use crate::store::cache::{Cache, cache};
use crate::store::compact::Compact;
use crate::store::foreign::{self, Foreign};
use crate::store::kinds::{ChildCaches, ChildKind, EachKind, MakeCache, each_kind};
use crate::store::pod_index::PodIndex;
use crate::store::written::Written;

/// The caches, filling, and the watches that feed them: what [`run`] drives the controller with, and what
/// others (the stats collector) read meanwhile.
pub struct Watches {
    /// The caches the reconciler and the stats collector read.
    pub stores: Stores,
    pub(super) namespace: Option<String>,
    /// Read-your-writes (see `written`): the reconciler keeps the answers to its writes, and the watches
    /// end them when their caches hold that version, or see the object deleted.
    pub(super) written: Arc<Written>,
    pub(super) secret_hashes: SecretHashes,
    /// The instances' watch is started by [`run`]: a deletion it sees makes the context forget the
    /// instance, so it needs the context.
    pub(super) instances: (Api<Memcached>, reflector::store::Writer<Memcached>),
    /// The Memcached cache's readiness is the controller's to wait for (a store wakes only its latest
    /// waiter), so the end of its initial list is observed on the stream instead.
    pub(super) instances_listed: (watch::Sender<bool>, watch::Receiver<bool>),
    pub(super) children_synced: Synced,
    pub(super) streams: ChildStreams,
    /// Shared: reconciles waiting for the caches, and the start-up discovery, must give up when shutdown
    /// begins, or it would wait for them.
    pub(super) shutdown: Shared<BoxFuture<'static, ()>>,
}

/// The child watches' streams, each triggering the instance an object belongs to.
pub(super) struct ChildStreams {
    /// The instances owning a changed child of a kind in the table (see `kinds`).
    pub(super) children: BoxStream<'static, ObjectRef<Memcached>>,
    pub(super) pods: Watched<Compact<Pod>>,
    pub(super) secrets: Watched<PartialObjectMeta<Secret>>,
    pub(super) service_monitors: Option<Watched<Compact<DynamicObject>>>,
    /// The instances whose child names an object the operator does not manage was seen under.
    pub(super) foreign: BoxStream<'static, ObjectRef<Memcached>>,
}

impl Watches {
    /// Resolves true once the instances and every other cache hold their initial lists; false when
    /// shutdown came first.
    pub fn synced(&self) -> impl Future<Output = bool> + Send + 'static {
        let (mut listed, children) = (
            self.instances_listed.1.clone(),
            self.children_synced.clone(),
        );
        async move { listed.wait_for(|l| *l).await.is_ok() && children.await }
    }
}

/// Makes the cache of each kind of child from its watch (labelled as managed by the operator), and keeps
/// the stream of the instances its changes trigger: those named by a changed child's owner references.
struct ChildWatches<'a> {
    client: &'a Client,
    namespace: Option<&'a str>,
    metrics: &'a Arc<Metrics>,
    config: &'a watcher::Config,
    written: &'a Arc<Written>,
    /// Kinds the operator may not list (see `permissions`): not watched, their caches empty and complete.
    forbidden: &'a BTreeSet<&'static str>,
    triggers: Vec<BoxStream<'static, ObjectRef<Memcached>>>,
}

impl MakeCache for ChildWatches<'_> {
    fn make<K: ChildKind>(&mut self) -> Cache<K> {
        if self.forbidden.contains(K::URL_PATH_SEGMENT) {
            let (cache, mut writer) = cache::<K>();
            writer.apply_watcher_event(&watcher::Event::Init);
            writer.apply_watcher_event(&watcher::Event::InitDone);
            return cache;
        }
        let (cache, stream) = cached(
            self.metrics,
            K::URL_PATH_SEGMENT,
            api::<Compact<K>>(self.client, self.namespace),
            self.config.clone(),
            forgets_seen(self.written, &()),
        );
        // The watch passes no errors on (see `watch_retry`).
        let owners = stream
            .filter_map(|child| futures::future::ready(child.ok()))
            .flat_map(|child| futures::stream::iter(owners(child.meta())));
        self.triggers.push(owners.boxed());
        cache
    }
}

/// Watches, for each kind of child, the same-named objects the operator does not manage (see `foreign`).
struct ForeignWatches<'a> {
    client: &'a Client,
    namespace: Option<&'a str>,
    metrics: &'a Arc<Metrics>,
    config: &'a watcher::Config,
    forbidden: &'a BTreeSet<&'static str>,
    builder: &'a mut foreign::Builder,
    instances: &'a reflector::Store<Memcached>,
    triggers: Vec<BoxStream<'static, ObjectRef<Memcached>>>,
}

impl EachKind for ForeignWatches<'_> {
    fn kind<K: ChildKind>(&mut self) {
        if self.forbidden.contains(K::URL_PATH_SEGMENT) {
            return;
        }
        // Named apart from the managed watch of the kind in the watch-error metric and logs; made once per
        // kind when the operator starts.
        let resource = Box::leak(format!("unmanaged {}", K::URL_PATH_SEGMENT).into_boxed_str());
        let config = self.config.clone().labels(&foreign::unmanaged_selector());
        let api = api::<PartialObjectMeta<K>>(self.client, self.namespace);
        let events = retrying(self.metrics, resource, watcher(api, config));
        let stream = self.builder.watch::<K, _>(events, self.instances.clone());
        self.triggers.push(stream.boxed());
    }
}

/// Starts the watches of everything the reconciler reads (in `namespace`, or all), except the instances'
/// own, which [`run`] starts: their caches fill from here on. Watches end with `shutdown`.
pub async fn watch(
    client: &Client,
    metrics: &Arc<Metrics>,
    namespace: Option<&str>,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) -> Watches {
    let (ns, metrics) = (namespace, metrics.clone());
    let written = Arc::new(Written::default());
    let secret_hashes = SecretHashes::default();
    let shutdown = shutdown.boxed().shared();
    let children = from_cache(watcher::Config::default().labels(&labels::managed_selector()));
    let (memcacheds, mc_writer) = reflector::store::<Memcached>();
    let mc_api = api::<Memcached>(client, ns);

    let forbidden = permissions::forbidden_kinds(client, ns).await;
    let mut child_watches = ChildWatches {
        client,
        namespace: ns,
        metrics: &metrics,
        config: &children,
        written: &written,
        forbidden: &forbidden,
        triggers: Vec::new(),
    };
    let child_caches = ChildCaches::build(&mut child_watches);
    let child_triggers = futures::stream::select_all(child_watches.triggers);
    let pod_index = PodIndex::default();
    let (pods, pod_stream) = {
        let index = pod_index.clone();
        cached(
            &metrics,
            "pods",
            api::<Compact<Pod>>(client, ns),
            children.clone(),
            (move |event: &_| index.observe(event), |_: &_| {}),
        )
    };
    // Secrets: metadata only, and every Secret in scope, since users name their own Secrets.
    let (secrets, secret_stream) = reflected(
        &metrics,
        "secrets",
        api::<PartialObjectMeta<Secret>>(client, ns),
        from_cache(watcher::Config::default()),
        trim_secret,
        (),
        // The operator writes one kind of Secret (`<name>-auth-file`), outside `written`: what is kept
        // is the hashes of Secrets' values (and of what it wrote there), which end with them.
        secret_hashes.observer(),
    );
    let (foreign, foreign_streams) = watch_foreign(client, ns, &metrics, &memcacheds, &forbidden);
    let (service_monitors, service_monitor_stream) =
        watch_service_monitors(client, ns, &metrics, children, &written, shutdown.clone()).await;

    let stores = Stores {
        memcacheds: memcacheds.clone(),
        children: child_caches,
        pods,
        pod_index,
        secrets,
        service_monitors,
        foreign,
    };
    let children_synced = children_synced(&stores, shutdown.clone());
    Watches {
        stores,
        namespace: ns.map(str::to_owned),
        written,
        secret_hashes,
        instances: (mc_api, mc_writer),
        instances_listed: watch::channel(false),
        children_synced,
        streams: ChildStreams {
            children: child_triggers.boxed(),
            pods: pod_stream.boxed(),
            secrets: secret_stream.boxed(),
            service_monitors: service_monitor_stream,
            foreign: foreign_streams.boxed(),
        },
        shutdown,
    }
}

/// Watches, for every kind it creates by name, the same-named objects the operator does not manage (see
/// `foreign`); ServiceMonitors are left out (an optional extra the operator only creates when asked).
fn watch_foreign(
    client: &Client,
    ns: Option<&str>,
    metrics: &Arc<Metrics>,
    memcacheds: &reflector::Store<Memcached>,
    forbidden: &BTreeSet<&'static str>,
) -> (Foreign, BoxStream<'static, ObjectRef<Memcached>>) {
    let mut foreign = foreign::Builder::default();
    let unmanaged = from_cache(watcher::Config::default());
    let mut foreign_watches = ForeignWatches {
        client,
        namespace: ns,
        metrics,
        config: &unmanaged,
        forbidden,
        builder: &mut foreign,
        instances: memcacheds,
        triggers: Vec::new(),
    };
    each_kind(&mut foreign_watches);
    let streams = futures::stream::select_all(foreign_watches.triggers).boxed();
    (foreign.build(), streams)
}

/// Keeps of a Secret only its identity and version. Annotations go too: `kubectl apply` stores the whole
/// Secret, data included, in one.
pub fn trim_secret(secret: &mut PartialObjectMeta<Secret>) {
    secret.metadata.managed_fields = None;
    secret.metadata.annotations = None;
    secret.metadata.labels = None;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::compact::trim_instance;
    use serde_json::json;

    #[test]
    fn secrets_are_cached_without_their_annotations() {
        let mut secret = PartialObjectMeta::<Secret>::default();
        secret.metadata.name = Some("creds".into());
        secret.metadata.annotations = Some(
            [(
                "kubectl.kubernetes.io/last-applied-configuration".to_owned(),
                "{..data..}".to_owned(),
            )]
            .into(),
        );
        trim_secret(&mut secret);
        assert!(
            secret.metadata.annotations.is_none(),
            "no Secret data is kept in the cache"
        );
    }

    #[test]
    fn instances_are_cached_without_annotations() {
        let mut mc: Memcached = serde_json::from_value(json!({
            "apiVersion": "cache.example.com/v1alpha1", "kind": "Memcached",
            "metadata": {"name": "cache", "namespace": "ns", "labels": {"team": "a"},
                         "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{...}"},
                         "managedFields": [{"manager": "kubectl"}]},
            "spec": {"size": 2}
        }))
        .unwrap();
        trim_instance(&mut mc);
        assert!(mc.metadata.annotations.is_none() && mc.metadata.managed_fields.is_none());
        assert_eq!(mc.metadata.labels.unwrap()["team"], "a");
        assert_eq!(mc.spec.size, 2);
    }
}
