//! Step 25: warm handovers (issue 23). Five cases, one instance each:
//! - a Deployment rollout of two servers (a changed memcached flag): each new pod waits behind the handover
//!   readiness gate while the operator copies the server it replaces, then takes that server's slot;
//! - a StatefulSet rollout of two servers: each server's items go through the operator's spare server
//!   (`<name>-handover`) to the pod that replaces it under the same name;
//! - a scale-down 3 -> 2 of a Deployment declaring `clients.hashing: jump`: the drained server's items are
//!   copied to their owners under the shorter list before its pod goes;
//! - a scale-up 3 -> 5 of such a Deployment: the items jump moves to the two new servers are copied there
//!   before those are published;
//! - a Deployment rollout to servers that refuse connections (an image of `no-server.test`, for which the
//!   stand-in kubelet starts no memcached but reports the pod ready), with `handover.timeoutSeconds: 20`:
//!   each copy ends at once, cold, the rollout proceeds, and a `HandoverFailed` Warning per slot names the
//!   refusal. Only a stand-in kubelet can make such a server; elsewhere the step says so and skips it.
//!
//! Keys are placed by jump hash over the slots (the operator's own `hashing` module, checked against the
//! library in tests/hashing.rs) before the change, and read back over the slots after it. Checked: every
//! key on the server that owns it afterwards, the rollouts' pods all replaced with the gate condition
//! `Copied`, the number of `HandedOver` events each case makes ([`Case::events`]), and no
//! `HandoverFailed` Warning.
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
use std::time::{Duration, Instant};

use memcached_operator::hashing::{Placement, Scheme};
use serde_json::Value;

use crate::checks::{check_ready_status, live_pods};
use crate::env::{E2e, delete_instance};
use crate::events::{Event, list_events, summarize_events};
use crate::kubectl::{apply_yaml_ok, compact, get_required, kubectl_ok, secs};
use crate::names::{API_VERSION, APP_NAME, MC, PORT};
use crate::telemetry::{memcached_session, stand_in_node};

pub const HANDOVER_NAME: &str = "memcached-handover";
/// The pod condition the operator sets when a new pod's copy ended (its readiness gate).
const GATE: &str = "cache.example.com/handover";
/// Keys written, in all.
const KEYS: usize = 60;

/// The registry the stand-in kubelet starts no memcached for, though it reports the pod ready
/// (`envtest/src/kubelet/image.rs`): connections to such a pod are refused.
const NO_SERVER_IMAGE: &str = "no-server.test/memcached:1.6";
/// `handover.timeoutSeconds` of the case whose targets refuse: each copy's time bound.
const REFUSED_TIMEOUT_SECONDS: u64 = 20;

/// One change to a settled instance, and what it must keep.
struct Case {
    name: &'static str,
    workload: &'static str,
    hashing: &'static str,
    size: (usize, usize),
    memory_mb: (u32, u32),
    /// The image after the change; `None` keeps the operator's default.
    image: Option<&'static str>,
    /// `spec.handover.timeoutSeconds`; `None` keeps the default.
    timeout_seconds: Option<u64>,
    /// How many handover events the change makes (`HandedOver`, or `HandoverFailed` where copies cannot
    /// connect): a rollout one per replaced server; a scale one per server that keys move to (the
    /// drained server's keys go to both others on 3 -> 2; both new servers on 3 -> 5, also when one turns
    /// ready first and the operator replaces its plan 3 -> 4 with 3 -> 5: the first new server, holding
    /// its keys already, gets an event saying how many were there).
    events: usize,
    /// Events the change may make besides: on 3 -> 5, when the first new server's copies end before the
    /// second turns ready, the list is published at 4 and then at 5, each step with its events (one for
    /// 3 -> 4; two for 4 -> 5, where keys move to both new servers). Both orders are correct; which one a
    /// run takes depends on when the pods turn ready (the second was seen once on v1.28.7).
    extra_events: usize,
}

const CASES: [Case; 5] = [
    Case {
        name: HANDOVER_NAME,
        workload: "Deployment",
        hashing: "unknown",
        size: (2, 2),
        memory_mb: (64, 65),
        image: None,
        timeout_seconds: None,
        events: 2,
        extra_events: 0,
    },
    Case {
        name: "memcached-handover-sts",
        workload: "StatefulSet",
        hashing: "unknown",
        size: (2, 2),
        memory_mb: (64, 65),
        image: None,
        timeout_seconds: None,
        events: 2,
        extra_events: 0,
    },
    Case {
        name: "memcached-handover-scale",
        workload: "Deployment",
        hashing: "jump",
        size: (3, 2),
        memory_mb: (64, 64),
        image: None,
        timeout_seconds: None,
        events: 2,
        extra_events: 0,
    },
    Case {
        name: "memcached-handover-scale-up",
        workload: "Deployment",
        hashing: "jump",
        size: (3, 5),
        memory_mb: (64, 64),
        image: None,
        timeout_seconds: None,
        events: 2,
        extra_events: 1,
    },
    Case {
        name: "memcached-handover-refused",
        workload: "Deployment",
        hashing: "unknown",
        size: (2, 2),
        memory_mb: (64, 64),
        image: Some(NO_SERVER_IMAGE),
        timeout_seconds: Some(REFUSED_TIMEOUT_SECONDS),
        events: 2,
        extra_events: 0,
    },
];

impl Case {
    fn rollout(&self) -> bool {
        self.memory_mb.0 != self.memory_mb.1 || self.image.is_some()
    }

    /// Whether the servers after the change refuse connections (see [`NO_SERVER_IMAGE`]).
    fn targets_refuse(&self) -> bool {
        self.image == Some(NO_SERVER_IMAGE)
    }

    /// The instance before the change (`after` false) or after it.
    fn instance(&self, ns: &str, after: bool) -> String {
        let (size, memory_mb) = if after {
            (self.size.1, self.memory_mb.1)
        } else {
            (self.size.0, self.memory_mb.0)
        };
        let mut lines = vec![
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
        ];
        if let Some(image) = self.image.filter(|_| after) {
            lines.push(format!("  image: {image}"));
        }
        if let Some(seconds) = self.timeout_seconds {
            lines.extend([
                "  handover:".to_owned(),
                format!("    timeoutSeconds: {seconds}"),
            ]);
        }
        lines.join("\n") + "\n"
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
pub fn slots(ns: &str, name: &str, size: usize) -> Result<Vec<(usize, String)>, String> {
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
pub fn pod(ns: &str, name: &str, pod: &str) -> Value {
    live_pods(ns, name)
        .unwrap_or_else(|e| panic!("{e}"))
        .into_iter()
        .find(|p| p["metadata"]["name"] == pod)
        .unwrap_or_else(|| panic!("pod {pod} is not live"))
}

/// Whether the operator, on this machine, can reach `pod`'s memcached.
pub fn reachable(pod: &Value) -> bool {
    pod["status"]["podIP"]
        .as_str()
        .and_then(|ip| ip.parse::<IpAddr>().ok())
        .is_some_and(|ip| {
            let port = u16::try_from(PORT).unwrap_or(11211);
            TcpStream::connect_timeout(&SocketAddr::new(ip, port), Duration::from_secs(2)).is_ok()
        })
}

/// The live pods' UIDs of instance `name`.
pub fn uids(ns: &str, name: &str) -> Result<BTreeSet<String>, String> {
    Ok(live_pods(ns, name)?
        .iter()
        .filter_map(|p| p["metadata"]["uid"].as_str().map(str::to_owned))
        .collect())
}

/// Waits until instance `name` is settled with `size` ready pods in `size` slots, none of them one of
/// `replaced` (the pods' UIDs before a rollout), and returns its slots.
pub fn settled(
    env: &E2e,
    name: &str,
    size: usize,
    replaced: &BTreeSet<String>,
) -> Vec<(usize, String)> {
    let ns = env.ns.as_str();
    env.wait(
        &format!(
            "Memcached {name}: {size} ready pods, settled{}",
            if replaced.is_empty() {
                ""
            } else {
                ", every pod replaced"
            }
        ),
        secs(300),
        || {
            check_ready_status(ns, name, size as i64)?;
            let slots = slots(ns, name, size)?;
            let now = uids(ns, name)?;
            if now.len() != size {
                return Err(format!("{} live pods", now.len()));
            }
            if !now.is_disjoint(replaced) {
                return Err(format!("not every pod replaced yet: {slots:?}"));
            }
            Ok(slots)
        },
    )
}

pub fn step_handover(env: &E2e) {
    for case in &CASES {
        handover(env, case);
    }
}

/// What the copies of a case can do on this cluster.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Copies {
    /// They connect to both servers: every key reaches its owner.
    Warm,
    /// The pod IPs are not routable from this machine, where the operator runs: each copy ends cold.
    Unreachable,
    /// The new servers refuse connections: each copy ends cold at once.
    Refused,
}

impl Copies {
    /// The handover condition's reason on a new pod, and the handover events' reason and type.
    fn outcome(self) -> (&'static str, &'static str, &'static str) {
        match self {
            Copies::Warm => ("Copied", "HandedOver", "Normal"),
            Copies::Unreachable | Copies::Refused => ("Failed", "HandoverFailed", "Warning"),
        }
    }
}

fn handover(env: &E2e, case: &Case) {
    let ns = env.ns.as_str();
    let name = case.name;
    let ((before_size, after_size), (before_mb, after_mb)) = (case.size, case.memory_mb);
    eprintln!(
        "    -- {name}: {} {before_size} -> {after_size} servers, maxMemoryMB {before_mb} -> {after_mb}, \
         hashing {}{}",
        case.workload,
        case.hashing,
        case.image
            .map(|image| format!(", image -> {image}"))
            .unwrap_or_default()
    );
    apply_yaml_ok(&case.instance(ns, false));
    let before = env.wait(
        &format!("Memcached {name}: {before_size} ready pods in {before_size} slots"),
        secs(180),
        || {
            check_ready_status(ns, name, before_size as i64)?;
            slots(ns, name, before_size)
        },
    );
    let pods: Vec<Value> = before.iter().map(|(_, p)| pod(ns, name, p)).collect();
    if case.targets_refuse() && stand_in_node(&pods[0]).is_none() {
        eprintln!(
            "    NOTE: SKIPPED {name}: only envtest's stand-in kubelet runs a pod whose server refuses \
             connections (an image of no-server.test); this cluster's pods are not on its nodes, so a \
             handover whose target refuses is not checked here"
        );
        delete_instance(env, name);
        return;
    }
    let copies = if case.targets_refuse() {
        Copies::Refused
    } else if pods.iter().all(reachable) {
        Copies::Warm
    } else {
        eprintln!(
            "    NOTE: the pod IPs are not reachable from this machine, where the operator runs: the copies \
             cannot connect, so the step checks that the handovers end cold and say why"
        );
        Copies::Unreachable
    };
    place_keys(ns, &before, &pods);
    eprintln!("    {KEYS} keys placed by jump hash on {before:?}; changing the spec");

    let old = uids(ns, name).unwrap_or_else(|e| panic!("{e}"));
    apply_yaml_ok(&case.instance(ns, true));
    let started = Instant::now();
    let replaced = if case.rollout() { old } else { BTreeSet::new() };
    let after = settled(env, name, after_size, &replaced);
    let took = started.elapsed();

    let (condition_reason, reason, event_type) = copies.outcome();
    if case.rollout() {
        check_gates(ns, name, &after, condition_reason);
    }
    let want = case.events;
    let events = env.wait(&format!("{want} {reason} events"), secs(30), || {
        let events = list_events(ns)?;
        let ours = notes(&events, name, reason, event_type);
        if ours.len() >= want {
            Ok(ours)
        } else {
            Err(summarize_events(&events))
        }
    });
    eprintln!("    {reason}: {events:#?}");
    assert!(
        (want..=want + case.extra_events).contains(&events.len()),
        "{reason} events for {name}: {} of {want}{}: {events:#?}",
        events.len(),
        if case.extra_events > 0 {
            format!(" to {}", want + case.extra_events)
        } else {
            String::new()
        }
    );
    if events.len() > want {
        // Published in two steps: both steps said so.
        let (from, to) = case.size;
        for step in [
            format!("for the scale from {from} to {}", from + 1),
            format!("for the scale from {} to {to}", from + 1),
        ] {
            assert!(
                events.iter().any(|note| note.contains(&step)),
                "{name}: no event {step:?}: {events:#?}"
            );
        }
    }
    if copies == Copies::Warm {
        let events = list_events(ns).unwrap_or_else(|e| panic!("{e}"));
        let failed = notes(&events, name, "HandoverFailed", "Warning");
        assert!(failed.is_empty(), "{name}: {failed:#?}");
    }

    match copies {
        Copies::Warm => check_keys(ns, name, &after),
        Copies::Refused => check_refused(&events, took),
        Copies::Unreachable => {}
    }
    delete_instance(env, name);
}

/// The distinct notes of the events of instance `name` with `reason` and `event_type` (each event is
/// listed twice: by events.k8s.io and by core/v1).
fn notes(events: &[Event], name: &str, reason: &str, event_type: &str) -> BTreeSet<String> {
    events
        .iter()
        .filter(|e| e.name == name && e.reason == reason && e.type_ == event_type)
        .map(|e| e.note.clone())
        .collect()
}

/// Writes each slot's keys to the server of that slot (`before`, with their `pods`).
fn place_keys(ns: &str, before: &[(usize, String)], pods: &[Value]) {
    let by_slot = placed(before.len());
    for (((slot, pod_name), pod), keys) in before.iter().zip(pods).zip(by_slot) {
        let mut script = String::new();
        for key in &keys {
            script.push_str(&format!("set {key} 0 0 {}\r\n{key}\r\n", key.len()));
        }
        script.push_str("quit\r\n");
        let out = pod_session(ns, pod, &script);
        assert_eq!(
            out.matches("STORED").count(),
            keys.len(),
            "sets on pod {pod_name} (slot {slot}): {out:?}"
        );
    }
}

/// Every pod of `after` (all new after a rollout) has its handover gate condition True with `reason`;
/// returns the conditions' messages (what each copy did).
pub fn check_gates(ns: &str, name: &str, after: &[(usize, String)], reason: &str) -> Vec<String> {
    let mut messages = Vec::new();
    for (slot, pod_name) in after {
        let pod = pod(ns, name, pod_name);
        let condition = pod["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["type"] == GATE)
            .cloned()
            .unwrap_or(Value::Null);
        assert!(
            condition["status"] == "True" && condition["reason"] == reason,
            "pod {pod_name} (slot {slot}): condition {GATE} should be True/{reason}: {}",
            compact(&condition)
        );
        messages.push(condition["message"].as_str().unwrap_or_default().to_owned());
    }
    messages
}

/// Every key is on the server that owns it under the slots `after` the change.
fn check_keys(ns: &str, name: &str, after: &[(usize, String)]) {
    for ((slot, pod_name), keys) in after.iter().zip(placed(after.len())) {
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

/// The Warnings of a rollout to refusing servers name the refusal, and the rollout took less than one
/// copy's time bound. Every copy began after the change was applied and ended before the rollout was
/// done, so each ended within its bound; and since the rollout replaces one server at a time
/// (`maxSurge: 1, maxUnavailable: 0`), a copy that waited for its bound instead of ending at the refusal
/// would alone have held it for the bound. (A warm rollout of two servers takes a few seconds here.)
fn check_refused(notes: &BTreeSet<String>, took: Duration) {
    assert!(
        notes.iter().all(
            |note| note.contains("target server: cannot connect") && note.contains("(connect)")
        ),
        "each HandoverFailed Warning should say the target refused the connection: {notes:#?}"
    );
    let bound = Duration::from_secs(REFUSED_TIMEOUT_SECONDS);
    assert!(
        took < bound,
        "the rollout to refusing servers took {took:?}; a copy's time bound is {bound:?}, which it \
         should not have waited for"
    );
    eprintln!(
        "    ok: the rollout to refusing servers was done {:.1} s after the change, within one copy's \
         {REFUSED_TIMEOUT_SECONDS} s bound; each Warning names the refused connection",
        took.as_secs_f64()
    );
}
