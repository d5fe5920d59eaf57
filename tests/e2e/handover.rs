//! Step 25: warm handovers. Three cases, one instance each:
//! - a Deployment rollout of two servers (a changed memcached flag): each new pod waits behind the handover
//!   readiness gate while the operator copies the server it replaces, then takes that server's slot;
//! - a StatefulSet rollout of two servers: each server's items go through the operator's spare server
//!   (`<name>-handover`) to the pod that replaces it under the same name;
//! - a scale-down 3 -> 2 of a Deployment declaring `clients.hashing: jump`: the drained server's items are
//!   copied to their owners under the shorter list before its pod goes.
//!
//! Keys are placed by jump hash over the slots (the operator's own `hashing` module, checked against the
//! library in tests/hashing.rs) before the change, and read back over the slots after it. Checked: every
//! key on the server that owns it afterwards, the rollouts' pods all replaced with the gate condition
//! `Copied`, and the `HandedOver` events.
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

use memcached_operator::hashing::{Placement, Scheme};
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
/// Keys written, in all.
const KEYS: usize = 60;

/// One change to a settled instance, and what it must keep.
struct Case {
    name: &'static str,
    workload: &'static str,
    hashing: &'static str,
    size: (usize, usize),
    memory_mb: (u32, u32),
}

const CASES: [Case; 3] = [
    Case {
        name: HANDOVER_NAME,
        workload: "Deployment",
        hashing: "unknown",
        size: (2, 2),
        memory_mb: (64, 65),
    },
    Case {
        name: "memcached-handover-sts",
        workload: "StatefulSet",
        hashing: "unknown",
        size: (2, 2),
        memory_mb: (64, 65),
    },
    Case {
        name: "memcached-handover-scale",
        workload: "Deployment",
        hashing: "jump",
        size: (3, 2),
        memory_mb: (64, 64),
    },
];

impl Case {
    fn rollout(&self) -> bool {
        self.memory_mb.0 != self.memory_mb.1
    }

    fn instance(&self, ns: &str, size: usize, memory_mb: u32) -> String {
        [
            format!("apiVersion: {API_VERSION}"),
            "kind: Memcached".to_owned(),
            "metadata:".to_owned(),
            format!("  name: {}", self.name),
            format!("  namespace: {ns}"),
            "spec:".to_owned(),
            format!("  size: {size}"),
            format!("  workload: {}", self.workload),
            "  memcached:".to_owned(),
            format!("    maxMemoryMB: {memory_mb}"),
            "  clients:".to_owned(),
            format!("    hashing: {}", self.hashing),
            "  scaling:".to_owned(),
            "    drainSeconds: 2".to_owned(),
        ]
        .join("\n")
            + "\n"
    }
}

fn key(i: usize) -> String {
    format!("e2e-handover-{i}")
}

/// The keys by the slot that owns them among `count` slots (jump hash over the slot order).
fn placed(count: usize) -> Vec<Vec<String>> {
    let slots: Vec<String> = (0..count)
        .map(|slot| format!("slot-{slot}:{PORT}"))
        .collect();
    let placement = Placement::new(Scheme::Jump, &slots).expect("host:port entries");
    let mut by_slot = vec![Vec::new(); count];
    for i in 0..KEYS {
        let slot = placement.server(key(i).as_bytes()).expect("a slot");
        by_slot[slot].push(key(i));
    }
    by_slot
}

/// (slot, pod name) of every slot in `status.servers`, once there are `size`.
fn slots(ns: &str, name: &str, size: usize) -> Result<Vec<(usize, String)>, String> {
    let mc = get_required(MC, ns, name)?;
    let servers = mc["status"]["servers"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let mut slots: Vec<(usize, String)> = servers
        .iter()
        .filter_map(|s| {
            Some((
                usize::try_from(s["slot"].as_u64()?).ok()?,
                s["pod"].as_str()?.to_owned(),
            ))
        })
        .collect();
    slots.sort();
    if slots.len() == size && slots.iter().enumerate().all(|(i, (slot, _))| i == *slot) {
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

/// The live pod named `pod` of instance `name`.
fn pod(ns: &str, name: &str, pod: &str) -> Value {
    live_pods(ns, name)
        .unwrap_or_else(|e| panic!("{e}"))
        .into_iter()
        .find(|p| p["metadata"]["name"] == pod)
        .unwrap_or_else(|| panic!("pod {pod} is not live"))
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

/// The live pods' UIDs of instance `name`.
fn uids(ns: &str, name: &str) -> Result<BTreeSet<String>, String> {
    Ok(live_pods(ns, name)?
        .iter()
        .filter_map(|p| p["metadata"]["uid"].as_str().map(str::to_owned))
        .collect())
}

pub fn step_handover(env: &E2e) {
    for case in &CASES {
        handover(env, case);
    }
}

fn handover(env: &E2e, case: &Case) {
    let ns = env.ns.as_str();
    let name = case.name;
    let ((before_size, after_size), (before_mb, after_mb)) = (case.size, case.memory_mb);
    eprintln!(
        "    -- {name}: {} {before_size} -> {after_size} servers, maxMemoryMB {before_mb} -> {after_mb}, \
         hashing {}",
        case.workload, case.hashing
    );
    apply_yaml_ok(&case.instance(ns, before_size, before_mb));
    let before = env.wait(
        &format!("Memcached {name}: {before_size} ready pods in {before_size} slots"),
        secs(180),
        || {
            check_ready_status(ns, name, before_size as i64)?;
            slots(ns, name, before_size)
        },
    );
    let mut copies = true;
    for ((slot, pod_name), keys) in before.iter().zip(placed(before_size)) {
        let pod = pod(ns, name, pod_name);
        copies &= reachable(&pod);
        let mut script = String::new();
        for key in &keys {
            script.push_str(&format!("set {key} 0 0 {}\r\n{key}\r\n", key.len()));
        }
        script.push_str("quit\r\n");
        let out = pod_session(ns, &pod, &script);
        assert_eq!(
            out.matches("STORED").count(),
            keys.len(),
            "sets on pod {pod_name} (slot {slot}): {out:?}"
        );
    }
    eprintln!("    {KEYS} keys placed by jump hash on {before:?}; changing the spec");
    if !copies {
        eprintln!(
            "    NOTE: the pod IPs are not reachable from this machine, where the operator runs: the copies \
             cannot connect, so the step checks that the handovers end cold and say why"
        );
    }

    let old = uids(ns, name).unwrap_or_else(|e| panic!("{e}"));
    apply_yaml_ok(&case.instance(ns, after_size, after_mb));
    let after = env.wait(
        &format!("Memcached {name}: {after_size} ready pods, settled, the change done"),
        secs(300),
        || {
            check_ready_status(ns, name, after_size as i64)?;
            let after = slots(ns, name, after_size)?;
            let now = uids(ns, name)?;
            if now.len() != after_size {
                return Err(format!("{} live pods", now.len()));
            }
            if case.rollout() && !now.is_disjoint(&old) {
                return Err(format!("not every pod replaced yet: {after:?}"));
            }
            Ok(after)
        },
    );

    if case.rollout() {
        let want_reason = if copies { "Copied" } else { "Failed" };
        for (slot, pod_name) in &after {
            let pod = pod(ns, name, pod_name);
            let condition = pod["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|c| c["type"] == GATE)
                .cloned()
                .unwrap_or(Value::Null);
            assert!(
                condition["status"] == "True" && condition["reason"] == want_reason,
                "pod {pod_name} (slot {slot}): condition {GATE} should be True/{want_reason}: {}",
                compact(&condition)
            );
        }
    }
    let (reason, event_type) = if copies {
        ("HandedOver", "Normal")
    } else {
        ("HandoverFailed", "Warning")
    };
    // A rollout hands each slot over; this scale-down the drained server's keys to both others.
    let want = if case.rollout() { after_size } else { 2 };
    let events = env.wait(&format!("{want} {reason} events"), secs(30), || {
        let events = list_events(ns)?;
        // Each event is listed twice: by events.k8s.io and by core/v1.
        let ours: BTreeSet<String> = events
            .iter()
            .filter(|e| e.name == name && e.reason == reason && e.type_ == event_type)
            .map(|e| e.note.clone())
            .collect();
        if ours.len() == want {
            Ok(ours)
        } else {
            Err(summarize_events(&events))
        }
    });
    eprintln!("    {reason}: {events:#?}");

    if copies {
        for ((slot, pod_name), keys) in after.iter().zip(placed(after_size)) {
            let out = pod_session(
                ns,
                &pod(ns, name, pod_name),
                &format!("get {}\r\nquit\r\n", keys.join(" ")),
            );
            assert_eq!(
                out.matches("VALUE e2e-handover-").count(),
                keys.len(),
                "slot {slot}'s keys on its pod {pod_name} after the change: {out:?}"
            );
        }
        eprintln!("    ok: every key is on the server that owns it after the change: {after:?}");
    }
    delete_instance(env, name);
}
