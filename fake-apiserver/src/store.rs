//! The fake's objects: one store per collection, keyed by namespace and name, with a resource version
//! per change, the history of changes that watches replay, and hooks that see every change (the bench's
//! stand-in kubelet and its progress tracking use them).

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use axum::http::StatusCode;
use bytes::Bytes;
use serde_json::{Value, json};
use tokio::sync::watch;

use crate::collections::{Collection, OWN};
use crate::request::Req;
use crate::selector::Selector;

/// A fixed timestamp for every time field the fake writes: nothing the operator does depends on it.
pub const TIMESTAMP: &str = "2026-01-01T00:00:00Z";

/// A request the store refuses, as the API server's `Status` answer says it.
#[derive(Clone, Debug, thiserror::Error)]
#[error("{reason} ({code}): {message}")]
pub struct Refusal {
    pub code: StatusCode,
    pub reason: &'static str,
    pub message: String,
}

impl Refusal {
    pub fn new(code: StatusCode, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            reason,
            message: message.into(),
        }
    }

    pub fn not_found(plural: &str, name: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "NotFound",
            format!("{plural} \"{name}\" not found"),
        )
    }

    /// The `Status` object the API server answers with.
    pub fn to_status(&self) -> Value {
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
               "message": self.message, "reason": self.reason, "code": self.code.as_u16()})
    }
}

/// What a change did to an object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChangeKind {
    Added,
    Modified,
    Deleted,
}

impl ChangeKind {
    /// The watch event's `type`.
    fn event_type(self) -> &'static str {
        match self {
            Self::Added => "ADDED",
            Self::Modified => "MODIFIED",
            Self::Deleted => "DELETED",
        }
    }
}

/// One change, as the hooks see it.
#[derive(Debug)]
pub struct Change<'a> {
    pub plural: &'static str,
    pub kind: ChangeKind,
    /// The object as stored (as it was, for a deletion), with its new resource version.
    pub object: &'a Value,
    /// Whether its spec changed: always for an addition, never for a deletion.
    pub spec_changed: bool,
}

/// A function called with every change, under the store's lock.
pub type Hook = Box<dyn FnMut(&Change<'_>) + Send>;

/// One change as watches replay it.
struct Event {
    resource_version: u64,
    namespace: String,
    /// The object's labels, for the watches' selectors.
    labels: Value,
    /// The watch line, full object.
    line: Bytes,
    /// The `metadata` of the object, for metadata-only watches.
    metadata: Value,
    event_type: &'static str,
}

/// One collection's objects and history.
struct Objects {
    collection: Collection,
    objects: BTreeMap<(String, String), Value>,
    history: Vec<Event>,
    /// The resource version of the latest change, for open watches to wake on.
    latest: watch::Sender<u64>,
}

/// What a watch asks for: which objects, from which version, in which form.
#[derive(Clone, Debug)]
pub struct WatchFilter {
    pub namespace: Option<String>,
    pub selector: Selector,
    pub metadata_only: bool,
}

/// Behaviour the tests switch at run time.
#[derive(Debug, Default)]
pub(crate) struct Settings {
    /// The operator's CRD is not installed: its API group answers `404 page not found`.
    pub crd_missing: bool,
    /// List paths answered after this delay, as a large list or a busy API server would be.
    pub slow_lists: Vec<(String, Duration)>,
    /// The plurals of the CRD's collections the cluster serves (see [`Collection::crd`]).
    pub installed: Vec<&'static str>,
}

/// Every object, every request, and what the tests switched.
pub struct Store {
    resource_version: u64,
    uids: u64,
    /// Watches from a resource version below this one are answered 410 `Expired` (a restarted server).
    expired_below: u64,
    /// Counts the times the server serving the open watches went away ([`Store::end_watches`]): a watch
    /// started before sends nothing more.
    watch_epoch: u64,
    collections: HashMap<&'static str, Objects>,
    pub(crate) requests: Vec<Req>,
    hooks: Vec<Hook>,
    pub(crate) settings: Settings,
}

impl Default for Store {
    /// A store of the fake's own collections only ([`OWN`]).
    fn default() -> Self {
        Self::serving(&[])
    }
}

impl Store {
    /// An empty store of the fake's own collections and of `children`, the kinds the caller's operator
    /// creates.
    pub fn serving(children: &[Collection]) -> Self {
        let collections = OWN
            .iter()
            .chain(children)
            .map(|&collection| {
                let objects = Objects {
                    collection,
                    objects: BTreeMap::new(),
                    history: Vec::new(),
                    latest: watch::Sender::new(0),
                };
                (collection.plural, objects)
            })
            .collect();
        Self {
            resource_version: 100,
            uids: 0,
            expired_below: 0,
            watch_epoch: 0,
            collections,
            requests: Vec::new(),
            hooks: Vec::new(),
            settings: Settings::default(),
        }
    }

    /// The collection named `plural` in `api_version`, if served.
    pub fn find(&self, api_version: &str, plural: &str) -> Option<Collection> {
        self.collections
            .get(plural)
            .map(|objects| objects.collection)
            .filter(|c| c.api_version == api_version)
    }

    /// Whether the cluster serves `collection`: a CRD's only when its CRD is installed.
    pub fn serves(&self, collection: &Collection) -> bool {
        !collection.crd || self.settings.installed.contains(&collection.plural)
    }

    /// The collections of `api_version` the cluster serves, by plural.
    pub fn served_in(&self, api_version: &str) -> Vec<Collection> {
        let mut served: Vec<_> = self
            .collections
            .values()
            .map(|objects| objects.collection)
            .filter(|c| c.api_version == api_version && self.serves(c))
            .collect();
        served.sort_by_key(|c| c.plural);
        served
    }

    /// The collection whose objects have `api_version` and `kind`, if served.
    pub fn find_kind(&self, api_version: &str, kind: &str) -> Option<Collection> {
        self.collections
            .values()
            .map(|objects| objects.collection)
            .find(|c| c.api_version == api_version && c.kind == kind)
    }
}

/// An object's namespace and name.
pub fn key_of(obj: &Value) -> (String, String) {
    let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
    (
        text(&obj["metadata"]["namespace"]),
        text(&obj["metadata"]["name"]),
    )
}

impl Store {
    /// Every request so far, in order of arrival.
    pub fn requests(&self) -> &[Req] {
        &self.requests
    }

    /// Calls `hook` with every change from now on.
    pub fn on_change(&mut self, hook: Hook) {
        self.hooks.push(hook);
    }

    fn collection(&self, plural: &str) -> Result<&Objects, Refusal> {
        self.collections.get(plural).ok_or_else(|| {
            Refusal::new(
                StatusCode::NOT_FOUND,
                "NotFound",
                format!("the fake API server has no collection {plural}"),
            )
        })
    }

    pub fn get(&self, plural: &str, namespace: &str, name: &str) -> Option<&Value> {
        self.collections
            .get(plural)?
            .objects
            .get(&(namespace.to_owned(), name.to_owned()))
    }

    /// Every object of `plural`, by namespace and name.
    pub fn objects(&self, plural: &str) -> impl Iterator<Item = &Value> {
        self.collections
            .get(plural)
            .into_iter()
            .flat_map(|c| c.objects.values())
    }

    /// Creates `obj` in `plural`: a name from `generateName` if it has none; uid, generation and
    /// creation time filled in unless given (seeded objects keep theirs; the HTTP route clears what a
    /// client may not set).
    pub fn create(&mut self, plural: &str, mut obj: Value) -> Result<Value, Refusal> {
        let collection = self.collection(plural)?;
        if obj["metadata"]["name"].as_str().is_none() {
            let prefix = obj["metadata"]["generateName"].as_str().unwrap_or("obj-");
            obj["metadata"]["name"] = json!(format!("{prefix}{:05}", self.uids + 1));
        }
        let key = key_of(&obj);
        if collection.objects.contains_key(&key) {
            return Err(Refusal::new(
                StatusCode::CONFLICT,
                "AlreadyExists",
                format!("{plural} \"{}\" already exists", key.1),
            ));
        }
        self.uids += 1;
        let meta = &mut obj["metadata"];
        if meta["uid"].as_str().is_none() {
            meta["uid"] = json!(format!("00000000-0000-0000-0000-{:012}", self.uids));
        }
        if meta["creationTimestamp"].as_str().is_none() {
            meta["creationTimestamp"] = json!(TIMESTAMP);
        }
        if meta["generation"].as_i64().is_none() {
            meta["generation"] = json!(1);
        }
        Ok(self.commit(plural, obj, ChangeKind::Added, true))
    }

    /// Replaces the stored object by `changed`, if it differs: the generation goes up when the spec
    /// changed, and an unchanged write is a no-op (no new version, no watch event), as on the API server.
    pub fn update(&mut self, plural: &str, mut changed: Value) -> Result<Value, Refusal> {
        let key = key_of(&changed);
        let old = self
            .collection(plural)?
            .objects
            .get(&key)
            .ok_or_else(|| Refusal::not_found(plural, &key.1))?;
        // The resource version is the server's: a write carrying the stored one changes nothing by it.
        changed["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"].clone();
        if *old == changed {
            return Ok(changed);
        }
        // The last finalizer of an object being deleted is gone: the object goes, as on the API server.
        let meta = &changed["metadata"];
        if meta["deletionTimestamp"].is_string()
            && meta["finalizers"].as_array().is_none_or(Vec::is_empty)
        {
            return Ok(self.commit(plural, changed, ChangeKind::Deleted, false));
        }
        let spec_changed = old.get("spec") != changed.get("spec");
        if spec_changed {
            let generation = old["metadata"]["generation"].as_i64().unwrap_or(1);
            changed["metadata"]["generation"] = json!(generation + 1);
        }
        Ok(self.commit(plural, changed, ChangeKind::Modified, spec_changed))
    }

    /// Changes the stored object `namespace/name` of `plural` with `change`, as [`Store::update`].
    pub fn modify(
        &mut self,
        plural: &str,
        namespace: &str,
        name: &str,
        change: impl FnOnce(&mut Value),
    ) -> Result<Value, Refusal> {
        let mut obj = self
            .get(plural, namespace, name)
            .cloned()
            .ok_or_else(|| Refusal::not_found(plural, name))?;
        change(&mut obj);
        self.update(plural, obj)
    }

    /// Deletes `namespace/name` of `plural` at once, whatever its finalizers (no graceful deletion).
    pub fn delete(&mut self, plural: &str, namespace: &str, name: &str) -> Option<Value> {
        let obj = self.get(plural, namespace, name)?.clone();
        Some(self.commit(plural, obj, ChangeKind::Deleted, false))
    }

    /// The list of `plural` (in `namespace`, or all) that `selector` selects, at the current version.
    pub(crate) fn list(
        &self,
        plural: &str,
        namespace: Option<&str>,
        selector: &Selector,
        metadata_only: bool,
    ) -> Result<Value, Refusal> {
        let collection = self.collection(plural)?;
        let items: Vec<Value> = collection
            .objects
            .iter()
            .filter(|((ns, _), obj)| {
                namespace.is_none_or(|n| n == ns) && selector.matches(&obj["metadata"]["labels"])
            })
            .map(|(_, obj)| {
                if metadata_only {
                    partial_object_metadata(&obj["metadata"])
                } else {
                    obj.clone()
                }
            })
            .collect();
        let (api_version, kind) = if metadata_only {
            ("meta.k8s.io/v1", "PartialObjectMetadataList".to_owned())
        } else {
            (
                collection.collection.api_version,
                format!("{}List", collection.collection.kind),
            )
        };
        Ok(json!({"apiVersion": api_version, "kind": kind,
               "metadata": {"resourceVersion": self.resource_version.to_string()}, "items": items}))
    }

    /// What a restarted API server forgets: every resource version handed out so far.
    pub(crate) fn expire_versions(&mut self) {
        self.resource_version += 1000;
        self.expired_below = self.resource_version;
    }

    /// The server that serves the open watches is gone (restarted, vanished, or down): from now on they
    /// send nothing, whatever changes. Their connections are cut or frozen too, but a connection's task
    /// may still be writing when that is asked, and would then send a change made after it (an instance
    /// created "after the restart" reaching the operator over the dead server's watch). Called under the
    /// same lock as every change, this leaves no such window.
    pub(crate) fn end_watches(&mut self) {
        self.watch_epoch += 1;
    }

    /// Which server the watches started now are served by (see [`Store::end_watches`]).
    pub(crate) fn watch_epoch(&self) -> u64 {
        self.watch_epoch
    }

    /// Whether a watch from `from` must be answered 410 `Expired`, with the message saying so.
    pub(crate) fn expired(&self, from: u64) -> Option<String> {
        (from < self.expired_below)
            .then(|| format!("too old resource version: {from} ({})", self.expired_below))
    }

    /// Open watches of `plural` wake on what this sends.
    pub(crate) fn subscribe(&self, plural: &str) -> Option<watch::Receiver<u64>> {
        Some(self.collections.get(plural)?.latest.subscribe())
    }

    /// The watch lines of `plural` after resource version `after` that `filter` selects, as one chunk
    /// (empty when none is selected), and the last version looked at; `None` when nothing changed since.
    pub(crate) fn changes_after(
        &self,
        plural: &str,
        after: u64,
        filter: &WatchFilter,
    ) -> Option<(Bytes, u64)> {
        let history = &self.collections.get(plural)?.history;
        let start = history.partition_point(|e| e.resource_version <= after);
        let changes = &history[start..];
        let last = changes.last()?.resource_version;
        let mut chunk = Vec::new();
        for event in changes.iter().filter(|e| {
            filter.namespace.as_ref().is_none_or(|n| *n == e.namespace)
                && filter.selector.matches(&e.labels)
        }) {
            if filter.metadata_only {
                let line = json!({"type": event.event_type,
                                  "object": partial_object_metadata(&event.metadata)});
                chunk.extend_from_slice(&line_of(&line));
            } else {
                chunk.extend_from_slice(&event.line);
            }
        }
        Some((Bytes::from(chunk), last))
    }

    /// Stores `obj` under a new resource version (or removes it, for a deletion), records the change for
    /// watches and tells the hooks.
    fn commit(
        &mut self,
        plural: &str,
        mut obj: Value,
        kind: ChangeKind,
        spec_changed: bool,
    ) -> Value {
        self.resource_version += 1;
        let rv = self.resource_version;
        let Some(objects) = self.collections.get_mut(plural) else {
            return obj;
        };
        let collection = objects.collection;
        obj["metadata"]["resourceVersion"] = json!(rv.to_string());
        obj["apiVersion"] = json!(collection.api_version);
        obj["kind"] = json!(collection.kind);
        let (namespace, _) = key_of(&obj);
        objects.history.push(Event {
            resource_version: rv,
            namespace,
            labels: obj["metadata"]["labels"].clone(),
            line: line_of(&json!({"type": kind.event_type(), "object": &obj})),
            metadata: obj["metadata"].clone(),
            event_type: kind.event_type(),
        });
        if kind == ChangeKind::Deleted {
            objects.objects.remove(&key_of(&obj));
        } else {
            objects.objects.insert(key_of(&obj), obj.clone());
        }
        objects.latest.send_replace(rv);
        let change = Change {
            plural: collection.plural,
            kind,
            object: &obj,
            spec_changed,
        };
        for hook in &mut self.hooks {
            hook(&change);
        }
        obj
    }
}

/// `metadata` as a metadata-only list or watch returns its object.
pub fn partial_object_metadata(metadata: &Value) -> Value {
    json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata", "metadata": metadata})
}

/// `value` as one JSON line of a watch.
fn line_of(value: &Value) -> Bytes {
    let mut line = serde_json::to_vec(value).unwrap_or_default();
    line.push(b'\n');
    Bytes::from(line)
}

#[cfg(test)]
mod tests;
