use super::*;
use crate::api::{MemcachedConfig, MemcachedSpec};
use crate::resources::testing::memcached;
use crate::resources::{Defaults, Instance, deployment};
use k8s_openapi::api::core::v1::Pod;
use serde_json::json;

fn build(max_memory_mb: i32) -> Deployment {
    let mc = memcached(
        "cache",
        MemcachedSpec {
            size: 4,
            memcached: Some(Box::new(MemcachedConfig {
                max_memory_mb: Some(max_memory_mb),
                ..MemcachedConfig::default()
            })),
            ..MemcachedSpec::default()
        },
    );
    let defaults = Defaults::default();
    let instance = Instance::new(&mc, &defaults).unwrap();
    deployment::deployment(&instance, 4, None)
}

fn gated(mut d: Deployment) -> Deployment {
    add_gate(&mut d);
    d
}

#[test]
fn a_new_deployment_starts_without_the_gate() {
    assert!(!gate_wanted(true, &build(64), None));
}

#[test]
fn the_gate_comes_only_with_a_template_change_that_replaces_the_servers_anyway() {
    let live = build(64);
    assert!(
        !gate_wanted(true, &build(64), Some(&live)),
        "a settled Deployment is not rolled out for the gate"
    );
    assert!(gate_wanted(true, &build(65), Some(&live)));
    assert!(
        !gate_wanted(false, &build(65), Some(&live)),
        "handover off (or no surge): the change goes without the gate"
    );
}

#[test]
fn a_live_gate_stays_until_the_template_changes_anyway() {
    let live = gated(build(64));
    assert!(has_gate(&live.spec.as_ref().unwrap().template));
    assert!(gate_wanted(true, &build(64), Some(&live)));
    assert!(
        gate_wanted(false, &build(64), Some(&live)),
        "turning the handover off does not roll the servers out to drop the gate"
    );
    assert!(
        !gate_wanted(false, &build(65), Some(&live)),
        "the next change drops it"
    );
    assert!(gate_wanted(true, &build(65), Some(&live)));
}

#[test]
fn server_defaults_in_the_live_template_are_no_change() {
    let mut live = serde_json::to_value(gated(build(64))).unwrap();
    live["spec"]["template"]["spec"]["dnsPolicy"] = json!("ClusterFirst");
    live["spec"]["template"]["spec"]["schedulerName"] = json!("default-scheduler");
    let live: Deployment = serde_json::from_value(live).unwrap();
    assert!(gate_wanted(false, &build(64), Some(&live)));
    assert!(!gate_wanted(false, &build(65), Some(&live)));
}

fn pod(name: &str, hash: &str, conditions: serde_json::Value, created: i64) -> Member {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {TEMPLATE_HASH_LABEL: hash},
                     "creationTimestamp": Timestamp::from_second(created).unwrap().to_string()},
        "status": {"podIP": format!("10.0.0.{created}"), "conditions": conditions},
    }))
    .unwrap();
    Member::of(&pod).unwrap()
}

fn ready(name: &str, hash: &str, created: i64) -> Member {
    pod(
        name,
        hash,
        json!([{"type": "ContainersReady", "status": "True"}, {"type": "Ready", "status": "True"}]),
        created,
    )
}

fn waiting(name: &str, created: i64) -> Member {
    pod(
        name,
        "new",
        json!([{"type": "ContainersReady", "status": "True"}, {"type": "Ready", "status": "False"}]),
        created,
    )
}

fn slots(pods: &[&str]) -> Vec<Server> {
    pods.iter()
        .zip(0..)
        .map(|(pod, slot)| Server {
            slot,
            pod: Some((*pod).to_owned()),
            address: Some(format!("10.0.0.{slot}:11211")),
            ready: true,
        })
        .collect()
}

#[test]
fn a_pod_waits_while_its_containers_are_ready_and_the_gate_condition_is_unset() {
    assert!(waiting("n", 9).waiting);
    assert!(!ready("a", "old", 1).waiting);
    let opened = pod(
        "n",
        "new",
        json!([{"type": "ContainersReady", "status": "True"}, {"type": "Ready", "status": "False"},
               {"type": GATE, "status": "True"}]),
        9,
    );
    assert!(
        !opened.waiting,
        "its gate is open; the kubelet has not said Ready yet"
    );
    let starting = pod(
        "n",
        "new",
        json!([{"type": "ContainersReady", "status": "False"}, {"type": "Ready", "status": "False"}]),
        9,
    );
    assert!(!starting.waiting, "memcached is not ready to be copied to");
}

#[test]
fn a_surge_pod_takes_over_the_lowest_slot_of_an_old_pod() {
    // Slot 0 was replaced already (a pod of the new template): the next one takes slot 1.
    let pods = [
        ready("n0", "new", 5),
        ready("a", "old", 1),
        ready("b", "old", 1),
        waiting("n1", 9),
    ];
    let servers = slots(&["n0", "a", "b"]);
    assert_eq!(
        takeovers(&servers, &pods, &BTreeMap::new()),
        [Takeover {
            pod: "n1".into(),
            source: Some((1, "a".into()))
        }]
    );
    // While its copy runs, it is not listed again, and nobody else reads its source.
    let running = BTreeMap::from([("n1".to_owned(), "a".to_owned())]);
    let mut more = pods.to_vec();
    more.push(waiting("n2", 10));
    assert_eq!(
        takeovers(&servers, &more, &running),
        [Takeover {
            pod: "n2".into(),
            source: Some((2, "b".into()))
        }]
    );
}

#[test]
fn a_waiting_pod_in_a_vacant_slot_or_without_an_old_pod_has_nothing_to_copy() {
    let pods = [ready("a", "old", 1), waiting("n", 9)];
    let vacant = slots(&["a", "n"]);
    assert_eq!(
        takeovers(&vacant, &pods, &BTreeMap::new()),
        [Takeover {
            pod: "n".into(),
            source: None
        }]
    );
    let pods = [ready("n0", "new", 5), waiting("n", 9)];
    assert_eq!(
        takeovers(&slots(&["n0"]), &pods, &BTreeMap::new()),
        [Takeover {
            pod: "n".into(),
            source: None
        }],
        "only pods of the new template hold slots"
    );
}

#[test]
fn terminating_or_unready_old_pods_are_no_source() {
    let mut going = ready("a", "old", 1);
    going.terminating = true;
    let unready = pod("b", "old", json!([{"type": "Ready", "status": "False"}]), 1);
    let pods = [going, unready, ready("c", "old", 1), waiting("n", 9)];
    assert_eq!(
        takeovers(&slots(&["a", "b", "c"]), &pods, &BTreeMap::new()),
        [Takeover {
            pod: "n".into(),
            source: Some((2, "c".into()))
        }]
    );
}

#[test]
fn after_an_interrupted_rollout_a_surge_pod_takes_over_from_the_oldest_replica_set_first() {
    // Slot 0 went to the interrupted rollout's template ("mid"); the template changed again ("new"). The
    // Deployment controller removes the oldest ReplicaSet's pods first, so the copy reads one of those.
    let pods = [
        ready("m0", "mid", 5),
        ready("a", "old", 1),
        ready("b", "old", 2),
        waiting("n", 9),
    ];
    let servers = slots(&["m0", "a", "b"]);
    assert_eq!(
        takeovers(&servers, &pods, &BTreeMap::new()),
        [Takeover {
            pod: "n".into(),
            source: Some((1, "a".into()))
        }]
    );
    // Once the oldest ReplicaSet is gone, the next one's pods are the sources.
    let pods = [
        ready("m0", "mid", 5),
        ready("n1", "new", 9),
        waiting("n", 10),
    ];
    assert_eq!(
        takeovers(&slots(&["m0", "n1"]), &pods, &BTreeMap::new()),
        [Takeover {
            pod: "n".into(),
            source: Some((0, "m0".into()))
        }]
    );
}

#[test]
fn a_takeover_replaces_the_slots_entry_in_place() {
    let servers = slots(&["a", "b", "c"]);
    let (old, new) = takeover_lists(&servers, 1, "10.1.0.9:11211").unwrap();
    assert_eq!(old, ["10.0.0.0:11211", "10.0.0.1:11211", "10.0.0.2:11211"]);
    assert_eq!(new, ["10.0.0.0:11211", "10.1.0.9:11211", "10.0.0.2:11211"]);
    assert_eq!(takeover_lists(&servers, 7, "10.1.0.9:11211"), None);
}
