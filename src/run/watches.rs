//! The watches that feed the caches and trigger reconciles, and the controller loop itself.
//!
//! - `Memcached`: all of them (in the watched namespace), the reconciled kind, without annotations.
//! - Deployments, StatefulSets, Services, the server-list ConfigMaps, PodDisruptionBudgets,
//!   NetworkPolicies, HorizontalPodAutoscalers and (where the cluster serves them) ServiceMonitors: only
//!   those labelled `app.kubernetes.io/managed-by=memcached-operator`; a change or deletion triggers the
//!   owning instance through its controller owner reference. They are cached compact but complete (see
//!   [`super::compact`]): the drift check compares their spec.
//! - Pods: same label scope, cached compact without their spec (the largest part of a pod, never read)
//!   and with only the one annotation read (the drained pod-deletion cost); a change triggers the
//!   instance named by the `app.kubernetes.io/instance` label.
//! - Secrets: every one in scope (users name their own), metadata only, since only existence and version
//!   matter until one an instance references changes; a change triggers the instances that name it.
//!
//! [`watch`] starts them all and hands back their caches ([`Watches::stores`], which the stats collector
//! reads too); [`run`] then drives the controller with them until shutdown.
//!
//! `managedFields` are dropped from everything cached. Initial lists come from the API server's watch
//! cache. Failed watches are retried within seconds and expired ones (410 Gone) re-listed at once (see
//! [`super::watch_retry`]); when the API server answers again after an outage, every instance is
//! reconciled at once (see [`super::connectivity`]).

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use futures::future::{BoxFuture, Shared};
use futures::stream::BoxStream;
use futures::{FutureExt, StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{DynamicObject, PartialObjectMeta};
use kube::runtime::controller::{Action, Config as ControllerConfig, Controller};
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use std::fmt::Debug;
use tokio::sync::watch;
use tracing::{debug, info, warn};

use super::connectivity::Connectivity;
use super::permissions;
use super::watch_retry::{FIRST_RETRY, LONGEST_RETRY, retrying, retrying_memcacheds};
use crate::api::Memcached;
use crate::api::names::served_auth_name;
use crate::controller::{Context, Error, Settings, error_policy, reconcile, system_clock};
use crate::metrics::Metrics;
use crate::resources::{labels, secrets, service_monitor};
use crate::store::cache::{Cache, cache};
use crate::store::compact::{Compact, Compactable, trim_instance};
use crate::store::foreign::{self, Foreign};
use crate::store::kinds::{ChildCaches, ChildKind, EachKind, MakeCache, each_kind};
use crate::store::pod_index::PodIndex;
use crate::store::written::Written;
use crate::store::{SecretCache, Stores};

/// Where and how to run the controller.
pub struct RunOptions {
    /// Watch only this namespace; all namespaces when `None`.
    pub namespace: Option<String>,
    /// Reconciler tunables.
    pub settings: Settings,
    /// Identity of this replica in the events it records (the pod name).
    pub reporter_instance: Option<String>,
}

type Watched<K> = BoxStream<'static, Result<K, watcher::Error>>;

/// The caches, filling, and the watches that feed them: what [`run`] drives the controller with, and what
/// others (the stats collector) read meanwhile.
pub struct Watches {
    /// The caches the reconciler and the stats collector read.
    pub stores: Stores,
    namespace: Option<String>,
    /// Read-your-writes (see `written`): the reconciler keeps the answers to its writes, and the watches
    /// end them when their caches hold that version, or see the object deleted.
    written: Arc<Written>,
    /// The instances' watch is started by [`run`]: a deletion it sees makes the context forget the
    /// instance, so it needs the context.
    instances: (Api<Memcached>, reflector::store::Writer<Memcached>),
    /// The Memcached cache's readiness is the controller's to wait for (a store wakes only its latest
    /// waiter), so the end of its initial list is observed on the stream instead.
    instances_listed: (watch::Sender<bool>, watch::Receiver<bool>),
    children_synced: Synced,
    streams: ChildStreams,
    /// Shared: reconciles waiting for the caches, and the start-up discovery, must give up when shutdown
    /// begins, or it would wait for them.
    shutdown: Shared<BoxFuture<'static, ()>>,
}

/// The child watches' streams, each triggering the instance an object belongs to.
struct ChildStreams {
    /// The instances owning a changed child of a kind in the table (see `kinds`).
    children: BoxStream<'static, ObjectRef<Memcached>>,
    pods: Watched<Compact<Pod>>,
    secrets: Watched<PartialObjectMeta<Secret>>,
    service_monitors: Option<Watched<Compact<DynamicObject>>>,
    /// The instances whose child names an object the operator does not manage was seen under.
    foreign: BoxStream<'static, ObjectRef<Memcached>>,
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

/// Lists served from the API server's watch cache (`resourceVersion=0`) instead of etcd. kube leaves
/// `resourceVersion=0` out of paginated lists, and the server ignores the page size for them anyway, so
/// pagination is off.
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

/// The instances that own an object: its owner references to a `Memcached` (as kube's `owns` reads them).
fn owners(meta: &kube::api::ObjectMeta) -> Vec<ObjectRef<Memcached>> {
    meta.owner_references
        .iter()
        .flatten()
        .filter_map(|owner| ObjectRef::from_owner_ref(meta.namespace.as_deref(), owner, ()))
        .collect()
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

/// The waits for each child cache's first complete list.
struct ChildrenListed<'a> {
    caches: &'a ChildCaches,
    waits: Vec<BoxFuture<'static, Result<(), crate::store::cache::WriterDropped>>>,
}

impl EachKind for ChildrenListed<'_> {
    fn kind<K: ChildKind>(&mut self) {
        let cache = K::cache(self.caches).clone();
        self.waits
            .push(async move { cache.wait_until_ready().await }.boxed());
    }
}

fn from_cache(config: watcher::Config) -> watcher::Config {
    let mut config = config.any_semantic();
    config.page_size = None;
    config
}

fn api<K>(client: &Client, namespace: Option<&str>) -> Api<K>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
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
    let secret_cache = SecretCache::default();
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
        // of Secrets (what was read of their values, and what it wrote there) ends with them.
        secret_cache.observer(),
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
        secret_cache,
        service_monitors,
        foreign,
    };
    let children_synced = children_synced(&stores, shutdown.clone());
    Watches {
        stores,
        namespace: ns.map(str::to_owned),
        written,
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

/// The ServiceMonitors' cache and watch, when the cluster serves their API (asked once, at start).
async fn watch_service_monitors(
    client: &Client,
    ns: Option<&str>,
    metrics: &Arc<Metrics>,
    config: watcher::Config,
    written: &Arc<Written>,
    shutdown: Shared<BoxFuture<'static, ()>>,
) -> (
    Option<Cache<DynamicObject>>,
    Option<Watched<Compact<DynamicObject>>>,
) {
    if !service_monitors_served(client, shutdown).await {
        info!(
            "the cluster does not serve monitoring.coreos.com/v1 ServiceMonitor; not watching them"
        );
        return (None, None);
    }
    let service_monitor = service_monitor::api_resource();
    let api = match ns {
        Some(ns) => {
            Api::<Compact<DynamicObject>>::namespaced_with(client.clone(), ns, &service_monitor)
        }
        None => Api::<Compact<DynamicObject>>::all_with(client.clone(), &service_monitor),
    };
    let observers = forgets_seen(written, &service_monitor);
    let (store, stream) = cached(metrics, "servicemonitors", api, config, observers);
    (Some(store), Some(stream.boxed()))
}

/// Runs the controller over `watches` until shutdown (theirs); in-flight reconciles finish first.
/// `synced` turns true once every cache has its initial list.
pub async fn run(
    watches: Watches,
    client: Client,
    metrics: Arc<Metrics>,
    connectivity: Arc<Connectivity>,
    options: RunOptions,
    synced: Arc<AtomicBool>,
) {
    tokio::spawn(mark_synced(watches.synced(), synced));
    let Watches {
        stores,
        namespace,
        written,
        instances: (mc_api, mc_writer),
        instances_listed: (mc_listed_tx, mc_listed),
        children_synced,
        streams,
        shutdown,
    } = watches;
    let stopped_unlisted = stopped_before_listing(shutdown.clone(), mc_listed);
    let memcacheds = stores.memcacheds.clone();
    let service_monitor = service_monitor::api_resource();
    let ctx = Arc::new(Context::sharing(
        client,
        options.settings,
        stores,
        metrics,
        options.reporter_instance,
        system_clock(),
        written,
    ));
    let mc_stream = instances(&ctx, &connectivity, mc_api, mc_writer, mc_listed_tx);

    info!(
        namespace = namespace.as_deref().unwrap_or("<all>"),
        concurrency = ctx.settings.concurrency,
        "starting controller"
    );
    let instances = memcacheds.clone();
    let mut controller = Controller::for_stream(mc_stream, memcacheds)
        .watches_stream(streams.pods, pod_owner)
        .watches_stream(streams.secrets, move |secret| {
            referencing(&instances.state(), &secret)
        });
    if let Some(stream) = streams.service_monitors {
        controller = controller.owns_stream_with(stream, service_monitor);
    }
    let controller = controller
        // Unbounded here: the reconciles take turns themselves, in order, and wait for them outside the
        // controller (see `turns`).
        .with_config(ControllerConfig::default())
        .reconcile_on(streams.children)
        // The instances whose warm-handover copy ended, to open the new server's gate.
        .reconcile_on(futures::stream::select(
            streams.foreign,
            ctx.handover.triggers(),
        ))
        // The instances whose turn, waited for outside the controller, came (see `turns`).
        .reconcile_on(ctx.turns.due())
        .reconcile_all_on(recoveries(&connectivity, ctx.clone()))
        .graceful_shutdown_on(shutdown)
        .run(
            move |mc, ctx| reconcile_when_synced(mc, ctx, children_synced.clone()),
            error_policy,
            ctx,
        )
        .for_each(|result| async move {
            if let Err(error) = result {
                log_controller_error(error);
            }
        });
    tokio::select! {
        () = controller => info!("controller stopped"),
        () = stopped_unlisted => {
            info!("controller stopped before the instances were listed; no reconcile had started");
        }
    }
}

/// The instances' watch, filling their cache: each instance changed, for the controller. Built once the
/// context exists: a deletion it sees makes the context forget the instance (no reconcile follows a
/// deletion). Its cache sees the deletion first, so a failure counted after this is dropped by the error
/// policy. `listed` turns true at the end of each complete list.
fn instances(
    ctx: &Arc<Context>,
    connectivity: &Arc<Connectivity>,
    api: Api<Memcached>,
    writer: reflector::store::Writer<Memcached>,
    listed: watch::Sender<bool>,
) -> impl futures::Stream<Item = Result<Memcached, watcher::Error>> + Send + 'static {
    let forget = ctx.clone();
    let written = ctx.writer.written.clone();
    // A 404 here means that the CRD is not installed: reported through `connectivity` (and `/readyz`).
    retrying_memcacheds(
        &ctx.metrics,
        connectivity.clone(),
        watcher(api, from_cache(watcher::Config::default())),
    )
    .modify(trim_instance)
    .reflect(writer)
    .inspect_ok(move |event| match event {
        watcher::Event::InitDone => {
            listed.send_replace(true);
        }
        watcher::Event::Delete(mc) => forget.forget(mc),
        // The cache holds it now: a status or finalizer write it has caught up with need not be kept.
        watcher::Event::Apply(mc) => written.observe_cached(mc, &()),
        _ => {}
    })
    .applied_objects()
}

/// Resolves when shutdown comes before the instances' first complete list (`listed` still false); pends
/// otherwise. kube's controller starts no reconcile before its cache of instances holds that list, and
/// until then it does not end either: its runner waits for the list even after a graceful shutdown has
/// ended its queue. Without the CRD (or with an API server that never answered) the list never comes, and
/// the process waited for it after SIGTERM until killed. Nothing is in flight then, so nothing is lost by
/// ending the controller at once.
async fn stopped_before_listing(
    shutdown: Shared<BoxFuture<'static, ()>>,
    listed: watch::Receiver<bool>,
) {
    shutdown.await;
    if *listed.borrow() {
        std::future::pending::<()>().await;
    }
}

/// Logs what the controller's stream reports: reconcile failures are logged by the reconcile itself;
/// these are queue or watch problems.
fn log_controller_error<E: std::error::Error>(
    error: kube::runtime::controller::Error<E, watcher::Error>,
) {
    match error {
        kube::runtime::controller::Error::ReconcilerFailed(..) => {}
        kube::runtime::controller::Error::ObjectNotFound(obj) => {
            debug!(%obj, "object gone before its reconcile ran")
        }
        other => warn!(error = %other, "controller error"),
    }
}

/// A compact, cached watch of `K` (the watch of `api`; what is kept is [`Compactable`]'s to say): its
/// cache, and the stream of touched objects (deletions included, so a deleted child triggers its owner and
/// is recreated). `observe` sees every event just before the cache does, `settled` just after.
fn cached<K>(
    metrics: &Arc<Metrics>,
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
    let (objects, bytes) = metrics.cache_gauges(resource);
    let stream = retrying(metrics, resource, watcher(api, config))
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
fn reflected<K>(
    metrics: &Arc<Metrics>,
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
    let stream = retrying(metrics, resource, watcher(api, config))
        .modify(trim)
        .inspect_ok(observe)
        .reflect(writer)
        .touched_objects();
    (store, stream)
}

/// The observers of a child watch (before and after its cache sees an event) that end what `written` kept
/// of an object (read-your-writes): a deletion ends it before the cache drops the object; a version the
/// cache holds ends a kept answer it has caught up with, once the cache can stand in for it.
fn forgets_seen<K>(
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

/// Keeps of a Secret only its identity and version. Annotations go too: `kubectl apply` stores the whole
/// Secret, data included, in one.
pub fn trim_secret(secret: &mut PartialObjectMeta<Secret>) {
    secret.metadata.managed_fields = None;
    secret.metadata.annotations = None;
    secret.metadata.labels = None;
}

/// The instances that reference `secret` (same namespace, named in their spec), or whose servers load it
/// (`<name>-auth-file`: changed or deleted by someone, it is written again).
pub fn referencing(
    instances: &[Arc<Memcached>],
    secret: &PartialObjectMeta<Secret>,
) -> Vec<ObjectRef<Memcached>> {
    let (Some(name), namespace) = (
        secret.metadata.name.as_deref(),
        secret.metadata.namespace.as_deref(),
    ) else {
        return Vec::new();
    };
    instances
        .iter()
        .filter(|mc| mc.metadata.namespace.as_deref() == namespace)
        .filter(|mc| {
            secrets::referenced(&mc.spec).iter().any(|r| r.name == name)
                || mc.metadata.name.as_deref().map(served_auth_name).as_deref() == Some(name)
        })
        .map(|mc| ObjectRef::from_obj(mc.as_ref()))
        .collect()
}

/// Whether the cluster serves the Prometheus Operator's ServiceMonitor API. Asked until it answers (an
/// operator started during an API-server outage must not decide "not served" from a refused connection),
/// or until shutdown; an error that a retry cannot fix (403, other 4xx) counts as not served.
async fn service_monitors_served(
    client: &Client,
    shutdown: Shared<BoxFuture<'static, ()>>,
) -> bool {
    let mut delay = FIRST_RETRY;
    loop {
        match client
            .list_api_group_resources("monitoring.coreos.com/v1")
            .await
        {
            Ok(list) => return list.resources.iter().any(|r| r.name == "servicemonitors"),
            Err(kube::Error::Api(status)) if status.code == 404 => return false,
            Err(kube::Error::Api(status)) if status.code < 500 => {
                warn!(error = %status.message, "cannot discover the ServiceMonitor API; ServiceMonitors are not managed");
                return false;
            }
            Err(error) => {
                debug!(%error, "cannot discover the ServiceMonitor API yet; retrying");
            }
        }
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            () = shutdown.clone() => return false,
        }
        delay = (delay * 2).min(LONGEST_RETRY);
    }
}

/// Fires once each time the API server answers again after an outage, after clearing every instance's
/// retry backoff: what failed during the outage failed because of it, and is retried now, level-based,
/// together with whatever changed meanwhile.
fn recoveries(
    connectivity: &Connectivity,
    ctx: Arc<Context>,
) -> impl futures::Stream<Item = ()> + Send + 'static {
    futures::stream::unfold(
        (connectivity.recoveries(), ctx),
        |(mut recoveries, ctx)| async move {
            recoveries.changed().await.ok()?;
            ctx.backoff.reset_all();
            Some(((), (recoveries, ctx)))
        },
    )
}

/// The instance a pod belongs to, from its labels: one of its servers, or its rollout's spare server
/// (see `resources::spare`).
pub fn pod_owner(pod: Compact<Pod>) -> Option<ObjectRef<Memcached>> {
    let labels = pod.labels();
    if labels.get(labels::NAME_KEY).map(String::as_str) != Some(labels::APP_NAME)
        && !crate::resources::spare::is_spare(labels)
    {
        return None;
    }
    let name = labels.get(labels::INSTANCE_KEY)?;
    let namespace = pod.namespace()?;
    Some(ObjectRef::new(name).within(&namespace))
}

/// Resolves to `true` once every child, pod and Secret cache holds its initial list, `false` if shutdown
/// comes first or one never will. A reflector store wakes only the latest task waiting for it to become
/// ready, so each store gets this one waiter, shared by everyone who needs to know.
type Synced = Shared<BoxFuture<'static, bool>>;

fn children_synced(stores: &Stores, shutdown: Shared<BoxFuture<'static, ()>>) -> Synced {
    let stores = stores.clone();
    async move {
        let mut children = ChildrenListed {
            caches: &stores.children,
            waits: Vec::new(),
        };
        each_kind(&mut children);
        let mut waits = children.waits;
        waits.extend([
            stores.pods.wait_until_ready().boxed(),
            stores
                .secrets
                .wait_until_ready()
                .map(|ready| ready.map_err(|_| crate::store::cache::WriterDropped))
                .boxed(),
        ]);
        if let Some(store) = &stores.service_monitors {
            waits.push(store.wait_until_ready().boxed());
        }
        let foreign = stores
            .foreign
            .ready()
            .map(|ready| {
                ready
                    .then_some(())
                    .ok_or(crate::store::cache::WriterDropped)
            })
            .boxed();
        waits.push(foreign);
        let all = futures::future::try_join_all(waits);
        tokio::select! {
            ready = all => ready.is_ok(),
            () = shutdown => false,
        }
    }
    .boxed()
    .shared()
}

/// [`reconcile`], once the other caches hold their initial lists. The controller itself waits only for
/// the Memcached cache; a reconcile that ran before the others are filled would take existing children
/// for missing ones (re-applying them and recording "Created" events), report existing Secrets as missing,
/// and compute the status without the pods. The caches keep filling while a reconcile waits here, so the
/// instance is read again from its cache afterwards.
async fn reconcile_when_synced(
    mc: Arc<Memcached>,
    ctx: Arc<Context>,
    children_synced: Synced,
) -> Result<Action, Error> {
    if !children_synced.await {
        return Ok(Action::await_change());
    }
    match ctx.stores.memcacheds.get(&ObjectRef::from_obj(mc.as_ref())) {
        Some(latest) => reconcile(latest, ctx).await,
        // Deleted while waiting: nothing left to reconcile.
        None => Ok(Action::await_change()),
    }
}

async fn mark_synced(all: impl Future<Output = bool>, synced: Arc<AtomicBool>) {
    if all.await {
        info!("caches synced");
        synced.store(true, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn pods_map_to_their_instance_by_label() {
        let pod: Compact<Pod> = serde_json::from_value(json!({"metadata": {"name": "cache-x", "namespace": "ns",
            "labels": {"app.kubernetes.io/name": "memcached", "app.kubernetes.io/instance": "cache"}}}))
        .unwrap();
        assert_eq!(pod_owner(pod), Some(ObjectRef::new("cache").within("ns")));
        let foreign: Compact<Pod> =
            serde_json::from_value(json!({"metadata": {"name": "x", "namespace": "ns",
            "labels": {"app.kubernetes.io/name": "redis", "app.kubernetes.io/instance": "cache"}}}))
            .unwrap();
        assert_eq!(pod_owner(foreign), None);
    }

    #[test]
    fn secrets_trigger_the_instances_that_name_them() {
        let mc = |name: &str, ns: &str, secret: Option<&str>| {
            let mut mc: Memcached = serde_json::from_value(json!({
                "apiVersion": "cache.example.com/v1alpha1", "kind": "Memcached",
                "metadata": {"name": name, "namespace": ns}, "spec": {}
            }))
            .unwrap();
            if let Some(secret) = secret {
                mc.spec =
                    serde_json::from_value(json!({"security": {"auth": {"secretName": secret}}}))
                        .unwrap();
            }
            Arc::new(mc)
        };
        let instances = [
            mc("a", "ns", Some("creds")),
            mc("b", "ns", None),
            mc("c", "other", Some("creds")),
            mc("d", "ns", Some("creds")),
        ];
        let mut secret = PartialObjectMeta::<Secret>::default();
        secret.metadata.name = Some("creds".into());
        secret.metadata.namespace = Some("ns".into());
        let refs = referencing(&instances, &secret);
        assert_eq!(
            refs,
            [
                ObjectRef::new("a").within("ns"),
                ObjectRef::new("d").within("ns")
            ]
        );

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
