//! Warm handover of a StatefulSet rollout, on real memcached servers: before the partition lets the
//! StatefulSet replace a server, the operator copies it to its spare server (`<name>-handover`); the new
//! pod, under the same name and DNS address, waits behind the handover readiness gate while the spare's
//! items are copied to it. A client hashing keys over the published list (the same DNS names before and
//! after) finds them after the rollout (issue 23: 0 % before, every server replaced empty).
//!
//! The published list holds DNS names the stand-in cluster cannot resolve: each slot is reached at its
//! pod's loopback IP (`status.servers` names the pod holding each slot), in slot order, so the keys are
//! placed as a jump-hash client over the published list places them.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use kube::ResourceExt;
use kube::api::ListParams;
use serde_json::{Value, json};

use crate::handover::{KEYS, fill, hits, notes};
use crate::instances::{apply, conditions, memcacheds, pods, settled};
use crate::{Scenario, wait_for};

const SIZE: usize = 4;
const PORT: i32 = 11211;
const SERVERS: &str = "app.kubernetes.io/name=memcached,app.kubernetes.io/instance=cache";

fn spec(memory: i64, handover: Value) -> Value {
    json!({
        "size": SIZE, "workload": "StatefulSet",
        "memcached": {"maxMemoryMB": memory},
        "highAvailability": {"preStopDelaySeconds": 1, "terminationGracePeriodSeconds": 5},
        "handover": handover,
    })
}

/// The servers' addresses in slot order (each slot's pod IP), once the instance is settled with `SIZE`
/// servers whose pods are none of `old` (uids), and the spare server is gone.
async fn settled_addresses(
    s: &Scenario,
    old: &BTreeSet<String>,
    timeout: Duration,
) -> (Vec<String>, BTreeSet<String>) {
    let api = memcacheds(s);
    let pods = pods(s);
    wait_for(
        &format!("the instance to settle on {SIZE} servers not in {old:?}, without a spare"),
        timeout,
        || async {
            let mc = api.get("cache").await.map_err(|e| e.to_string())?;
            let listed = pods
                .list(&ListParams::default().labels("app.kubernetes.io/instance=cache"))
                .await
                .map_err(|e| e.to_string())?
                .items;
            if listed.iter().any(|p| p.name_any() == "cache-handover") {
                return Err("the spare server is still there".into());
            }
            let servers = mc
                .status
                .as_ref()
                .map(|s| s.servers.clone())
                .unwrap_or_default();
            let mut addresses = Vec::new();
            let mut uids = BTreeSet::new();
            for server in &servers {
                let pod = listed
                    .iter()
                    .find(|p| Some(p.name_any()) == server.pod)
                    .ok_or_else(|| format!("no pod for slot {}", server.slot))?;
                let uid = pod.uid().unwrap_or_default();
                if old.contains(&uid) {
                    return Err(format!("{} is not replaced yet", pod.name_any()));
                }
                let ip = pod
                    .status
                    .as_ref()
                    .and_then(|s| s.pod_ip.clone())
                    .ok_or_else(|| format!("{} has no IP", pod.name_any()))?;
                addresses.push(format!("{ip}:{PORT}"));
                uids.insert(uid);
            }
            if settled(&mc) && addresses.len() == SIZE {
                Ok((addresses, uids))
            } else {
                Err(format!("{addresses:?}; {}", conditions(&mc)))
            }
        },
    )
    .await
}

/// Fills a settled StatefulSet pool, changes a memcached flag (a rollout), and reads every key back once
/// the rollout settled: (keys hit, how long the rollout took).
async fn rollout(s: &Scenario, handover: Value) -> (usize, Duration) {
    apply(s, "cache", spec(64, handover.clone())).await;
    let (old, uids) = settled_addresses(s, &BTreeSet::new(), Duration::from_secs(90)).await;
    let listed = pods(s)
        .list(&ListParams::default().labels(SERVERS))
        .await
        .expect("the servers");
    assert_eq!(listed.items.len(), SIZE);
    fill(&old, 100).await;
    let stored = hits(&old, 100).await;
    s.step(&format!(
        "{stored} of {KEYS} keys stored on {old:?}; changing -m (a rollout)"
    ));
    assert_eq!(stored, KEYS, "every key is stored before the rollout");
    apply(s, "cache", spec(65, handover)).await;
    let started = Instant::now();
    let (new, _) = settled_addresses(s, &uids, Duration::from_secs(300)).await;
    let took = started.elapsed();
    let read = hits(&new, 100).await;
    s.step(&format!(
        "rollout settled in {:.1} s on {new:?}: {read} of {KEYS} keys hit ({:.1} %)",
        took.as_secs_f64(),
        read as f64 * 100.0 / KEYS as f64
    ));
    (read, took)
}

#[tokio::test]
async fn a_statefulset_rollout_keeps_the_keys_warm() {
    let Some(s) = Scenario::start_with_memcached("sts-handover", &[]).await else {
        return;
    };
    let (read, _) = rollout(&s, json!({})).await;
    let handed = notes(&s, "HandedOver").await;
    let failed = notes(&s, "HandoverFailed").await;
    s.step(&format!(
        "HandedOver events: {handed:#?}; HandoverFailed: {failed:#?}"
    ));
    assert!(
        read * 100 >= KEYS * 95,
        "{read} of {KEYS} keys hit after the rollout"
    );
    assert_eq!(
        handed.len(),
        SIZE,
        "one HandedOver event per replaced server: {handed:#?}"
    );
    assert!(failed.is_empty(), "{failed:#?}");
}

#[tokio::test]
async fn without_a_handover_a_statefulset_rollout_starts_its_servers_empty() {
    let Some(s) = Scenario::start_with_memcached("sts-handover-off", &[]).await else {
        return;
    };
    let (read, _) = rollout(&s, json!({"enabled": false})).await;
    let spares = pods(&s)
        .list(&ListParams::default().labels("app.kubernetes.io/name=memcached-handover"))
        .await
        .expect("pods");
    assert!(spares.items.is_empty(), "no spare server when disabled");
    assert!(
        read * 100 <= KEYS * 75,
        "{read} of {KEYS} keys hit after a cold rollout"
    );
}
