//! Checks on the requests the fake recorded and on the operator's metrics.

use axum::http::Method;
use fake_apiserver::{Fake, Req};
use serde_json::Value;

use crate::cluster::paths::{
    APPLY, DEPLOYMENT, DIGEST_KEY, EVENTS, HEADLESS, LEASE, LEASES, MONITORING, PDB, SERVICE,
};

pub const MANAGED: &str = "app.kubernetes.io/managed-by=memcached-operator";
/// The selector of the watches of same-named objects the operator does not manage.
pub const UNMANAGED: &str = "app.kubernetes.io/managed-by!=memcached-operator";
pub const SELECTOR: &str = "app.kubernetes.io/instance=cache,app.kubernetes.io/name=memcached";

pub fn of<'a>(requests: &'a [Req], method: &Method, path: &str) -> Vec<&'a Req> {
    requests.iter().filter(|r| r.is(method, path)).collect()
}

pub fn conditions(status: &Value) -> Vec<String> {
    status["conditions"]
        .as_array()
        .map(|cs| {
            cs.iter()
                .filter_map(|c| c["type"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// A server-side apply that creates a child of the default instance: not forced (an object of that name
/// that is not the operator's answers a conflict rather than being taken over), owned by the instance.
pub fn assert_created(req: &Req, kind: &str) {
    assert_eq!(req.content_type.as_deref(), Some(APPLY), "{}", req.line());
    assert_eq!(
        req.param("fieldManager"),
        Some("memcached-operator"),
        "{}",
        req.line()
    );
    assert_eq!(req.param("force"), None, "{}", req.line());
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

/// Whether the first reconcile of the default instance is done: its Deployment, both Services and its
/// PodDisruptionBudget applied, and the `Created` event sent.
pub fn children_applied(requests: &[Req]) -> bool {
    !of(requests, &Method::PATCH, *DEPLOYMENT).is_empty()
        && !of(requests, &Method::PATCH, *SERVICE).is_empty()
        && !of(requests, &Method::PATCH, *HEADLESS).is_empty()
        && !of(requests, &Method::PATCH, *PDB).is_empty()
        && !of(requests, &Method::POST, EVENTS).is_empty()
}

/// Whether only the Lease was ever asked for: a standby starts no watch and writes nothing else.
pub fn only_lease_requests(fake: &Fake) -> bool {
    fake.requests().iter().all(|r| r.path == LEASE)
}

/// Nothing was asked of a path the fake does not serve, and nothing was refused, except reads of what
/// the operator creates when it is missing (the Lease, the digest key) and the discovery of a CRD's API
/// the cluster does not serve.
pub fn assert_no_unexpected_requests(fake: &Fake) {
    let unexpected: Vec<String> = fake
        .requests()
        .iter()
        .filter(|r| {
            let refused = !(200..300).contains(&r.status);
            let lease_not_created_yet = r.status == 404 && r.is(&Method::GET, LEASE);
            // Discovery of an API group the cluster does not serve.
            let no_service_monitors = r.status == 404 && r.is(&Method::GET, MONITORING);
            let key_not_made_yet = r.status == 404 && r.is(&Method::GET, DIGEST_KEY);
            refused && !lease_not_created_yet && !no_service_monitors && !key_not_made_yet
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
pub fn sample(text: &str, metric: &str) -> Option<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix(metric)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

/// The requests, one per line.
pub fn lines(requests: &[Req]) -> String {
    requests
        .iter()
        .map(Req::line)
        .collect::<Vec<_>>()
        .join("\n")
}

/// The bodies of `requests`, one per line, to tell repeated writes apart in a failure's message.
pub fn bodies(requests: &[&Req]) -> String {
    requests
        .iter()
        .map(|r| format!("{} {}: {}", r.method, r.path, r.body))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Writes other than to the Lease.
pub fn writes(requests: &[Req]) -> Vec<&Req> {
    requests
        .iter()
        .filter(|r| r.method != Method::GET && r.path != LEASE && r.path != LEASES)
        .collect()
}
