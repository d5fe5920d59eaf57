//! Smoke tests of `memcached-operator run` as a user runs it: the real binary, a kubeconfig, and an API
//! server, here a fake one served in-process over plain HTTP on 127.0.0.1.
//!
//! The fake answers what a real API server would for existing `Memcached` objects (`default/cache` by
//! default): lists of the watched kinds, watches held open without events, server-side applies echoed
//! back, events, the status subresource, and a small but faithful Lease store (create, get, apply and
//! strategic-merge patches where `null` removes a field). Lists can be made slow, and can hold existing
//! children and pods. Since watches never deliver events, what the operator writes is not reflected in
//! its caches. Every request is recorded, so the tests check what the operator asked for, with which
//! selectors and parameters, as well as what it did with the answers: health probes, metrics, leader
//! election (leader, standby, takeover), reconciles, restarts against settled instances, caches that
//! fill in any order or never, and a clean SIGTERM that releases the Lease.
//!
//! A request to any path the fake does not serve gets a 404 and fails the test. `SMOKE_DUMP=1 cargo
//! test --test smoke -- --nocapture` prints each run's operator log and requests.

use std::fmt::Write as _;
use std::fs::File;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri, header};
use axum::response::Response;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const BIN: &str = env!("CARGO_BIN_EXE_memcached-operator");
const TOKEN: &str = "smoke-token";
const IDENTITY: &str = "smoke-1";
const MANAGED: &str = "app.kubernetes.io/managed-by=memcached-operator";
const SELECTOR: &str = "app.kubernetes.io/instance=cache,app.kubernetes.io/name=memcached";

const MEMCACHEDS: &str = "/apis/cache.example.com/v1alpha1/namespaces/default/memcacheds";
const DEPLOYMENTS: &str = "/apis/apps/v1/namespaces/default/deployments";
const SERVICES: &str = "/api/v1/namespaces/default/services";
const PODS: &str = "/api/v1/namespaces/default/pods";
const PDBS: &str = "/apis/policy/v1/namespaces/default/poddisruptionbudgets";
const SECRETS: &str = "/api/v1/namespaces/default/secrets";
const MONITORING: &str = "/apis/monitoring.coreos.com/v1";
const SERVICE_MONITORS: &str = "/apis/monitoring.coreos.com/v1/namespaces/default/servicemonitors";
const HEADLESS: &str = "/api/v1/namespaces/default/services/cache-headless";
const PDB: &str = "/apis/policy/v1/namespaces/default/poddisruptionbudgets/cache";
const DEPLOYMENT: &str = "/apis/apps/v1/namespaces/default/deployments/cache";
const SERVICE: &str = "/api/v1/namespaces/default/services/cache";
const STATUS: &str = "/apis/cache.example.com/v1alpha1/namespaces/default/memcacheds/cache/status";
const EVENTS: &str = "/apis/events.k8s.io/v1/namespaces/default/events";
const LEASES: &str = "/apis/coordination.k8s.io/v1/namespaces/op-system/leases";
const LEASE: &str =
    "/apis/coordination.k8s.io/v1/namespaces/op-system/leases/memcached-operator.cache.example.com";

const APPLY: &str = "application/apply-patch+yaml";
const STRATEGIC: &str = "application/strategic-merge-patch+json";

/// Every wait is bounded by this, at most.
const WAIT: Duration = Duration::from_secs(30);

// ---------------------------------------------------------------------------------------------------
// The fake API server.

/// One request the operator made, and the status it was answered with.
#[derive(Clone, Debug)]
struct Req {
    seq: usize,
    /// When it arrived.
    at: Instant,
    method: Method,
    path: String,
    raw_query: String,
    /// Decoded query parameters, in order.
    query: Vec<(String, String)>,
    content_type: Option<String>,
    authorization: Option<String>,
    /// JSON body; `Null` when empty, a string when not JSON.
    body: Value,
    status: u16,
}

impl Req {
    fn param(&self, key: &str) -> Option<&str> {
        self.query
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    fn is_watch(&self) -> bool {
        matches!(self.param("watch"), Some("true" | "1"))
    }

    fn is(&self, method: &Method, path: &str) -> bool {
        self.method == *method && self.path == path
    }

    fn line(&self) -> String {
        let query = if self.raw_query.is_empty() {
            String::new()
        } else {
            format!("?{}", self.raw_query)
        };
        format!(
            "#{} {} {}{} -> {}",
            self.seq, self.method, self.path, query, self.status
        )
    }
}

struct FakeState {
    requests: Vec<Req>,
    /// What the lists return.
    world: World,
    /// The Lease, once created.
    lease: Option<Value>,
    resource_version: u64,
}

/// The objects the fake lists, and how slowly.
#[derive(Clone)]
struct World {
    memcacheds: Vec<Value>,
    deployments: Vec<Value>,
    services: Vec<Value>,
    pods: Vec<Value>,
    pdbs: Vec<Value>,
    /// Full Secrets: listed metadata-only, served whole on a GET by name.
    secrets: Vec<Value>,
    /// ServiceMonitors, or `None` when the cluster does not serve their API.
    service_monitors: Option<Vec<Value>>,
    /// List paths answered only after this delay, as a large list or a busy API server would be.
    slow_lists: Vec<(&'static str, Duration)>,
}

impl Default for World {
    /// One instance and nothing else: the operator has never run.
    fn default() -> Self {
        Self {
            memcacheds: vec![memcached()],
            deployments: vec![],
            services: vec![],
            pods: vec![],
            pdbs: vec![],
            secrets: vec![],
            service_monitors: None,
            slow_lists: vec![],
        }
    }
}

impl FakeState {
    fn next_rv(&mut self) -> String {
        self.resource_version += 1;
        self.resource_version.to_string()
    }
}

struct Fake {
    addr: SocketAddr,
    state: Mutex<FakeState>,
}

/// How to answer a request.
enum Answer {
    Json(StatusCode, Value),
    /// A watch: 200, then nothing, held open until the connection goes away.
    Hold,
}

impl Fake {
    /// Serves a fake API server on 127.0.0.1 for the default world; `lease` is a Lease that exists from
    /// the start.
    async fn start(lease: Option<Value>) -> Arc<Self> {
        Self::start_with(World::default(), lease).await
    }

    async fn start_with(world: World, lease: Option<Value>) -> Arc<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let fake = Arc::new(Fake {
            addr: listener.local_addr().unwrap(),
            state: Mutex::new(FakeState {
                requests: vec![],
                world,
                lease,
                resource_version: 100,
            }),
        });
        let router = Router::new().fallback(handle).with_state(fake.clone());
        tokio::spawn(async move { axum::serve(listener, router).await });
        fake
    }

    fn requests(&self) -> Vec<Req> {
        self.state.lock().unwrap().requests.clone()
    }

    fn count(&self) -> usize {
        self.state.lock().unwrap().requests.len()
    }

    fn lease(&self) -> Option<Value> {
        self.state.lock().unwrap().lease.clone()
    }

    fn lease_holder(&self) -> Option<String> {
        self.lease()
            .and_then(|l| l["spec"]["holderIdentity"].as_str().map(str::to_owned))
    }

    /// Every request, one per line, for failure messages.
    fn log(&self) -> String {
        let mut out = String::new();
        for req in self.requests() {
            let _ = writeln!(out, "{}", req.line());
        }
        out
    }

    fn answer(state: &mut FakeState, req: &Req) -> Answer {
        let m = &req.method;
        let path = req.path.as_str();
        if *m == Method::GET {
            let world = &state.world;
            let list = match path {
                MEMCACHEDS => Some((
                    "cache.example.com/v1alpha1",
                    "MemcachedList",
                    world.memcacheds.clone(),
                )),
                DEPLOYMENTS => Some(("apps/v1", "DeploymentList", world.deployments.clone())),
                SERVICES => Some(("v1", "ServiceList", world.services.clone())),
                PODS => Some(("v1", "PodList", world.pods.clone())),
                PDBS => Some(("policy/v1", "PodDisruptionBudgetList", world.pdbs.clone())),
                SECRETS => Some((
                    "meta.k8s.io/v1",
                    "PartialObjectMetadataList",
                    world.secrets.iter().map(metadata_only).collect(),
                )),
                SERVICE_MONITORS if world.service_monitors.is_some() => Some((
                    "monitoring.coreos.com/v1",
                    "ServiceMonitorList",
                    world.service_monitors.clone().unwrap_or_default(),
                )),
                _ => None,
            };
            if let Some((api_version, kind, items)) = list {
                if req.is_watch() {
                    return Answer::Hold;
                }
                return Answer::Json(
                    StatusCode::OK,
                    json!({"apiVersion": api_version, "kind": kind,
                           "metadata": {"resourceVersion": "1"}, "items": items}),
                );
            }
        }
        if *m == Method::GET && path == MONITORING {
            return match state.world.service_monitors {
                Some(_) => Answer::Json(
                    StatusCode::OK,
                    json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "monitoring.coreos.com/v1",
                           "resources": [{"name": "servicemonitors", "singularName": "servicemonitor",
                                          "namespaced": true, "kind": "ServiceMonitor",
                                          "verbs": ["get", "list", "watch", "create", "patch", "delete"]}]}),
                ),
                None => not_found("the server could not find the requested resource", path),
            };
        }
        if *m == Method::GET
            && let Some(name) = child_name(path, SECRETS)
        {
            return match state
                .world
                .secrets
                .iter()
                .find(|s| s["metadata"]["name"] == name)
            {
                Some(secret) => Answer::Json(StatusCode::OK, secret.clone()),
                None => not_found("secrets", name),
            };
        }
        if *m == Method::PATCH {
            if let Some(name) = child_name(path, DEPLOYMENTS)
                .or_else(|| child_name(path, SERVICES))
                .or_else(|| child_name(path, PDBS))
                .or_else(|| child_name(path, SERVICE_MONITORS))
            {
                let mut obj = req.body.clone();
                let uid = format!("uid-{}-{name}", path.rsplit('/').nth(1).unwrap_or_default());
                obj["metadata"]["uid"] = json!(uid);
                obj["metadata"]["resourceVersion"] = json!(state.next_rv());
                return Answer::Json(StatusCode::OK, obj);
            }
            let status_of = path
                .strip_suffix("/status")
                .and_then(|p| child_name(p, MEMCACHEDS));
            if let Some(name) = status_of {
                let rv = state.next_rv();
                let Some(mut obj) = state
                    .world
                    .memcacheds
                    .iter()
                    .find(|mc| mc["metadata"]["name"] == name)
                    .cloned()
                else {
                    return not_found("memcacheds.cache.example.com", name);
                };
                obj["metadata"]["resourceVersion"] = json!(rv);
                obj["status"] = req.body["status"].clone();
                return Answer::Json(StatusCode::OK, obj);
            }
        }
        if *m == Method::PATCH && child_name(path, EVENTS).is_some() {
            // A repeated event, folded into a series by the recorder.
            let mut obj = req.body.clone();
            obj["metadata"]["resourceVersion"] = json!(state.next_rv());
            return Answer::Json(StatusCode::OK, obj);
        }
        match (m.clone(), path) {
            (Method::POST, EVENTS) => {
                let mut obj = req.body.clone();
                obj["metadata"]["uid"] = json!(format!("uid-event-{}", req.seq));
                obj["metadata"]["resourceVersion"] = json!(state.next_rv());
                Answer::Json(StatusCode::CREATED, obj)
            }
            (Method::GET, LEASE) => match &state.lease {
                Some(lease) => Answer::Json(StatusCode::OK, lease.clone()),
                None => not_found("leases.coordination.k8s.io", LEASE),
            },
            (Method::POST, LEASES) => {
                let name = req.body["metadata"]["name"].as_str().unwrap_or_default();
                if state.lease.is_some() {
                    return status(StatusCode::CONFLICT, "AlreadyExists", "lease exists");
                }
                if format!("{LEASES}/{name}") != LEASE {
                    return status(StatusCode::BAD_REQUEST, "BadRequest", "unexpected name");
                }
                let mut lease = req.body.clone();
                lease["apiVersion"] = json!("coordination.k8s.io/v1");
                lease["kind"] = json!("Lease");
                lease["metadata"]["namespace"] = json!("op-system");
                lease["metadata"]["uid"] = json!("uid-lease");
                lease["metadata"]["creationTimestamp"] = json!("2024-01-01T00:00:00Z");
                lease["metadata"]["resourceVersion"] = json!(state.next_rv());
                state.lease = Some(lease.clone());
                Answer::Json(StatusCode::CREATED, lease)
            }
            (Method::PATCH, LEASE) => {
                let content_type = req.content_type.as_deref().unwrap_or_default();
                if content_type != APPLY && content_type != STRATEGIC {
                    return status(
                        StatusCode::UNSUPPORTED_MEDIA_TYPE,
                        "UnsupportedMediaType",
                        content_type,
                    );
                }
                let rv = state.next_rv();
                let Some(lease) = state.lease.as_mut() else {
                    return not_found("leases.coordination.k8s.io", LEASE);
                };
                merge_spec(lease, &req.body["spec"]);
                lease["metadata"]["resourceVersion"] = json!(rv);
                Answer::Json(StatusCode::OK, lease.clone())
            }
            _ => status(
                StatusCode::NOT_FOUND,
                "NotFound",
                &format!("the fake API server does not serve {} {path}", req.method),
            ),
        }
    }
}

/// Merges a patch's `spec` into the Lease's: `null` removes a field (strategic merge), anything else
/// replaces it. Lease spec fields are all scalars, so this is what both patch kinds do to them.
fn merge_spec(lease: &mut Value, patch: &Value) {
    let Some(patch) = patch.as_object() else {
        return;
    };
    if !lease["spec"].is_object() {
        lease["spec"] = json!({});
    }
    let spec = lease["spec"].as_object_mut().unwrap();
    for (key, value) in patch {
        if value.is_null() {
            spec.remove(key);
        } else {
            spec.insert(key.clone(), value.clone());
        }
    }
}

fn status(code: StatusCode, reason: &str, message: &str) -> Answer {
    Answer::Json(
        code,
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
               "message": message, "reason": reason, "code": code.as_u16()}),
    )
}

fn not_found(what: &str, path: &str) -> Answer {
    let name = path.rsplit('/').next().unwrap_or_default();
    status(
        StatusCode::NOT_FOUND,
        "NotFound",
        &format!("{what} \"{name}\" not found"),
    )
}

/// `name` when `path` is `{collection}/{name}`.
fn child_name<'a>(path: &'a str, collection: &str) -> Option<&'a str> {
    path.strip_prefix(collection)?
        .strip_prefix('/')
        .filter(|name| !name.is_empty() && !name.contains('/'))
}

/// A Secret as a metadata-only list returns it.
fn metadata_only(secret: &Value) -> Value {
    json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata", "metadata": secret["metadata"]})
}

/// The instance of most tests.
fn memcached() -> Value {
    memcached_named("cache", "uid-1")
}

/// An existing instance: 2 memcached pods on port 11211, with the operator's finalizer.
fn memcached_named(name: &str, uid: &str) -> Value {
    json!({
        "apiVersion": "cache.example.com/v1alpha1",
        "kind": "Memcached",
        "metadata": {
            "name": name, "namespace": "default", "uid": uid, "generation": 1,
            "resourceVersion": "1", "creationTimestamp": "2024-01-01T00:00:00Z",
            "finalizers": ["cache.example.com/finalizer"]
        },
        "spec": {"size": 2, "containerPort": 11211}
    })
}

async fn handle(
    State(fake): State<Arc<Fake>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let header = |name: header::HeaderName| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let raw_query = uri.query().unwrap_or_default().to_owned();
    let body = if body.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&body)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&body).into_owned()))
    };
    let (answer, delay) = {
        let mut state = fake.state.lock().unwrap();
        let mut req = Req {
            seq: state.requests.len(),
            at: Instant::now(),
            method,
            path: uri.path().to_owned(),
            query: parse_query(&raw_query),
            raw_query,
            content_type: header(header::CONTENT_TYPE),
            authorization: header(header::AUTHORIZATION),
            body,
            status: 0,
        };
        let answer = Fake::answer(&mut state, &req);
        req.status = match &answer {
            Answer::Json(code, _) => code.as_u16(),
            Answer::Hold => 200,
        };
        let delay = state
            .world
            .slow_lists
            .iter()
            .find(|(path, _)| req.method == Method::GET && !req.is_watch() && *path == req.path)
            .map(|(_, delay)| *delay);
        state.requests.push(req);
        (answer, delay)
    };
    if let Some(delay) = delay {
        tokio::time::sleep(delay).await;
    }
    let builder = Response::builder().header(header::CONTENT_TYPE, "application/json");
    match answer {
        Answer::Json(code, value) => builder
            .status(code)
            .body(Body::from(serde_json::to_vec(&value).unwrap()))
            .unwrap(),
        Answer::Hold => builder
            .status(StatusCode::OK)
            .body(Body::from_stream(futures::stream::pending::<
                Result<Bytes, std::io::Error>,
            >()))
            .unwrap(),
    }
}

fn parse_query(query: &str) -> Vec<(String, String)> {
    query
        .split('&')
        .filter(|kv| !kv.is_empty())
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (percent_decode(k), percent_decode(v))
        })
        .collect()
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b'%' if bytes.len() >= i + 3
                && bytes[i + 1].is_ascii_hexdigit()
                && bytes[i + 2].is_ascii_hexdigit() =>
            {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap();
                out.push(u8::from_str_radix(hex, 16).unwrap());
                i += 3;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

// ---------------------------------------------------------------------------------------------------
// The operator process.

/// A scratch directory under Cargo's per-target temp dir, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Self {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("smoke-{name}-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }

    /// A kubeconfig for the fake, with a bearer token.
    fn kubeconfig(&self, server: SocketAddr) -> PathBuf {
        let path = self.0.join("kubeconfig.yaml");
        let yaml = format!(
            "apiVersion: v1
kind: Config
clusters:
- name: fake
  cluster:
    server: http://{server}
users:
- name: smoke
  user:
    token: {TOKEN}
contexts:
- name: fake
  context:
    cluster: fake
    user: smoke
    namespace: default
current-context: fake
"
        );
        std::fs::write(&path, yaml).unwrap();
        path
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The running binary. Killed on drop; when the test is failing (or `SMOKE_DUMP` is set), its output
/// and the fake's request log are printed.
struct Operator {
    child: Child,
    stdout: PathBuf,
    stderr: PathBuf,
    fake: Option<Arc<Fake>>,
    exited: Option<ExitStatus>,
}

impl Operator {
    /// Starts the binary with a clean environment: only `env`, so no proxy, `RUST_LOG`, in-cluster or
    /// operator variable of the machine running the test leaks in.
    fn spawn(
        scratch: &Scratch,
        fake: Option<Arc<Fake>>,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Self {
        let stdout = scratch.0.join("stdout.log");
        let stderr = scratch.0.join("stderr.log");
        let child = Command::new(BIN)
            .args(args)
            .env_clear()
            .env("RUST_BACKTRACE", "1")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(File::create(&stdout).unwrap())
            .stderr(File::create(&stderr).unwrap())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {BIN}: {e}"));
        Self {
            child,
            stdout,
            stderr,
            fake,
            exited: None,
        }
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether the process has exited (and how), without waiting.
    fn poll_exit(&mut self) -> Option<ExitStatus> {
        if self.exited.is_none() {
            self.exited = self.child.try_wait().unwrap();
        }
        self.exited
    }

    /// Waits up to `timeout` for the process to exit.
    async fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.poll_exit() {
                return Some(status);
            }
            if Instant::now() > deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Polls `check` until it holds; fails if `timeout` passes or the process exits first.
    async fn wait_until<F, Fut>(&mut self, what: &str, timeout: Duration, mut check: F)
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = bool>,
    {
        let deadline = Instant::now() + timeout;
        loop {
            if check().await {
                return;
            }
            if let Some(status) = self.poll_exit() {
                panic!("the operator exited ({status}) while waiting for: {what}");
            }
            if Instant::now() > deadline {
                panic!("timed out after {timeout:?} waiting for: {what}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn sigterm(&self) {
        let status = Command::new("kill")
            .args(["-TERM", &self.pid().to_string()])
            .status()
            .expect("cannot run kill");
        assert!(status.success(), "kill -TERM failed: {status}");
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        if self.poll_exit().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        if std::thread::panicking() || std::env::var_os("SMOKE_DUMP").is_some() {
            let stdout = std::fs::read_to_string(&self.stdout).unwrap_or_default();
            eprintln!(
                "--- operator stderr ---\n{}\n--- operator stdout ---\n{stdout}",
                self.stderr()
            );
            if let Some(fake) = &self.fake {
                eprintln!("--- requests to the fake API server ---\n{}", fake.log());
            }
        }
    }
}

fn free_addr() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().to_string()
}

/// A GET over plain HTTP/1.1: status and body, or `None` when nothing answers (within 5 s).
async fn http_get(addr: &str, path: &str) -> Option<(u16, String)> {
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
        let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.ok()?;
        let mut response = Vec::new();
        stream.read_to_end(&mut response).await.ok()?;
        let text = String::from_utf8_lossy(&response).into_owned();
        let code = text.split_whitespace().nth(1)?.parse().ok()?;
        let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_owned())?;
        Some((code, body))
    };
    tokio::time::timeout(Duration::from_secs(5), exchange)
        .await
        .ok()
        .flatten()
}

async fn is_ok(addr: &str, path: &str) -> bool {
    matches!(http_get(addr, path).await, Some((200, _)))
}

// ---------------------------------------------------------------------------------------------------
// Checks on recorded requests.

fn of<'a>(requests: &'a [Req], method: &Method, path: &str) -> Vec<&'a Req> {
    requests.iter().filter(|r| r.is(method, path)).collect()
}

fn conditions(status: &Value) -> Vec<String> {
    status["conditions"]
        .as_array()
        .map(|cs| {
            cs.iter()
                .filter_map(|c| c["type"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

fn assert_applied(req: &Req, kind: &str) {
    assert_eq!(req.content_type.as_deref(), Some(APPLY), "{}", req.line());
    assert_eq!(
        req.param("fieldManager"),
        Some("memcached-operator"),
        "{}",
        req.line()
    );
    assert_eq!(req.param("force"), Some("true"), "{}", req.line());
    let body = &req.body;
    assert_eq!(body["kind"], kind, "{body}");
    let name = req.path.rsplit('/').next().unwrap_or_default();
    assert_eq!(body["metadata"]["name"], name, "{body}");
    assert_eq!(body["metadata"]["namespace"], "default", "{body}");
    assert_eq!(
        body["metadata"]["labels"]["app.kubernetes.io/managed-by"], "memcached-operator",
        "{body}"
    );
    let owner = &body["metadata"]["ownerReferences"][0];
    assert_eq!(owner["controller"], true, "{body}");
    assert_eq!(owner["kind"], "Memcached", "{body}");
    assert_eq!(owner["name"], "cache", "{body}");
    assert_eq!(owner["uid"], "uid-1", "{body}");
}

/// Starts `memcached-operator run` against `fake` as a replica `smoke-1` with leader election (Lease in
/// `op-system`) watching `default`. Returns the scratch dir (drop it last), the process, and the
/// metrics and probe addresses.
fn start_run(fake: &Arc<Fake>, name: &str) -> (Scratch, Operator, String, String) {
    let scratch = Scratch::new(name);
    let kubeconfig = scratch.kubeconfig(fake.addr);
    let metrics = free_addr();
    let probes = free_addr();
    let op = Operator::spawn(
        &scratch,
        Some(fake.clone()),
        &[
            "run",
            "--leader-elect",
            "--leader-election-namespace",
            "op-system",
            "--namespace",
            "default",
            "--metrics-bind-address",
            &metrics,
            "--health-probe-bind-address",
            &probes,
            "--log-level",
            "debug",
        ],
        &[
            ("KUBECONFIG", kubeconfig.to_str().unwrap()),
            ("POD_NAME", IDENTITY),
        ],
    );
    (scratch, op, metrics, probes)
}

/// Another replica's Lease, renewed now: held for `seconds` from now.
fn lease_held_by(holder: &str, seconds: u64, transitions: i32) -> Value {
    json!({
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": "memcached-operator.cache.example.com", "namespace": "op-system",
            "uid": "uid-lease", "resourceVersion": "1", "creationTimestamp": "2024-01-01T00:00:00Z"
        },
        "spec": {
            "holderIdentity": holder,
            "leaseDurationSeconds": seconds,
            "acquireTime": now(),
            "renewTime": now(),
            "leaseTransitions": transitions
        }
    })
}

fn now() -> Value {
    serde_json::to_value(MicroTime(Timestamp::now())).unwrap()
}

/// Plays the other replica: renews its Lease in the fake every 500 ms until `stop` is set.
fn keep_renewing(fake: &Arc<Fake>, stop: &Arc<AtomicBool>) {
    let (fake, stop) = (fake.clone(), stop.clone());
    tokio::spawn(async move {
        while !stop.load(Ordering::Acquire) {
            {
                let mut state = fake.state.lock().unwrap();
                let rv = state.next_rv();
                if let Some(lease) = state.lease.as_mut() {
                    lease["spec"]["renewTime"] = now();
                    lease["metadata"]["resourceVersion"] = json!(rv);
                }
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    });
}

/// Whether only the Lease was ever asked for: a standby starts no watch and writes nothing else.
fn only_lease_requests(fake: &Fake) -> bool {
    fake.requests().iter().all(|r| r.path == LEASE)
}

/// SIGTERM: the process exits 0 within 15 s, and releases the Lease on the way out.
async fn stop_and_check_release(op: &mut Operator, fake: &Fake) {
    let before_sigterm = fake.count();
    op.sigterm();
    let exit = op.wait_exit(Duration::from_secs(15)).await;
    let Some(exit) = exit else {
        panic!("the operator did not exit within 15 s of SIGTERM");
    };
    assert_eq!(exit.code(), Some(0), "exit status {exit}");
    let after: Vec<Req> = fake.requests().split_off(before_sigterm);
    assert!(
        after.iter().any(|r| r.is(&Method::PATCH, LEASE)
            && r.content_type.as_deref() == Some(STRATEGIC)
            && r.body["spec"]
                .as_object()
                .is_some_and(|s| s.get("holderIdentity") == Some(&Value::Null))),
        "a patch after SIGTERM clears holderIdentity; after SIGTERM: {after:#?}"
    );
    let lease = fake.lease().unwrap();
    assert!(
        lease["spec"].get("holderIdentity").is_none(),
        "released lease: {lease}"
    );
    // Shutdown writes nothing but the Lease.
    assert!(
        after.iter().all(|r| r.path == LEASE),
        "requests after SIGTERM: {after:#?}"
    );
    let stderr = op.stderr();
    assert!(stderr.contains("leader lease released"), "{stderr}");
    assert!(stderr.contains("shut down cleanly"), "{stderr}");
}

/// Nothing was asked of a path the fake does not serve, and nothing was refused, except reads of the
/// Lease before it exists.
fn assert_no_unexpected_requests(fake: &Fake) {
    let unexpected: Vec<String> = fake
        .requests()
        .iter()
        .filter(|r| {
            let refused = !(200..300).contains(&r.status);
            let lease_not_created_yet = r.status == 404 && r.is(&Method::GET, LEASE);
            // Discovery of an API group the cluster does not serve.
            let no_service_monitors = r.status == 404 && r.is(&Method::GET, MONITORING);
            refused && !lease_not_created_yet && !no_service_monitors
        })
        .map(Req::line)
        .collect();
    assert!(
        unexpected.is_empty(),
        "unexpected or refused requests:\n{}",
        unexpected.join("\n")
    );
}

/// The value of the first sample of `metric` (name plus labels, as exported) in a /metrics text.
fn sample(text: &str, metric: &str) -> Option<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix(metric)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

/// Runs the operator against `world` until it leads, its caches are synced and it has finished as many
/// successful reconciles as there are instances, lets it settle, stops it (checking the clean release)
/// and returns every request.
async fn run_once(world: World, name: &str) -> Vec<Req> {
    let instances = world.memcacheds.len() as f64;
    let fake = Fake::start_with(world, None).await;
    let (_scratch, mut op, metrics, probes) = start_run(&fake, name);
    op.wait_until("the Lease is held by smoke-1", WAIT, || {
        let holder = fake.lease_holder();
        async move { holder.as_deref() == Some(IDENTITY) }
    })
    .await;
    op.wait_until("/readyz answers 200 as the leader", WAIT, || {
        is_ok(&probes, "/readyz")
    })
    .await;
    op.wait_until("a successful reconcile of every instance", WAIT, || {
        let metrics = metrics.clone();
        async move {
            http_get(&metrics, "/metrics")
                .await
                .is_some_and(|(_, text)| {
                    sample(
                        &text,
                        "memcached_operator_reconcile_total{result=\"success\"}",
                    )
                    .is_some_and(|n| n >= instances)
                })
        }
    })
    .await;
    // Reconciles triggered by the children's initial lists.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    stop_and_check_release(&mut op, &fake).await;
    assert_no_unexpected_requests(&fake);
    fake.requests()
}

/// The requests, one per line.
fn lines(requests: &[Req]) -> String {
    requests
        .iter()
        .map(Req::line)
        .collect::<Vec<_>>()
        .join("\n")
}

/// Writes other than to the Lease.
fn writes(requests: &[Req]) -> Vec<&Req> {
    requests
        .iter()
        .filter(|r| r.method != Method::GET && r.path != LEASE && r.path != LEASES)
        .collect()
}

fn stored(applied: &Value, uid: &str) -> Value {
    let mut obj = applied.clone();
    obj["metadata"]["uid"] = json!(uid);
    obj["metadata"]["resourceVersion"] = json!("5");
    obj["metadata"]["generation"] = json!(1);
    obj["metadata"]["creationTimestamp"] = json!("2024-01-01T00:00:00Z");
    obj
}

fn ready_pod(name: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}"),
            "resourceVersion": "5", "labels": {
            "app.kubernetes.io/name": "memcached", "app.kubernetes.io/instance": "cache",
            "app.kubernetes.io/managed-by": "memcached-operator"}},
        "spec": {"containers": [{"name": "memcached", "image": "memcached:1.6-alpine"}]},
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
    })
}

// ---------------------------------------------------------------------------------------------------
// Tests.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_reconciles_leads_and_shuts_down_cleanly() {
    let started = Instant::now();
    let fake = Fake::start(None).await;
    let (_scratch, mut op, metrics, probes) = start_run(&fake, "run");

    // Probes come up, and readiness follows leadership and the caches.
    op.wait_until("/healthz answers 200", WAIT, || is_ok(&probes, "/healthz"))
        .await;
    op.wait_until("/readyz answers 200", WAIT, || is_ok(&probes, "/readyz"))
        .await;

    // Leader election, then one reconcile: both children applied, events, status.
    op.wait_until("the Lease is held by smoke-1", WAIT, || {
        let holder = fake.lease_holder();
        async move { holder.as_deref() == Some(IDENTITY) }
    })
    .await;
    op.wait_until(
        "the Deployment, Services and PDB applies, 4 events and a status patch",
        WAIT,
        || {
            let requests = fake.requests();
            async move {
                !of(&requests, &Method::PATCH, DEPLOYMENT).is_empty()
                    && !of(&requests, &Method::PATCH, SERVICE).is_empty()
                    && !of(&requests, &Method::PATCH, HEADLESS).is_empty()
                    && !of(&requests, &Method::PATCH, PDB).is_empty()
                    && of(&requests, &Method::POST, EVENTS).len() >= 4
                    && !of(&requests, &Method::PATCH, STATUS).is_empty()
            }
        },
    )
    .await;
    // Readiness now means "leader with synced caches".
    op.wait_until("/readyz answers 200 as the leader", WAIT, || {
        is_ok(&probes, "/readyz")
    })
    .await;

    let requests = fake.requests();

    // Every request is authenticated with the kubeconfig's token.
    for req in &requests {
        assert_eq!(
            req.authorization.as_deref(),
            Some(format!("Bearer {TOKEN}").as_str()),
            "{}",
            req.line()
        );
    }

    // Lists and watches: the watched namespace only; children and pods by the managed-by label only.
    // Secrets are named by users, so that watch is not label-scoped (and is metadata-only).
    for (path, selector) in [
        (MEMCACHEDS, None),
        (DEPLOYMENTS, Some(MANAGED)),
        (SERVICES, Some(MANAGED)),
        (PODS, Some(MANAGED)),
        (PDBS, Some(MANAGED)),
        (SECRETS, None),
    ] {
        let gets = of(&requests, &Method::GET, path);
        let lists: Vec<_> = gets.iter().filter(|r| !r.is_watch()).collect();
        assert_eq!(lists.len(), 1, "one list of {path}; got {gets:#?}");
        assert!(
            gets.iter().any(|r| r.is_watch()),
            "a watch of {path} follows its list; got {gets:#?}"
        );
        for req in &gets {
            assert_eq!(req.param("labelSelector"), selector, "{}", req.line());
        }
        if selector.is_some() {
            assert!(
                lists[0]
                    .raw_query
                    .contains("labelSelector=app.kubernetes.io%2Fmanaged-by%3Dmemcached-operator"),
                "the selector is URL-encoded: {}",
                lists[0].line()
            );
        }
    }

    // The Deployment: server-side applied, 2 replicas, memcached on the spec's port, controlled by the
    // instance.
    let deployments = of(&requests, &Method::PATCH, DEPLOYMENT);
    assert_eq!(deployments.len(), 1, "{deployments:#?}");
    assert_applied(deployments[0], "Deployment");
    let deployment = &deployments[0].body;
    assert_eq!(deployment["apiVersion"], "apps/v1");
    assert_eq!(deployment["spec"]["replicas"], 2, "{deployment}");
    let args: Vec<&str> = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    assert!(
        args.windows(2).any(|w| w == ["-p", "11211"]),
        "container args {args:?}"
    );

    let services = of(&requests, &Method::PATCH, SERVICE);
    assert_eq!(services.len(), 1, "{services:#?}");
    assert_applied(services[0], "Service");
    let service = &services[0].body;
    assert_eq!(service["spec"]["ports"][0]["port"], 11211, "{service}");
    let headless = of(&requests, &Method::PATCH, HEADLESS);
    assert_eq!(headless.len(), 1, "{headless:#?}");
    assert_applied(headless[0], "Service");
    assert_eq!(headless[0].body["spec"]["clusterIP"], "None");
    let pdbs = of(&requests, &Method::PATCH, PDB);
    assert_eq!(pdbs.len(), 1, "a budget for 2 pods: {pdbs:#?}");
    assert_applied(pdbs[0], "PodDisruptionBudget");
    // The cluster does not serve ServiceMonitors: discovered once, never listed.
    assert_eq!(of(&requests, &Method::GET, MONITORING).len(), 1);
    assert!(of(&requests, &Method::GET, SERVICE_MONITORS).is_empty());

    // Events: one per created child, about the instance, reported by this replica.
    let events = of(&requests, &Method::POST, EVENTS);
    assert_eq!(events.len(), 4, "{events:#?}");
    for event in &events {
        let body = &event.body;
        assert_eq!(body["reason"], "Created", "{body}");
        assert_eq!(body["type"], "Normal", "{body}");
        assert_eq!(body["regarding"]["kind"], "Memcached", "{body}");
        assert_eq!(body["regarding"]["name"], "cache", "{body}");
        assert_eq!(body["regarding"]["uid"], "uid-1", "{body}");
        assert_eq!(body["reportingController"], "memcached-operator", "{body}");
        assert_eq!(body["reportingInstance"], IDENTITY, "{body}");
    }
    let notes: Vec<&str> = events
        .iter()
        .filter_map(|e| e.body["note"].as_str())
        .collect();
    for kind in [
        "Deployment cache",
        "Service cache",
        "Service cache-headless",
        "PodDisruptionBudget cache",
    ] {
        assert!(notes.iter().any(|n| n.contains(kind)), "{kind}: {notes:?}");
    }

    // Status: server-side applied through the subresource, with the three conditions and the selector.
    let statuses = of(&requests, &Method::PATCH, STATUS);
    assert_eq!(statuses.len(), 1, "{statuses:#?}");
    let status = &statuses[0];
    assert_eq!(
        status.content_type.as_deref(),
        Some(APPLY),
        "{}",
        status.line()
    );
    assert_eq!(status.param("fieldManager"), Some("memcached-operator"));
    assert_eq!(status.param("force"), Some("true"));
    let body = &status.body["status"];
    let mut types = conditions(body);
    types.sort();
    assert_eq!(types, ["Available", "Degraded", "Progressing"], "{body}");
    assert_eq!(body["selector"], SELECTOR, "{body}");
    assert_eq!(body["observedGeneration"], 1, "{body}");

    // The finalizer is already there: the instance itself is never written, only its status.
    assert!(
        requests.iter().all(|r| r.method == Method::GET
            || !r.path.starts_with(MEMCACHEDS)
            || r.path == STATUS),
        "{}",
        fake.log()
    );

    // The Lease: created once, then acquired with an apply and a strategic-merge patch.
    assert_eq!(of(&requests, &Method::POST, LEASES).len(), 1);
    let lease = fake.lease().unwrap();
    assert_eq!(lease["spec"]["holderIdentity"], IDENTITY, "{lease}");
    assert_eq!(lease["spec"]["leaseDurationSeconds"], 15, "{lease}");
    assert!(lease["spec"]["renewTime"].is_string(), "{lease}");
    let lease_patches = of(&requests, &Method::PATCH, LEASE);
    assert!(
        lease_patches
            .iter()
            .any(|r| r.content_type.as_deref() == Some(APPLY)
                && r.body["spec"]["holderIdentity"] == IDENTITY),
        "{lease_patches:#?}"
    );

    // Metrics.
    let (code, text) = http_get(&metrics, "/metrics")
        .await
        .expect("/metrics answers");
    assert_eq!(code, 200, "{text}");
    // (`sample` reads the value line, not the HELP text, which also starts with the metric name.)
    assert_eq!(
        sample(&text, "memcached_operator_leader"),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        sample(&text, "memcached_operator_managed_instances"),
        Some(1.0),
        "{text}"
    );
    for metric in [
        "memcached_operator_reconcile_total{result=\"success\"}",
        "memcached_operator_kube_requests_total{verb=\"patch\",code=\"200\"}",
    ] {
        assert!(
            sample(&text, metric).is_some_and(|n| n >= 1.0),
            "missing {metric:?} in\n{text}"
        );
    }
    assert_eq!(
        sample(
            &text,
            "memcached_operator_reconcile_total{result=\"error\"}"
        ),
        None,
        "{text}"
    );

    // SIGTERM: a clean exit that releases the Lease.
    stop_and_check_release(&mut op, &fake).await;
    assert_no_unexpected_requests(&fake);
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "took {:?}",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_fails_fast_on_bad_configuration() {
    // A kubeconfig that does not exist: no client, no server, a message that says why.
    let scratch = Scratch::new("no-kubeconfig");
    let missing = scratch.0.join("missing.yaml");
    let mut op = Operator::spawn(
        &scratch,
        None,
        &[
            "run",
            "--metrics-bind-address",
            "0",
            "--health-probe-bind-address",
            "0",
        ],
        &[("KUBECONFIG", missing.to_str().unwrap())],
    );
    let exit = op.wait_exit(WAIT).await.expect("exits by itself");
    assert_eq!(exit.code(), Some(1), "exit status {exit}");
    let stderr = op.stderr();
    assert!(stderr.contains("Kubernetes configuration"), "{stderr}");
    drop(op);

    // Leader election (no subcommand: `run` is the default) without a namespace for the Lease.
    // The endpoints are disabled through the environment so nothing binds the default ports.
    let fake = Fake::start(None).await;
    let scratch = Scratch::new("no-namespace");
    let kubeconfig = scratch.kubeconfig(fake.addr);
    let mut op = Operator::spawn(
        &scratch,
        Some(fake.clone()),
        &["--leader-elect"],
        &[
            ("KUBECONFIG", kubeconfig.to_str().unwrap()),
            ("POD_NAMESPACE", ""),
            ("METRICS_BIND_ADDRESS", "0"),
            ("HEALTH_PROBE_BIND_ADDRESS", "0"),
        ],
    );
    let exit = op.wait_exit(WAIT).await.expect("exits by itself");
    assert_eq!(exit.code(), Some(1), "exit status {exit}");
    let stderr = op.stderr();
    assert!(stderr.contains("POD_NAMESPACE"), "{stderr}");
    assert_eq!(
        fake.count(),
        0,
        "nothing is sent before the configuration is complete:\n{}",
        fake.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standby_waits_then_takes_over_an_expired_lease() {
    // Another replica holds the Lease (5 s, renewed every 500 ms) and has changed hands 3 times.
    let fake = Fake::start(Some(lease_held_by("other-replica", 5, 3))).await;
    let stop_renewing = Arc::new(AtomicBool::new(false));
    keep_renewing(&fake, &stop_renewing);
    let (_scratch, mut op, metrics, probes) = start_run(&fake, "takeover");

    // As a standby: healthy, ready (it must not hold up a rollout), not leading, and not watching.
    op.wait_until("/readyz answers 200 as a standby", WAIT, || {
        is_ok(&probes, "/readyz")
    })
    .await;
    op.wait_until("/metrics reports a standby", WAIT, || {
        let metrics = metrics.clone();
        async move {
            http_get(&metrics, "/metrics")
                .await
                .is_some_and(|(code, text)| {
                    code == 200 && sample(&text, "memcached_operator_leader") == Some(0.0)
                })
        }
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(fake.lease_holder().as_deref(), Some("other-replica"));
    assert!(only_lease_requests(&fake), "{}", fake.log());
    assert!(
        fake.requests().iter().all(|r| r.method == Method::GET),
        "a standby only reads the live Lease of another replica:\n{}",
        fake.log()
    );

    // The other replica dies: its Lease expires, this one takes it over and reconciles.
    stop_renewing.store(true, Ordering::Release);
    // Acquiring is an apply (holder, times) then a patch counting the transition.
    op.wait_until(
        "the Lease is taken over by smoke-1, as its 4th transition",
        WAIT,
        || {
            let lease = fake.lease().unwrap_or_default();
            async move {
                lease["spec"]["holderIdentity"] == IDENTITY
                    && lease["spec"]["leaseTransitions"] == 4
            }
        },
    )
    .await;
    op.wait_until("the takeover is followed by a reconcile", WAIT, || {
        let requests = fake.requests();
        async move {
            !of(&requests, &Method::PATCH, DEPLOYMENT).is_empty()
                && !of(&requests, &Method::PATCH, STATUS).is_empty()
        }
    })
    .await;
    op.wait_until("/metrics reports the leader", WAIT, || {
        let metrics = metrics.clone();
        async move {
            http_get(&metrics, "/metrics")
                .await
                .is_some_and(|(code, text)| {
                    code == 200 && sample(&text, "memcached_operator_leader") == Some(1.0)
                })
        }
    })
    .await;

    stop_and_check_release(&mut op, &fake).await;
    assert_no_unexpected_requests(&fake);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standby_stops_on_sigterm_without_touching_the_lease() {
    let fake = Fake::start(Some(lease_held_by("other-replica", 15, 1))).await;
    let stop_renewing = Arc::new(AtomicBool::new(false));
    keep_renewing(&fake, &stop_renewing);
    let (_scratch, mut op, metrics, probes) = start_run(&fake, "standby");

    op.wait_until("/readyz answers 200 as a standby", WAIT, || {
        is_ok(&probes, "/readyz")
    })
    .await;
    op.wait_until("/metrics reports a standby", WAIT, || {
        let metrics = metrics.clone();
        async move {
            http_get(&metrics, "/metrics")
                .await
                .is_some_and(|(code, text)| {
                    code == 200 && sample(&text, "memcached_operator_leader") == Some(0.0)
                })
        }
    })
    .await;

    op.sigterm();
    let exit = op.wait_exit(Duration::from_secs(15)).await;
    let Some(exit) = exit else {
        panic!("the standby did not exit within 15 s of SIGTERM");
    };
    assert_eq!(exit.code(), Some(0), "exit status {exit}");
    stop_renewing.store(true, Ordering::Release);
    let stderr = op.stderr();
    assert!(
        stderr.contains("stopped before becoming leader"),
        "{stderr}"
    );
    assert_eq!(fake.lease_holder().as_deref(), Some("other-replica"));
    assert!(
        fake.requests().iter().all(|r| r.is(&Method::GET, LEASE)),
        "a standby reads the Lease and nothing else, and never writes it:\n{}",
        fake.log()
    );
    assert_no_unexpected_requests(&fake);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_against_a_settled_instance_writes_nothing() {
    // What a restart or a leader hand-over looks like to the operator. Reconciles used to start as soon
    // as the Memcached cache was filled, often before the others: the existing Deployment and Service
    // were taken for missing ones, applied again with "Created" events, and the status was written
    // without the pods.

    // 1. First start: the operator creates the children; keep what it applied.
    let first = run_once(World::default(), "settle-1").await;
    let applied = |path| {
        let patches = of(&first, &Method::PATCH, path);
        assert_eq!(patches.len(), 1, "{patches:#?}");
        patches[0].body.clone()
    };
    let mut deployment = stored(&applied(DEPLOYMENT), "uid-deployment");
    deployment["spec"]["progressDeadlineSeconds"] = json!(600);
    deployment["status"] = json!({"observedGeneration": 1, "replicas": 2, "readyReplicas": 2,
                                  "updatedReplicas": 2, "availableReplicas": 2});
    let service = stored(&applied(SERVICE), "uid-service");
    let headless = stored(&applied(HEADLESS), "uid-headless");
    let pdb = stored(&applied(PDB), "uid-pdb");
    let mut world = World {
        deployments: vec![deployment],
        services: vec![service, headless],
        pdbs: vec![pdb],
        pods: vec![
            ready_pod("cache-7d4b9c8f6d-a1b2c"),
            ready_pod("cache-7d4b9c8f6d-d3e4f"),
        ],
        ..World::default()
    };

    // 2. The children exist and are ready: no apply, no event; only the status is written. (More than
    //    once is possible: the fake's watches send no events, so the cache never sees the new status.)
    let second = run_once(world.clone(), "settle-2").await;
    let written = writes(&second);
    assert!(
        !written.is_empty() && written.iter().all(|r| r.is(&Method::PATCH, STATUS)),
        "{written:#?}\n{}",
        lines(&second)
    );
    let status = written[written.len() - 1].body["status"].clone();
    assert_eq!(status["readyReplicas"], 2, "{status}");
    assert_eq!(
        status["nodes"],
        json!(["cache-7d4b9c8f6d-a1b2c", "cache-7d4b9c8f6d-d3e4f"]),
        "{status}"
    );
    world.memcacheds[0]["status"] = status;

    // 3. Everything settled: a restart writes nothing at all.
    let third = run_once(world.clone(), "settle-3").await;
    assert!(
        writes(&third).is_empty(),
        "{:#?}\n{}",
        writes(&third),
        lines(&third)
    );

    // 4. Same, when the children's lists arrive after the instance's (a large cluster, a busy API
    //    server): the reconcile must not act on caches that do not hold their initial lists yet.
    world.slow_lists = vec![
        (DEPLOYMENTS, Duration::from_millis(1500)),
        (SERVICES, Duration::from_millis(1500)),
        (PODS, Duration::from_millis(1500)),
        (PDBS, Duration::from_millis(1500)),
        (SECRETS, Duration::from_millis(1500)),
    ];
    let fourth = run_once(world, "settle-4").await;
    assert!(
        writes(&fourth).is_empty(),
        "{:#?}\n{}",
        writes(&fourth),
        lines(&fourth)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn caches_may_sync_in_any_order() {
    // The instances' list arrives after the others. /readyz must still turn ready: it used to wait for
    // the Memcached cache next to the controller, and a cache wakes only its latest waiter.
    let world = World {
        slow_lists: vec![(MEMCACHEDS, Duration::from_millis(1500))],
        ..World::default()
    };
    let requests = run_once(world, "slow-instances").await;
    assert_eq!(of(&requests, &Method::PATCH, DEPLOYMENT).len(), 1);
    assert_eq!(of(&requests, &Method::PATCH, STATUS).len(), 1);

    // The children's and pods' lists arrive last, and there are more instances than reconcile slots
    // (4): each reconcile waits for those caches, every one of them then goes ahead, once.
    let names: Vec<String> = (1..=6).map(|i| format!("mc-{i}")).collect();
    let world = World {
        memcacheds: names
            .iter()
            .map(|name| memcached_named(name, &format!("uid-{name}")))
            .collect(),
        slow_lists: vec![
            (DEPLOYMENTS, Duration::from_millis(1500)),
            (SERVICES, Duration::from_millis(1500)),
            (PODS, Duration::from_millis(1500)),
            (PDBS, Duration::from_millis(1500)),
            (SECRETS, Duration::from_millis(1500)),
        ],
        ..World::default()
    };
    let requests = run_once(world, "slow-children").await;
    let listed = |path| {
        let list = requests
            .iter()
            .find(|r| r.is(&Method::GET, path) && !r.is_watch())
            .unwrap_or_else(|| panic!("no list of {path}"));
        list.at + Duration::from_millis(1500)
    };
    let synced = [DEPLOYMENTS, SERVICES, PODS, PDBS, SECRETS]
        .into_iter()
        .map(listed)
        .max()
        .unwrap();
    for name in &names {
        for path in [
            format!("{DEPLOYMENTS}/{name}"),
            format!("{SERVICES}/{name}"),
            format!("{SERVICES}/{name}-headless"),
            format!("{PDBS}/{name}"),
            format!("{MEMCACHEDS}/{name}/status"),
        ] {
            let patches = of(&requests, &Method::PATCH, &path);
            assert_eq!(patches.len(), 1, "{path}:\n{}", lines(&requests));
            assert!(
                patches[0].at >= synced,
                "{path} was written before the caches were filled:\n{}",
                lines(&requests)
            );
        }
        let events = requests
            .iter()
            .filter(|r| r.is(&Method::POST, EVENTS) && r.body["regarding"]["name"] == name.as_str())
            .count();
        assert_eq!(events, 4, "{name}:\n{}", lines(&requests));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn caches_that_never_sync_hold_reconciles_but_not_shutdown() {
    // The pods' list never comes back (within the test): the leader must not reconcile on the partial
    // caches, must not report ready, and must still stop promptly and release the Lease on SIGTERM.
    let world = World {
        slow_lists: vec![(PODS, Duration::from_secs(120))],
        ..World::default()
    };
    let fake = Fake::start_with(world, None).await;
    let (_scratch, mut op, _metrics, probes) = start_run(&fake, "never-synced");
    op.wait_until("the Lease is held by smoke-1", WAIT, || {
        let holder = fake.lease_holder();
        async move { holder.as_deref() == Some(IDENTITY) }
    })
    .await;
    op.wait_until("the pods' list is requested", WAIT, || {
        let requests = fake.requests();
        async move { !of(&requests, &Method::GET, PODS).is_empty() }
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (code, body) = http_get(&probes, "/readyz").await.expect("/readyz answers");
    assert_eq!(code, 503, "{body}");
    let requests = fake.requests();
    assert!(writes(&requests).is_empty(), "{}", lines(&requests));

    stop_and_check_release(&mut op, &fake).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secret_referencing_instance_reads_the_secret_once_and_hashes_it() {
    // base64("app:pw") = "YXBwOnB3"
    let mut instance = memcached();
    instance["spec"]["security"] = json!({"auth": {"secretName": "creds"}});
    let world = World {
        memcacheds: vec![instance],
        secrets: vec![json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "creds", "namespace": "default", "resourceVersion": "5", "uid": "uid-creds",
                         "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{\"data\":{\"auth-file\":\"YXBwOnB3\"}}"}},
            "type": "Opaque",
            "data": {"auth-file": "YXBwOnB3"}
        })],
        ..World::default()
    };
    let fake = Fake::start_with(world, None).await;
    let (_scratch, mut op, _metrics, _probes) = start_run(&fake, "secret");
    op.wait_until("the Deployment is applied", WAIT, || {
        let requests = fake.requests();
        async move {
            !of(&requests, &Method::PATCH, DEPLOYMENT).is_empty()
                && !of(&requests, &Method::PATCH, STATUS).is_empty()
        }
    })
    .await;
    stop_and_check_release(&mut op, &fake).await;
    let requests = fake.requests();

    // Read once (its version did not change), by name; the list was metadata-only.
    let secret_path = format!("{SECRETS}/creds");
    assert_eq!(
        of(&requests, &Method::GET, &secret_path).len(),
        1,
        "{}",
        lines(&requests)
    );
    let deployment = &of(&requests, &Method::PATCH, DEPLOYMENT)[0].body;
    let template = &deployment["spec"]["template"];
    let hash = template["metadata"]["annotations"]["cache.example.com/secret-hash"]
        .as_str()
        .unwrap_or_default();
    assert!(
        hash.len() == 64 && hash.chars().all(|c| c.is_ascii_hexdigit()),
        "{deployment}"
    );
    let args = template["spec"]["containers"][0]["args"].to_string();
    assert!(
        args.contains("\"-Y\",\"/etc/memcached/auth/auth-file\""),
        "{args}"
    );

    // The value never leaves: not in the log (at debug level), not in anything written.
    let stderr = op.stderr();
    for secret in ["app:pw", "YXBwOnB3"] {
        assert!(
            !stderr.contains(secret),
            "the log contains {secret}:\n{stderr}"
        );
        for req in writes(&requests) {
            assert!(
                !req.body.to_string().contains(secret),
                "{} contains {secret}",
                req.line()
            );
        }
    }
    assert_no_unexpected_requests(&fake);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn service_monitors_follow_what_the_cluster_serves() {
    let mut instance = memcached();
    instance["spec"]["monitoring"] =
        json!({"exporter": {"enabled": true}, "serviceMonitor": {"enabled": true}});

    // Served: listed and watched by label, and one applied for the instance.
    let world = World {
        memcacheds: vec![instance.clone()],
        service_monitors: Some(vec![]),
        ..World::default()
    };
    let requests = run_once(world, "monitors-served").await;
    let lists: Vec<_> = of(&requests, &Method::GET, SERVICE_MONITORS)
        .into_iter()
        .filter(|r| !r.is_watch())
        .collect();
    assert_eq!(lists.len(), 1, "{}", lines(&requests));
    assert_eq!(lists[0].param("labelSelector"), Some(MANAGED));
    let applied = of(
        &requests,
        &Method::PATCH,
        &format!("{SERVICE_MONITORS}/cache"),
    );
    assert_eq!(applied.len(), 1, "{}", lines(&requests));
    assert_applied(applied[0], "ServiceMonitor");
    assert_eq!(applied[0].body["spec"]["endpoints"][0]["port"], "metrics");

    // Not served: never listed, and the status says why instead of an error loop.
    let world = World {
        memcacheds: vec![instance],
        ..World::default()
    };
    let requests = run_once(world, "monitors-missing").await;
    assert!(
        of(&requests, &Method::GET, SERVICE_MONITORS).is_empty(),
        "{}",
        lines(&requests)
    );
    let statuses = of(&requests, &Method::PATCH, STATUS);
    let status = &statuses.last().expect("a status patch").body["status"];
    let degraded = status["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Degraded")
        .unwrap();
    assert_eq!(degraded["reason"], "ServiceMonitorUnavailable", "{status}");
    assert_eq!(sample_errors(&requests), 0);
}

/// Failed requests other than the expected 404s (for the Lease before it exists and undiscovered APIs).
fn sample_errors(requests: &[Req]) -> usize {
    requests
        .iter()
        .filter(|r| !(200..300).contains(&r.status) && r.status != 404)
        .count()
}
