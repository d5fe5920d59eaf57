//! The fake API server: answers what a real API server would for existing `Memcached` objects, and
//! records every request.
//!
//! It serves lists of the watched kinds ([`world::World`]), watches held open (delivering the events of
//! objects added with [`Fake::add_memcached`] after the watched version), server-side
//! applies echoed back, JSON patches of instances (kept), events, the status subresource, and a small but
//! faithful Lease store (create,
//! get, apply and strategic-merge patches where `null` removes a field). Lists can be made slow, and the
//! `Memcached` CRD can be missing ([`FakeState::crd_missing`]: the API group answers `404 page not found`,
//! as a real API server's does). What the
//! operator writes is not reflected in its caches. A request to any path the fake does not serve gets a
//! 404. The fake can go away and come back on the same address ([`Fake::outage`], [`Fake::back`]), as a
//! restarted API server that expires the old resource versions (410) or as a network blip that does not.
//!
//! It speaks plain HTTP, or with [`Fake::start_tls`] TLS offering HTTP/2 and HTTP/1.1 by ALPN as a real
//! API server does ([`tls`], the scale benchmark's): the kubeconfig then trusts a CA made for the test,
//! the connections are counted by protocol, every request records the HTTP version it came in with, and
//! [`Fake::restart`] drops every connection at once, and [`Fake::vanish`] silences them (a node gone
//! without a reset).
//!
//! - [`door`]: the relay in front of the HTTP server that makes the outages;
//! - [`paths`]: the API paths the fake serves;
//! - [`request`]: one recorded request ([`request::Req`]) and query decoding;
//! - [`world`]: the objects the fake lists;
//! - [`answers`]: what each request gets;
//! - [`tls`]: the TLS server (HTTP/2 and HTTP/1.1 by ALPN) and its certificates, shared with the scale
//!   benchmark.

pub mod answers;
pub mod door;
pub mod paths;
pub mod request;
#[path = "../../../bench/src/tls.rs"]
pub mod tls;
pub mod world;

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri, Version, header};
use axum::response::Response;
use futures::StreamExt;
use serde_json::{Value, json};

use crate::fake_api::answers::{child_name, merge_spec, not_found, status};
use crate::fake_api::paths::{
    APPLY, AUTOSCALERS, CONFIGMAPS, DEPLOYMENTS, EVENTS, JSON_PATCH, LEASE, LEASES, MEMCACHEDS,
    MONITORING, NETWORK_POLICIES, PDBS, PODS, SECRETS, SERVICE_MONITORS, SERVICES, STATEFULSETS,
    STRATEGIC,
};
use crate::fake_api::request::{Req, parse_query};
use crate::fake_api::tls::{Certificates, Connections, TlsServer};
use crate::fake_api::world::{World, metadata_only};

pub struct FakeState {
    pub requests: Vec<Req>,
    /// Watches from a resource version below this one are answered 410 `Expired` (a restarted server).
    pub expired_below: u64,
    /// Watch events: the collection path, the object's resource version, and the event.
    pub events: Vec<(&'static str, u64, Value)>,
    /// What the lists return.
    pub world: World,
    /// The Lease, once created.
    pub lease: Option<Value>,
    pub resource_version: u64,
    /// The `Memcached` CRD is not installed: every request to its API group gets the plain-text 404 a
    /// real API server gives for a path it does not serve.
    pub crd_missing: bool,
}

impl FakeState {
    pub fn next_rv(&mut self) -> String {
        self.resource_version += 1;
        self.resource_version.to_string()
    }

    /// A watch of `path` from resource version `from`: 410 when that version has expired, else the
    /// events after it.
    fn watch(&self, path: &str, from: Option<&str>) -> Answer {
        let from: u64 = from.and_then(|rv| rv.parse().ok()).unwrap_or(0);
        if from < self.expired_below {
            let message = format!("too old resource version: {from} ({})", self.expired_below);
            return Answer::Watch {
                events: vec![json!({"type": "ERROR", "object": {
                    "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                    "message": message, "reason": "Expired", "code": 410}})],
                end: true,
            };
        }
        let events = self
            .events
            .iter()
            .filter(|(p, rv, _)| *p == path && *rv > from)
            .map(|(_, _, event)| event.clone())
            .collect();
        Answer::Watch { events, end: false }
    }
}

pub struct Fake {
    /// Where the operator reaches it (the door).
    pub addr: SocketAddr,
    pub door: door::Door,
    pub state: Mutex<FakeState>,
    /// Over TLS: the kubeconfig's `certificate-authority-data`.
    pub certificate_authority_data: Option<String>,
    /// Over TLS: the server behind the door (set once the fake it serves exists).
    tls_server: OnceLock<TlsServer>,
}

/// How to answer a request.
pub enum Answer {
    Json(StatusCode, Value),
    /// A watch: 200, then these events (JSON lines), then held open until the connection goes away, or
    /// ended after them when `end` (as the API server ends a watch after an error event).
    Watch {
        events: Vec<Value>,
        end: bool,
    },
    /// A plain-text answer, as the API server's own 404 for a path nothing serves.
    Text(StatusCode, &'static str),
}

impl Fake {
    /// Serves a fake API server on 127.0.0.1 for the default world; `lease` is a Lease that exists from
    /// the start.
    pub async fn start(lease: Option<Value>) -> Arc<Self> {
        Self::start_with(World::default(), lease).await
    }

    pub async fn start_with(world: World, lease: Option<Value>) -> Arc<Self> {
        Self::serve(world, lease, None).await
    }

    /// [`Fake::start_with`] over TLS, offering HTTP/2 and HTTP/1.1 by ALPN, with a certificate from a CA
    /// made now, which [`crate::harness::Scratch::kubeconfig`] writes into the kubeconfig.
    pub async fn start_tls(world: World, lease: Option<Value>) -> Arc<Self> {
        Self::serve(world, lease, Some(Certificates::generate().unwrap())).await
    }

    async fn serve(
        world: World,
        lease: Option<Value>,
        certificates: Option<Certificates>,
    ) -> Arc<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let door = door::Door::open_for(listener.local_addr().unwrap()).await;
        let fake = Arc::new(Fake {
            addr: door.addr,
            door,
            state: Mutex::new(FakeState {
                requests: vec![],
                expired_below: 0,
                events: vec![],
                world,
                lease,
                resource_version: 100,
                crd_missing: false,
            }),
            certificate_authority_data: certificates
                .as_ref()
                .map(Certificates::certificate_authority_data),
            tls_server: OnceLock::new(),
        });
        let router = Router::new().fallback(handle).with_state(fake.clone());
        match certificates {
            Some(certificates) => {
                let server = TlsServer::serve(listener, &certificates, router);
                assert!(fake.tls_server.set(server).is_ok(), "served once");
            }
            None => {
                tokio::spawn(async move { axum::serve(listener, router).await });
            }
        }
        fake
    }

    /// The URL a kubeconfig names: `https://` over TLS, `http://` otherwise.
    pub fn url(&self) -> String {
        let scheme = match self.certificate_authority_data {
            Some(_) => "https",
            None => "http",
        };
        format!("{scheme}://{}", self.addr)
    }

    fn tls_server(&self) -> &TlsServer {
        self.tls_server
            .get()
            .expect("the fake is served over TLS (Fake::start_tls)")
    }

    /// The connections accepted so far over TLS, by the protocol each negotiated.
    pub fn connections(&self) -> Connections {
        self.tls_server().connections()
    }

    /// The API server restarts at once (over TLS): every open connection is dropped without a goodbye,
    /// new ones are accepted straight away, and the resource versions handed out before have expired
    /// (watches from them are answered 410 `Expired`).
    pub fn restart(&self) {
        self.expire_versions();
        self.tls_server().drop_connections();
    }

    /// The API server behind the open connections vanishes without a goodbye (over TLS), as a
    /// control-plane node that loses power, or whose flow a load balancer drops: every open connection
    /// stays open but goes silent (no answer, no PONG, no reset, no GOAWAY), while new connections reach
    /// another server of the same cluster. That one serves the same objects from the same store, so the
    /// resource versions handed out before are still valid (watches from them resume, no 410).
    pub fn vanish(&self) {
        self.tls_server().freeze_connections();
    }

    /// What a restarted API server forgets: every resource version handed out so far.
    fn expire_versions(&self) {
        let mut state = self.state.lock().unwrap();
        state.resource_version += 1000;
        state.expired_below = state.resource_version;
    }

    /// The API server goes away: connections are refused, and open ones (watches) are cut.
    pub fn outage(&self) {
        self.door.close();
    }

    /// The API server is back on the same address. A `restarted` one no longer knows the resource
    /// versions it handed out before: watches from them are answered 410 `Expired`, and the client must
    /// list again.
    pub fn back(&self, restarted: bool) {
        if restarted {
            self.expire_versions();
        }
        self.door.open();
    }

    /// A `Memcached` created now: listed from now on, and delivered to watches from an older version.
    pub fn add_memcached(&self, mut mc: Value) {
        let mut state = self.state.lock().unwrap();
        let rv = state.next_rv();
        mc["metadata"]["resourceVersion"] = json!(rv);
        state.world.memcacheds.push(mc.clone());
        let rv = rv.parse().unwrap();
        state
            .events
            .push((MEMCACHEDS, rv, json!({"type": "ADDED", "object": mc})));
    }

    pub fn requests(&self) -> Vec<Req> {
        self.state.lock().unwrap().requests.clone()
    }

    pub fn count(&self) -> usize {
        self.state.lock().unwrap().requests.len()
    }

    pub fn lease(&self) -> Option<Value> {
        self.state.lock().unwrap().lease.clone()
    }

    pub fn lease_holder(&self) -> Option<String> {
        self.lease()
            .and_then(|l| l["spec"]["holderIdentity"].as_str().map(str::to_owned))
    }

    /// Every request, one per line, for failure messages.
    pub fn log(&self) -> String {
        let mut out = String::new();
        for req in self.requests() {
            let _ = writeln!(out, "{}", req.line());
        }
        out
    }

    pub fn answer(state: &mut FakeState, req: &Req) -> Answer {
        let m = &req.method;
        let path = req.path.as_str();
        if state.crd_missing && path.starts_with("/apis/cache.example.com/") {
            return Answer::Text(StatusCode::NOT_FOUND, "404 page not found\n");
        }
        if *m == Method::GET {
            let world = &state.world;
            let list = match path {
                MEMCACHEDS => Some((
                    "cache.example.com/v1alpha1",
                    "MemcachedList",
                    world.memcacheds.clone(),
                )),
                DEPLOYMENTS => Some(("apps/v1", "DeploymentList", world.deployments.clone())),
                STATEFULSETS => Some(("apps/v1", "StatefulSetList", world.statefulsets.clone())),
                SERVICES => Some(("v1", "ServiceList", world.services.clone())),
                CONFIGMAPS => Some(("v1", "ConfigMapList", world.config_maps.clone())),
                PODS => Some(("v1", "PodList", world.pods.clone())),
                PDBS => Some(("policy/v1", "PodDisruptionBudgetList", world.pdbs.clone())),
                NETWORK_POLICIES => Some((
                    "networking.k8s.io/v1",
                    "NetworkPolicyList",
                    world.network_policies.clone(),
                )),
                AUTOSCALERS => Some((
                    "autoscaling/v2",
                    "HorizontalPodAutoscalerList",
                    world.autoscalers.clone(),
                )),
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
                    return state.watch(path, req.param("resourceVersion"));
                }
                return Answer::Json(
                    StatusCode::OK,
                    json!({"apiVersion": api_version, "kind": kind,
                           "metadata": {"resourceVersion": state.resource_version.to_string()},
                           "items": items}),
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
                .or_else(|| child_name(path, STATEFULSETS))
                .or_else(|| child_name(path, SERVICES))
                .or_else(|| child_name(path, CONFIGMAPS))
                .or_else(|| child_name(path, PODS))
                .or_else(|| child_name(path, PDBS))
                .or_else(|| child_name(path, NETWORK_POLICIES))
                .or_else(|| child_name(path, AUTOSCALERS))
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
        if *m == Method::PATCH
            && let Some(name) = child_name(path, MEMCACHEDS)
        {
            return patch_memcached(state, name, req);
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

/// A JSON patch of instance `name` (the removal of an earlier build's finalizer): applied to the stored
/// instance, all operations or none (a failed `test` is a 422, as on an API server), which is kept and
/// returned with a new resource version.
fn patch_memcached(state: &mut FakeState, name: &str, req: &Req) -> Answer {
    if req.content_type.as_deref() != Some(JSON_PATCH) {
        return status(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "UnsupportedMediaType",
            req.content_type.as_deref().unwrap_or_default(),
        );
    }
    let rv = state.next_rv();
    let Some(stored) = state
        .world
        .memcacheds
        .iter_mut()
        .find(|mc| mc["metadata"]["name"] == name)
    else {
        return not_found("memcacheds.cache.example.com", name);
    };
    let patch: json_patch::Patch = match serde_json::from_value(req.body.clone()) {
        Ok(patch) => patch,
        Err(e) => return status(StatusCode::BAD_REQUEST, "BadRequest", &e.to_string()),
    };
    let mut patched = stored.clone();
    if let Err(e) = json_patch::patch(&mut patched, &patch.0) {
        return status(StatusCode::UNPROCESSABLE_ENTITY, "Invalid", &e.to_string());
    }
    patched["metadata"]["resourceVersion"] = json!(rv);
    *stored = patched.clone();
    Answer::Json(StatusCode::OK, patched)
}

pub async fn handle(
    State(fake): State<Arc<Fake>>,
    method: Method,
    uri: Uri,
    version: Version,
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
            version,
            method,
            path: uri.path().to_owned(),
            query: parse_query(&raw_query),
            raw_query,
            content_type: header(header::CONTENT_TYPE),
            authorization: header(header::AUTHORIZATION),
            accept: header(header::ACCEPT),
            body,
            status: 0,
        };
        let answer = Fake::answer(&mut state, &req);
        req.status = match &answer {
            Answer::Json(code, _) | Answer::Text(code, _) => code.as_u16(),
            Answer::Watch { .. } => 200,
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
    if let Answer::Text(code, text) = answer {
        return Response::builder()
            .status(code)
            .header(header::CONTENT_TYPE, "text/plain; charset=utf-8")
            .body(Body::from(text))
            .unwrap();
    }
    let builder = Response::builder().header(header::CONTENT_TYPE, "application/json");
    match answer {
        Answer::Json(code, value) => builder
            .status(code)
            .body(Body::from(serde_json::to_vec(&value).unwrap()))
            .unwrap(),
        Answer::Watch { events, end } => {
            let lines = events.into_iter().map(|event| {
                let mut line = serde_json::to_vec(&event).unwrap();
                line.push(b'\n');
                Ok::<_, std::io::Error>(Bytes::from(line))
            });
            let lines = futures::stream::iter(lines.collect::<Vec<_>>());
            let body = if end {
                Body::from_stream(lines)
            } else {
                Body::from_stream(lines.chain(futures::stream::pending()))
            };
            builder.status(StatusCode::OK).body(body).unwrap()
        }
        Answer::Text(..) => unreachable!("answered above"),
    }
}
