//! Table tests for every condition and its transitions.

use super::*;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::jiff::Timestamp;
use serde_json::json;

mod pods;
mod progress;

fn at(secs: i64) -> Time {
    Time(Timestamp::from_second(secs).unwrap())
}

/// A Deployment at generation 1 with the given status fields.
fn deployment(status: serde_json::Value) -> Deployment {
    let mut status = status;
    if status.get("observedGeneration").is_none() {
        status["observedGeneration"] = json!(1);
    }
    serde_json::from_value(json!({
        "metadata": {"name": "cache", "namespace": "default", "generation": 1},
        "status": status,
    }))
    .unwrap()
}

fn pod(name: &str, status: serde_json::Value) -> Pod {
    serde_json::from_value(
        json!({"metadata": {"name": name, "namespace": "default"}, "status": status}),
    )
    .unwrap()
}

fn ready_deployment(n: i32) -> Deployment {
    deployment(
        json!({"replicas": n, "readyReplicas": n, "updatedReplicas": n, "availableReplicas": n}),
    )
}

fn observed<'a>(size: i32, deployment: Option<&'a Deployment>, pods: Vec<&'a Pod>) -> Observed<'a> {
    Observed {
        generation: Some(1),
        size,
        selector: Some("app.kubernetes.io/instance=cache,app.kubernetes.io/name=memcached".into()),
        workload: deployment.map(WorkloadStatus::from),
        pods,
        servers: vec![],
        drain: None,
        problem: None,
        handovers: vec![],
        proxy: None,
        fleet: None,
    }
}

/// (status, reason) of each condition, in the fixed order Available, Progressing, Degraded.
fn summary(status: &MemcachedStatus) -> Vec<(String, String, String)> {
    status
        .conditions
        .iter()
        .map(|c| (c.type_.clone(), c.status.clone(), c.reason.clone()))
        .collect()
}

fn expect(status: &MemcachedStatus, want: [(&str, &str); 3]) {
    let want: Vec<_> = [AVAILABLE, PROGRESSING, DEGRADED]
        .iter()
        .zip(want)
        .map(|(t, (s, r))| (t.to_string(), s.to_string(), r.to_string()))
        .collect();
    assert_eq!(summary(status), want);
}

/// The workload each case of the condition tables observes.
struct Workloads {
    none: Deployment,
    three: Deployment,
    creating: Deployment,
    scaling_up: Deployment,
    scaling_down: Deployment,
    rolling: Deployment,
    unobserved: Deployment,
    deadline: Deployment,
    quota: Deployment,
}

fn workloads() -> Workloads {
    let none = ready_deployment(0);
    let three = ready_deployment(3);
    let creating = deployment(json!({"replicas": 1, "readyReplicas": 0, "updatedReplicas": 1}));
    let scaling_up = deployment(json!({"replicas": 3, "readyReplicas": 1, "updatedReplicas": 3}));
    let scaling_down = deployment(json!({"replicas": 3, "readyReplicas": 3, "updatedReplicas": 3}));
    let rolling = deployment(json!({"replicas": 4, "readyReplicas": 3, "updatedReplicas": 1}));
    let mut unobserved = ready_deployment(1);
    unobserved.metadata.generation = Some(2);
    let deadline = deployment(json!({
        "replicas": 1, "updatedReplicas": 1,
        "conditions": [{"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded",
                        "message": "ReplicaSet \"cache-1\" has timed out progressing."}]
    }));
    let quota = deployment(json!({
        "replicas": 0,
        "conditions": [{"type": "ReplicaFailure", "status": "True", "reason": "FailedCreate",
                        "message": "pods \"cache-1\" is forbidden: exceeded quota: q"}]
    }));
    Workloads {
        none,
        three,
        creating,
        scaling_up,
        scaling_down,
        rolling,
        unobserved,
        deadline,
        quota,
    }
}

type Case<'a> = (&'a str, Observed<'a>, [(&'a str, &'a str); 3]);

/// Each case's three conditions, with the generation observed and a message.
fn check(cases: Vec<Case<'_>>) {
    for (name, obs, want) in cases {
        let status = compute(&obs, None, &at(0));
        let got = summary(&status);
        let want_v: Vec<_> = [AVAILABLE, PROGRESSING, DEGRADED]
            .iter()
            .zip(want)
            .map(|(t, (s, r))| (t.to_string(), s.to_string(), r.to_string()))
            .collect();
        assert_eq!(got, want_v, "case {name:?}");
        for c in &status.conditions {
            assert_eq!(c.observed_generation, Some(1), "case {name:?}");
            assert!(!c.message.is_empty(), "case {name:?}");
        }
    }
}

#[test]
fn condition_table_as_pods_come_and_go() {
    let w = workloads();
    check(vec![
        (
            "no deployment yet",
            observed(1, None, vec![]),
            [
                ("False", "ReplicasNotReady"),
                ("True", "Creating"),
                ("False", "AsExpected"),
            ],
        ),
        (
            "pod starting",
            observed(1, Some(&w.creating), vec![]),
            [
                ("False", "ReplicasNotReady"),
                ("True", "ScalingUp"),
                ("False", "AsExpected"),
            ],
        ),
        (
            "all ready",
            observed(3, Some(&w.three), vec![]),
            [
                ("True", "AllReplicasReady"),
                ("False", "Complete"),
                ("False", "AsExpected"),
            ],
        ),
        (
            "scaling up",
            observed(3, Some(&w.scaling_up), vec![]),
            [
                ("False", "ReplicasNotReady"),
                ("True", "ScalingUp"),
                ("False", "AsExpected"),
            ],
        ),
        (
            "scaling down",
            observed(1, Some(&w.scaling_down), vec![]),
            [
                ("True", "AllReplicasReady"),
                ("True", "ScalingDown"),
                ("False", "AsExpected"),
            ],
        ),
    ]);
}

#[test]
fn condition_table_of_rollouts_and_workload_problems() {
    let w = workloads();
    check(vec![
        (
            "rolling update",
            observed(3, Some(&w.rolling), vec![]),
            [
                ("True", "AllReplicasReady"),
                ("True", "RollingUpdate"),
                ("False", "AsExpected"),
            ],
        ),
        (
            "spec not yet observed by the deployment controller",
            observed(1, Some(&w.unobserved), vec![]),
            [
                ("True", "AllReplicasReady"),
                ("True", "Reconciling"),
                ("False", "AsExpected"),
            ],
        ),
        (
            "scaled to zero",
            observed(0, Some(&w.none), vec![]),
            [
                ("True", "ScaledToZero"),
                ("False", "Complete"),
                ("False", "AsExpected"),
            ],
        ),
        (
            "progress deadline exceeded",
            observed(1, Some(&w.deadline), vec![]),
            [
                ("False", "ReplicasNotReady"),
                ("False", "ProgressDeadlineExceeded"),
                ("True", "ProgressDeadlineExceeded"),
            ],
        ),
        (
            "quota rejects pods",
            observed(1, Some(&w.quota), vec![]),
            [
                ("False", "ReplicasNotReady"),
                ("True", "ScalingUp"),
                ("True", "ReplicaFailure"),
            ],
        ),
    ]);
}

#[test]
fn operator_problems_take_precedence() {
    let d = ready_deployment(1);
    let mut obs = observed(1, Some(&d), vec![]);
    obs.problem = Some(Problem {
        reason: "InvalidName".into(),
        message: "metadata.name is bad".into(),
    });
    let status = compute(&obs, None, &at(0));
    expect(
        &status,
        [
            ("True", "AllReplicasReady"),
            ("False", "Complete"),
            ("True", "InvalidName"),
        ],
    );
}

#[test]
fn counts_nodes_and_selector_come_from_what_exists() {
    let d = deployment(json!({"replicas": 3, "readyReplicas": 2, "updatedReplicas": 3}));
    let (b, a, c) = (
        pod("cache-b", json!({})),
        pod("cache-a", json!({})),
        pod("cache-c", json!({})),
    );
    let mut gone = pod("cache-0", json!({}));
    gone.metadata.deletion_timestamp = Some(at(5));
    let status = compute(
        &observed(3, Some(&d), vec![&b, &gone, &a, &c]),
        None,
        &at(0),
    );
    assert_eq!(status.replicas, 3);
    assert_eq!(status.ready_replicas, 2);
    assert_eq!(status.nodes, ["cache-a", "cache-b", "cache-c"]);
    assert_eq!(status.observed_generation, Some(1));
    assert_eq!(
        status.selector.as_deref(),
        Some("app.kubernetes.io/instance=cache,app.kubernetes.io/name=memcached")
    );
}

#[test]
fn servers_are_published_in_slot_order_with_the_ready_ones_in_server_list() {
    let d = ready_deployment(3);
    let mut obs = observed(3, Some(&d), vec![]);
    let server = |slot: i32, address: &str, ready: bool| Server {
        slot,
        pod: Some(format!("cache-{slot}")),
        address: Some(address.into()),
        ready,
    };
    obs.servers = vec![
        server(0, "10.0.0.9:11211", true),
        server(1, "10.0.0.10:11211", false),
        server(2, "[fd00::1]:11211", true),
    ];
    let status = compute(&obs, None, &at(0));
    assert_eq!(status.server_list, ["10.0.0.9:11211", "[fd00::1]:11211"]);
    assert_eq!(status.servers, obs.servers);
    assert_eq!(status.drain, None);
}

#[test]
fn transition_time_moves_only_when_status_changes() {
    let starting = deployment(json!({"replicas": 1, "readyReplicas": 0, "updatedReplicas": 1}));
    let ready = ready_deployment(1);
    let first = compute(&observed(1, Some(&starting), vec![]), None, &at(10));

    // Same observation later: identical status, so the reconciler writes nothing.
    let again = compute(&observed(1, Some(&starting), vec![]), Some(&first), &at(20));
    assert_eq!(again, first);

    // Pod becomes ready: Available and Progressing flip (new time), Degraded stays (old time).
    let later = compute(&observed(1, Some(&ready), vec![]), Some(&again), &at(30));
    let time = |s: &MemcachedStatus, t| find(Some(s), t).unwrap().last_transition_time.clone();
    assert_eq!(time(&later, AVAILABLE), at(30));
    assert_eq!(time(&later, PROGRESSING), at(30));
    assert_eq!(time(&later, DEGRADED), at(10));

    // Reason or message changes without a status change keep the time.
    let scaled = ready_deployment(3);
    let bigger = compute(&observed(3, Some(&scaled), vec![]), Some(&later), &at(40));
    assert_eq!(
        find(Some(&bigger), AVAILABLE).unwrap().message,
        "3 of 3 pods ready"
    );
    assert_eq!(time(&bigger, AVAILABLE), at(30));
}

#[test]
fn a_pod_counts_as_ready_before_its_workload_has_counted_it() {
    let ready = json!({"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]});
    let (a, b) = (pod("cache-a", ready.clone()), pod("cache-b", ready));
    let mut gone = pod(
        "cache-c",
        json!({"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}),
    );
    gone.metadata.deletion_timestamp = Some(at(0));
    // The kubelet marked both pods ready; the Deployment's controller has counted one of them so far.
    let lagging = deployment(json!({"replicas": 2, "readyReplicas": 1, "updatedReplicas": 2}));
    let status = compute(
        &observed(2, Some(&lagging), vec![&a, &b, &gone]),
        None,
        &at(0),
    );
    assert_eq!(status.ready_replicas, 2, "a terminating pod is not counted");
    expect(
        &status,
        [
            ("True", "AllReplicasReady"),
            ("False", "Complete"),
            ("False", "AsExpected"),
        ],
    );
    // And the other way round: the Deployment still counts a pod the cache no longer shows as ready.
    let status = compute(
        &observed(2, Some(&ready_deployment(2)), vec![&a]),
        None,
        &at(0),
    );
    assert_eq!(status.ready_replicas, 2);
}

#[test]
fn a_new_workloads_ready_pods_complete_it_before_its_controller_reports() {
    let ready = json!({"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]});
    let (a, b) = (pod("cache-a", ready.clone()), pod("cache-b", ready));
    // Generation 1, its controller has reported nothing yet (a burst: it lags the pods by seconds).
    let unreported: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "cache", "namespace": "default", "generation": 1},
    }))
    .unwrap();
    let early = compute(&observed(2, Some(&unreported), vec![&a, &b]), None, &at(0));
    expect(
        &early,
        [
            ("True", "AllReplicasReady"),
            ("False", "Complete"),
            ("False", "AsExpected"),
        ],
    );
    assert_eq!((early.replicas, early.ready_replicas), (2, 2));
    // When the controller catches up, the status is the same: no second write.
    let later = compute(
        &observed(2, Some(&ready_deployment(2)), vec![&a, &b]),
        Some(&early),
        &at(5),
    );
    assert_eq!(later, early);
    // One pod of two: still being created.
    let one = compute(&observed(2, Some(&unreported), vec![&a]), None, &at(0));
    assert_eq!(
        find(Some(&one), PROGRESSING).unwrap().reason,
        CREATING,
        "{one:?}"
    );
    // A workload whose spec changed since (generation 2) is not judged by its pods: they may be old.
    let mut changed = unreported.clone();
    changed.metadata.generation = Some(2);
    changed.status = ready_deployment(2).status;
    let status = compute(&observed(2, Some(&changed), vec![&a, &b]), None, &at(0));
    assert_eq!(
        find(Some(&status), PROGRESSING).unwrap().reason,
        "Reconciling"
    );
}

#[test]
fn an_instance_waiting_for_its_fleet_turn_says_so_with_its_place_until_it_rolls() {
    let ready = json!({"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]});
    let a = pod("cache-a", ready);
    let settled = ready_deployment(1);
    let mut waiting = observed(1, Some(&settled), vec![&a]);
    waiting.fleet = Some(crate::status::FleetWait { place: 7, slots: 2 });
    let status = compute(&waiting, None, &at(0));
    expect(
        &status,
        [
            ("True", "AllReplicasReady"),
            ("True", crate::status::WAITING_FOR_FLEET_ROLLOUT),
            ("False", "AsExpected"),
        ],
    );
    let message = &status.conditions[1].message;
    assert!(
        message.contains("place 7 in the queue, 2 rolling at a time"),
        "{message}"
    );
    // A rollout under way (the owner's, taking a slot) says what it does instead.
    let rolling = deployment(json!({"replicas": 2, "readyReplicas": 1, "updatedReplicas": 1}));
    let mut busy = observed(1, Some(&rolling), vec![&a]);
    busy.fleet = waiting.fleet;
    let status = compute(&busy, None, &at(0));
    assert_eq!(status.conditions[1].reason, "RollingUpdate");
}

#[test]
fn a_workload_replaces_pods_until_all_are_on_the_current_template() {
    let status = |value| WorkloadStatus::from(&deployment(value));
    assert!(!status(json!({"replicas": 2, "updatedReplicas": 2})).replacing(2));
    assert!(
        status(json!({"replicas": 3, "updatedReplicas": 2})).replacing(2),
        "an old pod left"
    );
    assert!(status(json!({"replicas": 2, "updatedReplicas": 1})).replacing(2));
    let mut unobserved = deployment(json!({"replicas": 2, "updatedReplicas": 2}));
    assert!(!WorkloadStatus::from(&unobserved).unobserved());
    unobserved.metadata.generation = Some(3);
    let unobserved = WorkloadStatus::from(&unobserved);
    assert!(unobserved.unobserved() && !unobserved.replacing(2));
}
