//! A stateful fake API server: one object store per collection with resource versions, lists, watches
//! that receive every later change (so the operator's caches see what it wrote), create, server-side
//! apply, merge and JSON patches, the status subresource, and delete. Every request is recorded, and
//! answered after a fixed latency, as a real API server's round trip would take.
//!
//! What it leaves out, because the operator does not depend on it: label and field selectors (the
//! benchmark's cluster holds only the operator's objects), defaulting and validation, managed fields,
//! bookmarks, watch timeouts and expiry. Discovery answers 404 for every group, so the operator finds no
//! ServiceMonitor API.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::convert::Infallible;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{Method, StatusCode, Uri, header};
use axum::response::Response;
use serde_json::{Value, json};
use tokio::sync::{mpsc, watch};

use crate::patch;

/// Every collection the operator lists, watches or writes: (group/version, plural, kind).
const COLLECTIONS: &[(&str, &str, &str)] = &[
    ("cache.example.com/v1alpha1", "memcacheds", "Memcached"),
    ("apps/v1", "deployments", "Deployment"),
    ("apps/v1", "statefulsets", "StatefulSet"),
    ("v1", "services", "Service"),
    ("v1", "configmaps", "ConfigMap"),
    ("v1", "pods", "Pod"),
    ("v1", "secrets", "Secret"),
    ("policy/v1", "poddisruptionbudgets", "PodDisruptionBudget"),
    ("networking.k8s.io/v1", "networkpolicies", "NetworkPolicy"),
    (
        "autoscaling/v2",
        "horizontalpodautoscalers",
        "HorizontalPodAutoscaler",
    ),
    ("events.k8s.io/v1", "events", "Event"),
];

/// The Services each instance has once its children exist: today's operator makes a client Service and a
/// headless one.
pub const SERVICES_PER_INSTANCE: usize = 2;

/// A fixed timestamp for every time field the fake writes: nothing the operator does depends on it.
pub const TIMESTAMP: &str = "2026-01-01T00:00:00Z";

/// One recorded request.
#[derive(Clone, Debug)]
pub struct Record {
    pub at: Instant,
    /// `list`, `watch`, `get`, `create`, `apply`, `patch-merge`, `patch-json`, `update`, `delete`, …
    pub verb: &'static str,
    /// The plural, with `/status` for the subresource; the path for anything else.
    pub resource: String,
    /// The answer's HTTP status (200 for a watch).
    pub code: u16,
}

impl Record {
    /// A write: anything but a read (list, watch, get, discovery).
    pub fn is_write(&self) -> bool {
        !matches!(self.verb, "list" | "watch" | "get" | "discovery")
    }
}

/// A workload the kubelet is to bring up: collection (`deployments` or `statefulsets`), namespace, name.
pub type Workload = (&'static str, String, String);

/// When each instance got its children and became Available.
#[derive(Default)]
pub struct Progress {
    /// Instance uids to watch for.
    pub expected: HashSet<String>,
    /// Per instance uid: whether its workload exists, and how many Services.
    children: HashMap<String, (bool, usize)>,
    complete: usize,
    available: HashSet<String>,
    pub children_at: Option<Instant>,
    pub available_at: Option<Instant>,
}

impl Progress {
    fn child_created(&mut self, plural: &str, obj: &Value) {
        let Some(owner) = controller_uid(obj) else {
            return;
        };
        if !self.expected.contains(owner) {
            return;
        }
        let entry = self.children.entry(owner.to_owned()).or_default();
        let was_complete = entry.0 && entry.1 >= SERVICES_PER_INSTANCE;
        match plural {
            "deployments" | "statefulsets" => entry.0 = true,
            "services" => entry.1 += 1,
            _ => return,
        }
        if !was_complete && entry.0 && entry.1 >= SERVICES_PER_INSTANCE {
            self.complete += 1;
            if self.complete == self.expected.len() && self.children_at.is_none() {
                self.children_at = Some(Instant::now());
            }
        }
    }

    fn status_written(&mut self, mc: &Value) {
        let Some(uid) = mc["metadata"]["uid"].as_str() else {
            return;
        };
        let available = mc["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["type"] == "Available" && c["status"] == "True");
        if available {
            self.available.insert(uid.to_owned());
        } else {
            self.available.remove(uid);
        }
        if self.available.len() == self.expected.len()
            && !self.expected.is_empty()
            && self.available_at.is_none()
        {
            self.available_at = Some(Instant::now());
        }
    }

    /// Instances with all their children so far.
    pub fn complete(&self) -> usize {
        self.complete
    }

    /// Instances Available so far.
    pub fn available(&self) -> usize {
        self.available.len()
    }
}

fn controller_uid(obj: &Value) -> Option<&str> {
    obj["metadata"]["ownerReferences"]
        .as_array()?
        .iter()
        .find(|r| r["controller"] == true)?["uid"]
        .as_str()
}

struct Collection {
    api_version: &'static str,
    kind: &'static str,
    objects: BTreeMap<(String, String), Value>,
    /// Every change, in resource-version order, as the watch line it is sent as.
    history: Vec<(u64, Bytes)>,
    /// The resource version of the latest change, for open watches to wake on.
    latest: watch::Sender<u64>,
}

pub struct Store {
    resource_version: u64,
    uids: u64,
    collections: HashMap<&'static str, Collection>,
    pub requests: Vec<Record>,
    pub progress: Progress,
    kubelet: mpsc::UnboundedSender<Workload>,
}

/// The fake API server.
pub struct Fake {
    store: Mutex<Store>,
    latency: Duration,
}

/// An answer: status and JSON body.
type Answer = (StatusCode, Value);

fn status(code: StatusCode, reason: &str, message: String) -> Answer {
    (
        code,
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
               "message": message, "reason": reason, "code": code.as_u16()}),
    )
}

/// A request path taken apart: `/api/v1/namespaces/ns/pods/name/status`.
#[derive(Debug, PartialEq, Eq)]
struct Target<'a> {
    plural: &'a str,
    namespace: Option<&'a str>,
    name: Option<&'a str>,
    subresource: Option<&'a str>,
}

fn parse_path(path: &str) -> Option<Target<'_>> {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let rest = match segments.as_slice() {
        ["api", "v1", rest @ ..] => rest,
        ["apis", _group, _version, rest @ ..] => rest,
        _ => return None,
    };
    let (namespace, rest) = match rest {
        ["namespaces", ns, rest @ ..] if !rest.is_empty() => (Some(*ns), rest),
        rest => (None, rest),
    };
    match rest {
        [plural] => Some(Target {
            plural,
            namespace,
            name: None,
            subresource: None,
        }),
        [plural, name] => Some(Target {
            plural,
            namespace,
            name: Some(name),
            subresource: None,
        }),
        [plural, name, sub] => Some(Target {
            plural,
            namespace,
            name: Some(name),
            subresource: Some(sub),
        }),
        _ => None,
    }
}

fn query_param<'a>(query: &'a str, key: &str) -> Option<&'a str> {
    query
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| *k == key)
        .map(|(_, v)| v)
}

impl Fake {
    /// A fake with empty collections; workloads to bring up are sent to `kubelet`.
    pub fn new(latency: Duration, kubelet: mpsc::UnboundedSender<Workload>) -> Arc<Self> {
        let collections = COLLECTIONS
            .iter()
            .map(|&(api_version, plural, kind)| {
                let collection = Collection {
                    api_version,
                    kind,
                    objects: BTreeMap::new(),
                    history: Vec::new(),
                    latest: watch::Sender::new(0),
                };
                (plural, collection)
            })
            .collect();
        Arc::new(Self {
            store: Mutex::new(Store {
                resource_version: 1,
                uids: 0,
                collections,
                requests: Vec::new(),
                progress: Progress::default(),
                kubelet,
            }),
            latency,
        })
    }

    pub fn store(&self) -> MutexGuard<'_, Store> {
        self.store.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The fake's HTTP routes: every request is answered by it ([`crate::endpoint`] serves them).
    pub fn router(self: &Arc<Self>) -> axum::Router {
        axum::Router::new()
            .fallback(handle)
            .with_state(self.clone())
    }

    /// The watch lines of `plural` after resource version `after`, as one chunk, and the last version in
    /// it.
    fn changes_after(&self, plural: &str, after: u64) -> Option<(Bytes, u64)> {
        let store = self.store();
        let history = &store.collections.get(plural)?.history;
        let start = history.partition_point(|(rv, _)| *rv <= after);
        let changes = &history[start..];
        let last = changes.last()?.0;
        let mut chunk = Vec::with_capacity(changes.iter().map(|(_, line)| line.len()).sum());
        for (_, line) in changes {
            chunk.extend_from_slice(line);
        }
        Some((Bytes::from(chunk), last))
    }
}

impl Store {
    fn next_rv(&mut self) -> u64 {
        self.resource_version += 1;
        self.resource_version
    }

    /// Stores `obj` (new or changed) under a new resource version and tells the watches; `created`
    /// chooses the watch event.
    fn commit(&mut self, plural: &'static str, mut obj: Value, created: bool) -> Value {
        let rv = self.next_rv();
        obj["metadata"]["resourceVersion"] = json!(rv.to_string());
        let key = key_of(&obj);
        let collection = self.collections.get_mut(plural).expect("known collection");
        obj["apiVersion"] = json!(collection.api_version);
        obj["kind"] = json!(collection.kind);
        let event = if created { "ADDED" } else { "MODIFIED" };
        if plural != "events" {
            let mut line =
                serde_json::to_vec(&json!({"type": event, "object": &obj})).expect("JSON");
            line.push(b'\n');
            collection.history.push((rv, Bytes::from(line)));
            collection.latest.send_replace(rv);
        }
        collection.objects.insert(key, obj.clone());
        match plural {
            "memcacheds" => self.progress.status_written(&obj),
            "deployments" | "statefulsets" | "services" if created => {
                self.progress.child_created(plural, &obj)
            }
            _ => {}
        }
        obj
    }

    /// Creates `obj` in `plural`: uid, generation and creation time filled in.
    pub fn create(&mut self, plural: &'static str, mut obj: Value) -> Result<Value, Answer> {
        if obj["metadata"]["name"].as_str().is_none() {
            let prefix = obj["metadata"]["generateName"].as_str().unwrap_or("obj-");
            obj["metadata"]["name"] = json!(format!("{prefix}{:05}", self.uids + 1));
        }
        if self
            .collections
            .get(plural)
            .is_some_and(|c| c.objects.contains_key(&key_of(&obj)))
        {
            return Err(status(
                StatusCode::CONFLICT,
                "AlreadyExists",
                format!("{plural} {:?} already exists", key_of(&obj)),
            ));
        }
        self.uids += 1;
        let meta = &mut obj["metadata"];
        meta["uid"] = json!(format!("00000000-0000-0000-0000-{:012}", self.uids));
        meta["creationTimestamp"] = json!(TIMESTAMP);
        meta["generation"] = json!(1);
        let obj = self.commit(plural, obj, true);
        self.workload_changed(plural, &obj);
        Ok(obj)
    }

    /// Replaces the stored object by `changed` if it differs: the generation goes up when the spec
    /// changed, and an unchanged write is a no-op (no new version, no watch event), as on the API server.
    pub fn update(&mut self, plural: &'static str, mut changed: Value) -> Value {
        let key = key_of(&changed);
        let old = &self.collections[plural].objects[&key];
        if *old == changed {
            return changed;
        }
        let spec_changed = old.get("spec") != changed.get("spec");
        if spec_changed {
            let generation = old["metadata"]["generation"].as_i64().unwrap_or(1);
            changed["metadata"]["generation"] = json!(generation + 1);
        }
        let obj = self.commit(plural, changed, false);
        if spec_changed {
            self.workload_changed(plural, &obj);
        }
        obj
    }

    pub fn get(&self, plural: &str, namespace: &str, name: &str) -> Option<&Value> {
        self.collections
            .get(plural)?
            .objects
            .get(&(namespace.to_owned(), name.to_owned()))
    }

    fn workload_changed(&self, plural: &'static str, obj: &Value) {
        if matches!(plural, "deployments" | "statefulsets") {
            let (namespace, name) = key_of(obj);
            let _ = self.kubelet.send((plural, namespace, name));
        }
    }

    fn delete(&mut self, plural: &'static str, key: &(String, String)) -> Option<Value> {
        let rv = self.next_rv();
        let collection = self.collections.get_mut(plural)?;
        let mut obj = collection.objects.remove(key)?;
        obj["metadata"]["resourceVersion"] = json!(rv.to_string());
        let mut line =
            serde_json::to_vec(&json!({"type": "DELETED", "object": &obj})).expect("JSON");
        line.push(b'\n');
        collection.history.push((rv, Bytes::from(line)));
        collection.latest.send_replace(rv);
        Some(obj)
    }

    /// The events recorded so far, counted by reason (an event patched as a series counts once).
    pub fn events_by_reason(&self) -> BTreeMap<String, usize> {
        let mut reasons = BTreeMap::new();
        for event in self.collections["events"].objects.values() {
            let reason = event["reason"].as_str().unwrap_or("<none>").to_owned();
            *reasons.entry(reason).or_insert(0) += 1;
        }
        reasons
    }

    /// Deletes a pod by namespace and name, for the kubelet's scale-down.
    pub fn delete_pod(&mut self, namespace: &str, name: &str) {
        self.delete("pods", &(namespace.to_owned(), name.to_owned()));
    }

    fn list(&self, plural: &str, namespace: Option<&str>, metadata_only: bool) -> Value {
        let collection = &self.collections[plural];
        let items: Vec<Value> = collection
            .objects
            .iter()
            .filter(|((ns, _), _)| namespace.is_none_or(|n| n == ns))
            .map(|(_, obj)| {
                if metadata_only {
                    json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
                           "metadata": obj["metadata"]})
                } else {
                    obj.clone()
                }
            })
            .collect();
        let (api_version, kind) = if metadata_only {
            ("meta.k8s.io/v1", "PartialObjectMetadataList".to_owned())
        } else {
            (collection.api_version, format!("{}List", collection.kind))
        };
        json!({"apiVersion": api_version, "kind": kind,
               "metadata": {"resourceVersion": self.resource_version.to_string()}, "items": items})
    }
}

fn key_of(obj: &Value) -> (String, String) {
    let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
    (
        text(&obj["metadata"]["namespace"]),
        text(&obj["metadata"]["name"]),
    )
}

fn plural_of(plural: &str) -> Option<&'static str> {
    COLLECTIONS
        .iter()
        .map(|(_, p, _)| *p)
        .find(|p| *p == plural)
}

async fn handle(
    State(fake): State<Arc<Fake>>,
    method: Method,
    uri: Uri,
    headers: axum::http::HeaderMap,
    body: Bytes,
) -> Response {
    tokio::time::sleep(fake.latency).await;
    let query = uri.query().unwrap_or_default();
    let header = |name| headers.get(name).and_then(|v| v.to_str().ok());
    let metadata_only = header(header::ACCEPT).is_some_and(|a| a.contains("PartialObjectMetadata"));
    let content_type = header(header::CONTENT_TYPE).unwrap_or_default().to_owned();
    let watch = matches!(query_param(query, "watch"), Some("true" | "1"));
    let target = parse_path(uri.path());
    let plural = target.as_ref().and_then(|t| plural_of(t.plural));

    if let (Some(plural), Some(target), true) = (plural, &target, watch) {
        record(&fake, "watch", plural, None, 200);
        let from = query_param(query, "resourceVersion")
            .and_then(|rv| rv.parse().ok())
            .unwrap_or(0);
        return watch_response(
            fake.clone(),
            plural,
            target.namespace.map(str::to_owned),
            from,
        );
    }
    let (code, value) = match (plural, target) {
        (Some(plural), Some(target)) => {
            let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            answer(
                &fake,
                &method,
                plural,
                &target,
                &content_type,
                metadata_only,
                body,
            )
        }
        _ => {
            record(&fake, "discovery", uri.path(), None, 404);
            status(
                StatusCode::NOT_FOUND,
                "NotFound",
                format!(
                    "the server could not find the requested resource {}",
                    uri.path()
                ),
            )
        }
    };
    Response::builder()
        .status(code)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(serde_json::to_vec(&value).expect("JSON")))
        .expect("valid response")
}

fn record(fake: &Fake, verb: &'static str, resource: &str, subresource: Option<&str>, code: u16) {
    let resource = match subresource {
        Some(sub) => format!("{resource}/{sub}"),
        None => resource.to_owned(),
    };
    fake.store().requests.push(Record {
        at: Instant::now(),
        verb,
        resource,
        code,
    });
}

fn answer(
    fake: &Fake,
    method: &Method,
    plural: &'static str,
    target: &Target<'_>,
    content_type: &str,
    metadata_only: bool,
    body: Value,
) -> Answer {
    let verb = match (method.as_str(), target.name, content_type) {
        ("GET", None, _) => "list",
        ("GET", Some(_), _) => "get",
        ("POST", None, _) => "create",
        ("PUT", Some(_), _) => "update",
        ("DELETE", Some(_), _) => "delete",
        ("PATCH", Some(_), t) if t.starts_with("application/apply-patch") => "apply",
        ("PATCH", Some(_), "application/json-patch+json") => "patch-json",
        ("PATCH", Some(_), "application/strategic-merge-patch+json") => "patch-strategic",
        ("PATCH", Some(_), _) => "patch-merge",
        _ => "other",
    };
    let answer = respond(fake, verb, method, plural, target, metadata_only, body);
    record(fake, verb, plural, target.subresource, answer.0.as_u16());
    answer
}

/// The answer to a request of `verb` on `target`.
fn respond(
    fake: &Fake,
    verb: &'static str,
    method: &Method,
    plural: &'static str,
    target: &Target<'_>,
    metadata_only: bool,
    body: Value,
) -> Answer {
    let mut store = fake.store();
    let namespace = target.namespace.unwrap_or_default();
    let not_found = |name: &str| {
        status(
            StatusCode::NOT_FOUND,
            "NotFound",
            format!("{plural} \"{name}\" not found"),
        )
    };
    match verb {
        "list" => (
            StatusCode::OK,
            store.list(plural, target.namespace, metadata_only),
        ),
        "get" => {
            let name = target.name.unwrap_or_default();
            match store.get(plural, namespace, name) {
                Some(obj) if metadata_only => (
                    StatusCode::OK,
                    json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
                           "metadata": obj["metadata"]}),
                ),
                Some(obj) => (StatusCode::OK, obj.clone()),
                None => not_found(name),
            }
        }
        "create" => {
            let mut obj = body;
            obj["metadata"]["namespace"] = json!(namespace);
            match store.create(plural, obj) {
                Ok(obj) => (StatusCode::CREATED, obj),
                Err(refused) => refused,
            }
        }
        "delete" => {
            let name = target.name.unwrap_or_default();
            match store.delete(plural, &(namespace.to_owned(), name.to_owned())) {
                Some(obj) => (StatusCode::OK, obj),
                None => not_found(name),
            }
        }
        "update" | "apply" | "patch-json" | "patch-strategic" | "patch-merge" => {
            let name = target.name.unwrap_or_default();
            let existing = store.get(plural, namespace, name).cloned();
            let status_only = target.subresource == Some("status");
            let Some(mut obj) = existing else {
                if verb == "apply" && !status_only {
                    let mut obj = body;
                    obj["metadata"]["namespace"] = json!(namespace);
                    obj["metadata"]["name"] = json!(name);
                    return match store.create(plural, obj) {
                        Ok(obj) => (StatusCode::CREATED, obj),
                        Err(refused) => refused,
                    };
                }
                return not_found(name);
            };
            let before = obj.clone();
            // A status write changes only the status; any other write leaves the status alone.
            let changes = if status_only {
                json!({"status": body["status"]})
            } else {
                let mut body = body;
                if let Some(map) = body.as_object_mut()
                    && verb != "patch-json"
                {
                    map.remove("status");
                }
                body
            };
            match verb {
                "update" => {
                    let mut replaced = changes;
                    replaced["status"] = before["status"].clone();
                    replaced["metadata"]["uid"] = before["metadata"]["uid"].clone();
                    obj = replaced;
                }
                "apply" => patch::apply(&mut obj, &changes),
                "patch-json" => {
                    if let Err(refused) = patch::json_patch(&mut obj, &changes) {
                        return status(StatusCode::UNPROCESSABLE_ENTITY, "Invalid", refused.0);
                    }
                }
                _ => patch::merge(&mut obj, &changes),
            }
            // Identity is the server's.
            obj["metadata"]["name"] = before["metadata"]["name"].clone();
            obj["metadata"]["namespace"] = before["metadata"]["namespace"].clone();
            obj["metadata"]["uid"] = before["metadata"]["uid"].clone();
            obj["metadata"]["resourceVersion"] = before["metadata"]["resourceVersion"].clone();
            (StatusCode::OK, store.update(plural, obj))
        }
        _ => status(
            StatusCode::METHOD_NOT_ALLOWED,
            "MethodNotAllowed",
            format!("{method} is not served here"),
        ),
    }
}

/// A watch of `plural` (in `namespace`, or all) from resource version `from`: every later change as a
/// JSON line, the connection held open for more.
fn watch_response(
    fake: Arc<Fake>,
    plural: &'static str,
    namespace: Option<String>,
    from: u64,
) -> Response {
    let latest = fake.store().collections[plural].latest.subscribe();
    let stream = futures::stream::unfold(
        (fake, from, latest),
        move |(fake, mut after, mut latest)| {
            let namespace = namespace.clone();
            async move {
                loop {
                    latest.borrow_and_update();
                    if let Some((chunk, last)) = fake.changes_after(plural, after) {
                        after = last;
                        let chunk = match &namespace {
                            None => chunk,
                            Some(ns) => only_namespace(&chunk, ns),
                        };
                        if !chunk.is_empty() {
                            return Some((Ok::<_, Infallible>(chunk), (fake, after, latest)));
                        }
                    }
                    latest.changed().await.ok()?;
                }
            }
        },
    );
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from_stream(stream))
        .expect("valid response")
}

/// The lines of `chunk` about objects in `namespace` (namespaced watches are rare here: the operator
/// watches every namespace by default).
fn only_namespace(chunk: &Bytes, namespace: &str) -> Bytes {
    let mut out = Vec::new();
    for line in chunk.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
        let event: Value = serde_json::from_slice(line).unwrap_or(Value::Null);
        if event["object"]["metadata"]["namespace"] == namespace {
            out.extend_from_slice(line);
            out.push(b'\n');
        }
    }
    Bytes::from(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_name_collection_namespace_object_and_subresource() {
        assert_eq!(
            parse_path("/apis/cache.example.com/v1alpha1/namespaces/ns/memcacheds/a/status"),
            Some(Target {
                plural: "memcacheds",
                namespace: Some("ns"),
                name: Some("a"),
                subresource: Some("status")
            })
        );
        assert_eq!(
            parse_path("/api/v1/pods"),
            Some(Target {
                plural: "pods",
                namespace: None,
                name: None,
                subresource: None
            })
        );
        assert_eq!(parse_path("/apis/monitoring.coreos.com/v1"), None);
    }

    #[test]
    fn writes_bump_versions_and_generations_and_unchanged_writes_are_no_ops() {
        let (kubelet, mut workloads) = mpsc::unbounded_channel();
        let fake = Fake::new(Duration::ZERO, kubelet);
        let mut store = fake.store();
        let created = store
            .create(
                "deployments",
                json!({"metadata": {"name": "a", "namespace": "ns"}, "spec": {"replicas": 1}}),
            )
            .unwrap();
        assert_eq!(created["metadata"]["generation"], 1);
        assert_eq!(
            workloads.try_recv().unwrap(),
            ("deployments", "ns".into(), "a".into())
        );
        let same = store.update("deployments", created.clone());
        assert_eq!(
            same["metadata"]["resourceVersion"],
            created["metadata"]["resourceVersion"]
        );
        assert!(workloads.try_recv().is_err(), "nothing changed");
        let mut scaled = created.clone();
        scaled["spec"]["replicas"] = json!(2);
        let scaled = store.update("deployments", scaled);
        assert_eq!(scaled["metadata"]["generation"], 2);
        assert_ne!(
            scaled["metadata"]["resourceVersion"],
            created["metadata"]["resourceVersion"]
        );
        assert!(workloads.try_recv().is_ok());
        drop(store);
        let (lines, _) = fake.changes_after("deployments", 0).unwrap();
        let events: Vec<&str> = std::str::from_utf8(&lines)
            .unwrap()
            .lines()
            .map(|l| {
                if l.contains("ADDED") {
                    "ADDED"
                } else {
                    "MODIFIED"
                }
            })
            .collect();
        assert_eq!(events, ["ADDED", "MODIFIED"]);
    }
}
