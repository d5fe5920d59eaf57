//! What one reconcile tells warm handover, and what it answered before the list was published.

use std::sync::Arc;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Pod, PodTemplateSpec};

use super::plan::scale::Change;
use crate::api::{Memcached, Server};
use crate::resources::Instance;
use crate::resources::rollout::Pace;

/// What one reconcile hands the step: the instance, its server pods, the slots as this reconcile
/// publishes them, the scale the pool planned, and the rollout's workload.
pub struct View<'a> {
    pub mc: &'a Memcached,
    pub instance: &'a Instance<'a>,
    pub pods: &'a [Arc<Pod>],
    pub servers: &'a [Server],
    /// What [`Handover::hold`](super::Handover::hold) answered before the list was published.
    pub hold: &'a Hold,
    pub rollout: Rollout<'a>,
}

/// What the reconcile obeys before it publishes the list and applies the workload.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Hold {
    /// The change of the published list whose keys the copies move (a scale's), to hand the step.
    pub change: Option<Change>,
    /// Whether the drained servers stay (their copies run): the workload keeps its replicas.
    pub keeps_drained: bool,
}

/// The workload whose rollout hands over.
pub enum Rollout<'a> {
    Deployment,
    StatefulSet {
        /// The new pod template (the spare runs it).
        template: Option<&'a PodTemplateSpec>,
        /// The rollout's pace: the partition it would apply without a handover.
        pace: &'a Pace,
        /// The live StatefulSet (none before it exists).
        live: Option<&'a StatefulSet>,
    },
}
