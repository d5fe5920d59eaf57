//! Rollouts are paced: a changed pod template replaces one server at a time, and each new server has been
//! ready for `warmupSeconds` before the next one is replaced, in both workloads. A Deployment paces itself
//! (`minReadySeconds`, `maxSurge: 1`, `maxUnavailable: 0`); a StatefulSet's controller ignores
//! `minReadySeconds` for `Parallel` pods, so there the operator steps the partition (on a v1.28 server an
//! unpaced pool replaced its servers 1.4 s and 2.0 s apart with an 8 s warmup).
//!
//! Times are the pods' own `Ready` transition times, as the API server records them and as the workload
//! controllers read them for `minReadySeconds` (whole seconds).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::ListParams;
use serde_json::{Value, json};

use crate::Scenario;
use crate::instances::{apply, pods, wait_settled};

const WARMUP: i64 = 8;
const SIZE: usize = 4;

fn ready_since(pod: &Pod) -> Option<i64> {
    pod.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready" && c.status == "True")?
        .last_transition_time
        .as_ref()
        .map(|t| t.0.as_second())
}

async fn paced_rollout(workload: &str) {
    let name = format!("rollout-{}", workload.to_lowercase());
    let Some(s) = Scenario::start(&name).await else {
        return;
    };
    let spec = |memory: i64| -> Value {
        json!({
            "size": SIZE, "workload": workload,
            "memcached": {"maxMemoryMB": memory},
            "rollout": {"warmupSeconds": WARMUP},
            "highAvailability": {"preStopDelaySeconds": 1, "terminationGracePeriodSeconds": 5}
        })
    };
    apply(&s, "cache", spec(64)).await;
    wait_settled(&s, "cache", Duration::from_secs(90)).await;
    // The servers, not the spare server a StatefulSet rollout's warm handover runs beside them.
    let selector = "app.kubernetes.io/name=memcached,app.kubernetes.io/instance=cache";
    // A list that fails (a busy API server) says nothing about readiness: `None`, not zero pods.
    let list = || async {
        pods(&s)
            .list(&ListParams::default().labels(selector))
            .await
            .map(|l| l.items)
            .ok()
    };
    let old: BTreeSet<String> = list()
        .await
        .expect("the pods of the settled instance")
        .iter()
        .filter_map(|p| p.uid())
        .collect();
    s.step(&format!(
        "settled with {} pods; changing the template",
        old.len()
    ));

    apply(&s, "cache", spec(65)).await;
    let started = Instant::now();
    // New pods (uids not seen before) and when each became ready; the fewest ready servers seen at once.
    let mut ready_at: BTreeMap<String, i64> = BTreeMap::new();
    let mut fewest_ready = usize::MAX;
    loop {
        let limit = Duration::from_secs(SIZE as u64 * (WARMUP as u64 + 15) + 30);
        let Some(now) = list().await else {
            assert!(started.elapsed() < limit, "the pods cannot be listed");
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let ready: Vec<&Pod> = now
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none() && ready_since(p).is_some())
            .collect();
        fewest_ready = fewest_ready.min(ready.len());
        for pod in &ready {
            let uid = pod.uid().unwrap_or_default();
            if !old.contains(&uid) {
                ready_at
                    .entry(uid)
                    .or_insert_with(|| ready_since(pod).unwrap_or_default());
            }
        }
        if ready_at.len() >= SIZE && ready.len() >= SIZE {
            break;
        }
        assert!(
            started.elapsed() < limit,
            "the rollout did not finish: {} of {SIZE} servers replaced",
            ready_at.len()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut times: Vec<i64> = ready_at.values().copied().collect();
    times.sort();
    let gaps: Vec<i64> = times.windows(2).map(|w| w[1] - w[0]).collect();
    s.step(&format!(
        "{workload}: {SIZE} servers replaced in {:.1} s; gaps between new servers' readiness {gaps:?} s \
         (warmup {WARMUP} s); fewest ready servers at once: {fewest_ready}",
        started.elapsed().as_secs_f64()
    ));
    assert!(
        gaps.iter().all(|g| *g >= WARMUP),
        "{workload}: servers replaced less than {WARMUP} s apart: gaps {gaps:?}"
    );
    assert!(
        fewest_ready + 1 >= SIZE,
        "{workload}: two slots down at once ({fewest_ready} of {SIZE} servers ready)"
    );
    wait_settled(&s, "cache", Duration::from_secs(60)).await;
}

#[tokio::test]
async fn a_deployment_rollout_replaces_servers_a_warmup_apart() {
    paced_rollout("Deployment").await;
}

#[tokio::test]
async fn a_statefulset_rollout_replaces_servers_a_warmup_apart() {
    paced_rollout("StatefulSet").await;
}
