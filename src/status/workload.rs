//! What the status reads of the workload, whichever kind runs the servers: Deployment and StatefulSet
//! both map into this summary, so every condition works for both.

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};

use super::health;
use super::problem::Problem;

/// The workload's counts and trouble, as its controller reports them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct WorkloadStatus {
    /// `Deployment` or `StatefulSet`, for messages.
    pub kind: &'static str,
    /// `metadata.generation`.
    pub generation: Option<i64>,
    /// `status.observedGeneration`: below `generation` while the workload controller catches up.
    pub observed_generation: Option<i64>,
    /// Pods that exist.
    pub replicas: i32,
    /// Pods that are ready.
    pub ready: i32,
    /// Pods that run the current template.
    pub updated: i32,
    /// Pods the workload controller cannot create (quota, admission).
    pub failure: Option<Problem>,
    /// The rollout made no progress within its deadline (Deployments only).
    pub deadline: Option<Problem>,
}

impl WorkloadStatus {
    /// A workload of `kind` being created: its controller has not reported on it yet. A new instance's
    /// first status, written before its workload (see `controller::reconcile`), says the same as the one
    /// computed just after the workload was created, so the reconcile that creates it writes no second one.
    pub fn pending(kind: &'static str) -> Self {
        Self {
            kind,
            ..Self::default()
        }
    }
}

impl WorkloadStatus {
    /// Whether its pods are being replaced, with `desired` pods wanted: pods not on the current template,
    /// or old pods left.
    pub fn replacing(&self, desired: i32) -> bool {
        self.updated < desired || self.replicas > self.updated
    }

    /// Whether its controller has not observed its latest spec yet. A Deployment's generation also moves
    /// with its annotations (they are copied to its ReplicaSets), so this alone is no rollout.
    pub fn unobserved(&self) -> bool {
        self.observed_generation < self.generation
    }
}

impl From<&Deployment> for WorkloadStatus {
    fn from(d: &Deployment) -> Self {
        let status = d.status.as_ref();
        Self {
            kind: "Deployment",
            generation: d.metadata.generation,
            observed_generation: status.and_then(|s| s.observed_generation),
            replicas: status.and_then(|s| s.replicas).unwrap_or(0),
            ready: status.and_then(|s| s.ready_replicas).unwrap_or(0),
            updated: status.and_then(|s| s.updated_replicas).unwrap_or(0),
            failure: health::replica_failure(d),
            deadline: health::progress_deadline_exceeded(d),
        }
    }
}

impl From<&StatefulSet> for WorkloadStatus {
    fn from(s: &StatefulSet) -> Self {
        let status = s.status.as_ref();
        Self {
            kind: "StatefulSet",
            generation: s.metadata.generation,
            observed_generation: status.and_then(|s| s.observed_generation),
            replicas: status.map_or(0, |s| s.replicas),
            ready: status.and_then(|s| s.ready_replicas).unwrap_or(0),
            updated: status.and_then(|s| s.updated_replicas).unwrap_or(0),
            // StatefulSets report failed pod creations as events only; pod problems still show.
            failure: None,
            deadline: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn both_kinds_map_their_counts() {
        let sts: StatefulSet = serde_json::from_value(json!({
            "metadata": {"name": "cache", "generation": 2},
            "status": {"observedGeneration": 1, "replicas": 3, "readyReplicas": 2, "updatedReplicas": 1}
        }))
        .unwrap();
        let w = WorkloadStatus::from(&sts);
        assert_eq!(
            (
                w.kind,
                w.generation,
                w.observed_generation,
                w.replicas,
                w.ready,
                w.updated
            ),
            ("StatefulSet", Some(2), Some(1), 3, 2, 1)
        );
        let d: Deployment = serde_json::from_value(json!({
            "metadata": {"name": "cache", "generation": 1},
            "status": {"observedGeneration": 1, "replicas": 2, "readyReplicas": 2, "updatedReplicas": 2}
        }))
        .unwrap();
        let w = WorkloadStatus::from(&d);
        assert_eq!(
            (w.kind, w.replicas, w.ready, w.updated),
            ("Deployment", 2, 2, 2)
        );
    }
}
