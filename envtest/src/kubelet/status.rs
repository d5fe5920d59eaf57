//! The status a pod the kubelet runs should have, as a strategic-merge patch, and whether the pod already
//! has it.
//!
//! Pure functions of the pod and what the kubelet knows (its IP, when it started, whether its memcached
//! process lives, which containers wait for an image), so the rules are tested without a server.
//!
//! Why a strategic-merge patch of the status subresource: conditions merge by `type` there, so the patch
//! leaves alone the readiness-gate conditions others set (the operator, a load balancer controller), with
//! no read-modify-write race; a JSON merge patch would replace the whole list. Container statuses have no
//! merge key, so each patch replaces them whole.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use k8s_openapi::api::core::v1::{Container, Pod, PodCondition};
use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};

pub use super::image::Waiting;

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
    /// Containers (init or not, by name) that the kubelet cannot start, and why: an image it cannot pull
    /// ([`super::image`]). They wait, and the pod with them.
    pub waiting: BTreeMap<String, Waiting>,
}

/// Whether every `spec.readinessGates` condition is `True` in the pod's status.
pub fn gates_pass(pod: &Pod) -> bool {
    failing_gate(pod).is_none()
}

/// The first readiness gate whose condition is not `True`, and what the kubelet says about it.
fn failing_gate(pod: &Pod) -> Option<String> {
    let gates = pod
        .spec
        .as_ref()
        .and_then(|s| s.readiness_gates.as_ref())
        .map(Vec::as_slice)
        .unwrap_or_default();
    gates.iter().find_map(|gate| {
        let kind = &gate.condition_type;
        match condition(pod, kind) {
            Some(c) if c.status == "True" => None,
            Some(c) => Some(format!(
                "the status of pod readiness gate \"{kind}\" is not \"True\", but {}",
                c.status
            )),
            None => Some(format!(
                "corresponding condition of pod readiness gate \"{kind}\" does not exist."
            )),
        }
    })
}

fn condition<'a>(pod: &'a Pod, kind: &str) -> Option<&'a PodCondition> {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == kind))
}

/// A container's state as the kubelet reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
enum State {
    Waiting(Waiting),
    Running,
    /// Exited with this code.
    Terminated(i32),
}

impl State {
    fn ready(&self) -> bool {
        matches!(self, State::Running)
    }

    fn waiting(reason: &str, message: &str) -> State {
        State::Waiting(Waiting {
            reason: reason.to_owned(),
            message: message.to_owned(),
        })
    }
}

/// A condition the kubelet owns: type, status, and the reason and message it gives when `False`.
struct Cond {
    kind: &'static str,
    status: bool,
    reason: Option<&'static str>,
    message: Option<String>,
}

/// Everything the kubelet reports about a pod, derived from the pod and `run`.
struct Desired {
    phase: &'static str,
    conditions: Vec<Cond>,
    init: Vec<(String, State)>,
    containers: Vec<(String, State)>,
}

fn desired(pod: &Pod, run: &Running) -> Desired {
    let spec = pod.spec.as_ref();
    let inits: &[Container] = spec
        .and_then(|s| s.init_containers.as_deref())
        .unwrap_or_default();
    let mains: &[Container] = spec.map(|s| s.containers.as_slice()).unwrap_or_default();

    // Init containers run in order: those before the first that cannot start have completed, those after
    // it have not begun.
    let mut blocked = false;
    let init: Vec<(String, State)> = inits
        .iter()
        .map(|c| {
            let state = if blocked {
                State::waiting("PodInitializing", "")
            } else if let Some(w) = run.waiting.get(&c.name) {
                blocked = true;
                State::Waiting(w.clone())
            } else {
                State::Terminated(0)
            };
            (c.name.clone(), state)
        })
        .collect();
    let initialized = !blocked;
    let containers: Vec<(String, State)> = mains
        .iter()
        .map(|c| {
            let state = if !initialized {
                State::waiting("PodInitializing", "")
            } else if let Some(w) = run.waiting.get(&c.name) {
                State::Waiting(w.clone())
            } else if let Some(code) = run.exited {
                State::Terminated(code)
            } else {
                State::Running
            };
            (c.name.clone(), state)
        })
        .collect();

    let names = |list: &[(String, State)], pick: fn(&State) -> bool| -> Vec<String> {
        list.iter()
            .filter(|(_, s)| pick(s))
            .map(|(n, _)| n.clone())
            .collect()
    };
    let incomplete = names(&init, |s| !matches!(s, State::Terminated(0)));
    let unready = names(&containers, |s| !s.ready());
    let containers_ready = unready.is_empty();
    let gate = failing_gate(pod);
    let unready_message = format!("containers with unready status: [{}]", unready.join(" "));
    let (ready_reason, ready_message) = if !containers_ready {
        (Some("ContainersNotReady"), Some(unready_message.clone()))
    } else if let Some(gate) = gate.clone() {
        (Some("ReadinessGatesNotReady"), Some(gate))
    } else {
        (None, None)
    };
    let conditions = vec![
        Cond {
            kind: "PodScheduled",
            status: true,
            reason: None,
            message: None,
        },
        Cond {
            kind: "Initialized",
            status: initialized,
            reason: (!initialized).then_some("ContainersNotInitialized"),
            message: (!initialized).then(|| {
                format!(
                    "containers with incomplete status: [{}]",
                    incomplete.join(" ")
                )
            }),
        },
        Cond {
            kind: "ContainersReady",
            status: containers_ready,
            reason: (!containers_ready).then_some("ContainersNotReady"),
            message: (!containers_ready).then_some(unready_message),
        },
        Cond {
            kind: "Ready",
            status: containers_ready && gate.is_none(),
            reason: ready_reason,
            message: ready_message,
        },
    ];
    // A kubelet reports a pod Pending while any of its containers has not started yet.
    let any_waiting = init
        .iter()
        .chain(&containers)
        .any(|(_, s)| matches!(s, State::Waiting(_)));
    Desired {
        phase: if any_waiting { "Pending" } else { "Running" },
        conditions,
        init,
        containers,
    }
}

/// Whether the pod's status already says what [`patch`] would write (ignoring timestamps and messages), so
/// that an unchanged pod costs no request.
pub fn up_to_date(pod: &Pod, run: &Running) -> bool {
    let Some(status) = pod.status.as_ref() else {
        return false;
    };
    let want = desired(pod, run);
    let ip = run.ip.to_string();
    let conditions_match = want.conditions.iter().all(|w| {
        condition(pod, w.kind).is_some_and(|c| {
            c.status == if w.status { "True" } else { "False" } && c.reason.as_deref() == w.reason
        })
    });
    let states_match = |have: Option<&Vec<k8s_openapi::api::core::v1::ContainerStatus>>,
                        want: &[(String, State)]| {
        have.map(Vec::as_slice).unwrap_or_default().len() == want.len()
            && have.into_iter().flatten().zip(want).all(|(c, (name, w))| {
                let state = c.state.as_ref();
                &c.name == name
                    && c.ready == w.ready()
                    && match w {
                        State::Running => state.is_some_and(|s| s.running.is_some()),
                        State::Terminated(code) => state
                            .and_then(|s| s.terminated.as_ref())
                            .is_some_and(|t| t.exit_code == *code),
                        State::Waiting(w) => state
                            .and_then(|s| s.waiting.as_ref())
                            .is_some_and(|s| s.reason.as_deref() == Some(w.reason.as_str())),
                    }
            })
    };
    status.phase.as_deref() == Some(want.phase)
        && status.pod_ip.as_deref() == Some(ip.as_str())
        && conditions_match
        && states_match(status.container_statuses.as_ref(), &want.containers)
        && states_match(status.init_container_statuses.as_ref(), &want.init)
}

/// The strategic-merge patch of the status subresource that reports the pod on `run.ip`, with a
/// `lastTransitionTime` kept for every condition whose status does not change.
pub fn patch(pod: &Pod, run: &Running, now: Timestamp) -> Value {
    let time = |t: Timestamp| k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(t);
    let want = desired(pod, run);
    let conditions: Vec<Value> = want
        .conditions
        .iter()
        .map(|w| {
            let status = if w.status { "True" } else { "False" };
            let since = condition(pod, w.kind)
                .filter(|c| c.status == status)
                .and_then(|c| c.last_transition_time.clone())
                .unwrap_or(time(now));
            // Null removes a reason or message left from an earlier status.
            json!({
                "type": w.kind, "status": status, "lastTransitionTime": since, "lastProbeTime": null,
                "reason": w.reason, "message": w.message,
            })
        })
        .collect();
    let spec = pod.spec.as_ref();
    let images: BTreeMap<&str, String> = spec
        .iter()
        .flat_map(|s| {
            s.containers
                .iter()
                .chain(s.init_containers.iter().flatten())
        })
        .map(|c| (c.name.as_str(), c.image.clone().unwrap_or_default()))
        .collect();
    let statuses = |list: &[(String, State)], init: bool| -> Vec<Value> {
        list.iter()
            .map(|(name, state)| {
                let image = images.get(name.as_str()).cloned().unwrap_or_default();
                let mut status = json!({
                    "name": name,
                    "image": image,
                    "imageID": "",
                    "ready": state.ready() || (init && *state == State::Terminated(0)),
                    "restartCount": 0,
                });
                if !init {
                    status["started"] = json!(state.ready());
                }
                let (started, finished) = (time(run.started), time(run.finished.unwrap_or(now)));
                status["state"] = match state {
                    State::Waiting(w) if w.message.is_empty() => {
                        json!({"waiting": {"reason": w.reason}})
                    }
                    State::Waiting(w) => {
                        json!({"waiting": {"reason": w.reason, "message": w.message}})
                    }
                    State::Running => json!({"running": {"startedAt": started}}),
                    State::Terminated(0) if init => json!({"terminated": {
                        "exitCode": 0, "reason": "Completed",
                        "startedAt": started, "finishedAt": started,
                    }}),
                    State::Terminated(code) => json!({"terminated": {
                        "exitCode": code,
                        "reason": if *code == 0 { "Completed" } else { "Error" },
                        "startedAt": started,
                        "finishedAt": finished,
                    }}),
                };
                if !matches!(state, State::Waiting(_)) {
                    // Only a pulled image has an ID, and only a created container one of its own.
                    status["imageID"] = json!(format!("envtest://{image}"));
                    status["containerID"] = json!(format!("envtest://{}/{name}", uid(pod)));
                }
                status
            })
            .collect()
    };
    let ip = run.ip.to_string();
    let mut status = json!({
        "phase": want.phase,
        "hostIP": HOST_IP,
        "hostIPs": [{"ip": HOST_IP}],
        "podIP": ip,
        "podIPs": [{"ip": ip}],
        "startTime": time(run.started),
        "conditions": conditions,
        "containerStatuses": statuses(&want.containers, false),
    });
    if !want.init.is_empty() {
        status["initContainerStatuses"] = Value::Array(statuses(&want.init, true));
    }
    json!({ "status": status })
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
            waiting: BTreeMap::new(),
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

    fn phase(pod: &Pod) -> &str {
        pod.status.as_ref().unwrap().phase.as_deref().unwrap()
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

    #[test]
    fn a_container_waiting_for_its_image_keeps_the_pod_pending_and_not_ready() {
        let now = "2024-01-01T00:00:05Z".parse().unwrap();
        let p = pod(None, None);
        let p = apply(p.clone(), &patch(&p, &running(), now));
        assert_eq!((phase(&p), ready(&p)), ("Running", "True"));

        let pulling = |reason: &str| Running {
            waiting: BTreeMap::from([(
                "memcached".to_owned(),
                Waiting {
                    reason: reason.to_owned(),
                    message: "no such host".to_owned(),
                },
            )]),
            ..running()
        };
        assert!(!up_to_date(&p, &pulling("ErrImagePull")));
        let p = apply(p.clone(), &patch(&p, &pulling("ErrImagePull"), now));
        assert_eq!((phase(&p), ready(&p)), ("Pending", "False"));
        let ready_condition = condition(&p, "Ready").unwrap();
        assert_eq!(
            ready_condition.reason.as_deref(),
            Some("ContainersNotReady")
        );
        assert_eq!(
            ready_condition.message.as_deref(),
            Some("containers with unready status: [memcached]")
        );
        assert_eq!(condition(&p, "Initialized").unwrap().status, "True");
        let statuses = p
            .status
            .as_ref()
            .unwrap()
            .container_statuses
            .clone()
            .unwrap();
        let waiting = statuses[0]
            .state
            .as_ref()
            .unwrap()
            .waiting
            .as_ref()
            .unwrap();
        assert_eq!(waiting.reason.as_deref(), Some("ErrImagePull"));
        assert_eq!(waiting.message.as_deref(), Some("no such host"));
        assert!(!statuses[0].ready && statuses[0].started == Some(false));
        assert_eq!(statuses[0].container_id, None);
        // The sidecar whose image was pulled runs.
        assert!(statuses[1].ready);
        assert!(up_to_date(&p, &pulling("ErrImagePull")));
        assert!(!up_to_date(&p, &pulling("ImagePullBackOff")));
        let p = apply(p.clone(), &patch(&p, &pulling("ImagePullBackOff"), now));
        assert!(up_to_date(&p, &pulling("ImagePullBackOff")));
    }

    #[test]
    fn an_init_container_waiting_for_its_image_holds_back_the_others() {
        let now = "2024-01-01T00:00:05Z".parse().unwrap();
        let mut p = pod(None, None);
        p.spec.as_mut().unwrap().init_containers = Some(
            serde_json::from_value(
                json!([{"name": "setup", "image": "registry.invalid/x"}, {"name": "later"}]),
            )
            .unwrap(),
        );
        let run = Running {
            waiting: BTreeMap::from([(
                "setup".to_owned(),
                Waiting {
                    reason: "ImagePullBackOff".to_owned(),
                    message: "Back-off pulling image".to_owned(),
                },
            )]),
            ..running()
        };
        let p = apply(p.clone(), &patch(&p, &run, now));
        assert_eq!((phase(&p), ready(&p)), ("Pending", "False"));
        let initialized = condition(&p, "Initialized").unwrap();
        assert_eq!(initialized.status, "False");
        assert_eq!(
            initialized.message.as_deref(),
            Some("containers with incomplete status: [setup later]")
        );
        let status = p.status.as_ref().unwrap();
        let reason = |c: &k8s_openapi::api::core::v1::ContainerStatus| {
            c.state
                .as_ref()
                .unwrap()
                .waiting
                .as_ref()
                .unwrap()
                .reason
                .clone()
                .unwrap()
        };
        let init = status.init_container_statuses.as_ref().unwrap();
        assert_eq!(
            init.iter().map(reason).collect::<Vec<_>>(),
            ["ImagePullBackOff", "PodInitializing"]
        );
        let main = status.container_statuses.as_ref().unwrap();
        assert_eq!(
            main.iter().map(reason).collect::<Vec<_>>(),
            ["PodInitializing", "PodInitializing"]
        );
        assert!(up_to_date(&p, &run));
    }
}
