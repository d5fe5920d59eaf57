use k8s_openapi::jiff::Timestamp;
use serde_json::json;

use super::*;

const WARMUP: i32 = 8;

fn at(second: i64) -> Time {
    Time(Timestamp::from_second(1_800_000_000 + second).unwrap())
}

/// A live StatefulSet `cache` of `replicas` whose controller has taken in generation 2, rolling out
/// revision `new`, with `partition` and the pod template `image`.
fn live(replicas: i32, partition: i32, image: &str) -> StatefulSet {
    serde_json::from_value(json!({
        "metadata": {"name": "cache", "generation": 2},
        "spec": {
            "replicas": replicas,
            "selector": {},
            "serviceName": "cache-headless",
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"partition": partition}},
            "template": {"spec": {"containers": [{"name": "memcached", "image": image}]}}
        },
        "status": {"observedGeneration": 2, "replicas": replicas, "currentRevision": "old", "updateRevision": "new"}
    }))
    .unwrap()
}

fn desired(replicas: i32, image: &str) -> StatefulSet {
    let mut sts = live(replicas, 0, image);
    sts.status = None;
    sts
}

/// Pod `cache-<ordinal>` of `revision`, ready since `ready_since` (seconds), or not ready.
fn pod(ordinal: i32, revision: &str, ready_since: Option<i64>) -> Pod {
    let conditions = match ready_since {
        Some(s) => json!([{"type": "Ready", "status": "True", "lastTransitionTime": at(s)}]),
        None => json!([{"type": "Ready", "status": "False", "lastTransitionTime": at(0)}]),
    };
    serde_json::from_value(json!({
        "metadata": {"name": format!("cache-{ordinal}"), "labels": {REVISION_LABEL: revision}},
        "status": {"phase": "Running", "conditions": conditions}
    }))
    .unwrap()
}

fn run(desired: &StatefulSet, live: Option<&StatefulSet>, pods: &[Pod], now: i64) -> Pace {
    let pods: Vec<&Pod> = pods.iter().collect();
    pace(desired, live, &pods, WARMUP, &at(now))
}

#[test]
fn a_new_template_lets_exactly_the_highest_server_go() {
    let live = live(3, 0, "memcached:1.6.1");
    let pods = [
        pod(0, "new", Some(0)),
        pod(1, "new", Some(0)),
        pod(2, "new", Some(0)),
    ];
    let pace = run(&desired(3, "memcached:1.6.2"), Some(&live), &pods, 100);
    assert_eq!(
        pace,
        Pace {
            partition: 2,
            wait: None,
            next: None,
        }
    );
}

#[test]
fn the_partition_moves_down_once_the_replaced_server_has_warmed_up() {
    let live = live(3, 2, "x");
    let desired = desired(3, "x");
    // Server 2 is being replaced: the partition stays.
    let replacing = [
        pod(0, "old", Some(0)),
        pod(1, "old", Some(0)),
        pod(2, "old", None),
    ];
    assert_eq!(run(&desired, Some(&live), &replacing, 100).partition, 2);
    // Ready on the new revision 3 s ago: 5 s of warmup left.
    let warming = [
        pod(0, "old", Some(0)),
        pod(1, "old", Some(0)),
        pod(2, "new", Some(97)),
    ];
    assert_eq!(
        run(&desired, Some(&live), &warming, 100),
        Pace {
            partition: 2,
            wait: Some(Duration::from_secs(5)),
            next: Some(1),
        }
    );
    // Warm: server 1 is next, and only server 1.
    assert_eq!(
        run(&desired, Some(&live), &warming, 105),
        Pace {
            partition: 1,
            wait: None,
            next: Some(1),
        }
    );
    // Every server warm on the new revision: done, partition 0.
    let done = [
        pod(0, "new", Some(90)),
        pod(1, "new", Some(80)),
        pod(2, "new", Some(70)),
    ];
    assert_eq!(run(&desired, Some(&live), &done, 100), Pace::default());
}

#[test]
fn a_missing_or_terminating_server_holds_the_partition() {
    let live = live(3, 1, "x");
    let mut going = pod(1, "new", Some(0));
    going.metadata.deletion_timestamp = Some(at(50));
    let pods = [pod(0, "old", Some(0)), going, pod(2, "new", Some(0))];
    assert_eq!(run(&desired(3, "x"), Some(&live), &pods, 100).partition, 1);
    let pods = [pod(0, "old", Some(0)), pod(2, "new", Some(0))];
    assert_eq!(run(&desired(3, "x"), Some(&live), &pods, 100).partition, 1);
}

#[test]
fn revisions_the_controller_has_not_computed_yet_keep_the_live_partition() {
    let mut live = live(3, 2, "x");
    live.metadata.generation = Some(3);
    let pods = [
        pod(0, "new", Some(0)),
        pod(1, "new", Some(0)),
        pod(2, "new", Some(0)),
    ];
    assert_eq!(run(&desired(3, "x"), Some(&live), &pods, 100).partition, 2);
}

#[test]
fn without_a_warmup_or_a_live_statefulset_the_controller_paces_itself() {
    let desired = desired(3, "y");
    assert_eq!(run(&desired, None, &[], 0), Pace::default());
    let live = live(3, 0, "x");
    let pods: Vec<&Pod> = Vec::new();
    assert_eq!(
        pace(&desired, Some(&live), &pods, 0, &at(0)),
        Pace::default()
    );
}

#[test]
fn a_new_pool_warming_up_is_not_held_back() {
    // Created a moment ago: every server on the one revision, none warm yet.
    let live = live(3, 0, "x");
    let pods = [
        pod(0, "new", Some(99)),
        pod(1, "new", Some(99)),
        pod(2, "new", None),
    ];
    assert_eq!(
        run(&desired(3, "x"), Some(&live), &pods, 100),
        Pace::default()
    );
}

#[test]
fn a_settled_pool_stays_at_partition_zero() {
    let live = live(2, 0, "x");
    let pods = [pod(0, "new", Some(0)), pod(1, "new", Some(0))];
    assert_eq!(
        run(&desired(2, "x"), Some(&live), &pods, 100),
        Pace::default()
    );
}

fn handed(desired: &StatefulSet, live: &StatefulSet, pods: &[Pod], warmup: i32, now: i64) -> Pace {
    let pods: Vec<&Pod> = pods.iter().collect();
    paced(desired, Some(live), &pods, warmup, true, &at(now))
}

#[test]
fn with_a_handover_a_new_template_holds_every_server() {
    let live = live(3, 0, "memcached:1.6.1");
    let pods = [
        pod(0, "old", Some(0)),
        pod(1, "old", Some(0)),
        pod(2, "old", Some(0)),
    ];
    let pace = handed(&desired(3, "memcached:1.6.2"), &live, &pods, WARMUP, 100);
    assert_eq!(pace.partition, 3, "none goes before its copy to the spare");
    assert_eq!(pace.stepping(0), None, "nothing to step yet");
}

#[test]
fn with_a_handover_the_pace_applies_without_a_warmup_and_names_the_server_to_copy() {
    let live = live(3, 3, "x");
    let pods = [
        pod(0, "old", Some(0)),
        pod(1, "old", Some(0)),
        pod(2, "old", Some(0)),
    ];
    let pace = handed(&desired(3, "x"), &live, &pods, 0, 100);
    assert_eq!((pace.partition, pace.next), (2, Some(2)));
    assert_eq!(
        pace.stepping(3),
        Some(2),
        "server 2 is copied before it goes"
    );
    assert_eq!(pace.stepping(2), None, "already stepped: it is going");
    // Server 2 replaced and ready, no warmup: server 1 is next.
    let replaced = [
        pod(0, "old", Some(0)),
        pod(1, "old", Some(0)),
        pod(2, "new", Some(99)),
    ];
    let live = super::tests::live(3, 2, "x");
    let pace = handed(&desired(3, "x"), &live, &replaced, 0, 100);
    assert_eq!(pace.stepping(2), Some(1));
    // Not ready yet (behind its gate): held at 2, nothing to copy yet.
    let gated = [
        pod(0, "old", Some(0)),
        pod(1, "old", Some(0)),
        pod(2, "new", None),
    ];
    let pace = handed(&desired(3, "x"), &live, &gated, 0, 100);
    assert_eq!((pace.partition, pace.stepping(2)), (2, None));
}
