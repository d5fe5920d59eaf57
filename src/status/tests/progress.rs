//! The `Progressing` condition while the servers change: drains, rollouts and warm handovers.

use super::*;

#[test]
fn a_drain_is_progressing_with_reason_draining() {
    let d = ready_deployment(3);
    let mut obs = observed(2, Some(&d), vec![]);
    obs.drain = Some(Drain {
        from_size: 3,
        to_size: 2,
        started_at: at(0),
        servers: Vec::new(),
    });
    let status = compute(&obs, None, &at(5));
    let progressing = find(Some(&status), PROGRESSING).unwrap();
    assert_eq!(
        (progressing.status.as_str(), progressing.reason.as_str()),
        ("True", "Draining")
    );
    assert!(progressing.message.contains("from 3 to 2"));
    assert_eq!(status.drain, obs.drain);
}

#[test]
fn a_running_handover_is_progressing_with_each_slots_items_and_bytes() {
    let d = deployment(json!({"replicas": 5, "readyReplicas": 4, "updatedReplicas": 2}));
    let mut obs = observed(4, Some(&d), vec![]);
    obs.handovers = vec![HandoverProgress {
        slot: 1,
        items: 1200,
        bytes: 96000,
    }];
    let status = compute(&obs, None, &at(0));
    let progressing = find(Some(&status), PROGRESSING).unwrap();
    assert_eq!(
        (progressing.status.as_str(), progressing.reason.as_str()),
        ("True", HANDING_OVER)
    );
    assert!(
        progressing
            .message
            .contains("slot 1: 1200 items, 96000 bytes"),
        "{}",
        progressing.message
    );
    assert!(progressing.message.contains("2 of 4 servers updated"));
}

#[test]
fn a_rollout_says_how_many_servers_are_updated() {
    let d = deployment(json!({"replicas": 5, "readyReplicas": 5, "updatedReplicas": 3}));
    let status = compute(&observed(5, Some(&d), vec![]), None, &at(0));
    let progressing = find(Some(&status), PROGRESSING).unwrap();
    assert_eq!(progressing.reason, "RollingUpdate");
    assert_eq!(progressing.message, "3 of 5 servers updated");
}

#[test]
fn a_scale_down_handover_is_progressing_with_each_target_slots_items_and_bytes() {
    let d = ready_deployment(4);
    let mut obs = observed(3, Some(&d), vec![]);
    obs.drain = Some(Drain {
        from_size: 4,
        to_size: 3,
        started_at: at(0),
        servers: vec![],
    });
    obs.handovers = vec![HandoverProgress {
        slot: 0,
        items: 300,
        bytes: 3000,
    }];
    let status = compute(&obs, None, &at(1));
    let progressing = find(Some(&status), PROGRESSING).unwrap();
    assert_eq!(progressing.reason, HANDING_OVER);
    assert!(
        progressing.message.contains("from 4 to 3")
            && progressing
                .message
                .contains("slot 0: 300 items, 3000 bytes"),
        "{}",
        progressing.message
    );
}

#[test]
fn a_scale_up_handover_says_the_joining_servers_wait_to_be_published() {
    let d = ready_deployment(5);
    let mut obs = observed(5, Some(&d), vec![]);
    obs.servers = (0..5)
        .map(|slot| Server {
            slot,
            pod: Some(format!("p{slot}")),
            address: (slot < 3).then(|| format!("10.0.0.{slot}:11211")),
            ready: true,
        })
        .collect();
    obs.handovers = vec![HandoverProgress {
        slot: 3,
        items: 10,
        bytes: 100,
    }];
    let status = compute(&obs, None, &at(1));
    let progressing = find(Some(&status), PROGRESSING).unwrap();
    assert_eq!(progressing.reason, HANDING_OVER);
    assert!(
        progressing.message.starts_with("scaling up")
            && progressing.message.contains("slot 3: 10 items"),
        "{}",
        progressing.message
    );
}
