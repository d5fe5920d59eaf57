//! Events in the test namespace, and the leader Lease.

use std::collections::BTreeSet;

use serde_json::Value;

use crate::kubectl::{items, truncate, try_kubectl_json};
use crate::names::{LEASE, OPERATOR_NS};

/// An event from either events.k8s.io/v1 (`regarding`) or core/v1 (`involvedObject`).
pub struct Event {
    pub type_: String,
    pub reason: String,
    pub kind: String,
    pub name: String,
    pub uid: String,
    pub note: String,
}

pub fn list_events(ns: &str) -> Result<Vec<Event>, String> {
    let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
    let mut events = Vec::new();
    let mut errors = Vec::new();
    match try_kubectl_json(&["get", "events.events.k8s.io", "-n", ns, "-o", "json"]) {
        Ok(list) => events.extend(items(&list).iter().map(|e| Event {
            type_: text(&e["type"]),
            reason: text(&e["reason"]),
            kind: text(&e["regarding"]["kind"]),
            name: text(&e["regarding"]["name"]),
            uid: text(&e["regarding"]["uid"]),
            note: text(&e["note"]),
        })),
        Err(e) => errors.push(e),
    }
    match try_kubectl_json(&["get", "events", "-n", ns, "-o", "json"]) {
        Ok(list) => events.extend(items(&list).iter().map(|e| Event {
            type_: text(&e["type"]),
            reason: text(&e["reason"]),
            kind: text(&e["involvedObject"]["kind"]),
            name: text(&e["involvedObject"]["name"]),
            uid: text(&e["involvedObject"]["uid"]),
            note: text(&e["message"]),
        })),
        Err(e) => errors.push(e),
    }
    if errors.len() == 2 {
        return Err(errors.join("; "));
    }
    Ok(events)
}

pub fn summarize_events(events: &[Event]) -> String {
    if events.is_empty() {
        return "<none>".into();
    }
    let seen: BTreeSet<String> = events
        .iter()
        .map(|e| {
            format!(
                "{} {} {}/{}: {}",
                e.type_,
                e.reason,
                e.kind,
                e.name,
                truncate(&e.note, 100)
            )
        })
        .collect();
    truncate(&seen.into_iter().collect::<Vec<_>>().join(" | "), 3000)
}

/// `spec.holderIdentity` (empty when unheld) and `spec.leaseDurationSeconds` of the leader Lease.
pub fn lease_holder() -> Result<(String, Option<i64>), String> {
    let lease = try_kubectl_json(&[
        "get",
        "leases.coordination.k8s.io",
        LEASE,
        "-n",
        OPERATOR_NS,
        "-o",
        "json",
    ])?;
    Ok((
        lease["spec"]["holderIdentity"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
        lease["spec"]["leaseDurationSeconds"].as_i64(),
    ))
}

pub fn holder_contains(identity: &str) -> Result<(), String> {
    let (holder, _) = lease_holder()?;
    if holder.contains(identity) {
        Ok(())
    } else {
        Err(format!(
            "spec.holderIdentity is {holder:?}, want it to contain {identity:?}"
        ))
    }
}

/// `Ok` once an event in `ns` matches `pred`; else the events seen.
pub fn expect_event(ns: &str, pred: impl Fn(&Event) -> bool) -> Result<(), String> {
    let events = list_events(ns)?;
    if events.iter().any(pred) {
        Ok(())
    } else {
        Err(format!("events in {ns}: {}", summarize_events(&events)))
    }
}
