//! The reconciler against a mocked API server: a scripted API server, caches as the watches would fill
//! them, and the objects the scenarios start from. Shared by `tests/reconciler.rs`, `tests/pools.rs` and
//! `tests/isolation.rs`.

pub use std::collections::VecDeque;
pub use std::sync::Arc;
pub use std::time::Duration;

pub use http::{Method, Request, Response, StatusCode};
pub use http_body_util::BodyExt;
pub use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
pub use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
pub use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret, Service};
pub use k8s_openapi::api::networking::v1::NetworkPolicy;
pub use k8s_openapi::api::policy::v1::PodDisruptionBudget;
pub use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
pub use k8s_openapi::jiff::Timestamp;
pub use kube::api::{DynamicObject, PartialObjectMeta, PartialObjectMetaExt};
pub use kube::client::Body;
pub use kube::runtime::controller::Action;
pub use kube::runtime::reflector::{self, store::Writer};
pub use kube::runtime::watcher;
pub use kube::{Client, Resource};
pub use memcached_operator::api::{FINALIZER, Memcached, MemcachedSpec, MemcachedStatus};
pub use memcached_operator::controller::{
    Context, Error, SecretHashes, Settings, error_policy, reconcile,
};
pub use memcached_operator::metrics::Metrics;
pub use memcached_operator::store::foreign;
pub use memcached_operator::store::{
    Cache, CacheWriter, ChildCaches, Compact, Compactable, PodIndex, Stores, cache,
};
pub use serde_json::{Value, json};
pub use tower_test::mock::{self, Handle};

pub const NOW: i64 = 1_700_000_000;
pub const NS: &str = "default";
pub const NAME: &str = "cache";

// ---------------------------------------------------------------------------------------------------
// Fixture: a scripted API server.

/// One expected request and the answer to give.
pub struct Exchange {
    pub method: Method,
    /// Path the request must have (query excluded).
    pub path: String,
    /// Substrings the query must contain.
    pub query: Vec<&'static str>,
    /// Substrings the query must not contain.
    pub not_query: Vec<&'static str>,
    pub status: StatusCode,
    /// Answer body; `None` echoes the request body (what a server does for an apply of a new object).
    pub reply: Option<Value>,
    /// Answer made from the request body, when set (instead of `reply` or the echo).
    pub answer: Option<fn(&Value) -> Value>,
    /// No answer at all: the connection fails (an API server that is down).
    pub unanswered: bool,
}

pub fn expect(method: Method, path: &str) -> Exchange {
    Exchange {
        method,
        path: path.to_owned(),
        query: vec![],
        not_query: vec![],
        status: StatusCode::OK,
        reply: None,
        answer: None,
        unanswered: false,
    }
}

impl Exchange {
    /// A server-side apply that takes over fields others own: to an object the operator manages.
    pub fn apply(mut self) -> Self {
        self.query = vec!["fieldManager=memcached-operator", "force=true"];
        self
    }
    /// A server-side apply that creates a child: not forced, so that an object of that name which is not
    /// the operator's answers a conflict instead of being taken over.
    pub fn create(mut self) -> Self {
        self.query = vec!["fieldManager=memcached-operator"];
        self.not_query = vec!["force"];
        self
    }
    pub fn reply(mut self, status: StatusCode, body: Value) -> Self {
        self.status = status;
        self.reply = Some(body);
        self
    }
    /// Answers with `answer(request body)`: an object as the server stores it, say.
    pub fn answer(mut self, answer: fn(&Value) -> Value) -> Self {
        self.answer = Some(answer);
        self
    }
    /// The request fails without an answer, as when the API server is down.
    pub fn unanswered(mut self) -> Self {
        self.unanswered = true;
        self
    }
    pub fn fail(self, code: u16, reason: &str) -> Self {
        let status = StatusCode::from_u16(code).unwrap();
        self.reply(
            status,
            json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code,
                   "reason": reason, "message": format!("mock says {reason}")}),
        )
    }
}

/// A request the reconciler made.
#[derive(Debug)]
#[allow(dead_code)] // method and path show in failure messages
pub struct Seen {
    pub method: Method,
    pub path: String,
    pub body: Value,
}

pub const DEPLOYMENTS: &str = "/apis/apps/v1/namespaces/default/deployments/cache";
pub const STATEFULSETS: &str = "/apis/apps/v1/namespaces/default/statefulsets/cache";
pub const CONFIG_MAPS: &str = "/api/v1/namespaces/default/configmaps/cache-servers";
pub const PODS: &str = "/api/v1/namespaces/default/pods";
pub const SERVICES: &str = "/api/v1/namespaces/default/services/cache";
pub const HEADLESS: &str = "/api/v1/namespaces/default/services/cache-headless";
pub const PDBS: &str = "/apis/policy/v1/namespaces/default/poddisruptionbudgets/cache";
pub const NETWORK_POLICIES: &str =
    "/apis/networking.k8s.io/v1/namespaces/default/networkpolicies/cache";
pub const AUTOSCALERS: &str =
    "/apis/autoscaling/v2/namespaces/default/horizontalpodautoscalers/cache";
pub const SERVICE_MONITORS: &str =
    "/apis/monitoring.coreos.com/v1/namespaces/default/servicemonitors/cache";
pub const MEMCACHED: &str = "/apis/cache.example.com/v1alpha1/namespaces/default/memcacheds/cache";
pub const STATUS: &str =
    "/apis/cache.example.com/v1alpha1/namespaces/default/memcacheds/cache/status";
pub const EVENTS: &str = "/apis/events.k8s.io/v1/namespaces/default/events";

pub fn event() -> Exchange {
    expect(Method::POST, EVENTS)
}

/// Answers `script` in order, then requires that no further request arrives.
pub async fn serve(
    mut handle: Handle<Request<Body>, Response<Body>>,
    script: Vec<Exchange>,
) -> Vec<Seen> {
    let mut seen = Vec::new();
    let mut script: VecDeque<Exchange> = script.into();
    while let Some(want) = script.pop_front() {
        let next = tokio::time::timeout(Duration::from_secs(5), handle.next_request()).await;
        let Ok(Some((request, respond))) = next else {
            panic!(
                "expected {} {} but the reconciler sent nothing more; seen so far: {seen:#?}",
                want.method, want.path
            );
        };
        let (parts, body) = request.into_parts();
        let bytes = body.collect().await.unwrap().to_bytes();
        let body: Value = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).unwrap()
        };
        let path = parts.uri.path().to_owned();
        let query = parts.uri.query().unwrap_or_default().to_owned();
        assert_eq!(
            (&parts.method, path.as_str()),
            (&want.method, want.path.as_str()),
            "request #{} out of script (query {query:?}, body {body})",
            seen.len() + 1
        );
        for q in &want.query {
            assert!(
                query.contains(q),
                "{} {path}: query {query:?} lacks {q}",
                parts.method
            );
        }
        for q in &want.not_query {
            assert!(
                !query.contains(q),
                "{} {path}: query {query:?} has {q}",
                parts.method
            );
        }
        if want.unanswered {
            respond.send_error(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
            seen.push(Seen {
                method: parts.method,
                path,
                body,
            });
            continue;
        }
        let reply = match want.answer {
            Some(answer) => answer(&body),
            None => want.reply.clone().unwrap_or_else(|| echo(&body, &path)),
        };
        let response = Response::builder()
            .status(want.status)
            .body(Body::from(serde_json::to_vec(&reply).unwrap()))
            .unwrap();
        respond.send_response(response);
        seen.push(Seen {
            method: parts.method,
            path,
            body,
        });
    }
    match tokio::time::timeout(Duration::from_secs(5), handle.next_request()).await {
        Ok(None) => {}
        Ok(Some((request, _))) => panic!(
            "unexpected request after the script: {} {}; seen: {seen:#?}",
            request.method(),
            request.uri()
        ),
        Err(_) => panic!("the client was not dropped after the reconcile"),
    }
    seen
}

/// What a server returns for an apply: the object, with the metadata a status-only body leaves out.
pub fn echo(body: &Value, path: &str) -> Value {
    let mut obj = body.clone();
    if obj.get("metadata").is_none() {
        let name = path
            .trim_end_matches("/status")
            .rsplit('/')
            .next()
            .unwrap_or_default();
        obj["metadata"] = json!({"name": name, "namespace": NS});
        obj["spec"] = json!({});
    }
    obj
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
    pub deployments: CacheWriter<Deployment>,
    pub statefulsets: CacheWriter<StatefulSet>,
    pub config_maps: CacheWriter<ConfigMap>,
    pub services: CacheWriter<Service>,
    pub pods: CacheWriter<Pod>,
    pub pdbs: CacheWriter<PodDisruptionBudget>,
    pub secrets: Writer<PartialObjectMeta<Secret>>,
    pub service_monitors: Option<CacheWriter<DynamicObject>>,
    pub network_policies: CacheWriter<NetworkPolicy>,
    pub autoscalers: CacheWriter<HorizontalPodAutoscaler>,
    /// Shared by every reconcile, as in the operator, so Secrets are read once per version.
    pub secret_hashes: SecretHashes,
    /// Same-named Deployments and ConfigMaps the operator does not manage.
    pub foreign_deployments: Writer<PartialObjectMeta<Deployment>>,
    pub foreign_config_maps: Writer<PartialObjectMeta<ConfigMap>>,
}

impl Cluster {
    pub fn new() -> Self {
        // Each cache has had its initial (empty) list, as when the operator's watches have synced.
        fn synced<K>() -> (reflector::Store<K>, Writer<K>)
        where
            K: kube::Resource<DynamicType = ()> + Clone + 'static,
        {
            let (reader, mut writer) = reflector::store();
            writer.apply_watcher_event(&watcher::Event::InitDone);
            (reader, writer)
        }
        fn synced_cache<K: Compactable>() -> (Cache<K>, CacheWriter<K>) {
            let (reader, mut writer) = cache();
            writer.apply_watcher_event(&watcher::Event::InitDone);
            (reader, writer)
        }
        let (memcacheds_r, memcacheds) = synced();
        let (deployments_r, deployments) = synced_cache();
        let (statefulsets_r, statefulsets) = synced_cache();
        let (config_maps_r, config_maps) = synced_cache();
        let (services_r, services) = synced_cache();
        let (pods_r, pods) = synced_cache();
        let (pdbs_r, pdbs) = synced_cache();
        let (secrets_r, secrets) = synced();
        let (network_policies_r, network_policies) = synced_cache();
        let (autoscalers_r, autoscalers) = synced_cache();
        let mut foreign = foreign::Builder::default();
        let mut foreign_deployments = foreign.store::<Deployment>();
        foreign_deployments.apply_watcher_event(&watcher::Event::InitDone);
        let mut foreign_config_maps = foreign.store::<ConfigMap>();
        foreign_config_maps.apply_watcher_event(&watcher::Event::InitDone);
        Self {
            stores: Stores {
                memcacheds: memcacheds_r,
                children: ChildCaches {
                    deployments: deployments_r,
                    statefulsets: statefulsets_r,
                    config_maps: config_maps_r,
                    services: services_r,
                    pdbs: pdbs_r,
                    network_policies: network_policies_r,
                    autoscalers: autoscalers_r,
                },
                pods: pods_r,
                pod_index: PodIndex::default(),
                secrets: secrets_r,
                service_monitors: None,
                foreign: foreign.build(),
            },
            memcacheds,
            deployments,
            statefulsets,
            config_maps,
            services,
            pods,
            pdbs,
            secrets,
            service_monitors: None,
            network_policies,
            autoscalers,
            secret_hashes: SecretHashes::default(),
            foreign_deployments,
            foreign_config_maps,
        }
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
    /// A cluster that serves the ServiceMonitor API.
    pub fn with_service_monitors() -> Self {
        let mut cluster = Self::new();
        let (reader, mut writer) = cache();
        writer.apply_watcher_event(&watcher::Event::InitDone);
        cluster.stores.service_monitors = Some(reader);
        cluster.service_monitors = Some(writer);
        cluster
    }
    pub fn pdb(&mut self, p: PodDisruptionBudget) {
        self.pdbs
            .apply_watcher_event(&watcher::Event::Apply(compact(&p)));
    }
    pub fn service_monitor(&mut self, sm: DynamicObject) {
        self.service_monitors
            .as_mut()
            .unwrap()
            .apply_watcher_event(&watcher::Event::Apply(compact(&sm)));
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
    pub fn deployment(&mut self, d: Deployment) {
        self.deployments
            .apply_watcher_event(&watcher::Event::Apply(compact(&d)));
    }
    pub fn statefulset(&mut self, s: StatefulSet) {
        self.statefulsets
            .apply_watcher_event(&watcher::Event::Apply(compact(&s)));
    }
    /// Whether the cache holds the instance's server list.
    pub fn has_config_map(&self) -> bool {
        let name = CONFIG_MAPS.rsplit('/').next().unwrap_or_default();
        matches!(self.stores.children.config_maps.get(NS, name), Ok(Some(_)))
    }
    pub fn config_map(&mut self, c: ConfigMap) {
        self.config_maps
            .apply_watcher_event(&watcher::Event::Apply(compact(&c)));
    }
    pub fn remove_pod(&mut self, p: Pod) {
        let event = watcher::Event::Delete(compact(&p));
        self.stores.pod_index.observe(&event);
        self.pods.apply_watcher_event(&event);
    }
    pub fn service(&mut self, s: Service) {
        self.services
            .apply_watcher_event(&watcher::Event::Apply(compact(&s)));
    }
    pub fn pod(&mut self, p: Pod) {
        let event = watcher::Event::Apply(compact(&p));
        self.stores.pod_index.observe(&event);
        self.pods.apply_watcher_event(&event);
    }
    pub fn network_policy(&mut self, p: NetworkPolicy) {
        self.network_policies
            .apply_watcher_event(&watcher::Event::Apply(compact(&p)));
    }
    pub fn autoscaler(&mut self, a: HorizontalPodAutoscaler) {
        self.autoscalers
            .apply_watcher_event(&watcher::Event::Apply(compact(&a)));
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
    server: tokio::task::JoinHandle<Vec<Seen>>,
}

impl Session {
    pub fn start(cluster: &Cluster, settings: Settings, script: Vec<Exchange>, now: i64) -> Self {
        let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
        let server = tokio::spawn(serve(handle, script));
        let metrics = Arc::new(Metrics::default());
        let mut ctx = Context::new(
            Client::new(service, NS),
            settings,
            cluster.stores.clone(),
            metrics.clone(),
            Some("test".into()),
            Arc::new(move || Time(Timestamp::from_second(now).unwrap())),
        );
        ctx.secret_hashes = cluster.secret_hashes.clone();
        Self {
            ctx: Arc::new(ctx),
            metrics,
            server,
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
        self.server
            .await
            .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()))
    }
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
    let seen = create_as(cluster, memcached(size), DEPLOYMENTS).await;
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
    cluster.service(serde_json::from_value(as_stored(&seen[2].body)).unwrap());
    if size > 1 {
        cluster.pdb(serde_json::from_value(as_stored(&seen[3].body)).unwrap());
    }
    seen
}

/// The applies (and the one Created event naming them) that create an instance's children: workload
/// (at the path `workload`), Services, and the budget when `size` > 1. No server list before a server
/// is ready.
pub fn created_children(workload: &str, size: i32) -> Vec<Exchange> {
    let mut script = vec![
        expect(Method::PATCH, workload).create(),
        expect(Method::PATCH, SERVICES).create(),
        expect(Method::PATCH, HEADLESS).create(),
    ];
    if size > 1 {
        script.push(expect(Method::PATCH, PDBS).create());
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
