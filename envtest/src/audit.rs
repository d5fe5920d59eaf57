//! The API server's audit log, read back to count requests exactly: by user, verb, resource and
//! subresource, since a [`Mark`] or within a time window.
//!
//! Why the audit log: it is the server's own record of every request, whoever made it and however it
//! was made (HTTP/2 streams, retries, watches restarted by a client library), so a count from it cannot
//! drift from what the operator really did, unlike counters kept by the operator or a proxy.
//!
//! Each request is counted once, by its `auditID`: the policy omits the RequestReceived stage, a watch
//! logs ResponseStarted when it begins and ResponseComplete when it ends, everything else logs
//! ResponseComplete only. A request belongs to the window of its `requestReceivedTimestamp`.
//!
//! Timing: in blocking mode the server writes a request's line as its handler returns, which can be a
//! hair after the client has the response. Read a moment (100 ms is plenty) after the last request.

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
pub use k8s_openapi::jiff::Timestamp;
use serde::Deserialize;

/// The audit log file of a control plane.
#[derive(Clone, Debug)]
pub struct AuditLog {
    path: PathBuf,
}

/// A point in the log: its length and the time when taken. Requests received after it are "since" it.
#[derive(Clone, Copy, Debug)]
pub struct Mark {
    offset: u64,
    at: Timestamp,
}

impl Mark {
    pub fn at(&self) -> Timestamp {
        self.at
    }
}

/// One request, from its audit event(s).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuditEvent {
    pub audit_id: String,
    pub user: String,
    pub groups: Vec<String>,
    pub user_agent: String,
    pub verb: String,
    /// The resource (`pods`, `memcacheds`), or for a non-resource request (discovery, `/readyz`) its path.
    pub resource: String,
    pub subresource: String,
    pub api_group: String,
    pub namespace: String,
    pub name: String,
    /// The `fieldManager` of a write that names one (server-side apply does), from the request URI; empty
    /// when none. It tells apart two writers of one user, e.g. the operator's reconciler and its stats
    /// collector patching the same status.
    pub field_manager: String,
    pub code: u16,
    pub received: Timestamp,
    /// When the server answered, for a request logged at `ResponseComplete` first (every request but a
    /// watch, whose first line is `ResponseStarted`).
    pub completed: Option<Timestamp>,
}

/// What requests are counted by.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RequestKey {
    pub user: String,
    pub verb: String,
    pub resource: String,
    pub subresource: String,
}

/// Request counts by [`RequestKey`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RequestCounts(pub BTreeMap<RequestKey, usize>);

impl AuditLog {
    pub fn new(path: &Path) -> AuditLog {
        AuditLog {
            path: path.to_owned(),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The end of the log now.
    pub fn mark(&self) -> Result<Mark> {
        let at = Timestamp::now();
        let offset = std::fs::metadata(&self.path).map(|m| m.len()).unwrap_or(0);
        Ok(Mark { offset, at })
    }

    /// Every request in the log.
    pub fn read_all(&self) -> Result<Vec<AuditEvent>> {
        self.read_from(0)
    }

    /// The requests received since `mark`.
    pub fn read_since(&self, mark: &Mark) -> Result<Vec<AuditEvent>> {
        let mut events = self.read_from(mark.offset)?;
        events.retain(|e| e.received >= mark.at);
        Ok(events)
    }

    /// The requests `user` made since `mark`, counted.
    pub fn count_since(&self, mark: &Mark, user: &str) -> Result<RequestCounts> {
        Ok(count(
            self.read_since(mark)?.iter().filter(|e| e.user == user),
        ))
    }

    /// The requests received in `[from, to)`, by `user` if given, counted.
    pub fn count_window(
        &self,
        user: Option<&str>,
        from: Timestamp,
        to: Timestamp,
    ) -> Result<RequestCounts> {
        let events = self.read_all()?;
        Ok(count(events.iter().filter(|e| {
            e.received >= from && e.received < to && user.is_none_or(|u| e.user == u)
        })))
    }

    /// Complete lines from `offset` on (a line being written is left for the next read), one event per
    /// request.
    fn read_from(&self, offset: u64) -> Result<Vec<AuditEvent>> {
        let mut file = match File::open(&self.path) {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => {
                return Err(e).with_context(|| format!("cannot open {}", self.path.display()));
            }
        };
        file.seek(SeekFrom::Start(offset))?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)
            .with_context(|| format!("cannot read {}", self.path.display()))?;
        let complete = bytes.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
        Ok(parse_lines(&bytes[..complete]))
    }
}

/// One event per request (by audit ID) from JSON lines; lines that are not audit events are skipped.
pub fn parse_lines(bytes: &[u8]) -> Vec<AuditEvent> {
    let mut seen = HashSet::new();
    bytes
        .split(|b| *b == b'\n')
        .filter_map(|line| serde_json::from_slice::<RawEvent>(line).ok())
        .filter(|raw| {
            matches!(
                raw.stage.as_str(),
                "ResponseStarted" | "ResponseComplete" | "Panic"
            )
        })
        .filter(|raw| seen.insert(raw.audit_id.clone()))
        .map(RawEvent::into_event)
        .collect()
}

/// Counts `events` by user, verb, resource and subresource.
pub fn count<'a>(events: impl IntoIterator<Item = &'a AuditEvent>) -> RequestCounts {
    let mut counts = RequestCounts::default();
    for e in events {
        *counts.0.entry(e.key()).or_default() += 1;
    }
    counts
}

impl AuditEvent {
    pub fn key(&self) -> RequestKey {
        RequestKey {
            user: self.user.clone(),
            verb: self.verb.clone(),
            resource: self.resource.clone(),
            subresource: self.subresource.clone(),
        }
    }
}

impl RequestCounts {
    pub fn total(&self) -> usize {
        self.0.values().sum()
    }

    /// Requests with this verb on this resource and subresource ("" for none), whoever made them.
    pub fn get(&self, verb: &str, resource: &str, subresource: &str) -> usize {
        self.0
            .iter()
            .filter(|(k, _)| {
                k.verb == verb && k.resource == resource && k.subresource == subresource
            })
            .map(|(_, n)| n)
            .sum()
    }

    /// Requests with this verb, on anything.
    pub fn verb(&self, verb: &str) -> usize {
        self.0
            .iter()
            .filter(|(k, _)| k.verb == verb)
            .map(|(_, n)| n)
            .sum()
    }

    /// Requests that change something: create, update, patch, delete, deletecollection.
    pub fn writes(&self) -> usize {
        ["create", "update", "patch", "delete", "deletecollection"]
            .iter()
            .map(|v| self.verb(v))
            .sum()
    }
}

impl fmt::Display for RequestCounts {
    /// One line per key: `count verb resource[/subresource] (user)`, then the total.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (k, n) in &self.0 {
            let sub = if k.subresource.is_empty() {
                String::new()
            } else {
                format!("/{}", k.subresource)
            };
            writeln!(f, "{n:6} {:<8} {}{sub}  ({})", k.verb, k.resource, k.user)?;
        }
        write!(f, "{:6} total", self.total())
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawEvent {
    #[serde(rename = "auditID")]
    audit_id: String,
    stage: String,
    #[serde(default, rename = "requestURI")]
    request_uri: String,
    #[serde(default)]
    verb: String,
    #[serde(default)]
    user: RawUser,
    #[serde(default)]
    user_agent: String,
    object_ref: Option<RawObjectRef>,
    response_status: Option<RawStatus>,
    request_received_timestamp: Timestamp,
    stage_timestamp: Option<Timestamp>,
}

#[derive(Default, Deserialize)]
struct RawUser {
    #[serde(default)]
    username: String,
    #[serde(default)]
    groups: Vec<String>,
}

#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawObjectRef {
    #[serde(default)]
    resource: String,
    #[serde(default)]
    subresource: String,
    #[serde(default)]
    namespace: String,
    #[serde(default)]
    name: String,
    #[serde(default)]
    api_group: String,
}

#[derive(Deserialize)]
struct RawStatus {
    #[serde(default)]
    code: u16,
}

impl RawEvent {
    fn into_event(self) -> AuditEvent {
        let object = self.object_ref.unwrap_or_default();
        let field_manager = query_parameter(&self.request_uri, "fieldManager")
            .unwrap_or_default()
            .to_owned();
        let resource = if object.resource.is_empty() {
            self.request_uri
                .split('?')
                .next()
                .unwrap_or_default()
                .to_owned()
        } else {
            object.resource
        };
        AuditEvent {
            audit_id: self.audit_id,
            user: self.user.username,
            groups: self.user.groups,
            user_agent: self.user_agent,
            verb: self.verb,
            resource,
            subresource: object.subresource,
            api_group: object.api_group,
            namespace: object.namespace,
            name: object.name,
            field_manager,
            code: self.response_status.map_or(0, |s| s.code),
            received: self.request_received_timestamp,
            completed: self
                .stage_timestamp
                .filter(|_| self.stage == "ResponseComplete"),
        }
    }
}

/// The value of the query parameter `name` of `uri`, as sent (not percent-decoded).
fn query_parameter<'a>(uri: &'a str, name: &str) -> Option<&'a str> {
    let (_, query) = uri.split_once('?')?;
    query
        .split('&')
        .find_map(|pair| pair.strip_prefix(name)?.strip_prefix('='))
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOG: &str = r#"{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"a1","stage":"ResponseComplete","requestURI":"/api/v1/namespaces/ns/pods/p/status?force=true&fieldManager=op-stats","verb":"patch","user":{"username":"system:serviceaccount:x:op","groups":["system:serviceaccounts"]},"userAgent":"op","objectRef":{"resource":"pods","namespace":"ns","name":"p","apiVersion":"v1","subresource":"status"},"responseStatus":{"metadata":{},"code":200},"requestReceivedTimestamp":"2024-01-01T00:00:01.000001Z","stageTimestamp":"2024-01-01T00:00:01.000100Z"}
{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"w1","stage":"ResponseStarted","requestURI":"/api/v1/pods?watch=true","verb":"watch","user":{"username":"system:serviceaccount:x:op"},"objectRef":{"resource":"pods","apiVersion":"v1"},"responseStatus":{"metadata":{},"code":200},"requestReceivedTimestamp":"2024-01-01T00:00:02Z","stageTimestamp":"2024-01-01T00:00:02Z"}
{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"w1","stage":"ResponseComplete","requestURI":"/api/v1/pods?watch=true","verb":"watch","user":{"username":"system:serviceaccount:x:op"},"objectRef":{"resource":"pods","apiVersion":"v1"},"responseStatus":{"metadata":{},"code":200},"requestReceivedTimestamp":"2024-01-01T00:00:02Z","stageTimestamp":"2024-01-01T00:05:02Z"}
{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"d1","stage":"ResponseComplete","requestURI":"/apis/apps/v1?timeout=32s","verb":"get","user":{"username":"envtest-admin"},"responseStatus":{"metadata":{},"code":200},"requestReceivedTimestamp":"2024-01-01T00:00:03Z","stageTimestamp":"2024-01-01T00:00:03Z"}
{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"#;

    #[test]
    fn one_event_per_request_and_a_partial_line_is_ignored() {
        let events = parse_lines(LOG.as_bytes());
        assert_eq!(events.len(), 3);
        assert_eq!(events[0].subresource, "status");
        assert_eq!(events[0].code, 200);
        assert_eq!(events[0].field_manager, "op-stats");
        assert_eq!(
            events[1].field_manager, "",
            "a watch names no field manager"
        );
        assert_eq!(
            events[0].completed,
            Some("2024-01-01T00:00:01.0001Z".parse().unwrap())
        );
        assert_eq!(events[1].verb, "watch");
        assert_eq!(
            events[1].completed, None,
            "a watch's first line is its start"
        );
        assert_eq!(events[2].resource, "/apis/apps/v1");
    }

    #[test]
    fn counts_by_user_verb_resource_and_subresource() {
        let events = parse_lines(LOG.as_bytes());
        let op = count(
            events
                .iter()
                .filter(|e| e.user == "system:serviceaccount:x:op"),
        );
        assert_eq!(op.total(), 2);
        assert_eq!(op.get("patch", "pods", "status"), 1);
        assert_eq!(op.get("patch", "pods", ""), 0);
        assert_eq!(op.get("watch", "pods", ""), 1);
        assert_eq!(op.writes(), 1);
        assert!(op.to_string().ends_with("     2 total"), "{op}");
    }

    #[test]
    fn a_mark_keeps_later_requests_only() {
        let dir = std::env::temp_dir().join(format!("envtest-audit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("audit.log");
        let (first, rest) = LOG.split_once('\n').unwrap();
        std::fs::write(&path, format!("{first}\n")).unwrap();
        let log = AuditLog::new(&path);
        let mark = Mark {
            offset: log.mark().unwrap().offset,
            at: "2024-01-01T00:00:01.5Z".parse().unwrap(),
        };
        std::fs::write(&path, format!("{first}\n{rest}")).unwrap();
        let since = log.read_since(&mark).unwrap();
        assert_eq!(
            since
                .iter()
                .map(|e| e.audit_id.as_str())
                .collect::<Vec<_>>(),
            ["w1", "d1"]
        );
        let window = log
            .count_window(
                Some("envtest-admin"),
                "2024-01-01T00:00:00Z".parse().unwrap(),
                "2024-01-01T00:00:04Z".parse().unwrap(),
            )
            .unwrap();
        assert_eq!(window.total(), 1);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
