use serde_json::json;

use super::*;
use crate::resources::rollout::REVISION_LABEL;

fn at(second: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + second).unwrap()
}

fn spare_pod(ready: bool, ip: Option<&str>, created: i64) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": "cache-handover", "creationTimestamp": at(created)},
        "status": {
            "podIP": ip,
            "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]
        }
    }))
    .unwrap()
}

#[test]
fn a_spare_takes_copies_once_ready_and_is_late_after_the_handover_timeout() {
    let ready = Member::of(&spare_pod(true, Some("10.0.0.9"), 0)).unwrap();
    assert_eq!(usable(&ready), Some("10.0.0.9"));
    assert!(!late(&ready, 120, at(500)), "a running spare is never late");
    let starting = Member::of(&spare_pod(false, None, 0)).unwrap();
    assert_eq!(usable(&starting), None);
    assert!(!late(&starting, 120, at(119)));
    assert!(
        late(&starting, 120, at(120)),
        "unschedulable for the whole timeout"
    );
    let mut going = spare_pod(true, Some("10.0.0.9"), 0);
    going.metadata.deletion_timestamp = going.metadata.creation_timestamp.clone();
    assert_eq!(usable(&Member::of(&going).unwrap()), None);
}

#[test]
fn ordinals_are_read_from_the_statefulsets_pod_names_only() {
    assert_eq!(ordinal("cache", "cache-0"), Some(0));
    assert_eq!(ordinal("cache", "cache-12"), Some(12));
    assert_eq!(ordinal("cache", "cache-handover"), None);
    assert_eq!(ordinal("cache", "cache-"), None);
    assert_eq!(ordinal("cache", "cache-x-1"), None);
    assert_eq!(ordinal("cache", "other-1"), None);
}

#[test]
fn only_the_server_just_replaced_takes_the_spares_items() {
    // The partition stepped down to 2 after server 2 was copied to the spare.
    assert!(takes_from_spare(2, 2, Some(2)));
    assert!(
        takes_from_spare(2, 2, None),
        "after a restart: the partition only reaches a server once it is on the spare"
    );
    assert!(
        !takes_from_spare(2, 2, Some(3)),
        "the spare holds another server's items"
    );
    assert!(
        !takes_from_spare(4, 2, None),
        "a scale-up's new server: nothing to copy"
    );
}

#[test]
fn the_spare_stays_while_a_server_is_left_to_replace_or_a_copy_needs_it() {
    assert!(needed(true, true, false, false));
    assert!(
        needed(true, false, false, true),
        "the last server waits for its copy"
    );
    assert!(needed(false, false, true, false), "a copy runs");
    assert!(!needed(true, false, false, false), "rollout over: removed");
    assert!(
        !needed(false, true, false, true),
        "handover disabled: no spare"
    );
}

fn server(ready: bool, gate: Option<&str>, terminating: bool) -> Pod {
    let mut conditions =
        vec![json!({"type": "Ready", "status": if ready { "True" } else { "False" }})];
    if let Some(status) = gate {
        conditions.push(json!({"type": GATE, "status": status}));
    }
    let mut pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "cache-0", "creationTimestamp": at(0)},
        "status": {"conditions": conditions}
    }))
    .unwrap();
    if terminating {
        pod.metadata.deletion_timestamp = pod.metadata.creation_timestamp.clone();
    }
    pod
}

#[test]
fn the_last_server_replaced_keeps_the_spare_until_it_passed_its_gate() {
    assert!(
        gate_pending(None, None),
        "deleted, its replacement not there yet"
    );
    assert!(
        gate_pending(Some(&server(true, None, true)), None),
        "the old pod stopping"
    );
    assert!(
        gate_pending(Some(&server(false, None, false)), None),
        "starting, or waiting behind the gate"
    );
    assert!(
        !gate_pending(Some(&server(false, Some("True"), false)), None),
        "gate opened"
    );
    assert!(
        !gate_pending(Some(&server(true, None, false)), None),
        "ready without a gate"
    );
}

fn on_revision(mut pod: Pod, revision: &str) -> Pod {
    pod.metadata.labels = Some([(REVISION_LABEL.to_owned(), revision.to_owned())].into());
    pod
}

#[test]
fn a_server_the_partition_just_stepped_to_keeps_the_spare_until_it_is_replaced() {
    // The partition stepped down to cache-0, whose old server still runs, its gate opened long ago: the
    // StatefulSet controller has yet to replace it (or even to see the step), and the spare holds the
    // items its replacement takes.
    let old = on_revision(server(true, Some("True"), false), "cache-old");
    assert!(
        gate_pending(Some(&old), Some("cache-new")),
        "the old server, not replaced yet"
    );
    let new = on_revision(server(true, Some("True"), false), "cache-new");
    assert!(
        !gate_pending(Some(&new), Some("cache-new")),
        "replaced, gate opened"
    );
    let unlabelled = server(true, Some("True"), false);
    assert!(
        gate_pending(Some(&unlabelled), Some("cache-new")),
        "no revision: not known to be replaced"
    );
}
