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

use crate::handover::{
    KEYS, after_both_rollouts, fill, first_handed_over, handover_metrics, hits, notes,
    restart_while_handing_over,
};
use crate::instances::{apply, conditions, memcacheds, pods, settled};
use crate::{Scenario, wait_for};

const SIZE: usize = 4;
const PORT: i32 = 11211;
const SERVERS: &str = "app.kubernetes.io/name=memcached,app.kubernetes.io/instance=cache";

fn spec(size: usize, memory: i64, handover: Value) -> Value {
    json!({
        "size": size, "workload": "StatefulSet",
        "memcached": {"maxMemoryMB": memory},
        "highAvailability": {"preStopDelaySeconds": 1, "terminationGracePeriodSeconds": 5},
        "handover": handover,
    })
}

/// The servers' addresses in slot order (each slot's pod IP), once the instance is settled with `size`
/// servers whose pods are none of `old` (uids), and the spare server is gone.
async fn settled_addresses(
    s: &Scenario,
    size: usize,
    old: &BTreeSet<String>,
    timeout: Duration,
) -> (Vec<String>, BTreeSet<String>) {
    let api = memcacheds(s);
    let pods = pods(s);
    wait_for(
        &format!("the instance to settle on {size} servers not in {old:?}, without a spare"),
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
            if settled(&mc) && addresses.len() == size {
                Ok((addresses, uids))
            } else {
                Err(format!("{addresses:?}; {}", conditions(&mc)))
            }
        },
    )
    .await
}

/// Fills a settled StatefulSet pool of `SIZE`, changes a memcached flag (a rollout), and reads every key
/// back once the rollout settled: (keys hit, how long the rollout took).
async fn rollout(s: &Scenario, handover: Value, value_len: usize) -> (usize, Duration) {
    apply(s, "cache", spec(SIZE, 64, handover.clone())).await;
    let (old, uids) = settled_addresses(s, SIZE, &BTreeSet::new(), Duration::from_secs(90)).await;
    let listed = pods(s)
        .list(&ListParams::default().labels(SERVERS))
        .await
        .expect("the servers");
    assert_eq!(listed.items.len(), SIZE);
    fill(&old, value_len).await;
    let stored = hits(&old, value_len).await;
    s.step(&format!(
        "{stored} of {KEYS} keys stored on {old:?}; changing -m (a rollout)"
    ));
    assert_eq!(stored, KEYS, "every key is stored before the rollout");
    apply(s, "cache", spec(SIZE, 65, handover)).await;
    let started = Instant::now();
    let (new, _) = settled_addresses(s, SIZE, &uids, Duration::from_secs(300)).await;
    let took = started.elapsed();
    let read = hits(&new, value_len).await;
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
    let (read, _) = rollout(&s, json!({}), 100).await;
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
    // Two copies per server, to the spare and from it, each counted.
    let metrics = handover_metrics(&s).await;
    s.step(&format!("handover metrics: {metrics:#?}"));
    let series = |key: &str| metrics.get(key).copied().unwrap_or(0.0);
    assert_eq!(
        series("memcached_operator_handovers_total"),
        (2 * SIZE) as f64,
        "two copies per replaced server"
    );
    assert!(
        series("memcached_operator_handover_items_total{outcome=\"copied\"}") >= (2 * read) as f64,
        "every key hit was copied twice: {metrics:#?}"
    );
    assert!(
        !metrics
            .keys()
            .any(|k| k.starts_with("memcached_operator_handover_failures_total")),
        "{metrics:#?}"
    );
}

/// An image change, then a memcached flag changed once the first server was handed over: the servers
/// already on the first change's revision are replaced again, through the spare as well.
#[tokio::test]
async fn a_statefulset_rollout_changed_again_midway_keeps_the_keys_warm() {
    let Some(s) = Scenario::start_with_memcached("sts-handover-interrupted", &[]).await else {
        return;
    };
    // About 5 000 items of 100 bytes per server at 256 KiB/s: each copy takes about 2 s, so the second
    // change lands while the first rollout is under way.
    let handover = json!({"maxBytesPerSecond": 262144});
    let spec = |memory: i64, image: &str| {
        let mut spec = spec(SIZE, memory, handover.clone());
        spec["image"] = image.into();
        spec
    };
    apply(&s, "cache", spec(64, "memcached:1.6.18")).await;
    let (old, uids) = settled_addresses(&s, SIZE, &BTreeSet::new(), Duration::from_secs(90)).await;
    fill(&old, 100).await;
    assert_eq!(hits(&old, 100).await, KEYS, "every key is stored first");
    s.step("changing the image (a rollout)");
    apply(&s, "cache", spec(64, "memcached:1.6.19")).await;
    let started = Instant::now();
    let first = first_handed_over(&s).await;
    s.step(&format!(
        "{first}; changing -m (a second rollout over the first)"
    ));
    apply(&s, "cache", spec(65, "memcached:1.6.19")).await;
    let (new, _) = settled_addresses(&s, SIZE, &uids, Duration::from_secs(300)).await;
    let took = started.elapsed();
    let read = hits(&new, 100).await;
    after_both_rollouts(&s, &new, read, took).await;
}

#[tokio::test]
async fn without_a_handover_a_statefulset_rollout_starts_its_servers_empty() {
    let Some(s) = Scenario::start_with_memcached("sts-handover-off", &[]).await else {
        return;
    };
    let (read, _) = rollout(&s, json!({"enabled": false}), 100).await;
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

#[tokio::test]
async fn a_statefulset_handover_out_of_time_ends_cold_and_the_rollout_proceeds() {
    let Some(s) = Scenario::start_with_memcached("sts-handover-timeout", &[]).await else {
        return;
    };
    // 5 000 items of 1 kB per server at 64 KiB/s is over a minute per copy; each copy has 1 s.
    let handover = json!({"timeoutSeconds": 1, "maxBytesPerSecond": 65536});
    let (read, took) = rollout(&s, handover, 1000).await;
    let failed = notes(&s, "HandoverFailed").await;
    s.step(&format!("HandoverFailed events: {failed:#?}"));
    // Each server's copy to the spare times out; the copy from the spare (what little it holds) then
    // goes through, or times out too.
    assert!(
        failed.len() >= SIZE,
        "at least one Warning per replaced server: {failed:#?}"
    );
    assert!(
        failed.iter().any(|note| note.contains("(timeout)")),
        "{failed:#?}"
    );
    // The copies that timed out are failures in the metrics, the copies to the spare included; the
    // Warnings also count servers that went cold without a copy (a spare not started within 1 s).
    let metrics = handover_metrics(&s).await;
    s.step(&format!("handover metrics: {metrics:#?}"));
    let failures: f64 = metrics
        .iter()
        .filter(|(k, _)| k.starts_with("memcached_operator_handover_failures_total"))
        .map(|(_, v)| v)
        .sum();
    assert!(
        failures >= 1.0 && failures <= failed.len() as f64,
        "{failures} failed copies, {} Warnings: {metrics:#?}",
        failed.len()
    );
    assert!(
        metrics.contains_key("memcached_operator_handover_failures_total{reason=\"timeout\"}"),
        "{metrics:#?}"
    );
    assert!(
        took < Duration::from_secs(90),
        "the rollout took {took:?} with 1 s handovers"
    );
    assert!(
        read < KEYS / 2,
        "most keys were not copied in time ({read} of {KEYS} hit)"
    );
}

#[tokio::test]
async fn an_operator_restart_mid_copy_starts_a_fresh_copy_to_the_spare() {
    let Some(mut s) = Scenario::start_with_memcached("sts-handover-restart", &[]).await else {
        return;
    };
    // 2 servers of 10 000 items of 100 bytes at 64 KiB/s: about 15 s per copy, two copies per server.
    let handover = json!({"maxBytesPerSecond": 65536, "timeoutSeconds": 60});
    apply(&s, "cache", spec(2, 64, handover.clone())).await;
    let (old, uids) = settled_addresses(&s, 2, &BTreeSet::new(), Duration::from_secs(90)).await;
    fill(&old, 100).await;
    apply(&s, "cache", spec(2, 65, handover)).await;
    restart_while_handing_over(&mut s).await;
    let (new, _) = settled_addresses(&s, 2, &uids, Duration::from_secs(240)).await;
    let read = hits(&new, 100).await;
    let handed = notes(&s, "HandedOver").await;
    s.step(&format!(
        "settled on {new:?}: {read} of {KEYS} keys hit; HandedOver events: {handed:#?}"
    ));
    assert_eq!(
        handed.len(),
        2,
        "each new server handed over once: {handed:#?}"
    );
    assert!(
        read * 100 >= KEYS * 95,
        "{read} of {KEYS} keys hit after a restart mid-copy"
    );
    assert_eq!(s.refused_requests(), Vec::<String>::new());
}
