//! Steps 20 to 23, cache-aware pools: the StatefulSet workload end to end (shape, stable addresses, the
//! published `<name>-servers` list), a replaced pod keeping its slot in both workloads, the 3→2 drain
//! (the list shrinks before any pod goes; exactly the drained servers go after `drainSeconds`), and a warm
//! rollout (`warmupSeconds` between two replacements).

use std::collections::BTreeMap;

use k8s_openapi::jiff::Timestamp;
use serde_json::Value;

use crate::checks::{condition, live_pods, pod_ready};
use crate::env::{E2e, delete_instance};
use crate::events::expect_event;
use crate::kubectl::{apply_yaml_ok, get_opt, get_required, gone, kubectl_ok, secs, str_at};
use crate::names::{MC, PORT};

/// The StatefulSet pool and the Deployment pool the steps create.
pub const STS_POOL: &str = "memcached-pool";
pub const DEPLOY_POOL: &str = "memcached-pool-deployment";
/// Drain and warmup the pools use: long enough to observe the drain and the gap between replacements,
/// short enough for a quick suite.
const DRAIN_SECONDS: u64 = 30;
const WARMUP_SECONDS: i64 = 15;
const DELETION_COST: &str = "controller.kubernetes.io/pod-deletion-cost";
const STATEFULSETS: &str = "statefulsets.apps";
const DEPLOYMENTS: &str = "deployments.apps";

fn pool_yaml(ns: &str, name: &str, workload: &str, size: i64) -> String {
    format!(
        "apiVersion: cache.example.com/v1alpha1\nkind: Memcached\nmetadata:\n  name: {name}\n  namespace: {ns}\n\
         spec:\n  size: {size}\n  workload: {workload}\n  scaling:\n    drainSeconds: {DRAIN_SECONDS}\n  \
         rollout:\n    warmupSeconds: {WARMUP_SECONDS}\n"
    )
}

/// `<name>-servers` data, or an error saying what is missing.
fn server_list(ns: &str, name: &str) -> Result<BTreeMap<String, String>, String> {
    let cm = get_required("configmaps", ns, &format!("{name}-servers"))?;
    serde_json::from_value(cm["data"].clone()).map_err(|e| format!("{name}-servers data: {e}"))
}

/// The `servers` file's lines.
fn published(ns: &str, name: &str) -> Result<Vec<String>, String> {
    let data = server_list(ns, name)?;
    Ok(data
        .get("servers")
        .map(|s| s.lines().map(str::to_owned).collect())
        .unwrap_or_default())
}

/// `status.servers` as (pod, address, ready) per slot, requiring slots 0 … n-1 in order.
fn slots(ns: &str, name: &str) -> Result<Vec<(String, String, bool)>, String> {
    let mc = get_required(MC, ns, name)?;
    let servers = mc["status"]["servers"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    servers
        .iter()
        .enumerate()
        .map(|(i, s)| {
            if s["slot"].as_i64() != i64::try_from(i).ok() {
                return Err(format!("status.servers[{i}] has slot {}", s["slot"]));
            }
            // A slot whose pod is gone and not replaced yet has no `pod`, and one of a new instance whose
            // pods are being created (its first status) no `address` either: the API makes both optional.
            Ok((
                s["pod"].as_str().unwrap_or_default().to_owned(),
                s["address"].as_str().unwrap_or_default().to_owned(),
                s["ready"].as_bool() == Some(true),
            ))
        })
        .collect()
}

/// Every one of `n` slots has a ready pod, and the published list is exactly their addresses in slot order.
fn settled_slots(ns: &str, name: &str, n: usize) -> Result<Vec<(String, String, bool)>, String> {
    let slots = slots(ns, name)?;
    if slots.len() != n
        || slots
            .iter()
            .any(|(pod, address, ready)| !ready || address.is_empty() || pod.is_empty())
    {
        return Err(format!(
            "status.servers: want {n} ready slots, have {slots:?}"
        ));
    }
    let addresses: Vec<String> = slots.iter().map(|(_, a, _)| a.clone()).collect();
    let list = published(ns, name)?;
    if list != addresses {
        return Err(format!(
            "{name}-servers lists {list:?}, status.servers {addresses:?}"
        ));
    }
    Ok(slots)
}

fn stable_address(ns: &str, name: &str, i: usize) -> String {
    format!("{name}-{i}.{name}-headless.{ns}.svc:{PORT}")
}

fn pod_uid(ns: &str, pod: &str) -> Result<String, String> {
    let pod = get_required("pods", ns, pod)?;
    Ok(str_at(&pod, "/metadata/uid").to_owned())
}

fn timestamp(v: &Value, what: &str) -> Result<Timestamp, String> {
    v.as_str()
        .unwrap_or_default()
        .parse()
        .map_err(|e| format!("{what} {v}: {e}"))
}

/// Step 20: the StatefulSet pool comes up with its shape, stable addresses and published list; a deleted
/// pod comes back in its slot with the list unchanged.
pub fn step_statefulset_pool(env: &E2e) {
    let ns = env.ns.as_str();
    apply_yaml_ok(&pool_yaml(ns, STS_POOL, "StatefulSet", 3));
    let want: Vec<String> = (0..3).map(|i| stable_address(ns, STS_POOL, i)).collect();
    env.wait(
        &format!("{STS_POOL}: 3 ready slots at stable DNS names, published in slot order"),
        secs(240),
        || {
            let slots = settled_slots(ns, STS_POOL, 3)?;
            let addresses: Vec<&String> = slots.iter().map(|(_, a, _)| a).collect();
            if addresses != want.iter().collect::<Vec<_>>() {
                return Err(format!("addresses {addresses:?}, want {want:?}"));
            }
            Ok(())
        },
    );
    let sts = get_required(STATEFULSETS, ns, STS_POOL).unwrap_or_else(|e| panic!("{e}"));
    let spec = &sts["spec"];
    assert_eq!(str_at(spec, "/serviceName"), format!("{STS_POOL}-headless"));
    assert_eq!(str_at(spec, "/podManagementPolicy"), "Parallel");
    assert_eq!(spec["minReadySeconds"].as_i64(), Some(WARMUP_SECONDS));
    assert_eq!(str_at(spec, "/updateStrategy/type"), "RollingUpdate");
    assert!(
        get_opt(DEPLOYMENTS, ns, STS_POOL).is_ok_and(|d| d.is_none()),
        "no Deployment for a StatefulSet pool"
    );
    let mcrouter = server_list(ns, STS_POOL).unwrap_or_default();
    let config: Value =
        serde_json::from_str(mcrouter.get("mcrouter.json").map_or("", String::as_str))
            .unwrap_or_else(|e| panic!("mcrouter.json: {e}"));
    assert_eq!(config["route"], format!("PoolRoute|{STS_POOL}"));
    assert_eq!(
        config["pools"][STS_POOL]["servers"],
        serde_json::to_value(&want).unwrap_or_default()
    );

    // A deleted server comes back under its name, in its slot, and the list never changes.
    let victim = format!("{STS_POOL}-1");
    let old_uid = pod_uid(ns, &victim).unwrap_or_else(|e| panic!("{e}"));
    kubectl_ok(&["delete", "pod", &victim, "-n", ns, "--wait=false"]);
    env.wait(
        &format!("pod {victim} replaced (new uid) and ready in slot 1"),
        secs(180),
        || {
            let uid = pod_uid(ns, &victim)?;
            if uid == old_uid {
                return Err("still the old pod".into());
            }
            let slots = settled_slots(ns, STS_POOL, 3)?;
            if slots[1].0 != victim {
                return Err(format!("slot 1 holds {:?}", slots[1]));
            }
            Ok(())
        },
    );
    assert_eq!(published(ns, STS_POOL), Ok(want));
}

/// Step 21: a changed template replaces one server at a time, each new one ready for warmupSeconds before
/// the next goes; the published list keeps its order throughout.
pub fn step_warm_rollout(env: &E2e) {
    let ns = env.ns.as_str();
    let list_before = published(ns, STS_POOL).unwrap_or_else(|e| panic!("{e}"));
    let patch = r#"{"spec":{"memcached":{"verbosity":1}}}"#;
    kubectl_ok(&["patch", MC, STS_POOL, "-n", ns, "--type=merge", "-p", patch]);
    let mut messages = Vec::new();
    env.wait(
        &format!("{STS_POOL}: every server replaced with the new template"),
        secs(480),
        || {
            let list = published(ns, STS_POOL)?;
            if list != list_before {
                panic!("the published list changed during a rollout: {list_before:?} -> {list:?}");
            }
            let mc = get_required(MC, ns, STS_POOL)?;
            if let Some(p) = condition(&mc, "Progressing") {
                messages.push(str_at(p, "/message").to_owned());
            }
            let sts = get_required(STATEFULSETS, ns, STS_POOL)?;
            let status = &sts["status"];
            let done = status["updateRevision"] == status["currentRevision"]
                && status["updatedReplicas"].as_i64() == Some(3)
                && status["readyReplicas"].as_i64() == Some(3)
                && status["observedGeneration"] == sts["metadata"]["generation"];
            if done {
                Ok(())
            } else {
                Err(format!("StatefulSet status {status}"))
            }
        },
    );
    assert!(
        messages.iter().any(|m| m.contains("servers updated")),
        "Progressing never said how far the rollout was: {messages:?}"
    );
    // Highest ordinal first: each replacement was created at least warmupSeconds after the previous one
    // became ready.
    let pods = live_pods(ns, STS_POOL).unwrap_or_else(|e| panic!("{e}"));
    let by_name: BTreeMap<String, &Value> = pods
        .iter()
        .map(|p| (str_at(p, "/metadata/name").to_owned(), p))
        .collect();
    for (earlier, later) in [(2, 1), (1, 0)] {
        let earlier = by_name[&format!("{STS_POOL}-{earlier}")];
        let later = by_name[&format!("{STS_POOL}-{later}")];
        let ready = earlier["status"]["conditions"]
            .as_array()
            .and_then(|cs| cs.iter().find(|c| c["type"] == "Ready"))
            .map(|c| c["lastTransitionTime"].clone())
            .unwrap_or_default();
        let ready = timestamp(&ready, "Ready time").unwrap_or_else(|e| panic!("{e}"));
        let created = timestamp(&later["metadata"]["creationTimestamp"], "creation time")
            .unwrap_or_else(|e| panic!("{e}"));
        let gap = created.as_second() - ready.as_second();
        assert!(
            gap >= WARMUP_SECONDS - 1,
            "{} was created {gap} s after {} was ready; warmupSeconds is {WARMUP_SECONDS}",
            str_at(later, "/metadata/name"),
            str_at(earlier, "/metadata/name"),
        );
    }
}

/// Step 22: 3 → 2 on the StatefulSet pool: the list drops slot 2 while its pod still runs, and only after
/// drainSeconds does the StatefulSet shrink, removing exactly that pod. The instance is deleted.
pub fn step_statefulset_drain(env: &E2e) {
    let ns = env.ns.as_str();
    let drained = format!("{STS_POOL}-2");
    kubectl_ok(&[
        "scale",
        &format!("{MC}/{STS_POOL}"),
        "--replicas=2",
        "-n",
        ns,
    ]);
    env.wait(
        &format!("{STS_POOL}: slot 2 leaves the published list first"),
        secs(30),
        || {
            let list = published(ns, STS_POOL)?;
            if list.len() != 2 {
                return Err(format!("list {list:?}"));
            }
            Ok(())
        },
    );
    let sts = get_required(STATEFULSETS, ns, STS_POOL).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        sts["spec"]["replicas"].as_i64(),
        Some(3),
        "the StatefulSet keeps its 3 servers during the drain"
    );
    assert!(get_opt("pods", ns, &drained).is_ok_and(|p| p.is_some()));
    let mc = get_required(MC, ns, STS_POOL).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        condition(&mc, "Progressing").map(|c| str_at(c, "/reason")),
        Some("Draining")
    );
    assert!(
        mc["status"]["drain"]["startedAt"].is_string(),
        "{}",
        mc["status"]
    );
    env.wait("a Draining event", secs(30), || {
        expect_event(ns, |e| e.reason == "Draining" && e.name == STS_POOL)
    });

    env.wait(
        &format!("{drained} removed after the drain, the other two kept"),
        secs(DRAIN_SECONDS + 120),
        || {
            gone("pods", ns, &drained)?;
            settled_slots(ns, STS_POOL, 2)?;
            let mc = get_required(MC, ns, STS_POOL)?;
            if !mc["status"]["drain"].is_null() {
                return Err(format!("status.drain still {}", mc["status"]["drain"]));
            }
            expect_event(ns, |e| e.reason == "Drained" && e.name == STS_POOL)
        },
    );
    delete_instance(env, STS_POOL);
}

/// Step 23: the Deployment pool: a replaced pod's slot goes to its replacement (the others keep theirs),
/// and 3 → 2 marks exactly the drained pod with the deletion cost and removes it after drainSeconds.
pub fn step_deployment_pool(env: &E2e) {
    let ns = env.ns.as_str();
    apply_yaml_ok(&pool_yaml(ns, DEPLOY_POOL, "Deployment", 3));
    let before = env.wait(
        &format!("{DEPLOY_POOL}: 3 ready slots published"),
        secs(240),
        || settled_slots(ns, DEPLOY_POOL, 3),
    );

    let victim = before[1].0.clone();
    kubectl_ok(&["delete", "pod", &victim, "-n", ns, "--wait=false"]);
    let after = env.wait(
        &format!("slot 1 ({victim}) taken over by a ready replacement"),
        secs(180),
        || {
            let slots = settled_slots(ns, DEPLOY_POOL, 3)?;
            if slots[1].0 == victim {
                return Err(format!("slot 1 still holds {victim}"));
            }
            Ok(slots)
        },
    );
    assert_eq!(
        (&after[0], &after[2]),
        (&before[0], &before[2]),
        "slots 0 and 2 keep their pods and addresses"
    );
    let new_pod = get_required("pods", ns, &after[1].0).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        after[1].1,
        format!("{}:{PORT}", str_at(&new_pod, "/status/podIP")),
        "slot 1's address is its new pod's"
    );

    let drained = after[2].0.clone();
    kubectl_ok(&[
        "scale",
        &format!("{MC}/{DEPLOY_POOL}"),
        "--replicas=2",
        "-n",
        ns,
    ]);
    env.wait(
        &format!("{drained} (slot 2) marked with the deletion cost, the list without it"),
        secs(30),
        || {
            let list = published(ns, DEPLOY_POOL)?;
            let pod = get_required("pods", ns, &drained)?;
            let cost = pod["metadata"]["annotations"][DELETION_COST].as_str();
            if list.len() != 2 || cost != Some("-1000") {
                return Err(format!("list {list:?}, cost {cost:?}"));
            }
            Ok(())
        },
    );
    for (pod, ..) in &after[..2] {
        let pod = get_required("pods", ns, pod).unwrap_or_else(|e| panic!("{e}"));
        assert!(
            pod["metadata"]["annotations"][DELETION_COST].is_null(),
            "a kept pod is not marked: {}",
            pod["metadata"]
        );
    }
    let deployment = get_required(DEPLOYMENTS, ns, DEPLOY_POOL).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        deployment["spec"]["replicas"].as_i64(),
        Some(3),
        "no pod goes during the drain"
    );

    env.wait(
        &format!("exactly {drained} removed after the drain"),
        secs(DRAIN_SECONDS + 120),
        || {
            gone("pods", ns, &drained)?;
            let slots = settled_slots(ns, DEPLOY_POOL, 2)?;
            if slots[..] != after[..2] {
                return Err(format!("slots {slots:?}, want {:?}", &after[..2]));
            }
            let pods = live_pods(ns, DEPLOY_POOL)?;
            if pods.len() != 2 || !pods.iter().all(pod_ready) {
                return Err(format!("{} live pods", pods.len()));
            }
            Ok(())
        },
    );
    delete_instance(env, DEPLOY_POOL);
}
