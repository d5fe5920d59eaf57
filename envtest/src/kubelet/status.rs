//! The status a running pod should have, as a strategic-merge patch, and whether the pod already has it.
//!
//! Pure functions of the pod and what the kubelet knows (its IP, when it started, whether its memcached
//! process lives), so the rules are tested without a server.
//!
//! Why a strategic-merge patch of the status subresource: conditions merge by `type` there, so the patch
//! leaves alone the readiness-gate conditions others set (the operator, a load balancer controller), with
//! no read-modify-write race; a JSON merge patch would replace the whole list.

use std::net::Ipv4Addr;

use k8s_openapi::api::core::v1::{Pod, PodCondition};
use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};

/// The host every pod runs on, as far as clients are concerned.
pub const HOST_IP: &str = "127.0.0.1";

/// What the kubelet knows about a pod it runs.
#[derive(Clone, Debug)]
pub struct Running {
    pub ip: Ipv4Addr,
    pub started: Timestamp,
    /// `None` while the container (process) runs; its exit code once it has exited.
    pub exited: Option<i32>,
    pub finished: Option<Timestamp>,
}

/// Whether every `spec.readinessGates` condition is `True` in the pod's status.
pub fn gates_pass(pod: &Pod) -> bool {
    let gates = pod
        .spec
        .as_ref()
        .and_then(|s| s.readiness_gates.as_ref())
        .map(Vec::as_slice)
        .unwrap_or_default();
    gates
        .iter()
        .all(|gate| condition(pod, &gate.condition_type).is_some_and(|c| c.status == "True"))
}

fn condition<'a>(pod: &'a Pod, kind: &str) -> Option<&'a PodCondition> {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == kind))
}

/// The conditions the kubelet owns, in the order a kubelet writes them.
fn desired_conditions(pod: &Pod, run: &Running) -> [(&'static str, bool); 4] {
    let containers_ready = run.exited.is_none();
    [
        ("PodScheduled", true),
        ("Initialized", true),
        ("ContainersReady", containers_ready),
        ("Ready", containers_ready && gates_pass(pod)),
    ]
}

/// Whether the pod's status already says what [`patch`] would write (ignoring timestamps), so that an
/// unchanged pod costs no request.
pub fn up_to_date(pod: &Pod, run: &Running) -> bool {
    let Some(status) = pod.status.as_ref() else {
        return false;
    };
    let ip = run.ip.to_string();
    let conditions_match = desired_conditions(pod, run).iter().all(|(kind, want)| {
        condition(pod, kind).is_some_and(|c| c.status == if *want { "True" } else { "False" })
    });
    let names = container_names(pod);
    let containers_match = status.container_statuses.as_ref().is_some_and(|cs| {
        cs.len() == names.len()
            && cs.iter().zip(&names).all(|(c, name)| {
                &c.name == name
                    && c.ready == run.exited.is_none()
                    && c.state.as_ref().is_some_and(|s| {
                        s.running.is_some() == run.exited.is_none()
                            && s.terminated.is_some() == run.exited.is_some()
                    })
            })
    });
    status.phase.as_deref() == Some("Running")
        && status.pod_ip.as_deref() == Some(ip.as_str())
        && conditions_match
        && containers_match
}

/// The strategic-merge patch of the status subresource that makes the pod Running on `run.ip`, with a
/// `lastTransitionTime` kept for every condition whose status does not change.
pub fn patch(pod: &Pod, run: &Running, now: Timestamp) -> Value {
    let time = |t: Timestamp| k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(t);
    let conditions: Vec<Value> = desired_conditions(pod, run)
        .iter()
        .map(|(kind, want)| {
            let status = if *want { "True" } else { "False" };
            let since = condition(pod, kind)
                .filter(|c| c.status == status)
                .and_then(|c| c.last_transition_time.clone())
                .unwrap_or(time(now));
            json!({"type": kind, "status": status, "lastTransitionTime": since, "lastProbeTime": null})
        })
        .collect();
    let spec = pod.spec.as_ref();
    let containers: Vec<Value> = spec
        .map(|s| s.containers.as_slice())
        .unwrap_or_default()
        .iter()
        .map(|c| {
            let state = match run.exited {
                None => json!({"running": {"startedAt": time(run.started)}}),
                Some(code) => json!({"terminated": {
                    "exitCode": code,
                    "reason": if code == 0 { "Completed" } else { "Error" },
                    "startedAt": time(run.started),
                    "finishedAt": time(run.finished.unwrap_or(now)),
                }}),
            };
            json!({
                "name": c.name,
                "image": c.image.clone().unwrap_or_default(),
                "imageID": format!("envtest://{}", c.image.clone().unwrap_or_default()),
                "containerID": format!("envtest://{}/{}", uid(pod), c.name),
                "ready": run.exited.is_none(),
                "started": run.exited.is_none(),
                "restartCount": 0,
                "state": state,
            })
        })
        .collect();
    let init_containers: Vec<Value> = spec
        .and_then(|s| s.init_containers.as_deref())
        .unwrap_or_default()
        .iter()
        .map(|c| {
            json!({
                "name": c.name,
                "image": c.image.clone().unwrap_or_default(),
                "imageID": format!("envtest://{}", c.image.clone().unwrap_or_default()),
                "containerID": format!("envtest://{}/{}", uid(pod), c.name),
                "ready": true,
                "restartCount": 0,
                "state": {"terminated": {
                    "exitCode": 0, "reason": "Completed",
                    "startedAt": time(run.started), "finishedAt": time(run.started),
                }},
            })
        })
        .collect();
    let ip = run.ip.to_string();
    let mut status = json!({
        "phase": "Running",
        "hostIP": HOST_IP,
        "hostIPs": [{"ip": HOST_IP}],
        "podIP": ip,
        "podIPs": [{"ip": ip}],
        "startTime": time(run.started),
        "conditions": conditions,
        "containerStatuses": containers,
    });
    if !init_containers.is_empty() {
        status["initContainerStatuses"] = Value::Array(init_containers);
    }
    json!({ "status": status })
}

fn container_names(pod: &Pod) -> Vec<String> {
    pod.spec
        .as_ref()
        .map(|s| s.containers.iter().map(|c| c.name.clone()).collect())
        .unwrap_or_default()
}

fn uid(pod: &Pod) -> &str {
    pod.metadata.uid.as_deref().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(gate: Option<&str>, gate_status: Option<&str>) -> Pod {
        let mut pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u1"},
            "spec": {"containers": [{"name": "memcached", "image": "memcached:1.6"}, {"name": "exporter"}]},
        }))
        .unwrap();
        if let Some(gate) = gate {
            pod.spec.as_mut().unwrap().readiness_gates = Some(vec![
                serde_json::from_value(json!({"conditionType": gate})).unwrap(),
            ]);
        }
        if let (Some(gate), Some(status)) = (gate, gate_status) {
            pod.status = Some(
                serde_json::from_value(json!({"conditions": [{"type": gate, "status": status}]}))
                    .unwrap(),
            );
        }
        pod
    }

    fn running() -> Running {
        Running {
            ip: Ipv4Addr::new(127, 1, 1, 7),
            started: "2024-01-01T00:00:00Z".parse().unwrap(),
            exited: None,
            finished: None,
        }
    }

    /// The pod as the server would hold it after the patch (the strategic merge of conditions by type).
    fn apply(mut pod: Pod, patch: &Value) -> Pod {
        let mut status = serde_json::to_value(pod.status.take().unwrap_or_default()).unwrap();
        let mut conditions: Vec<Value> =
            status["conditions"].as_array().cloned().unwrap_or_default();
        for new in patch["status"]["conditions"].as_array().unwrap() {
            conditions.retain(|c| c["type"] != new["type"]);
            conditions.push(new.clone());
        }
        for (k, v) in patch["status"].as_object().unwrap() {
            status[k] = v.clone();
        }
        status["conditions"] = Value::Array(conditions);
        pod.status = Some(serde_json::from_value(status).unwrap());
        pod
    }

    fn ready(pod: &Pod) -> &str {
        &condition(pod, "Ready").unwrap().status
    }

    #[test]
    fn without_gates_a_running_pod_is_ready_with_every_container() {
        let now = "2024-01-01T00:00:05Z".parse().unwrap();
        let p = pod(None, None);
        assert!(!up_to_date(&p, &running()));
        let patch = patch(&p, &running(), now);
        let p = apply(p, &patch);
        assert_eq!(ready(&p), "True");
        let status = p.status.as_ref().unwrap();
        assert_eq!(status.pod_ip.as_deref(), Some("127.1.1.7"));
        assert_eq!(status.host_ip.as_deref(), Some(HOST_IP));
        let names: Vec<&str> = status
            .container_statuses
            .as_ref()
            .unwrap()
            .iter()
            .map(|c| c.name.as_str())
            .collect();
        assert_eq!(names, ["memcached", "exporter"]);
        assert!(up_to_date(&p, &running()));
    }

    #[test]
    fn ready_waits_for_every_gate_and_keeps_the_gate_condition() {
        let now = "2024-01-01T00:00:05Z".parse().unwrap();
        let p = pod(Some("example.com/in-rotation"), None);
        let p = apply(p.clone(), &patch(&p, &running(), now));
        assert_eq!(ready(&p), "False");
        assert_eq!(condition(&p, "ContainersReady").unwrap().status, "True");

        let mut p = p;
        let gate: PodCondition =
            serde_json::from_value(json!({"type": "example.com/in-rotation", "status": "True"}))
                .unwrap();
        p.status
            .as_mut()
            .unwrap()
            .conditions
            .as_mut()
            .unwrap()
            .push(gate);
        assert!(
            !up_to_date(&p, &running()),
            "a passing gate must flip Ready"
        );
        let later = "2024-01-01T00:00:09Z".parse().unwrap();
        let patch = patch(&p, &running(), later);
        let p = apply(p, &patch);
        assert_eq!(ready(&p), "True");
        assert_eq!(
            condition(&p, "example.com/in-rotation").unwrap().status,
            "True"
        );
        // Unchanged conditions keep their transition time; Ready's is the flip's.
        let t = |kind| {
            condition(&p, kind)
                .unwrap()
                .last_transition_time
                .clone()
                .unwrap()
                .0
        };
        assert_eq!(t("ContainersReady"), now);
        assert_eq!(t("Ready"), later);
    }

    #[test]
    fn an_exited_process_makes_the_pod_not_ready() {
        let now = "2024-01-01T00:00:05Z".parse().unwrap();
        let p = pod(None, None);
        let p = apply(p.clone(), &patch(&p, &running(), now));
        let dead = Running {
            exited: Some(1),
            finished: Some(now),
            ..running()
        };
        assert!(!up_to_date(&p, &dead));
        let p = apply(p.clone(), &patch(&p, &dead, now));
        assert_eq!(ready(&p), "False");
        let c = &p
            .status
            .as_ref()
            .unwrap()
            .container_statuses
            .as_ref()
            .unwrap()[0];
        assert!(!c.ready);
        assert_eq!(
            c.state
                .as_ref()
                .unwrap()
                .terminated
                .as_ref()
                .unwrap()
                .exit_code,
            1
        );
        assert!(up_to_date(&p, &dead));
    }
}
