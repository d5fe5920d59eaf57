//! Table tests for every condition and its transitions.

use super::*;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::jiff::Timestamp;
use serde_json::json;

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
fn pod_problems_become_degraded_with_stable_messages() {
    let d = deployment(json!({"replicas": 1, "updatedReplicas": 1}));
    let cases = [
        (
            json!({"containerStatuses": [{"name": "memcached", "image": "nope:1", "imageID": "", "ready": false, "restartCount": 0,
            "state": {"waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling image"}}}]}),
            "ImagePullFailed",
            "cannot pull image",
        ),
        (
            json!({"containerStatuses": [{"name": "memcached", "image": "nope:1", "imageID": "", "ready": false, "restartCount": 0,
            "state": {"waiting": {"reason": "ErrImagePull", "message": "rpc error"}}}]}),
            "ImagePullFailed",
            "cannot pull image",
        ),
        (
            json!({"containerStatuses": [{"name": "memcached", "image": "m", "imageID": "", "ready": false, "restartCount": 7,
            "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 5m0s"}},
            "lastState": {"terminated": {"exitCode": 71, "reason": "Error"}}}]}),
            "CrashLoopBackOff",
            "last exit code 71 (Error)",
        ),
        (
            json!({"containerStatuses": [{"name": "memcached", "image": "m", "imageID": "", "ready": false, "restartCount": 0,
            "state": {"waiting": {"reason": "CreateContainerConfigError", "message": "secret \"x\" not found"}}}]}),
            "ContainerCreateFailed",
            "secret",
        ),
        (
            json!({"conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
            "message": "0/3 nodes are available: insufficient memory"}]}),
            "Unschedulable",
            "insufficient memory",
        ),
    ];
    for (pod_status, reason, fragment) in cases {
        let p = pod("cache-abc", pod_status);
        let status = compute(&observed(1, Some(&d), vec![&p]), None, &at(0));
        let degraded = find(Some(&status), DEGRADED).unwrap();
        assert_eq!(
            (degraded.status.as_str(), degraded.reason.as_str()),
            ("True", reason)
        );
        assert!(
            degraded.message.contains("cache-abc"),
            "{}",
            degraded.message
        );
        assert!(degraded.message.contains(fragment), "{}", degraded.message);
        assert!(
            !degraded.message.contains("restart"),
            "no volatile counts: {}",
            degraded.message
        );
    }
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

/// A memcached pod as the pod cache holds it (no spec), with `container` as its status.
fn pod_with_status(container: serde_json::Value) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": "cache-abc", "namespace": "default"},
        "status": {"containerStatuses": [container]}
    }))
    .unwrap()
}

fn degraded_of(pod: &Pod) -> Option<(String, String)> {
    let d = deployment(json!({"replicas": 1, "updatedReplicas": 1}));
    let status = compute(&observed(1, Some(&d), vec![pod]), None, &at(0));
    find(Some(&status), DEGRADED)
        .filter(|c| c.status == "True")
        .map(|c| (c.reason.clone(), c.message.clone()))
}

fn oom_killed_last(restarts: i32, state: serde_json::Value) -> serde_json::Value {
    json!({"name": "memcached", "image": "m", "imageID": "", "ready": false, "restartCount": restarts,
        "state": state,
        "lastState": {"terminated": {"exitCode": 137, "reason": "OOMKilled",
            "finishedAt": format!("2024-01-01T00:00:{restarts:02}Z")}}})
}

#[test]
fn an_oom_kill_takes_precedence_over_the_crash_loop_and_does_not_flap() {
    let waiting = json!({"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s"}});
    let running = json!({"running": {"startedAt": "2024-01-01T00:01:00Z"}});
    let seen: Vec<_> = [(3, waiting.clone()), (4, running), (5, waiting)]
        .into_iter()
        .map(|(restarts, state)| degraded_of(&pod_with_status(oom_killed_last(restarts, state))))
        .collect();
    let (reason, message) = seen[0].clone().expect("Degraded");
    assert_eq!(reason, "OOMKilled");
    assert!(
        seen.iter()
            .all(|s| s.as_ref() == Some(&(reason.clone(), message.clone()))),
        "{seen:?}"
    );
    for fragment in [
        "cache-abc",
        "memcached",
        "memory limit",
        "restarted empty",
        "spec.resources.limits.memory",
        "maxMemoryMB",
    ] {
        assert!(message.contains(fragment), "{fragment}: {message}");
    }
    assert!(
        !message.contains("2024") && !message.contains("137"),
        "nothing volatile: {message}"
    );
}

#[test]
fn a_running_container_is_reported_only_after_an_oom_kill() {
    let running = json!({"running": {"startedAt": "2024-01-01T00:01:00Z"}});
    let killed = pod_with_status(oom_killed_last(1, running.clone()));
    assert_eq!(
        degraded_of(&killed).map(|(r, _)| r).as_deref(),
        Some("OOMKilled")
    );

    let errored = json!({"name": "memcached", "image": "m", "imageID": "", "ready": true, "restartCount": 1,
        "state": running.clone(), "lastState": {"terminated": {"exitCode": 1, "reason": "Error"}}});
    let fresh = json!({"name": "memcached", "image": "m", "imageID": "", "ready": true, "restartCount": 0,
        "state": running});
    for container in [errored, fresh] {
        assert_eq!(
            degraded_of(&pod_with_status(container.clone())),
            None,
            "{container}"
        );
    }
}
