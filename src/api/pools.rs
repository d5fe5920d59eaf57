//! Cache-aware pools: which workload runs the servers, how a scale-down drains them, how a rollout warms
//! them, and the server slots the operator publishes for clients.
//!
//! Clients spread keys over an ordered server list; these fields keep that list stable (a server keeps
//! its slot when its pod is replaced) and change it in a client-friendly order (a server leaves the list
//! before its pod goes, a replaced server is ready before it takes over its slot).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Default for `spec.scaling.drainSeconds`.
pub const DEFAULT_DRAIN_SECONDS: i32 = 30;
/// Default for `spec.rollout.warmupSeconds`.
pub const DEFAULT_WARMUP_SECONDS: i32 = 0;

/// CEL transition rule on `spec`: the workload kind is fixed for the life of an instance. Both sides
/// default to Deployment, so objects stored before the field existed compare as Deployment.
pub const WORKLOAD_RULE: &str = "(has(self.workload) ? self.workload : 'Deployment') == \
     (has(oldSelf.workload) ? oldSelf.workload : 'Deployment')";
/// Message of [`WORKLOAD_RULE`].
pub const WORKLOAD_RULE_MESSAGE: &str = "spec.workload cannot change on a live instance; create a new instance \
     with the other workload and move clients to it (see docs/operations.md, Migrating between workloads)";

/// The Kubernetes workload that runs the memcached servers.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum Workload {
    /// Pods with generated names; the operator assigns them server slots and publishes `podIP:port`.
    #[default]
    Deployment,
    /// Pods `<name>-0 … <name>-(size-1)` behind the headless Service; slot = ordinal, and each server
    /// has the stable address `<name>-<i>.<name>-headless.<namespace>.svc:<port>`.
    StatefulSet,
}

impl Workload {
    /// The kind's name, as in `kind:`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Deployment => "Deployment",
            Self::StatefulSet => "StatefulSet",
        }
    }
}

/// How a scale-down removes servers (`spec.scaling`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Scaling {
    /// Seconds between taking the removed servers out of the published server list and removing their
    /// pods, so that clients stop sending them traffic first. 0 removes them at once. Default 30.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 3600))]
    pub drain_seconds: Option<i32>,
}

impl Scaling {
    pub fn drain_seconds(&self) -> i32 {
        self.drain_seconds.unwrap_or(DEFAULT_DRAIN_SECONDS)
    }
}

/// How a changed pod template rolls out (`spec.rollout`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Rollout {
    /// Seconds a new server must have been ready before the next server is replaced, so that it fills up
    /// before another one starts cold. Servers are replaced one at a time. A Deployment's
    /// `minReadySeconds`; a StatefulSet's rollout is paced by the operator (its partition). Default 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 3600))]
    pub warmup_seconds: Option<i32>,
}

impl Rollout {
    pub fn warmup_seconds(&self) -> i32 {
        self.warmup_seconds.unwrap_or(DEFAULT_WARMUP_SECONDS)
    }
}

/// One server slot, as published in `status.servers` and the `<name>-servers` ConfigMap.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Server {
    /// Position of the server in the list, 0 to size-1; it never moves.
    pub slot: i32,

    /// The pod holding the slot (a replacement that is not ready yet included), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,

    /// `host:port` clients use for this slot: set once the slot's first pod is ready, and changed only
    /// when a replacement pod is ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,

    /// Whether the pod holding the slot is ready.
    #[serde(default)]
    pub ready: bool,
}

/// A scale-down under way: the removed servers are out of the published list, their pods still run.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Drain {
    /// Servers before the scale-down (pods kept running during the drain).
    pub from_size: i32,
    /// Servers after it (slots published).
    pub to_size: i32,
    /// When the shrunk list was published; the pods go `spec.scaling.drainSeconds` later. Kept in the
    /// status so that an operator restart continues the drain instead of restarting its clock.
    pub started_at: Time,
    /// The published list before the scale-down (`host:port` entries in slot order), kept when the
    /// clients' hashing is declared (`spec.clients.hashing`) and `spec.handover.enabled`: the warm
    /// handover copies each item the removed servers held to the server that owns it under the shorter
    /// list, and a restarted operator needs to know which server held which keys (a Deployment's drained
    /// pods hold no slot any more).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub servers: Vec<String>,
}
