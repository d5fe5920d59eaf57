//! Pure status computation: what exists in, `MemcachedStatus` out.
//!
//! The reconciler writes the result only when it differs from the stored status. That is safe because the
//! computation is deterministic: `lastTransitionTime` is carried over from the previous status unless a
//! condition's `status` really changes, and messages leave out volatile details.

mod health;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use crate::api::MemcachedStatus;
use crate::resources::InvalidSpec;

/// Condition type: every desired pod is ready.
pub const AVAILABLE: &str = "Available";
/// Condition type: a rollout or scale is under way.
pub const PROGRESSING: &str = "Progressing";
/// Condition type: pods cannot start or the spec cannot be realised.
pub const DEGRADED: &str = "Degraded";

/// Reason on `Degraded` while the instance is being deleted.
pub const FINALIZING: &str = "Finalizing";

/// Something wrong, as a condition reason (CamelCase) and a message for people.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    pub reason: String,
    pub message: String,
}

impl From<InvalidSpec> for Problem {
    fn from(e: InvalidSpec) -> Self {
        Self {
            reason: e.reason.to_owned(),
            message: e.message,
        }
    }
}

/// What the reconciler observed for one instance.
#[derive(Clone, Debug, Default)]
pub struct Observed<'a> {
    /// `metadata.generation` of the instance.
    pub generation: Option<i64>,
    /// `spec.size`.
    pub size: i32,
    /// Label selector of the instance's pods, in string form.
    pub selector: Option<String>,
    /// The instance's Deployment as last seen (after applying it, when it was applied).
    pub deployment: Option<&'a Deployment>,
    /// The instance's pods (any order; terminating ones are ignored).
    pub pods: Vec<&'a Pod>,
    /// Port memcached listens on in the pods (`spec.containerPort`), for the server list.
    pub port: i32,
    /// A problem only the operator can see (invalid spec, rejected apply, deletion under way).
    pub problem: Option<Problem>,
}

/// Computes the status for `observed`, keeping transition times from `previous` where nothing transitioned.
pub fn compute(
    observed: &Observed<'_>,
    previous: Option<&MemcachedStatus>,
    now: &Time,
) -> MemcachedStatus {
    let mut pods: Vec<&Pod> = observed
        .pods
        .iter()
        .copied()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect();
    pods.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));

    let dep_status = observed.deployment.and_then(|d| d.status.as_ref());
    let replicas = dep_status.and_then(|s| s.replicas).unwrap_or(0);
    let ready = dep_status.and_then(|s| s.ready_replicas).unwrap_or(0);
    let counts = Counts {
        size: observed.size,
        replicas,
        ready,
        updated: dep_status.and_then(|s| s.updated_replicas).unwrap_or(0),
    };

    let deadline = observed
        .deployment
        .and_then(health::progress_deadline_exceeded);
    let degraded = observed
        .problem
        .clone()
        .or_else(|| observed.deployment.and_then(health::replica_failure))
        .or_else(|| health::pod_problem(&pods))
        .or_else(|| deadline.clone());

    let generation = observed.generation;
    let previous_conditions = previous
        .map(|s| s.conditions.as_slice())
        .unwrap_or_default();
    let make = |type_: &str, (status, reason, message): (bool, &str, String)| {
        condition(
            type_,
            status,
            reason,
            message,
            generation,
            previous_conditions,
            now,
        )
    };
    let conditions = vec![
        make(AVAILABLE, available(&counts)),
        make(
            PROGRESSING,
            progressing(observed, &counts, deadline.as_ref()),
        ),
        make(
            DEGRADED,
            match &degraded {
                Some(p) => (true, p.reason.as_str(), p.message.clone()),
                None => (false, "AsExpected", "no problems detected".to_owned()),
            },
        ),
    ];

    MemcachedStatus {
        conditions,
        observed_generation: generation,
        replicas,
        ready_replicas: ready,
        selector: observed.selector.clone(),
        nodes: pods
            .iter()
            .filter_map(|p| p.metadata.name.clone())
            .collect(),
        server_list: server_list(&pods, observed.port),
    }
}

/// `ip:port` (`[ip]:port` for IPv6) of every ready pod, sorted.
fn server_list(pods: &[&Pod], port: i32) -> Vec<String> {
    let mut servers: Vec<String> = pods
        .iter()
        .filter_map(|pod| {
            let status = pod.status.as_ref()?;
            let ready = status
                .conditions
                .iter()
                .flatten()
                .any(|c| c.type_ == "Ready" && c.status == "True");
            let ip = status
                .pod_ip
                .as_deref()
                .filter(|ip| ready && !ip.is_empty())?;
            Some(if ip.contains(':') {
                format!("[{ip}]:{port}")
            } else {
                format!("{ip}:{port}")
            })
        })
        .collect();
    servers.sort();
    servers
}

struct Counts {
    size: i32,
    replicas: i32,
    ready: i32,
    updated: i32,
}

fn available(c: &Counts) -> (bool, &'static str, String) {
    if c.size == 0 {
        (
            true,
            "ScaledToZero",
            "spec.size is 0: no memcached pods are wanted".to_owned(),
        )
    } else if c.ready >= c.size {
        (
            true,
            "AllReplicasReady",
            format!("{} of {} pods ready", c.ready, c.size),
        )
    } else {
        (
            false,
            "ReplicasNotReady",
            format!("{} of {} pods ready", c.ready, c.size),
        )
    }
}

fn progressing(
    o: &Observed<'_>,
    c: &Counts,
    deadline: Option<&Problem>,
) -> (bool, &'static str, String) {
    let Some(deployment) = o.deployment else {
        return (
            true,
            "Creating",
            "the Deployment does not exist yet".to_owned(),
        );
    };
    let seen = deployment
        .status
        .as_ref()
        .and_then(|s| s.observed_generation);
    if seen < deployment.metadata.generation {
        return (
            true,
            "Reconciling",
            "waiting for the Deployment controller to observe the new spec".to_owned(),
        );
    }
    if let Some(problem) = deadline {
        return (false, "ProgressDeadlineExceeded", problem.message.clone());
    }
    if c.replicas > c.updated {
        (
            true,
            "RollingUpdate",
            format!(
                "{} of {} pods updated to the current spec",
                c.updated, c.size
            ),
        )
    } else if c.replicas > c.size {
        (
            true,
            "ScalingDown",
            format!("scaling down from {} to {} pods", c.replicas, c.size),
        )
    } else if c.ready < c.size || c.updated < c.size {
        (
            true,
            "ScalingUp",
            format!("{} of {} pods ready", c.ready, c.size),
        )
    } else {
        (
            false,
            "Complete",
            format!("{} of {} pods up to date and ready", c.ready, c.size),
        )
    }
}

/// A condition whose `lastTransitionTime` only moves when its status changes.
fn condition(
    type_: &str,
    status: bool,
    reason: &str,
    message: String,
    generation: Option<i64>,
    previous: &[Condition],
    now: &Time,
) -> Condition {
    let status = if status { "True" } else { "False" }.to_owned();
    let last_transition_time = previous
        .iter()
        .find(|c| c.type_ == type_ && c.status == status)
        .map_or_else(|| now.clone(), |c| c.last_transition_time.clone());
    Condition {
        type_: type_.to_owned(),
        status,
        reason: reason.to_owned(),
        message,
        observed_generation: generation,
        last_transition_time,
    }
}

/// Marks the instance as being deleted: `Degraded=True` with reason `Finalizing`, the rest kept.
pub fn finalizing(
    previous: Option<&MemcachedStatus>,
    generation: Option<i64>,
    now: &Time,
) -> MemcachedStatus {
    let mut status = previous.cloned().unwrap_or_default();
    let previous_conditions = status.conditions.clone();
    let degraded = condition(
        DEGRADED,
        true,
        FINALIZING,
        "the Memcached is being deleted; what it created is removed by garbage collection"
            .to_owned(),
        generation,
        &previous_conditions,
        now,
    );
    status.conditions.retain(|c| c.type_ != DEGRADED);
    status.conditions.push(degraded);
    status
}

/// The condition of `type_` in `status`, if any.
pub fn find<'a>(status: Option<&'a MemcachedStatus>, type_: &str) -> Option<&'a Condition> {
    status?.conditions.iter().find(|c| c.type_ == type_)
}

#[cfg(test)]
mod tests;
