//! Reading trouble out of the Deployment and pod statuses: why pods cannot start.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ContainerStatus, Pod};

use super::problem::Problem;

/// Waiting reasons that mean the image cannot be pulled.
const IMAGE_PULL_REASONS: &[&str] = &[
    "ErrImagePull",
    "ImagePullBackOff",
    "InvalidImageName",
    "ErrImageNeverPull",
];
/// Waiting reasons that mean the container cannot be created or started.
const CREATE_REASONS: &[&str] = &[
    "CreateContainerConfigError",
    "CreateContainerError",
    "RunContainerError",
];

/// A `Deployment` condition of the given type and status, if present.
fn deployment_condition<'a>(
    deployment: &'a Deployment,
    type_: &str,
    status: &str,
) -> Option<&'a k8s_openapi::api::apps::v1::DeploymentCondition> {
    deployment
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_ && c.status == status)
}

/// Pods the ReplicaSet controller could not create (quota, admission webhooks, Pod Security admission).
pub fn replica_failure(deployment: &Deployment) -> Option<Problem> {
    deployment_condition(deployment, "ReplicaFailure", "True").map(|c| Problem {
        reason: "ReplicaFailure".into(),
        message: format!(
            "the Deployment cannot create pods: {}",
            c.message.as_deref().unwrap_or("no message")
        ),
    })
}

/// The rollout made no progress within the Deployment's progress deadline.
pub fn progress_deadline_exceeded(deployment: &Deployment) -> Option<Problem> {
    deployment_condition(deployment, "Progressing", "False")
        .filter(|c| c.reason.as_deref() == Some("ProgressDeadlineExceeded"))
        .map(|c| Problem {
            reason: "ProgressDeadlineExceeded".into(),
            message: c
                .message
                .clone()
                .unwrap_or_else(|| "the rollout made no progress".into()),
        })
}

/// The first pod problem, in pod-name order. Messages name the pod and container but leave out volatile
/// details (restart counts, back-off timers) so that the status does not churn while nothing changes.
pub fn pod_problem(pods: &[&Pod]) -> Option<Problem> {
    pods.iter().find_map(|pod| {
        let name = pod.metadata.name.as_deref().unwrap_or("<unnamed>");
        let status = pod.status.as_ref()?;
        let containers = status
            .init_container_statuses
            .iter()
            .flatten()
            .chain(status.container_statuses.iter().flatten());
        for container in containers {
            if let Some(problem) = container_problem(name, container) {
                return Some(problem);
            }
        }
        status
            .conditions
            .iter()
            .flatten()
            .find(|c| {
                c.type_ == "PodScheduled"
                    && c.status == "False"
                    && c.reason.as_deref() == Some("Unschedulable")
            })
            .map(|c| Problem {
                reason: "Unschedulable".into(),
                message: format!(
                    "pod {name} cannot be scheduled: {}",
                    c.message.as_deref().unwrap_or("no message")
                ),
            })
    })
}

/// A container the kernel killed for memory (its last termination `OOMKilled`), whether it is back up or
/// waiting in CrashLoopBackOff: reported first, so the reason stays `OOMKilled` as the container cycles
/// between the two. The message says nothing that changes between kills (counts, times). It cannot name
/// the limit: the pod cache drops pod specs (`store::compact`), which a real node showed, where the unit
/// tests' pods still had theirs.
fn oom_killed(pod: &str, container: &ContainerStatus) -> Option<Problem> {
    let terminated = container.last_state.as_ref()?.terminated.as_ref()?;
    if terminated.reason.as_deref() != Some("OOMKilled") {
        return None;
    }
    let name = &container.name;
    Some(Problem {
        reason: "OOMKilled".into(),
        message: format!(
            "pod {pod}: container {name} was killed for going over its memory limit and restarted empty \
             (its items are lost); raise spec.resources.limits.memory or lower spec.memcached.maxMemoryMB"
        ),
    })
}

fn container_problem(pod: &str, container: &ContainerStatus) -> Option<Problem> {
    if let Some(problem) = oom_killed(pod, container) {
        return Some(problem);
    }
    let waiting = container.state.as_ref()?.waiting.as_ref()?;
    let reason = waiting.reason.as_deref()?;
    let name = &container.name;
    if IMAGE_PULL_REASONS.contains(&reason) {
        return Some(Problem {
            reason: "ImagePullFailed".into(),
            message: format!(
                "pod {pod}: container {name} cannot pull image {:?}",
                container.image
            ),
        });
    }
    if reason == "CrashLoopBackOff" {
        let last = container
            .last_state
            .as_ref()
            .and_then(|s| s.terminated.as_ref());
        let detail = match last {
            Some(t) => format!(
                "; last exit code {} ({})",
                t.exit_code,
                t.reason.as_deref().unwrap_or("no reason")
            ),
            None => String::new(),
        };
        return Some(Problem {
            reason: "CrashLoopBackOff".into(),
            message: format!("pod {pod}: container {name} keeps crashing{detail}"),
        });
    }
    if CREATE_REASONS.contains(&reason) {
        return Some(Problem {
            reason: "ContainerCreateFailed".into(),
            message: format!(
                "pod {pod}: container {name} cannot start ({reason}): {}",
                waiting.message.as_deref().unwrap_or("no message")
            ),
        });
    }
    None
}
