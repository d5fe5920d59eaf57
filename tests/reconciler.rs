//! The reconciler against a mocked API server: every request it makes, in order, per scenario.
//!
//! The stores stand in for the watch caches: each test puts in them what a real cluster would have, runs
//! one reconcile, and the mock checks the requests (method, path, body) and answers them. When the
//! reconcile returns, the mock asserts nothing else was sent.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use http::{Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, Secret, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DynamicObject, PartialObjectMeta};
use kube::client::Body;
use kube::runtime::controller::Action;
use kube::runtime::reflector::{self, store::Writer};
use kube::runtime::watcher;
use kube::{Client, Resource};
use memcached_operator::api::{FINALIZER, Memcached, MemcachedSpec, MemcachedStatus};
use memcached_operator::controller::{
    Context, Error, SecretHashes, Settings, Stores, error_policy, reconcile,
};
use memcached_operator::metrics::Metrics;
use serde_json::{Value, json};
use tower_test::mock::{self, Handle};

const NOW: i64 = 1_700_000_000;
const NS: &str = "default";
const NAME: &str = "cache";

// ---------------------------------------------------------------------------------------------------
// Fixture: a scripted API server.

/// One expected request and the answer to give.
struct Exchange {
    method: Method,
    /// Path the request must have (query excluded).
    path: String,
    /// Substrings the query must contain.
    query: Vec<&'static str>,
    status: StatusCode,
    /// Answer body; `None` echoes the request body (what a server does for an apply of a new object).
    reply: Option<Value>,
}

fn expect(method: Method, path: &str) -> Exchange {
    Exchange {
        method,
        path: path.to_owned(),
        query: vec![],
        status: StatusCode::OK,
        reply: None,
    }
}

impl Exchange {
    fn apply(mut self) -> Self {
        self.query = vec!["fieldManager=memcached-operator", "force=true"];
        self
    }
    fn reply(mut self, status: StatusCode, body: Value) -> Self {
        self.status = status;
        self.reply = Some(body);
        self
    }
    fn fail(self, code: u16, reason: &str) -> Self {
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
struct Seen {
    method: Method,
    path: String,
    body: Value,
}

const DEPLOYMENTS: &str = "/apis/apps/v1/namespaces/default/deployments/cache";
const SERVICES: &str = "/api/v1/namespaces/default/services/cache";
const HEADLESS: &str = "/api/v1/namespaces/default/services/cache-headless";
const PDBS: &str = "/apis/policy/v1/namespaces/default/poddisruptionbudgets/cache";
const SERVICE_MONITORS: &str =
    "/apis/monitoring.coreos.com/v1/namespaces/default/servicemonitors/cache";
const MEMCACHED: &str = "/apis/cache.example.com/v1alpha1/namespaces/default/memcacheds/cache";
const STATUS: &str = "/apis/cache.example.com/v1alpha1/namespaces/default/memcacheds/cache/status";
const EVENTS: &str = "/apis/events.k8s.io/v1/namespaces/default/events";

fn event() -> Exchange {
    expect(Method::POST, EVENTS)
}

/// Answers `script` in order, then requires that no further request arrives.
async fn serve(
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
        let reply = want.reply.clone().unwrap_or_else(|| echo(&body, &path));
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
fn echo(body: &Value, path: &str) -> Value {
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

/// Caches as the watches would fill them.
struct Cluster {
    stores: Stores,
    memcacheds: Writer<Memcached>,
    deployments: Writer<Deployment>,
    services: Writer<Service>,
    pods: Writer<Pod>,
    pdbs: Writer<PodDisruptionBudget>,
    secrets: Writer<PartialObjectMeta<Secret>>,
    service_monitors: Option<Writer<DynamicObject>>,
    /// Shared by every reconcile, as in the operator, so Secrets are read once per version.
    secret_hashes: SecretHashes,
}

impl Cluster {
    fn new() -> Self {
        // Each cache has had its initial (empty) list, as when the operator's watches have synced.
        fn synced<K>() -> (reflector::Store<K>, Writer<K>)
        where
            K: kube::Resource<DynamicType = ()> + Clone + 'static,
        {
            let (reader, mut writer) = reflector::store();
            writer.apply_watcher_event(&watcher::Event::InitDone);
            (reader, writer)
        }
        let (memcacheds_r, memcacheds) = synced();
        let (deployments_r, deployments) = synced();
        let (services_r, services) = synced();
        let (pods_r, pods) = synced();
        let (pdbs_r, pdbs) = synced();
        let (secrets_r, secrets) = synced();
        Self {
            stores: Stores {
                memcacheds: memcacheds_r,
                deployments: deployments_r,
                services: services_r,
                pods: pods_r,
                pdbs: pdbs_r,
                secrets: secrets_r,
                service_monitors: None,
            },
            memcacheds,
            deployments,
            services,
            pods,
            pdbs,
            secrets,
            service_monitors: None,
            secret_hashes: SecretHashes::default(),
        }
    }
    /// A cluster that serves the ServiceMonitor API.
    fn with_service_monitors() -> Self {
        let mut cluster = Self::new();
        let mut writer =
            Writer::new(memcached_operator::resources::service_monitor::api_resource());
        writer.apply_watcher_event(&watcher::Event::InitDone);
        cluster.stores.service_monitors = Some(writer.as_reader());
        cluster.service_monitors = Some(writer);
        cluster
    }
    fn pdb(&mut self, p: PodDisruptionBudget) {
        self.pdbs.apply_watcher_event(&watcher::Event::Apply(p));
    }
    fn service_monitor(&mut self, sm: DynamicObject) {
        self.service_monitors
            .as_mut()
            .unwrap()
            .apply_watcher_event(&watcher::Event::Apply(sm));
    }
    fn secret(&mut self, name: &str, version: &str) {
        let meta: PartialObjectMeta<Secret> = serde_json::from_value(json!({
            "apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
            "metadata": {"name": name, "namespace": NS, "resourceVersion": version}
        }))
        .unwrap();
        self.secrets
            .apply_watcher_event(&watcher::Event::Apply(meta));
    }
    fn deployment(&mut self, d: Deployment) {
        self.deployments
            .apply_watcher_event(&watcher::Event::Apply(d));
    }
    fn service(&mut self, s: Service) {
        self.services.apply_watcher_event(&watcher::Event::Apply(s));
    }
    fn pod(&mut self, p: Pod) {
        self.pods.apply_watcher_event(&watcher::Event::Apply(p));
    }
}

struct Run {
    result: Result<Action, Error>,
    seen: Vec<Seen>,
    metrics: Arc<Metrics>,
}

/// Runs one reconcile of `mc` against `script`.
async fn run(cluster: &mut Cluster, mc: Memcached, script: Vec<Exchange>) -> Run {
    cluster
        .memcacheds
        .apply_watcher_event(&watcher::Event::Apply(mc.clone()));
    let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
    let server = tokio::spawn(serve(handle, script));
    let metrics = Arc::new(Metrics::default());
    let mut ctx = Context::new(
        Client::new(service, NS),
        Settings::default(),
        cluster.stores.clone(),
        metrics.clone(),
        Some("test".into()),
        Arc::new(|| Time(Timestamp::from_second(NOW).unwrap())),
    );
    ctx.secret_hashes = cluster.secret_hashes.clone();
    let result = reconcile(Arc::new(mc), Arc::new(ctx)).await;
    let seen = server
        .await
        .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
    Run {
        result,
        seen,
        metrics,
    }
}

// ---------------------------------------------------------------------------------------------------
// Objects.

/// An instance of size 1 that `kubectl delete` has marked for deletion (its finalizer still on).
fn being_deleted() -> Memcached {
    let mut mc = memcached(1);
    mc.metadata.deletion_timestamp = Some(Time(Timestamp::from_second(NOW).unwrap()));
    mc
}

fn memcached(size: i32) -> Memcached {
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
    mc.metadata.finalizers = Some(vec![FINALIZER.into()]);
    mc
}

/// What the API server returns for an applied object: the body plus server-set metadata and defaults.
fn as_stored(applied: &Value) -> Value {
    let mut obj = applied.clone();
    obj["metadata"]["uid"] = json!("child-uid");
    obj["metadata"]["resourceVersion"] = json!("10");
    obj["metadata"]["generation"] = json!(1);
    obj["metadata"]["creationTimestamp"] = json!("2023-11-14T22:13:20Z");
    obj
}

/// A stored Deployment whose controller reports every replica ready.
fn settled(applied: &Value) -> Deployment {
    let mut obj = as_stored(applied);
    let n = obj["spec"]["replicas"].as_i64().unwrap();
    obj["spec"]["progressDeadlineSeconds"] = json!(600); // a server default
    obj["status"] = json!({"observedGeneration": 1, "replicas": n, "readyReplicas": n,
                           "updatedReplicas": n, "availableReplicas": n});
    serde_json::from_value(obj).unwrap()
}

fn ready_pod(name: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": NS, "labels": {
            "app.kubernetes.io/name": "memcached", "app.kubernetes.io/instance": NAME,
            "app.kubernetes.io/managed-by": "memcached-operator"}},
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
    }))
    .unwrap()
}

/// Asserts that the status body has `Degraded=True` with `reason` and a message containing `fragment`.
fn assert_degraded(status: &Value, reason: &str, fragment: &str) {
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

fn condition<'a>(status: &'a Value, type_: &str) -> &'a Value {
    status["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == type_)
        .unwrap_or_else(|| panic!("no {type_} condition in {status}"))
}

/// The happy create path of a default instance of `size` pods. It puts what was applied into the
/// caches, as the watches would, and returns the bodies of the Deployment, client Service and status.
async fn create(cluster: &mut Cluster, size: i32) -> (Value, Value, Value) {
    let mut script = vec![
        expect(Method::PATCH, DEPLOYMENTS).apply(),
        event(),
        expect(Method::PATCH, SERVICES).apply(),
        event(),
        expect(Method::PATCH, HEADLESS).apply(),
        event(),
    ];
    if size > 1 {
        script.extend([expect(Method::PATCH, PDBS).apply(), event()]);
    }
    script.push(expect(Method::PATCH, STATUS).apply());
    let run = run(cluster, memcached(size), script).await;
    assert_eq!(
        run.result.unwrap(),
        Action::requeue(Duration::from_secs(300))
    );
    let seen = run.seen;
    assert_eq!(seen[1].body["reason"], "Created");
    assert_eq!(seen[1].body["type"], "Normal");
    assert_eq!(seen[1].body["regarding"]["kind"], "Memcached");
    assert_eq!(
        seen[1].body["note"],
        format!("Created Deployment cache with {size} replicas")
    );
    assert_eq!(seen[3].body["note"], "Created Service cache");
    assert_eq!(seen[5].body["note"], "Created Service cache-headless");
    cluster.service(serde_json::from_value(as_stored(&seen[4].body)).unwrap());
    if size > 1 {
        assert_eq!(seen[7].body["note"], "Created PodDisruptionBudget cache");
        cluster.pdb(serde_json::from_value(as_stored(&seen[6].body)).unwrap());
    }
    (
        seen[0].body.clone(),
        seen[2].body.clone(),
        seen.last().unwrap().body.clone(),
    )
}

// ---------------------------------------------------------------------------------------------------
// Scenarios.

#[tokio::test]
async fn new_instance_gets_the_finalizer_first() {
    let mut cluster = Cluster::new();
    let mut mc = memcached(1);
    mc.metadata.finalizers = None;
    let mut with_finalizer = serde_json::to_value(memcached(1)).unwrap();
    with_finalizer["metadata"]["resourceVersion"] = json!("2");
    let run = run(
        &mut cluster,
        mc,
        vec![expect(Method::PATCH, MEMCACHED).reply(StatusCode::OK, with_finalizer)],
    )
    .await;
    assert_eq!(run.result.unwrap(), Action::await_change());
    let patch = &run.seen[0].body;
    assert!(
        patch.to_string().contains(FINALIZER),
        "the JSON patch adds the finalizer: {patch}"
    );
}

#[tokio::test]
async fn create_applies_deployment_service_and_status() {
    let mut cluster = Cluster::new();
    let (deployment, service, status) = create(&mut cluster, 1).await;

    assert_eq!(deployment["apiVersion"], "apps/v1");
    assert_eq!(deployment["kind"], "Deployment");
    assert_eq!(deployment["spec"]["replicas"], 1);
    let owner = &deployment["metadata"]["ownerReferences"][0];
    assert_eq!(
        (
            owner["kind"].as_str(),
            owner["uid"].as_str(),
            owner["controller"].as_bool()
        ),
        (Some("Memcached"), Some("uid-1"), Some(true))
    );
    assert!(deployment["metadata"]["annotations"]["cache.example.com/desired-hash"].is_string());
    assert!(
        deployment.get("status").is_none(),
        "status is never applied"
    );
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(
        container["args"],
        json!(["-p", "11211", "-m", "64", "-o", "modern"])
    );
    assert_eq!(container["image"], "memcached:1.6-alpine");

    assert_eq!(service["kind"], "Service");
    assert_eq!(service["spec"]["ports"][0]["port"], 11211);

    assert_eq!(status["apiVersion"], "cache.example.com/v1alpha1");
    assert_eq!(status["kind"], "Memcached");
    assert_eq!(status["status"]["observedGeneration"], 1);
    assert_eq!(
        status["status"]["selector"],
        "app.kubernetes.io/instance=cache,app.kubernetes.io/name=memcached"
    );
    assert_eq!(condition(&status, "Available")["status"], "False");
    assert_eq!(condition(&status, "Progressing")["status"], "True");
    assert_eq!(condition(&status, "Degraded")["status"], "False");
    assert_eq!(
        condition(&status, "Degraded")["lastTransitionTime"],
        "2023-11-14T22:13:20Z"
    );
}

#[tokio::test]
async fn unchanged_instance_makes_no_request_at_all() {
    let mut cluster = Cluster::new();
    let (deployment, service, _) = create(&mut cluster, 2).await;

    // The cluster catches up: children exist with server defaults, pods are ready.
    cluster.deployment(settled(&deployment));
    cluster.service(serde_json::from_value(as_stored(&service)).unwrap());
    cluster.pod(ready_pod("cache-7d9f-b"));
    cluster.pod(ready_pod("cache-7d9f-a"));

    // One reconcile records the settled status ...
    let run1 = run(
        &mut cluster,
        memcached(2),
        vec![expect(Method::PATCH, STATUS).apply()],
    )
    .await;
    run1.result.unwrap();
    let status: MemcachedStatus =
        serde_json::from_value(run1.seen[0].body["status"].clone()).unwrap();
    assert_eq!(status.ready_replicas, 2);
    assert_eq!(status.nodes, ["cache-7d9f-a", "cache-7d9f-b"]);
    assert_eq!(condition(&run1.seen[0].body, "Available")["status"], "True");
    assert_eq!(
        condition(&run1.seen[0].body, "Progressing")["reason"],
        "Complete"
    );

    // ... and from then on a reconcile writes nothing: no apply, no status, no event.
    let mut mc = memcached(2);
    mc.status = Some(status);
    let run2 = run(&mut cluster, mc.clone(), vec![]).await;
    assert_eq!(
        run2.result.unwrap(),
        Action::requeue(Duration::from_secs(300))
    );
    assert!(run2.seen.is_empty());
    assert!(
        run2.metrics
            .encode()
            .contains("memcached_operator_reconcile_total{result=\"success\"} 1")
    );
    let run3 = run(&mut cluster, mc, vec![]).await;
    assert!(run3.result.is_ok() && run3.seen.is_empty());
}

#[tokio::test]
async fn scaling_applies_the_deployment_and_adds_a_budget() {
    let mut cluster = Cluster::new();
    let (deployment, service, _) = create(&mut cluster, 1).await;
    cluster.deployment(settled(&deployment));
    cluster.service(serde_json::from_value(as_stored(&service)).unwrap());

    let run = run(
        &mut cluster,
        memcached(3),
        vec![
            expect(Method::PATCH, DEPLOYMENTS).apply(),
            event(),
            expect(Method::PATCH, PDBS).apply(),
            event(),
            expect(Method::PATCH, STATUS).apply(),
        ],
    )
    .await;
    run.result.unwrap();
    assert_eq!(run.seen[0].body["spec"]["replicas"], 3);
    assert_eq!(run.seen[2].body["spec"]["maxUnavailable"], 1);
    assert_eq!(run.seen[1].body["reason"], "Scaled");
    assert_eq!(
        run.seen[1].body["note"],
        "Scaled Deployment cache from 1 to 3 replicas"
    );
}

#[tokio::test]
async fn drift_is_put_back_and_deleted_children_come_back() {
    let mut cluster = Cluster::new();
    let (deployment, _service, _) = create(&mut cluster, 3).await;

    // Someone scaled the Deployment by hand and changed its image; the Service was deleted.
    let mut drifted = settled(&deployment);
    drifted.spec.as_mut().unwrap().replicas = Some(1);
    let pod = drifted
        .spec
        .as_mut()
        .unwrap()
        .template
        .spec
        .as_mut()
        .unwrap();
    pod.containers[0].image = Some("memcached:evil".into());
    cluster.deployment(drifted);

    let run = run(
        &mut cluster,
        memcached(3),
        vec![
            expect(Method::PATCH, DEPLOYMENTS).apply(),
            event(),
            expect(Method::PATCH, SERVICES).apply(),
            event(),
            expect(Method::PATCH, STATUS).apply(),
        ],
    )
    .await;
    run.result.unwrap();
    let applied = &run.seen[0].body;
    assert_eq!(applied["spec"]["replicas"], 3);
    assert_eq!(
        applied["spec"]["template"]["spec"]["containers"][0]["image"],
        "memcached:1.6-alpine"
    );
    assert_eq!(
        run.seen[1].body["note"],
        "Scaled Deployment cache from 1 to 3 replicas"
    );
    assert_eq!(run.seen[3].body["note"], "Created Service cache");
}

#[tokio::test]
async fn template_drift_without_replica_change_is_an_update() {
    let mut cluster = Cluster::new();
    let (deployment, service, _) = create(&mut cluster, 1).await;
    let mut drifted = settled(&deployment);
    let pod = drifted
        .spec
        .as_mut()
        .unwrap()
        .template
        .spec
        .as_mut()
        .unwrap();
    pod.containers[0].args = Some(vec!["-m".into(), "1024".into()]);
    cluster.deployment(drifted);
    cluster.service(serde_json::from_value(as_stored(&service)).unwrap());

    let run = run(
        &mut cluster,
        memcached(1),
        vec![
            expect(Method::PATCH, DEPLOYMENTS).apply(),
            event(),
            expect(Method::PATCH, STATUS).apply(),
        ],
    )
    .await;
    run.result.unwrap();
    assert_eq!(run.seen[1].body["reason"], "Updated");
}

#[tokio::test]
async fn deletion_records_event_and_status_then_removes_the_finalizer() {
    let mut cluster = Cluster::new();
    let mc = being_deleted();
    let run = run(
        &mut cluster,
        mc,
        vec![
            event(),
            expect(Method::PATCH, STATUS).apply(),
            expect(Method::PATCH, MEMCACHED)
                .reply(StatusCode::OK, serde_json::to_value(memcached(1)).unwrap()),
        ],
    )
    .await;
    assert_eq!(run.result.unwrap(), Action::await_change());
    assert_eq!(run.seen[0].body["type"], "Warning");
    assert_eq!(run.seen[0].body["reason"], "Deleting");
    let degraded = condition(&run.seen[1].body, "Degraded");
    assert_eq!(
        (degraded["status"].as_str(), degraded["reason"].as_str()),
        (Some("True"), Some("Finalizing"))
    );
    let patch = run.seen[2].body.to_string();
    assert!(
        patch.contains("remove") && patch.contains("/metadata/finalizers/0"),
        "{patch}"
    );
}

#[tokio::test]
async fn deletion_is_not_held_up_by_failing_side_steps() {
    let mut cluster = Cluster::new();
    let mc = being_deleted();
    let run = run(
        &mut cluster,
        mc,
        vec![
            event().fail(403, "Forbidden"),
            expect(Method::PATCH, STATUS).fail(500, "InternalError"),
            expect(Method::PATCH, MEMCACHED)
                .reply(StatusCode::OK, serde_json::to_value(memcached(1)).unwrap()),
        ],
    )
    .await;
    assert_eq!(run.result.unwrap(), Action::await_change());
}

/// After a leader hand-over the new leader may remove the finalizer of an instance that the old one already
/// let go: the API server answers 404, which means the work is done, not that it failed.
#[tokio::test]
async fn finalizer_removal_on_an_instance_already_gone_is_success() {
    let mut cluster = Cluster::new();
    let mc = being_deleted();
    let run = run(
        &mut cluster,
        mc,
        vec![
            event(),
            expect(Method::PATCH, STATUS).fail(404, "NotFound"),
            expect(Method::PATCH, MEMCACHED).fail(404, "NotFound"),
        ],
    )
    .await;
    assert_eq!(run.result.unwrap(), Action::await_change());
    assert_eq!(
        run.seen.len(),
        3,
        "no ReconcileFailed event after the 404: {:#?}",
        run.seen
    );
    let text = run.metrics.encode();
    assert!(
        text.contains("memcached_operator_reconcile_total{result=\"success\"} 1"),
        "{text}"
    );
    assert!(!text.contains("kind=\"finalizer\""), "{text}");
}

/// A new instance deleted before its finalizer could be added: nothing to do either.
#[tokio::test]
async fn finalizer_addition_on_an_instance_already_gone_is_success() {
    let mut cluster = Cluster::new();
    let mut mc = memcached(1);
    mc.metadata.finalizers = None;
    let run = run(
        &mut cluster,
        mc,
        vec![expect(Method::PATCH, MEMCACHED).fail(404, "NotFound")],
    )
    .await;
    assert_eq!(run.result.unwrap(), Action::await_change());
    assert_eq!(run.seen.len(), 1, "{:#?}", run.seen);
}

/// Any other failure to remove the finalizer is still a failure, retried with backoff.
#[tokio::test]
async fn finalizer_removal_failing_otherwise_is_retried() {
    let mut cluster = Cluster::new();
    let mc = being_deleted();
    let run = run(
        &mut cluster,
        mc,
        vec![
            event(),
            expect(Method::PATCH, STATUS).apply(),
            expect(Method::PATCH, MEMCACHED).fail(500, "InternalError"),
            event(),
        ],
    )
    .await;
    assert_eq!(run.result.unwrap_err().kind(), "finalizer");
    assert_eq!(run.seen[3].body["reason"], "ReconcileFailed");
}

#[tokio::test]
async fn transient_api_errors_are_retried_with_growing_backoff() {
    for (code, reason) in [(500, "InternalError"), (409, "Conflict")] {
        let mut cluster = Cluster::new();
        let run = run(
            &mut cluster,
            memcached(1),
            vec![
                expect(Method::PATCH, DEPLOYMENTS)
                    .apply()
                    .fail(code, reason),
                event(),
            ],
        )
        .await;
        let error = run.result.unwrap_err();
        assert_eq!(error.kind(), "apply");
        assert!(
            error.problem().is_none(),
            "a {code} is not reported as Degraded"
        );
        assert_eq!(run.seen[1].body["reason"], "ReconcileFailed");
        assert_eq!(run.seen[1].body["type"], "Warning");
        assert!(
            run.metrics
                .encode()
                .contains("memcached_operator_reconcile_errors_total{kind=\"apply\"} 1")
        );
    }
}

#[tokio::test]
async fn error_policy_backs_off_per_object_and_resets_on_success() {
    let mut cluster = Cluster::new();
    let (service, _handle) = mock::pair::<Request<Body>, Response<Body>>();
    let ctx = Arc::new(Context::new(
        Client::new(service, NS),
        Settings::default(),
        cluster.stores.clone(),
        Arc::new(Metrics::default()),
        None,
        Arc::new(|| Time(Timestamp::from_second(NOW).unwrap())),
    ));
    let mc = Arc::new(memcached(1));
    let err = Error::Malformed("test".into());
    let delays: Vec<Duration> = (0..6)
        .map(|_| requeue_of(error_policy(mc.clone(), &err, ctx.clone())))
        .collect();
    // Jitter keeps each delay within [ceiling/2, ceiling] of 1, 2, 4, 8, 16, 32 seconds.
    for (i, d) in delays.iter().enumerate() {
        let ceiling = Duration::from_secs(1 << i);
        assert!(*d <= ceiling && *d >= ceiling / 2, "attempt {i}: {d:?}");
    }
    let mut other = memcached(1);
    other.metadata.name = Some("other".into());
    assert!(requeue_of(error_policy(Arc::new(other), &err, ctx.clone())) <= Duration::from_secs(1));

    // A successful reconcile (no writes needed) resets the count.
    ctx.backoff
        .reset(&kube::runtime::reflector::ObjectRef::from_obj(mc.as_ref()));
    assert!(requeue_of(error_policy(mc, &err, ctx)) <= Duration::from_secs(1));
    cluster.pods.apply_watcher_event(&watcher::Event::InitDone);
}

fn requeue_of(action: Action) -> Duration {
    // Action has no accessor; its Debug form is stable: `Action { requeue_after: Some(1.5s) }`.
    let text = format!("{action:?}");
    let secs = text
        .split("Some(")
        .nth(1)
        .and_then(|s| s.split(')').next())
        .unwrap_or_else(|| panic!("no requeue in {text}"));
    if let Some(ms) = secs.strip_suffix("ms") {
        Duration::from_secs_f64(ms.parse::<f64>().unwrap() / 1000.0)
    } else {
        Duration::from_secs_f64(secs.trim_end_matches('s').parse().unwrap())
    }
}

#[tokio::test]
async fn rejected_apply_is_reported_as_degraded() {
    let mut cluster = Cluster::new();
    let run = run(
        &mut cluster,
        memcached(1),
        vec![
            expect(Method::PATCH, DEPLOYMENTS)
                .apply()
                .fail(422, "Invalid"),
            expect(Method::PATCH, STATUS).apply(),
            event(),
            event(),
        ],
    )
    .await;
    assert!(run.result.is_err());
    assert_degraded(&run.seen[1].body, "ApplyRejected", "mock says Invalid");
    assert_eq!(run.seen[2].body["reason"], "ApplyRejected");
    assert_eq!(run.seen[3].body["reason"], "ReconcileFailed");
}

#[tokio::test]
async fn names_that_cannot_be_realised_are_degraded_without_retrying() {
    let mut cluster = Cluster::new();
    let mut mc = memcached(1);
    mc.metadata.name = Some("1cache".into());
    let status_path =
        "/apis/cache.example.com/v1alpha1/namespaces/default/memcacheds/1cache/status";
    let run = run(
        &mut cluster,
        mc.clone(),
        vec![expect(Method::PATCH, status_path).apply(), event()],
    )
    .await;
    assert_eq!(
        run.result.unwrap(),
        Action::requeue(Duration::from_secs(300))
    );
    let degraded = condition(&run.seen[0].body, "Degraded");
    assert_eq!(degraded["reason"], "InvalidName");
    assert_eq!(
        run.seen[0].body["status"]["selector"],
        "app.kubernetes.io/instance=1cache,app.kubernetes.io/name=memcached"
    );
    assert_eq!(run.seen[1].body["reason"], "InvalidName");

    // Recorded once: the next reconcile finds the same status and sends nothing.
    mc.status = Some(serde_json::from_value(run.seen[0].body["status"].clone()).unwrap());
    let again = run_named(&mut cluster, mc).await;
    assert!(again.is_empty());
}

async fn run_named(cluster: &mut Cluster, mc: Memcached) -> Vec<Seen> {
    run(cluster, mc, vec![]).await.seen
}

#[tokio::test]
async fn children_controlled_by_another_owner_are_left_alone() {
    let mut cluster = Cluster::new();
    let (deployment, _, _) = create(&mut cluster, 1).await;
    let mut foreign = settled(&deployment);
    foreign.metadata.owner_references.as_mut().unwrap()[0].uid = "old-uid".into();
    cluster.deployment(foreign);
    let run = run(
        &mut cluster,
        memcached(1),
        vec![expect(Method::PATCH, STATUS).apply(), event(), event()],
    )
    .await;
    assert_eq!(run.result.unwrap_err().kind(), "foreign_owner");
    assert_eq!(
        condition(&run.seen[0].body, "Degraded")["reason"],
        "OwnershipConflict"
    );
}

#[tokio::test]
async fn pod_trouble_shows_in_status() {
    let mut cluster = Cluster::new();
    let (deployment, service, _) = create(&mut cluster, 1).await;
    let mut stuck = settled(&deployment);
    stuck.status.as_mut().unwrap().ready_replicas = Some(0);
    cluster.deployment(stuck);
    cluster.service(serde_json::from_value(as_stored(&service)).unwrap());
    let mut pod = ready_pod("cache-x");
    pod.status = Some(
        serde_json::from_value(json!({"containerStatuses": [{"name": "memcached", "image": "memcached:nope",
            "imageID": "", "ready": false, "restartCount": 0,
            "state": {"waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling image"}}}]}))
        .unwrap(),
    );
    cluster.pod(pod);
    let run = run(
        &mut cluster,
        memcached(1),
        vec![expect(Method::PATCH, STATUS).apply(), event()],
    )
    .await;
    run.result.unwrap();
    let degraded = condition(&run.seen[0].body, "Degraded");
    assert_eq!(degraded["reason"], "ImagePullFailed");
    assert_eq!(run.seen[1].body["type"], "Warning");
    assert_eq!(run.seen[1].body["reason"], "ImagePullFailed");
}

#[test]
fn memcached_test_object_is_namespaced() {
    assert_eq!(Memcached::kind(&()), "Memcached");
    assert_eq!(memcached(1).meta().namespace.as_deref(), Some(NS));
}

// ---------------------------------------------------------------------------------------------------
// Production features: Secrets, PodDisruptionBudget, exporter, ServiceMonitor.

const TLS_SECRET: &str = "/api/v1/namespaces/default/secrets/cache-tls";
const AUTH_SECRET: &str = "/api/v1/namespaces/default/secrets/cache-auth";

fn with_spec(size: i32, spec: Value) -> Memcached {
    let mut mc = memcached(size);
    let mut merged = serde_json::to_value(&mc.spec).unwrap();
    for (k, v) in spec.as_object().unwrap() {
        merged[k] = v.clone();
    }
    mc.spec = serde_json::from_value(merged).unwrap();
    mc
}

/// Every optional feature on.
fn full(size: i32) -> Memcached {
    with_spec(
        size,
        json!({
            "memcached": {"maxMemoryMB": 256, "threads": 8, "extraArgs": ["-o", "lru_crawler"]},
            "highAvailability": {"antiAffinity": "hard"},
            "service": {"type": "ClusterIP", "annotations": {"a": "b"}},
            "security": {"tls": {"secretName": "cache-tls", "clientAuth": true},
                         "auth": {"secretName": "cache-auth"}},
            "monitoring": {"exporter": {"enabled": true},
                           "serviceMonitor": {"enabled": true, "interval": "30s"}}
        }),
    )
}

fn secret(name: &str, version: &str, data: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Secret",
           "metadata": {"name": name, "namespace": NS, "resourceVersion": version}, "data": data})
}

fn tls_secret(version: &str) -> Value {
    // base64 of "crt", "key", "ca"
    secret(
        "cache-tls",
        version,
        json!({"tls.crt": "Y3J0", "tls.key": "a2V5", "ca.crt": "Y2E="}),
    )
}

fn auth_secret(version: &str, content_b64: &str) -> Value {
    secret("cache-auth", version, json!({"auth-file": content_b64}))
}

fn secret_hash(deployment: &Value) -> String {
    deployment["spec"]["template"]["metadata"]["annotations"]["cache.example.com/secret-hash"]
        .as_str()
        .expect("the pod template carries the secret hash")
        .to_owned()
}

/// Creates `full(size)` in a cluster that has its Secrets, puts every applied child into the caches, and
/// returns the Deployment as applied.
async fn create_full(cluster: &mut Cluster, size: i32) -> Value {
    cluster.secret("cache-tls", "1");
    cluster.secret("cache-auth", "1");
    let mut script = vec![
        expect(Method::GET, TLS_SECRET).reply(StatusCode::OK, tls_secret("1")),
        expect(Method::GET, AUTH_SECRET).reply(StatusCode::OK, auth_secret("1", "dTpw")),
        expect(Method::PATCH, DEPLOYMENTS).apply(),
        event(),
        expect(Method::PATCH, SERVICES).apply(),
        event(),
        expect(Method::PATCH, HEADLESS).apply(),
        event(),
    ];
    if size > 1 {
        script.extend([expect(Method::PATCH, PDBS).apply(), event()]);
    }
    script.extend([
        expect(Method::PATCH, SERVICE_MONITORS).apply(),
        event(),
        expect(Method::PATCH, STATUS).apply(),
    ]);
    let run = run(cluster, full(size), script).await;
    run.result.unwrap();
    let seen = run.seen;
    cluster.deployment(settled(&seen[2].body));
    cluster.service(serde_json::from_value(as_stored(&seen[4].body)).unwrap());
    cluster.service(serde_json::from_value(as_stored(&seen[6].body)).unwrap());
    let mut i = 8;
    if size > 1 {
        cluster.pdb(serde_json::from_value(as_stored(&seen[i].body)).unwrap());
        i += 2;
    }
    cluster.service_monitor(serde_json::from_value(as_stored(&seen[i].body)).unwrap());
    seen[2].body.clone()
}

/// Reconciles `mc` once more to record the settled status and returns the instance with that status.
async fn settle_status(cluster: &mut Cluster, mut mc: Memcached) -> Memcached {
    let run = run(
        cluster,
        mc.clone(),
        vec![expect(Method::PATCH, STATUS).apply()],
    )
    .await;
    run.result.unwrap();
    mc.status = Some(serde_json::from_value(run.seen[0].body["status"].clone()).unwrap());
    mc
}

#[tokio::test]
async fn every_feature_on_applies_each_child_then_settles_with_no_request() {
    let mut cluster = Cluster::with_service_monitors();
    let deployment = create_full(&mut cluster, 3).await;

    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(
        pod["containers"].as_array().unwrap().len(),
        2,
        "memcached and the exporter"
    );
    assert!(
        pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            .is_array()
    );
    assert_eq!(secret_hash(&deployment).len(), 64);
    let args = pod["containers"][0]["args"].to_string();
    assert!(
        args.contains("-Z") && args.contains("ssl_verify_mode=2") && args.contains("lru_crawler"),
        "{args}"
    );

    // Once the status is recorded, nothing is sent: no apply, no Secret read, no status, no event.
    let mc = settle_status(&mut cluster, full(3)).await;
    let quiet = run(&mut cluster, mc.clone(), vec![]).await;
    assert!(quiet.result.is_ok() && quiet.seen.is_empty());
    let again = run(&mut cluster, mc, vec![]).await;
    assert!(again.result.is_ok() && again.seen.is_empty());
}

#[tokio::test]
async fn a_changed_secret_rolls_the_pods() {
    let mut cluster = Cluster::with_service_monitors();
    let before = create_full(&mut cluster, 1).await;
    let mc = settle_status(&mut cluster, full(1)).await;

    // A new version with the same content: read once, nothing rolls.
    cluster.secret("cache-auth", "2");
    let same = run(
        &mut cluster,
        mc.clone(),
        vec![expect(Method::GET, AUTH_SECRET).reply(StatusCode::OK, auth_secret("2", "dTpw"))],
    )
    .await;
    same.result.unwrap();

    // New content: the pod template's hash changes, which rolls the pods.
    cluster.secret("cache-auth", "3");
    let rotated = run(
        &mut cluster,
        mc,
        vec![
            expect(Method::GET, AUTH_SECRET).reply(StatusCode::OK, auth_secret("3", "dTpx")),
            expect(Method::PATCH, DEPLOYMENTS).apply(),
            event(),
            expect(Method::PATCH, STATUS).apply(),
        ],
    )
    .await;
    rotated.result.unwrap();
    assert_ne!(secret_hash(&rotated.seen[1].body), secret_hash(&before));
    assert_eq!(rotated.seen[2].body["reason"], "Updated");
    let logged = format!("{:?}", rotated.seen);
    assert!(
        !logged.contains("u:q"),
        "secret values never leave the reconciler"
    );
}

#[tokio::test]
async fn a_missing_secret_is_degraded_until_it_appears() {
    let mut cluster = Cluster::new();
    let mc = with_spec(1, json!({"security": {"tls": {"secretName": "cache-tls"}}}));
    let missing = run(
        &mut cluster,
        mc.clone(),
        vec![expect(Method::PATCH, STATUS).apply(), event()],
    )
    .await;
    assert_eq!(
        missing.result.unwrap(),
        Action::requeue(Duration::from_secs(300))
    );
    assert_degraded(&missing.seen[0].body, "SecretNotFound", "default/cache-tls");
    assert_eq!(missing.seen[1].body["reason"], "SecretNotFound");

    // A Secret without the key needed is named too.
    cluster.secret("cache-tls", "1");
    let mut recorded = mc.clone();
    recorded.status = Some(serde_json::from_value(missing.seen[0].body["status"].clone()).unwrap());
    let invalid = run(
        &mut cluster,
        recorded.clone(),
        vec![
            expect(Method::GET, TLS_SECRET).reply(
                StatusCode::OK,
                secret("cache-tls", "1", json!({"tls.crt": "Y3J0"})),
            ),
            expect(Method::PATCH, STATUS).apply(),
            event(),
        ],
    )
    .await;
    invalid.result.unwrap();
    assert_degraded(&invalid.seen[1].body, "SecretInvalid", "\"tls.key\"");

    // The Secret is fixed (the watch triggers this reconcile): the instance comes up.
    cluster.secret("cache-tls", "2");
    let recovered = run(
        &mut cluster,
        recorded,
        vec![
            expect(Method::GET, TLS_SECRET).reply(StatusCode::OK, tls_secret("2")),
            expect(Method::PATCH, DEPLOYMENTS).apply(),
            event(),
            expect(Method::PATCH, SERVICES).apply(),
            event(),
            expect(Method::PATCH, HEADLESS).apply(),
            event(),
            expect(Method::PATCH, STATUS).apply(),
        ],
    )
    .await;
    recovered.result.unwrap();
    assert_eq!(
        condition(&recovered.seen[7].body, "Degraded")["status"],
        "False"
    );
}

#[tokio::test]
async fn the_budget_goes_when_size_drops_to_one_or_it_is_disabled() {
    for (size, spec) in [
        (1, json!({})),
        (
            3,
            json!({"highAvailability": {"podDisruptionBudget": {"enabled": false}}}),
        ),
    ] {
        let mut cluster = Cluster::new();
        let (deployment, service, _) = create(&mut cluster, 3).await;
        cluster.deployment(settled(&deployment));
        cluster.service(serde_json::from_value(as_stored(&service)).unwrap());
        let mut script = vec![];
        if size != 3 {
            script.extend([expect(Method::PATCH, DEPLOYMENTS).apply(), event()]);
        }
        script.extend([
            expect(Method::DELETE, PDBS).reply(
                StatusCode::OK,
                json!({"kind": "Status", "status": "Success"}),
            ),
            event(),
        ]);
        script.push(expect(Method::PATCH, STATUS).apply());
        let run = run(&mut cluster, with_spec(size, spec), script).await;
        run.result.unwrap();
        let deleted = run
            .seen
            .iter()
            .find(|s| s.method == Method::POST && s.body["reason"] == "Deleted");
        assert!(deleted.is_some(), "a Deleted event: {:?}", run.seen);
    }
}

#[tokio::test]
async fn the_exporter_is_added_and_removed_with_its_service_port() {
    let mut cluster = Cluster::new();
    let (deployment, service, _) = create(&mut cluster, 1).await;
    cluster.deployment(settled(&deployment));
    cluster.service(serde_json::from_value(as_stored(&service)).unwrap());

    let on = run(
        &mut cluster,
        with_spec(1, json!({"monitoring": {"exporter": {"enabled": true}}})),
        vec![
            expect(Method::PATCH, DEPLOYMENTS).apply(),
            event(),
            expect(Method::PATCH, SERVICES).apply(),
            event(),
            expect(Method::PATCH, STATUS).apply(),
        ],
    )
    .await;
    on.result.unwrap();
    let containers = &on.seen[0].body["spec"]["template"]["spec"]["containers"];
    assert_eq!(containers[1]["name"], "exporter");
    assert_eq!(on.seen[2].body["spec"]["ports"][1]["port"], 9150);
    cluster.deployment(settled(&on.seen[0].body));
    cluster.service(serde_json::from_value(as_stored(&on.seen[2].body)).unwrap());

    let off = run(
        &mut cluster,
        memcached(1),
        vec![
            expect(Method::PATCH, DEPLOYMENTS).apply(),
            event(),
            expect(Method::PATCH, SERVICES).apply(),
            event(),
            expect(Method::PATCH, STATUS).apply(),
        ],
    )
    .await;
    off.result.unwrap();
    let containers = off.seen[0].body["spec"]["template"]["spec"]["containers"]
        .as_array()
        .unwrap()
        .len();
    assert_eq!(
        containers, 1,
        "server-side apply drops the sidecar the operator no longer sets"
    );
    assert_eq!(
        off.seen[2].body["spec"]["ports"].as_array().unwrap().len(),
        1
    );
}

#[tokio::test]
async fn a_service_monitor_without_its_api_is_a_condition_not_an_error_loop() {
    let mut cluster = Cluster::new();
    let mc = with_spec(
        1,
        json!({"monitoring": {"exporter": {"enabled": true}, "serviceMonitor": {"enabled": true}}}),
    );
    let run = run(
        &mut cluster,
        mc,
        vec![
            expect(Method::PATCH, DEPLOYMENTS).apply(),
            event(),
            expect(Method::PATCH, SERVICES).apply(),
            event(),
            expect(Method::PATCH, HEADLESS).apply(),
            event(),
            expect(Method::PATCH, STATUS).apply(),
            event(),
        ],
    )
    .await;
    assert_eq!(
        run.result.unwrap(),
        Action::requeue(Duration::from_secs(300))
    );
    assert_degraded(
        &run.seen[6].body,
        "ServiceMonitorUnavailable",
        "monitoring.coreos.com/v1",
    );
}

#[tokio::test]
async fn the_service_monitor_is_removed_when_turned_off() {
    let mut cluster = Cluster::with_service_monitors();
    create_full(&mut cluster, 1).await;
    let mut mc = full(1);
    mc.spec.monitoring.as_mut().unwrap().service_monitor = None;
    let run = run(
        &mut cluster,
        mc,
        vec![
            expect(Method::DELETE, SERVICE_MONITORS).reply(
                StatusCode::OK,
                json!({"kind": "Status", "status": "Success"}),
            ),
            event(),
            expect(Method::PATCH, STATUS).apply(),
        ],
    )
    .await;
    run.result.unwrap();
    assert_eq!(
        run.seen[1].body["note"],
        "Deleted ServiceMonitor cache: the spec no longer wants it"
    );
}

#[tokio::test]
async fn invalid_config_is_degraded_and_nothing_is_applied() {
    let mut cluster = Cluster::new();
    let mc = with_spec(1, json!({"memcached": {"extraArgs": ["-m", "4096"]}}));
    let run = run(
        &mut cluster,
        mc,
        vec![expect(Method::PATCH, STATUS).apply(), event()],
    )
    .await;
    assert_eq!(
        run.result.unwrap(),
        Action::requeue(Duration::from_secs(300))
    );
    assert_degraded(&run.seen[0].body, "InvalidConfig", "extraArgs[0]");
}
