//! Step 25: warm handover of a Deployment rollout. An instance of two servers gets a few keys on each
//! server (the keys of slot N on the pod holding slot N); a changed memcached flag rolls the pods; each new
//! pod waits behind the handover readiness gate while the operator copies the server it replaces, then
//! takes that server's slot. Checked: both pods replaced, each new pod's `cache.example.com/handover`
//! condition, one `HandedOver` event per slot, and every key back on the server now holding its slot.
//!
//! Keys are written to and read from each server directly: on a stand-in kubelet's node (pods are
//! memcached processes on loopback addresses here, see [`crate::telemetry`]) from this machine, elsewhere
//! from inside the pod with busybox `nc`.
//!
//! The operator runs on this machine, so it copies only where pod IPs are routable from here (as the
//! stats collector reads, step 24). Where they are not, each copy ends cold: the step checks that
//! instead (condition reason `Failed`, one `HandoverFailed` Warning per slot, the rollout done) and says
//! so.

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::time::Duration;

use serde_json::Value;

use crate::checks::{check_ready_status, live_pods};
use crate::env::{E2e, delete_instance};
use crate::events::{list_events, summarize_events};
use crate::kubectl::{apply_yaml_ok, compact, get_required, kubectl_ok, secs};
use crate::names::{API_VERSION, APP_NAME, MC, PORT};
use crate::telemetry::{memcached_session, stand_in_node};

pub const HANDOVER_NAME: &str = "memcached-handover";
/// The pod condition the operator sets when a new pod's copy ended (its readiness gate).
const GATE: &str = "cache.example.com/handover";
/// Keys written per slot.
const KEYS: usize = 20;

fn key(slot: i64, i: usize) -> String {
    format!("e2e-handover-{slot}-{i}")
}

fn instance(ns: &str, memory_mb: u32) -> String {
    format!(
        "apiVersion: {API_VERSION}\nkind: Memcached\nmetadata:\n  name: {HANDOVER_NAME}\n  namespace: {ns}\n\
         spec:\n  size: 2\n  memcached:\n    maxMemoryMB: {memory_mb}\n"
    )
}

/// (slot, pod name) of every slot in `status.servers`.
fn slots(ns: &str) -> Result<Vec<(i64, String)>, String> {
    let mc = get_required(MC, ns, HANDOVER_NAME)?;
    let servers = mc["status"]["servers"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let slots: Vec<(i64, String)> = servers
        .iter()
        .filter_map(|s| Some((s["slot"].as_i64()?, s["pod"].as_str()?.to_owned())))
        .collect();
    if slots.len() == 2 {
        Ok(slots)
    } else {
        Err(format!(
            "status.servers: {}",
            compact(&mc["status"]["servers"])
        ))
    }
}

/// Sends `script` (ending with `quit`) to the memcached of `pod` and returns its answers.
fn pod_session(ns: &str, pod: &Value, script: &str) -> String {
    let name = pod["metadata"]["name"].as_str().unwrap_or_default();
    if stand_in_node(pod).is_some() {
        let ip: IpAddr = pod["status"]["podIP"]
            .as_str()
            .and_then(|ip| ip.parse().ok())
            .unwrap_or_else(|| panic!("pod {name} has no IP: {}", compact(&pod["status"])));
        let port = u16::try_from(PORT).unwrap_or(11211);
        memcached_session(SocketAddr::new(ip, port), script).unwrap_or_else(|e| panic!("{e}"))
    } else {
        let shell = format!(
            "printf '{}' | nc -w 5 127.0.0.1 {PORT}",
            script.replace("\r\n", "\\r\\n")
        );
        kubectl_ok(&[
            "exec", "-n", ns, name, "-c", APP_NAME, "--", "sh", "-c", &shell,
        ])
    }
}

/// The live pod named `name`.
fn pod(ns: &str, name: &str) -> Value {
    live_pods(ns, HANDOVER_NAME)
        .unwrap_or_else(|e| panic!("{e}"))
        .into_iter()
        .find(|p| p["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("pod {name} is not live"))
}

/// Whether the operator, on this machine, can reach `pod`'s memcached.
fn reachable(pod: &Value) -> bool {
    pod["status"]["podIP"]
        .as_str()
        .and_then(|ip| ip.parse::<IpAddr>().ok())
        .is_some_and(|ip| {
            let port = u16::try_from(PORT).unwrap_or(11211);
            TcpStream::connect_timeout(&SocketAddr::new(ip, port), Duration::from_secs(2)).is_ok()
        })
}

pub fn step_handover(env: &E2e) {
    let ns = env.ns.as_str();
    apply_yaml_ok(&instance(ns, 64));
    env.wait(
        &format!("Memcached {HANDOVER_NAME}: 2 ready pods in 2 slots"),
        secs(180),
        || check_ready_status(ns, HANDOVER_NAME, 2).and_then(|()| slots(ns)),
    );
    let before = slots(ns).unwrap_or_else(|e| panic!("{e}"));
    let mut copies = true;
    for (slot, name) in &before {
        let pod = pod(ns, name);
        copies &= reachable(&pod);
        let mut script = String::new();
        for i in 0..KEYS {
            let value = key(*slot, i);
            script.push_str(&format!("set {value} 0 0 {}\r\n{value}\r\n", value.len()));
        }
        script.push_str("quit\r\n");
        let out = pod_session(ns, &pod, &script);
        assert_eq!(
            out.matches("STORED").count(),
            KEYS,
            "sets on pod {name} (slot {slot}): {out:?}"
        );
    }
    eprintln!(
        "    {KEYS} keys on each of {before:?}; rolling the pods (memcached.maxMemoryMB 64 -> 65)"
    );
    if !copies {
        eprintln!(
            "    NOTE: the pod IPs are not reachable from this machine, where the operator runs: the copies \
             cannot connect, so the step checks that the rollout ends cold and says why"
        );
    }

    apply_yaml_ok(&instance(ns, 65));
    let old: Vec<&String> = before.iter().map(|(_, name)| name).collect();
    let after = env.wait(
        &format!("Memcached {HANDOVER_NAME}: both pods replaced, 2 ready, settled"),
        secs(300),
        || {
            check_ready_status(ns, HANDOVER_NAME, 2)?;
            let after = slots(ns)?;
            if after.iter().any(|(_, name)| old.contains(&name)) {
                return Err(format!("slots {after:?}, old pods {old:?}"));
            }
            let live = live_pods(ns, HANDOVER_NAME)?;
            if live.len() == 2 {
                Ok(after)
            } else {
                Err(format!("{} live pods", live.len()))
            }
        },
    );

    let want_reason = if copies { "Copied" } else { "Failed" };
    for (slot, name) in &after {
        let pod = pod(ns, name);
        let condition = pod["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["type"] == GATE)
            .cloned()
            .unwrap_or(Value::Null);
        assert!(
            condition["status"] == "True" && condition["reason"] == want_reason,
            "pod {name} (slot {slot}): condition {GATE} should be True/{want_reason}: {}",
            compact(&condition)
        );
    }
    let (reason, event_type) = if copies {
        ("HandedOver", "Normal")
    } else {
        ("HandoverFailed", "Warning")
    };
    let events = env.wait(&format!("one {reason} event per slot"), secs(30), || {
        let events = list_events(ns)?;
        // Each event is listed twice: by events.k8s.io and by core/v1.
        let ours: BTreeSet<String> = events
            .iter()
            .filter(|e| e.name == HANDOVER_NAME && e.reason == reason && e.type_ == event_type)
            .map(|e| e.note.clone())
            .collect();
        if ours.len() == 2 {
            Ok(ours)
        } else {
            Err(summarize_events(&events))
        }
    });
    eprintln!("    {reason}: {events:#?}");

    if copies {
        for (slot, name) in &after {
            let keys: Vec<String> = (0..KEYS).map(|i| key(*slot, i)).collect();
            let out = pod_session(
                ns,
                &pod(ns, name),
                &format!("get {}\r\nquit\r\n", keys.join(" ")),
            );
            assert_eq!(
                out.matches("VALUE e2e-handover-").count(),
                KEYS,
                "slot {slot}'s keys on its new pod {name}: {out:?}"
            );
        }
        eprintln!("    ok: every key of each slot is on the new pod holding the slot: {after:?}");
    }
    delete_instance(env, HANDOVER_NAME);
}
