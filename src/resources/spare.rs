//! The pure side of a StatefulSet rollout's warm handover: the spare server and which copy runs when.
//!
//! A StatefulSet replaces a pod under the same name: the old server `<name>-i` is gone before the new
//! one starts, so there is no moment when both run to copy from one to the other. The operator therefore
//! runs a spare server of its own, the bare pod `<name>-handover`, for the length of a rollout:
//! 1. before the partition steps down to ordinal `i` ([`super::rollout::Pace::stepping`]), the spare is
//!    emptied and server `i`'s items are copied to it;
//! 2. the new pod `i` starts behind the handover readiness gate; once its memcached runs, the spare's
//!    items are copied to it (add mode: what clients wrote to it meanwhile stays), and its gate opens;
//! 3. once no server is left to replace and no new pod waits, the spare is deleted.
//!
//! The spare carries the instance's labels but another `app.kubernetes.io/name`
//! ([`SPARE_APP_NAME`]): the Services, the PodDisruptionBudget and the StatefulSet select
//! `app.kubernetes.io/name=memcached`, so clients never reach it and no workload adopts it, while the
//! operator's pod watch (`managed-by`) still sees it and brings its instance back when it changes.

use k8s_openapi::api::core::v1::{Pod, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;

use super::handover::{GATE, without_gate};
use super::rollout::on_revision;
use super::servers::is_ready;
use super::{Instance, labels};

/// The spare's name: `<name>-handover` (the StatefulSet's pods are `<name>-<ordinal>`).
pub const SUFFIX: &str = "-handover";
/// The spare's `app.kubernetes.io/name`: not `memcached`, so nothing that selects servers selects it.
pub const SPARE_APP_NAME: &str = "memcached-handover";

/// The spare server's name for instance `name`.
pub fn name(instance: &str) -> String {
    format!("{instance}{SUFFIX}")
}

/// The spare's labels: the instance's, with [`SPARE_APP_NAME`].
pub fn spare_labels(instance: &str) -> std::collections::BTreeMap<String, String> {
    let mut labels = labels::common_labels(instance);
    labels.insert(labels::NAME_KEY.to_owned(), SPARE_APP_NAME.to_owned());
    labels
}

/// Whether `pod`'s labels make it a spare server (what the pod watch maps to its instance).
pub fn is_spare(pod_labels: &std::collections::BTreeMap<String, String>) -> bool {
    pod_labels.get(labels::NAME_KEY).map(String::as_str) == Some(SPARE_APP_NAME)
}

/// The spare server of `instance`, from the rollout's new pod `template`: the same containers, memcached
/// settings, TLS and authentication volumes, node selection and tolerations, so it holds what a new server
/// holds and the operator reaches it as it reaches them. Left out: the handover gate (nothing opens it,
/// and the spare is the operator's own), and the pod (anti-)affinity and topology spread, which count the
/// servers: the spare is not one of them, and a hard anti-affinity would leave it nowhere to run on a pool
/// with a server on every node. Owned by the instance (controller), so it goes with it.
pub fn spare(instance: &Instance<'_>, template: &PodTemplateSpec) -> Pod {
    let template = without_gate(template);
    let mut spec = template.spec.unwrap_or_default();
    if let Some(gates) = &spec.readiness_gates
        && gates.is_empty()
    {
        spec.readiness_gates = None;
    }
    if let Some(affinity) = spec.affinity.as_mut() {
        affinity.pod_affinity = None;
        affinity.pod_anti_affinity = None;
    }
    if spec
        .affinity
        .as_ref()
        .is_some_and(|a| a.node_affinity.is_none())
    {
        spec.affinity = None;
    }
    spec.topology_spread_constraints = None;
    let annotations = template.metadata.and_then(|m| m.annotations);
    let mut meta = instance.child_meta();
    meta.name = Some(name(instance.name));
    meta.labels = Some(spare_labels(instance.name));
    Pod {
        metadata: ObjectMeta {
            annotations,
            ..meta
        },
        spec: Some(spec),
        status: None,
    }
}

/// What the operator reads of the spare server.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Spare {
    /// Its IP once it runs.
    pub ip: Option<String>,
    pub ready: bool,
    pub terminating: bool,
    pub created: Option<Timestamp>,
}

impl Spare {
    /// The spare's state from its (cached) `pod`.
    pub fn of(pod: &Pod) -> Self {
        let status = pod.status.as_ref();
        Self {
            ip: status
                .and_then(|s| s.pod_ip.clone())
                .filter(|ip| !ip.is_empty()),
            ready: is_ready(pod),
            terminating: pod.metadata.deletion_timestamp.is_some(),
            created: pod.metadata.creation_timestamp.as_ref().map(|t| t.0),
        }
    }

    /// Its IP when it can take a copy: ready, running, not on its way out.
    pub fn usable(&self) -> Option<&str> {
        self.ip
            .as_deref()
            .filter(|_| self.ready && !self.terminating)
    }

    /// Whether it has been starting for more than `timeout_seconds` (unschedulable, its image not pulled):
    /// the rollout then goes on cold rather than wait for it.
    pub fn late(&self, timeout_seconds: u64, now: Timestamp) -> bool {
        let Some(created) = self.created else {
            return false;
        };
        let waited = now.as_second() - created.as_second();
        self.usable().is_none() && u64::try_from(waited).is_ok_and(|w| w >= timeout_seconds)
    }
}

/// The StatefulSet ordinal of pod `pod` of instance `instance` (`<instance>-<ordinal>`).
pub fn ordinal(instance: &str, pod: &str) -> Option<i32> {
    let digits = pod.strip_prefix(instance)?.strip_prefix('-')?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// Whether the new pod `ordinal`, waiting behind its gate, takes its items from the spare: it is the one
/// the rollout just replaced (the partition stepped down to it, which only happens once its old server
/// was copied to the spare), and the spare does not hold another server's items (`staged`, the ordinal
/// of the last copy to the spare this operator ran, when it knows). A new pod anywhere else (a scale-up's)
/// took a slot no server held: nothing to copy.
pub fn takes_from_spare(ordinal: i32, live_partition: i32, staged: Option<i32>) -> bool {
    ordinal == live_partition && staged.is_none_or(|s| s == ordinal)
}

/// Whether the spare is still needed: a server is left to replace (`rolling`), a copy from or to it runs
/// (`copying`), or a new pod waits behind its gate or is on its way there (`waiting`, see
/// [`gate_pending`]), which may be the spare's to fill.
pub fn needed(enabled: bool, rolling: bool, copying: bool, waiting: bool) -> bool {
    copying || (enabled && (rolling || waiting))
}

/// Whether the server at the live partition (`pod`, the last one the rollout let go) has yet to pass its
/// handover gate: missing or terminating (being replaced), still on another revision than the
/// StatefulSet's `update_revision` (the partition just stepped down to it, and the StatefulSet controller
/// has not replaced it yet, nor perhaps even taken in the step), or not ready without the gate's
/// condition (starting, or waiting behind the gate). Once a rollout's last server is let go nothing is
/// left to roll, but the spare holds its items until that server takes them.
pub fn gate_pending(pod: Option<&Pod>, update_revision: Option<&str>) -> bool {
    let Some(pod) = pod else {
        return true;
    };
    let gate_condition = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == GATE));
    pod.metadata.deletion_timestamp.is_some()
        || update_revision.is_some_and(|update| !on_revision(pod, update))
        || (!gate_condition && !is_ready(pod))
}

#[cfg(test)]
mod tests;
