//! The reconciler against the scripted API server ([`super::scripted`]): caches as the watches would fill
//! them (one per kind of the operator's table), the paths of the instance's children (from the same
//! table), and the objects the scenarios start from. Shared by `tests/reconciler/`, `tests/pools.rs`,
//! `tests/isolation.rs` and `tests/convergence.rs`.

use std::any::{Any, TypeId};
use std::collections::HashMap;
pub use std::collections::VecDeque;
pub use std::sync::{Arc, LazyLock};
pub use std::time::Duration;

pub use super::kinds::object_path;
pub use super::scripted::{Api, Exchange, NS, Seen, echo, expect};
pub use http::{Method, Request, Response, StatusCode};
pub use http_body_util::BodyExt;
pub use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
pub use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
pub use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret, Service};
pub use k8s_openapi::api::networking::v1::NetworkPolicy;
pub use k8s_openapi::api::policy::v1::PodDisruptionBudget;
pub use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
pub use k8s_openapi::jiff::Timestamp;
pub use kube::api::{PartialObjectMeta, PartialObjectMetaExt};
pub use kube::client::Body;
pub use kube::runtime::controller::Action;
pub use kube::runtime::reflector::{self, store::Writer};
pub use kube::runtime::watcher;
pub use kube::{Client, Resource};
pub use memcached_operator::api::external::ServiceMonitor;
pub use memcached_operator::api::{FINALIZER, Memcached, MemcachedSpec, MemcachedStatus};
pub use memcached_operator::controller::{Context, Error, Settings, error_policy, reconcile};
pub use memcached_operator::metrics::Metrics;
pub use memcached_operator::store::digest_key::{DigestKey, KeyLocation};
pub use memcached_operator::store::foreign;
pub use memcached_operator::store::{
    Cache, CacheWriter, ChildCaches, ChildKind, Compact, Compactable, MakeCache, PodIndex, Served,
    Stores, Unserved, cache, kind_names,
};
pub use serde_json::{Value, json};
pub use tower_test::mock;

pub const NOW: i64 = 1_700_000_000;
pub const NAME: &str = "cache";
/// The digest key the scenarios' operator holds.
pub const TEST_DIGEST_KEY: &[u8] = b"a test key, thirty-two bytes long";

/// The paths of the instance's children, from the table's kinds.
pub static DEPLOYMENTS: LazyLock<&str> = LazyLock::new(|| object_path::<Deployment>(NAME));
pub static STATEFULSETS: LazyLock<&str> = LazyLock::new(|| object_path::<StatefulSet>(NAME));
pub static CONFIG_MAPS: LazyLock<&str> =
    LazyLock::new(|| object_path::<ConfigMap>(&format!("{NAME}-servers")));
pub static SERVICES: LazyLock<&str> = LazyLock::new(|| object_path::<Service>(NAME));
pub static HEADLESS: LazyLock<&str> =
    LazyLock::new(|| object_path::<Service>(&format!("{NAME}-headless")));
pub static PDBS: LazyLock<&str> = LazyLock::new(|| object_path::<PodDisruptionBudget>(NAME));
pub static NETWORK_POLICIES: LazyLock<&str> = LazyLock::new(|| object_path::<NetworkPolicy>(NAME));
pub static AUTOSCALERS: LazyLock<&str> =
    LazyLock::new(|| object_path::<HorizontalPodAutoscaler>(NAME));
pub const PODS: &str = "/api/v1/namespaces/default/pods";
pub static SERVICE_MONITORS: LazyLock<&str> = LazyLock::new(|| object_path::<ServiceMonitor>(NAME));
pub const MEMCACHED: &str = "/apis/cache.example.com/v1alpha1/namespaces/default/memcacheds/cache";
pub const STATUS: &str =
    "/apis/cache.example.com/v1alpha1/namespaces/default/memcacheds/cache/status";
pub const EVENTS: &str = "/apis/events.k8s.io/v1/namespaces/default/events";

pub fn event() -> Exchange {
    expect(Method::POST, EVENTS)
}

/// `object` as the operator's watches cache it.
pub fn compact<K: Compactable>(object: &K) -> Compact<K> {
    Compact::encode(object).unwrap()
}

/// An object without the operator's label, as its foreign watch keeps it.
fn unmanaged<K>(name: &str) -> PartialObjectMeta<K> {
    kube::api::ObjectMeta {
        name: Some(name.into()),
        namespace: Some(NS.into()),
        ..Default::default()
    }
    .into_response_partial()
}

/// Caches as the watches would fill them.
pub struct Cluster {
    pub stores: Stores,
    pub memcacheds: Writer<Memcached>,
    /// The writer of each kind of child, made with its cache from the table ([`ChildCaches::build`]).
    children: ChildWriters,
    pub pods: CacheWriter<Pod>,
    pub secrets: Writer<PartialObjectMeta<Secret>>,
    /// The key of the Secrets' hash: a fixed one, as if read before; a scenario replaces it with
    /// [`DigestKey::new`] to see it read or made.
    pub digest_key: DigestKey,
    /// Same-named Deployments, ConfigMaps and ServiceMonitors the operator does not manage.
    pub foreign_deployments: Writer<PartialObjectMeta<Deployment>>,
    pub foreign_config_maps: Writer<PartialObjectMeta<ConfigMap>>,
    pub foreign_service_monitors: Writer<PartialObjectMeta<ServiceMonitor>>,
}

/// The writers of the children's caches, one per kind of the table, by type, and the kinds the cluster
/// does not serve.
#[derive(Default)]
struct ChildWriters(HashMap<TypeId, Box<dyn Any + Send>>, Unserved);

impl MakeCache for ChildWriters {
    /// A cache that has had its initial (empty) list, as when the operator's watches have synced.
    fn make<K: ChildKind>(&mut self) -> Cache<K> {
        let (reader, mut writer) = cache::<K>();
        writer.apply_watcher_event(&watcher::Event::InitDone);
        self.0.insert(TypeId::of::<K>(), Box::new(writer));
        reader
    }

    fn unserved(&self) -> Unserved {
        self.1.clone()
    }
}

impl Cluster {
    /// A cluster that serves no CRD: the table's kinds of [`Served::IfInstalled`] (the ServiceMonitor)
    /// are not served.
    pub fn new() -> Self {
        Self::serving(false)
    }

    /// A cluster that serves every kind of the table, the CRDs' too.
    pub fn with_crds() -> Self {
        Self::serving(true)
    }

    fn serving(crds: bool) -> Self {
        fn synced<K>() -> (reflector::Store<K>, Writer<K>)
        where
            K: kube::Resource<DynamicType = ()> + Clone + 'static,
        {
            let (reader, mut writer) = reflector::store();
            writer.apply_watcher_event(&watcher::Event::InitDone);
            (reader, writer)
        }
        let (memcacheds_r, memcacheds) = synced();
        let (pods_r, mut pods) = cache();
        pods.apply_watcher_event(&watcher::Event::InitDone);
        let (secrets_r, secrets) = synced();
        let mut children = ChildWriters::default();
        if !crds {
            let if_installed = kind_names()
                .into_iter()
                .filter(|k| k.served == Served::IfInstalled);
            children.1 = if_installed.map(|k| k.plural).collect();
        }
        let caches = ChildCaches::build(&mut children);
        let mut foreign = foreign::Builder::default();
        let mut foreign_deployments = foreign.store::<Deployment>();
        foreign_deployments.apply_watcher_event(&watcher::Event::InitDone);
        let mut foreign_config_maps = foreign.store::<ConfigMap>();
        foreign_config_maps.apply_watcher_event(&watcher::Event::InitDone);
        let mut foreign_service_monitors = foreign.store::<ServiceMonitor>();
        foreign_service_monitors.apply_watcher_event(&watcher::Event::InitDone);
        Self {
            stores: Stores {
                memcacheds: memcacheds_r,
                children: caches,
                pods: pods_r,
                pod_index: PodIndex::default(),
                secrets: secrets_r,
                // Shared by every reconcile, as in the operator, so Secrets are read once per version.
                secret_cache: Default::default(),
                foreign: foreign.build(),
            },
            memcacheds,
            children,
            pods,
            secrets,
            digest_key: DigestKey::fixed(TEST_DIGEST_KEY),
            foreign_deployments,
            foreign_config_maps,
            foreign_service_monitors,
        }
    }
    /// A child of any kind of the table in its cache, as its watch would put it there.
    pub fn child<K: ChildKind>(&mut self, object: K) {
        self.child_event(watcher::Event::Apply(compact(&object)));
    }
    /// A child of any kind of the table gone from its cache, as its watch would report it.
    pub fn remove_child<K: ChildKind>(&mut self, object: K) {
        self.child_event(watcher::Event::Delete(compact(&object)));
    }
    fn child_event<K: ChildKind>(&mut self, event: watcher::Event<Compact<K>>) {
        self.children
            .0
            .get_mut(&TypeId::of::<K>())
            .and_then(|writer| writer.downcast_mut::<CacheWriter<K>>())
            .expect("every kind of the table has a cache")
            .apply_watcher_event(&event);
    }
    /// Someone else's Deployment named `name`, in the instance's namespace (`present` false: it is gone).
    pub fn foreign_deployment(&mut self, name: &str, present: bool) {
        let object = unmanaged(name);
        self.foreign_deployments.apply_watcher_event(&if present {
            watcher::Event::Apply(object)
        } else {
            watcher::Event::Delete(object)
        });
    }
    /// Someone else's ConfigMap named `name`, in the instance's namespace.
    pub fn foreign_config_map(&mut self, name: &str) {
        self.foreign_config_maps
            .apply_watcher_event(&watcher::Event::Apply(unmanaged(name)));
    }
    /// Someone else's ServiceMonitor named `name`, in the instance's namespace.
    pub fn foreign_service_monitor(&mut self, name: &str) {
        self.foreign_service_monitors
            .apply_watcher_event(&watcher::Event::Apply(unmanaged(name)));
    }
    pub fn secret(&mut self, name: &str, version: &str) {
        let meta: PartialObjectMeta<Secret> = serde_json::from_value(json!({
            "apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
            "metadata": {"name": name, "namespace": NS, "resourceVersion": version}
        }))
        .unwrap();
        self.secrets
            .apply_watcher_event(&watcher::Event::Apply(meta));
    }
    /// The Secret the servers load (`<name>-auth-file`, the operator's) at `version`, as the metadata
    /// watch sees it once applied.
    pub fn served_auth(&mut self, version: &str) {
        let meta: PartialObjectMeta<Secret> = serde_json::from_value(json!({
            "apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
            "metadata": {"name": format!("{NAME}-auth-file"), "namespace": NS, "resourceVersion": version,
                         "ownerReferences": [{"apiVersion": "cache.example.com/v1alpha1", "kind": "Memcached",
                                              "name": NAME, "uid": "uid-1", "controller": true}]}
        }))
        .unwrap();
        self.secrets
            .apply_watcher_event(&watcher::Event::Apply(meta));
    }
    /// Whether the cache holds the instance's server list.
    pub fn has_config_map(&self) -> bool {
        let name = CONFIG_MAPS.rsplit('/').next().unwrap_or_default();
        matches!(
            ConfigMap::cache(&self.stores.children).get(NS, name),
            Ok(Some(_))
        )
    }
    pub fn remove_pod(&mut self, p: Pod) {
        let event = watcher::Event::Delete(compact(&p));
        self.stores.pod_index.observe(&event);
        self.pods.apply_watcher_event(&event);
    }
    pub fn pod(&mut self, p: Pod) {
        let event = watcher::Event::Apply(compact(&p));
        self.stores.pod_index.observe(&event);
        self.pods.apply_watcher_event(&event);
    }
}

pub struct Run {
    pub result: Result<Action, Error>,
    pub seen: Vec<Seen>,
    pub metrics: Arc<Metrics>,
}

/// Runs one reconcile of `mc` against `script`.
pub async fn run(cluster: &mut Cluster, mc: Memcached, script: Vec<Exchange>) -> Run {
    run_at(cluster, mc, script, NOW).await
}

/// Runs one reconcile of `mc` against `script` with the clock at `now` (seconds since the epoch).
pub async fn run_at(cluster: &mut Cluster, mc: Memcached, script: Vec<Exchange>, now: i64) -> Run {
    let session = Session::start(cluster, settings(), script, now);
    let result = session.reconcile(cluster, mc).await;
    let metrics = session.metrics.clone();
    let seen = session.finish().await;
    Run {
        result,
        seen,
        metrics,
    }
}

/// The reconciler's settings in the scenarios: the defaults, but every status change written at once, a
/// new instance's first status included (pacing and the first status's wait have scenarios of their own
/// in `tests/convergence.rs`).
pub fn settings() -> Settings {
    Settings {
        status_pace: Duration::ZERO,
        ..Settings::default()
    }
}

/// One operator process against the mocked API server: reconciles share its context (its memory of
/// what it wrote and when), and the mock answers `script` across all of them.
pub struct Session {
    pub ctx: Arc<Context>,
    pub metrics: Arc<Metrics>,
    api: Api,
}

impl Session {
    pub fn start(cluster: &Cluster, settings: Settings, script: Vec<Exchange>, now: i64) -> Self {
        let (client, api) = Api::start(script, vec![]);
        let metrics = Arc::new(Metrics::default());
        let ctx = Context::new(
            client,
            settings,
            cluster.stores.clone(),
            metrics.clone(),
            Some("test".into()),
            Arc::new(move || Time(Timestamp::from_second(now).unwrap())),
        )
        .with_digest_key(cluster.digest_key.clone());
        Self {
            ctx: Arc::new(ctx),
            metrics,
            api,
        }
    }

    /// One reconcile of `mc`, which the instance cache holds first (as the watch would).
    pub async fn reconcile(&self, cluster: &mut Cluster, mc: Memcached) -> Result<Action, Error> {
        cluster
            .memcacheds
            .apply_watcher_event(&watcher::Event::Apply(mc.clone()));
        reconcile(Arc::new(mc), self.ctx.clone()).await
    }

    /// Ends the session: every request seen, after checking that the script was answered whole and
    /// nothing else was sent.
    pub async fn finish(self) -> Vec<Seen> {
        drop(self.ctx);
        self.api.finish().await
    }
}

/// Reconciles `mc` as the controller does across turns: again each time its turn, waited for outside the
/// controller, comes due (`Turns::due`), until none is waited for; the last reconcile's answer. Takes the
/// context's due stream, so once per context.
pub async fn reconcile_in_turns(mc: Arc<Memcached>, ctx: Arc<Context>) -> Result<Action, Error> {
    use futures::StreamExt as _;
    let mut due = Box::pin(ctx.memory.turns.due());
    let mut answer = reconcile(mc.clone(), ctx.clone()).await;
    while ctx.memory.turns.queued() != (0, 0) {
        due.next().await.expect("the turns outlive the wait");
        answer = reconcile(mc.clone(), ctx.clone()).await;
    }
    answer
}

// ---------------------------------------------------------------------------------------------------
// Objects.

pub fn memcached(size: i32) -> Memcached {
    let mut mc = Memcached::new(
        NAME,
        MemcachedSpec {
            size,
            ..MemcachedSpec::default()
        },
    );
    mc.metadata.namespace = Some(NS.into());
    mc.metadata.uid = Some("uid-1".into());
    mc.metadata.generation = Some(1);
    mc.metadata.resource_version = Some("1".into());
    mc
}

/// `mc` as an earlier build of the operator left it: carrying the finalizer it added.
pub fn with_legacy_finalizer(mut mc: Memcached) -> Memcached {
    mc.metadata.finalizers = Some(vec![FINALIZER.into()]);
    mc
}

/// What the API server returns for an applied object: the body plus server-set metadata and defaults.
pub fn as_stored(applied: &Value) -> Value {
    let mut obj = applied.clone();
    obj["metadata"]["uid"] = json!("child-uid");
    obj["metadata"]["resourceVersion"] = json!("10");
    obj["metadata"]["generation"] = json!(1);
    obj["metadata"]["creationTimestamp"] = json!("2023-11-14T22:13:20Z");
    obj
}

/// A stored Deployment whose controller reports every replica ready.
pub fn settled(applied: &Value) -> Deployment {
    let mut obj = as_stored(applied);
    let n = obj["spec"]["replicas"].as_i64().unwrap();
    obj["spec"]["progressDeadlineSeconds"] = json!(600); // a server default
    obj["status"] = json!({"observedGeneration": 1, "replicas": n, "readyReplicas": n,
                           "updatedReplicas": n, "availableReplicas": n});
    serde_json::from_value(obj).unwrap()
}

pub fn ready_pod(name: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": NS, "labels": {
            "app.kubernetes.io/name": "memcached", "app.kubernetes.io/instance": NAME,
            "app.kubernetes.io/managed-by": "memcached-operator"}},
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
    }))
    .unwrap()
}

/// Asserts that the status body has `Degraded=True` with `reason` and a message containing `fragment`.
pub fn assert_degraded(status: &Value, reason: &str, fragment: &str) {
    let degraded = condition(status, "Degraded");
    assert_eq!(
        (degraded["status"].as_str(), degraded["reason"].as_str()),
        (Some("True"), Some(reason))
    );
    let message = degraded["message"].as_str().unwrap_or_default();
    assert!(
        message.contains(fragment),
        "{reason}: {message:?} lacks {fragment:?}"
    );
}

pub fn condition<'a>(status: &'a Value, type_: &str) -> &'a Value {
    status["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == type_)
        .unwrap_or_else(|| panic!("no {type_} condition in {status}"))
}

/// `memcached(size)` with the top-level spec fields of `spec` replaced.
pub fn with_spec(size: i32, spec: Value) -> Memcached {
    let mut mc = memcached(size);
    let mut merged = serde_json::to_value(&mc.spec).unwrap();
    for (k, v) in spec.as_object().unwrap() {
        merged[k] = v.clone();
    }
    mc.spec = serde_json::from_value(merged).unwrap();
    mc
}

/// The happy create path of a default instance of `size` pods. It puts what was applied into the
/// caches, as the watches would, and returns the bodies of the Deployment, client Service and status.
pub async fn create(cluster: &mut Cluster, size: i32) -> (Value, Value, Value) {
    let seen = create_as(cluster, memcached(size), *DEPLOYMENTS).await;
    (
        seen[0].body.clone(),
        seen[1].body.clone(),
        seen.last().unwrap().body.clone(),
    )
}

/// The happy create path of `mc`, whose workload is applied at `workload` (a Deployment or StatefulSet
/// path): workload, Services, budget (size > 1), one `Created` event naming them all, status (written at
/// once with the scenarios' [`settings`]). No server list: no pod is ready yet, so there is nothing to
/// publish. The headless Service and the budget go into the caches; the workload and the client Service
/// are left to the caller (which knows the workload's kind, and whether the Service is to be found).
/// Returns every request seen.
pub async fn create_as(cluster: &mut Cluster, mc: Memcached, workload: &str) -> Vec<Seen> {
    let size = mc.spec.size;
    let mut script = created_children(workload, size);
    script.push(expect(Method::PATCH, STATUS).apply());
    let run = run(cluster, mc, script).await;
    assert_eq!(
        run.result.unwrap(),
        Action::requeue(Duration::from_secs(300))
    );
    let seen = run.seen;
    let kind = seen[0].body["kind"].as_str().unwrap_or_default().to_owned();
    let event = &seen[seen.len() - 2].body;
    assert_eq!(event["reason"], "Created");
    assert_eq!(event["type"], "Normal");
    assert_eq!(event["regarding"]["kind"], "Memcached");
    let budget = if size > 1 {
        ", PodDisruptionBudget cache"
    } else {
        ""
    };
    assert_eq!(
        event["note"],
        format!(
            "Created {kind} cache with {size} replicas, Service cache, Service cache-headless{budget}"
        )
    );
    cluster.child::<Service>(serde_json::from_value(as_stored(&seen[2].body)).unwrap());
    if size > 1 {
        cluster.child::<PodDisruptionBudget>(
            serde_json::from_value(as_stored(&seen[3].body)).unwrap(),
        );
    }
    seen
}

/// The applies (and the one Created event naming them) that create an instance's children: workload
/// (at the path `workload`), Services, and the budget when `size` > 1. No server list before a server
/// is ready.
pub fn created_children(workload: &str, size: i32) -> Vec<Exchange> {
    let mut script = vec![
        expect(Method::PATCH, workload).create(),
        expect(Method::PATCH, *SERVICES).create(),
        expect(Method::PATCH, *HEADLESS).create(),
    ];
    if size > 1 {
        script.push(expect(Method::PATCH, *PDBS).create());
    }
    script.push(event());
    script
}

/// A ready pod of the instance at `ip`: a server to publish.
pub fn ready_pod_at(name: &str, ip: &str) -> Pod {
    let mut pod = ready_pod(name);
    pod.status.as_mut().unwrap().pod_ip = Some(ip.into());
    pod
}
