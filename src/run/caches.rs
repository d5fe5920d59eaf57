//! The watches that fill the caches the reconciler reads, and the streams of what changed in them.
//!
//! - Every kind of child of the table (`store::kinds`: Deployments, StatefulSets, Services, the
//!   server-list ConfigMaps, ..., and where the cluster serves them ServiceMonitors): only
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
//! A kind of the table the operator may not list (`permissions`), or whose API the cluster does not serve
//! (`discovery`), is not watched: its cache is empty and complete.
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
use kube::api::PartialObjectMeta;
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::watcher;
use kube::{Api, Client, Resource};
use tokio::sync::watch;

use super::cached_watch::{Watched, api, cached, forgets_seen, from_cache, reflected};
use super::connectivity::Connectivity;
use super::discovery;
use super::first_lists::{Synced, children_synced};
use super::permissions;
use super::triggers::owners;
use super::watch_retry::{Retries, retrying};
use crate::api::Memcached;
use crate::metrics::Metrics;
use crate::resources::labels;
use crate::store::cache::{Cache, cache};
use crate::store::compact::Compact;
use crate::store::foreign::{self, Foreign};
use crate::store::kinds::{ChildCaches, ChildKind, EachKind, MakeCache, Unserved, each_kind};
use crate::store::pod_index::PodIndex;
use crate::store::written::Written;
use crate::store::{SecretCache, Stores};

/// The caches, filling, and the watches that feed them: what [`run`](super::run) drives the controller with, and what
/// others (the stats collector) read meanwhile.
pub struct Watches {
    /// The caches the reconciler and the stats collector read.
    pub stores: Stores,
    pub(super) namespace: Option<String>,
    /// Read-your-writes (see `written`): the reconciler keeps the answers to its writes, and the watches
    /// end them when their caches hold that version, or see the object deleted.
    pub(super) written: Arc<Written>,
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
    retries: &'a Retries,
    config: &'a watcher::Config,
    written: &'a Arc<Written>,
    /// Kinds not watched, their caches empty and complete: those the operator may not list (see
    /// `permissions`), and those the cluster does not serve (see `discovery`).
    unwatched: &'a BTreeSet<&'static str>,
    unserved: &'a Unserved,
    triggers: Vec<BoxStream<'static, ObjectRef<Memcached>>>,
}

impl MakeCache for ChildWatches<'_> {
    fn make<K: ChildKind>(&mut self) -> Cache<K> {
        if self.unwatched.contains(K::URL_PATH_SEGMENT) {
            return empty_and_complete();
        }
        let (cache, stream) = cached(
            self.retries,
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

    fn unserved(&self) -> Unserved {
        self.unserved.clone()
    }
}

/// The cache of a kind that is not watched: it holds every object the operator may see (none), so no
/// reconcile waits for its first list.
fn empty_and_complete<K: ChildKind>() -> Cache<K> {
    let (cache, mut writer) = cache::<K>();
    writer.apply_watcher_event(&watcher::Event::Init);
    writer.apply_watcher_event(&watcher::Event::InitDone);
    cache
}

/// Watches, for each kind of child, the same-named objects the operator does not manage (see `foreign`).
struct ForeignWatches<'a> {
    client: &'a Client,
    namespace: Option<&'a str>,
    retries: &'a Retries,
    config: &'a watcher::Config,
    unwatched: &'a BTreeSet<&'static str>,
    builder: &'a mut foreign::Builder,
    instances: &'a reflector::Store<Memcached>,
    triggers: Vec<BoxStream<'static, ObjectRef<Memcached>>>,
}

impl EachKind for ForeignWatches<'_> {
    fn kind<K: ChildKind>(&mut self) {
        if self.unwatched.contains(K::URL_PATH_SEGMENT) {
            return;
        }
        // Named apart from the managed watch of the kind in the watch-error metric and logs; made once per
        // kind when the operator starts.
        let resource = Box::leak(format!("unmanaged {}", K::URL_PATH_SEGMENT).into_boxed_str());
        let config = self.config.clone().labels(&foreign::unmanaged_selector());
        let api = api::<PartialObjectMeta<K>>(self.client, self.namespace);
        let events = retrying(self.retries, resource, watcher(api, config));
        let stream = self.builder.watch::<K, _>(events, self.instances.clone());
        self.triggers.push(stream.boxed());
    }
}

/// Starts the watches of everything the reconciler reads (in `namespace`, or all), except the instances'
/// own, which [`run`](super::run) starts: their caches fill from here on. Their retries wait less when `connectivity`
/// sees the API server grant requests again (see [`super::watch_retry`]). Watches end with `shutdown`.
pub async fn watch(
    client: &Client,
    metrics: &Arc<Metrics>,
    connectivity: &Connectivity,
    namespace: Option<&str>,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) -> Watches {
    let (ns, metrics) = (namespace, metrics.clone());
    let retries = Retries::new(metrics.clone(), connectivity);
    let written = Arc::new(Written::default());
    let secret_cache = SecretCache::default();
    let shutdown = shutdown.boxed().shared();
    let children = from_cache(watcher::Config::default().labels(&labels::managed_selector()));
    let (memcacheds, mc_writer) = reflector::store::<Memcached>();
    let mc_api = api::<Memcached>(client, ns);

    let unserved = discovery::unserved_kinds(client, shutdown.clone()).await;
    let forbidden = permissions::forbidden_kinds(client, ns, &unserved).await;
    let unwatched: BTreeSet<_> = forbidden.union(&unserved).copied().collect();
    let mut child_watches = ChildWatches {
        client,
        namespace: ns,
        retries: &retries,
        config: &children,
        written: &written,
        unwatched: &unwatched,
        unserved: &unserved,
        triggers: Vec::new(),
    };
    let child_caches = ChildCaches::build(&mut child_watches);
    let child_triggers = futures::stream::select_all(child_watches.triggers);
    let pod_index = PodIndex::default();
    let (pods, pod_stream) = {
        let index = pod_index.clone();
        cached(
            &retries,
            "pods",
            api::<Compact<Pod>>(client, ns),
            children,
            (move |event: &_| index.observe(event), |_: &_| {}),
        )
    };
    // Secrets: metadata only, and every Secret in scope, since users name their own Secrets.
    let (secrets, secret_stream) = reflected(
        &retries,
        "secrets",
        api::<PartialObjectMeta<Secret>>(client, ns),
        from_cache(watcher::Config::default()),
        trim_secret,
        (),
        // The operator writes one kind of Secret (`<name>-auth-file`), outside `written`: what is kept
        // of Secrets (what was read of their values, and what it wrote there) ends with them.
        secret_cache.observer(),
    );
    let (foreign, foreign_streams) = watch_foreign(client, ns, &retries, &memcacheds, &unwatched);

    let stores = Stores {
        memcacheds: memcacheds.clone(),
        children: child_caches,
        pods,
        pod_index,
        secrets,
        secret_cache,
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
            foreign: foreign_streams.boxed(),
        },
        shutdown,
    }
}

/// Watches, for every kind it creates by name, the same-named objects the operator does not manage (see
/// `foreign`), where the cluster serves it and the operator may list it.
fn watch_foreign(
    client: &Client,
    ns: Option<&str>,
    retries: &Retries,
    memcacheds: &reflector::Store<Memcached>,
    unwatched: &BTreeSet<&'static str>,
) -> (Foreign, BoxStream<'static, ObjectRef<Memcached>>) {
    let mut foreign = foreign::Builder::default();
    let unmanaged = from_cache(watcher::Config::default());
    let mut foreign_watches = ForeignWatches {
        client,
        namespace: ns,
        retries,
        config: &unmanaged,
        unwatched,
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

    /// A kind of the table the cluster may not serve (the test-only VerticalPodAutoscaler, one entry in
    /// `store::kinds`) is asked for at start, then watched where served; where not, its cache is complete
    /// at once (no reconcile waits for it) and nothing asks the API server for it.
    mod optional_kinds {
        use super::*;
        use crate::api::external::VerticalPodAutoscaler;
        use http::{Request, Response};
        use kube::client::Body;
        use std::time::Duration;
        use tower_test::mock::{self, Handle};

        type Server = Handle<Request<Body>, Response<Body>>;

        fn client() -> (Client, Server) {
            let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
            (Client::new(service, "ns"), handle)
        }

        /// Answers the discovery of each kind of the table the cluster may not serve until it is done:
        /// `autoscaling.k8s.io/v1` serving the kind where `served`, a 404 for it otherwise and for
        /// every other group (their CRDs not installed here).
        async fn discovery(client: &Client, server: &mut Server, served: bool) -> Unserved {
            let never = futures::future::pending::<()>().boxed().shared();
            let unserved = discovery::unserved_kinds(client, never);
            tokio::pin!(unserved);
            loop {
                let (request, send) = tokio::select! {
                    unserved = &mut unserved => return unserved,
                    next = server.next_request() => next.expect("a discovery"),
                };
                let path = request.uri().path();
                assert!(path.starts_with("/apis/"), "{path}");
                let (status, body) = if served && path == "/apis/autoscaling.k8s.io/v1" {
                    let list = json!({"kind": "APIResourceList", "apiVersion": "v1",
                        "groupVersion": "autoscaling.k8s.io/v1", "resources": [{"name": "verticalpodautoscalers",
                        "singularName": "verticalpodautoscaler", "namespaced": true,
                        "kind": "VerticalPodAutoscaler", "verbs": ["list", "watch"]}]});
                    (200, list)
                } else {
                    let status = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                        "reason": "NotFound", "code": 404, "message": "the server could not find it"});
                    (404, status)
                };
                let response = Response::builder().status(status);
                send.send_response(
                    response
                        .body(Body::from(body.to_string().into_bytes()))
                        .unwrap(),
                );
            }
        }

        /// What discovery finds and the cache `ChildWatches` makes of the kind, with its triggers.
        async fn watched(
            client: &Client,
            server: &mut Server,
            served: bool,
        ) -> (Unserved, Cache<VerticalPodAutoscaler>, usize) {
            let unserved = discovery(client, server, served).await;
            let (metrics, written) = (Arc::new(Metrics::default()), Arc::new(Written::default()));
            let retries = Retries::new(metrics.clone(), &Connectivity::new(metrics));
            let config = watcher::Config::default();
            let mut watches = ChildWatches {
                client,
                namespace: Some("ns"),
                retries: &retries,
                config: &config,
                written: &written,
                unwatched: &unserved,
                unserved: &unserved,
                triggers: Vec::new(),
            };
            let cache = watches.make::<VerticalPodAutoscaler>();
            assert_eq!(watches.unserved(), unserved);
            let triggers = watches.triggers.len();
            if let Some(stream) = watches.triggers.pop() {
                tokio::spawn(stream.for_each(|_| async {}));
            }
            (unserved, cache, triggers)
        }

        #[tokio::test]
        async fn not_served_it_is_complete_at_once_and_never_asked_for() {
            let (client, mut server) = client();
            let (unserved, cache, triggers) = watched(&client, &mut server, false).await;
            assert!(unserved.contains("verticalpodautoscalers"));
            assert_eq!(triggers, 0);
            assert!(matches!(
                cache.wait_until_ready().now_or_never(),
                Some(Ok(()))
            ));
            let next =
                tokio::time::timeout(Duration::from_millis(100), server.next_request()).await;
            assert!(
                next.is_err(),
                "no request for a kind the cluster does not serve"
            );
        }

        #[tokio::test]
        async fn served_it_is_watched_and_listed() {
            let (client, mut server) = client();
            let (unserved, cache, triggers) = watched(&client, &mut server, true).await;
            assert!(!unserved.contains("verticalpodautoscalers"), "{unserved:?}");
            assert_eq!(triggers, 1);
            assert!(
                cache.wait_until_ready().now_or_never().is_none(),
                "not listed yet"
            );
            let (request, send) = server.next_request().await.expect("the list");
            assert_eq!(
                request.uri().path(),
                "/apis/autoscaling.k8s.io/v1/namespaces/ns/verticalpodautoscalers"
            );
            let list = json!({"kind": "VerticalPodAutoscalerList", "apiVersion": "autoscaling.k8s.io/v1",
                "metadata": {"resourceVersion": "1"}, "items": [{"apiVersion": "autoscaling.k8s.io/v1",
                "kind": "VerticalPodAutoscaler", "metadata": {"name": "cache-vpa", "namespace": "ns",
                "resourceVersion": "1"}, "spec": {}}]});
            send.send_response(
                Response::builder()
                    .body(Body::from(list.to_string().into_bytes()))
                    .unwrap(),
            );
            tokio::time::timeout(Duration::from_secs(5), cache.wait_until_ready())
                .await
                .expect("listed")
                .unwrap();
            assert_eq!(cache.len(), 1);
        }
    }
}
