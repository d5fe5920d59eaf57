//! Pod trouble as the `Degraded` condition: what cannot start, and memcached killed for memory.

use super::*;

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
