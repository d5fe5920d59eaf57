//! The spare server of a StatefulSet rollout's warm handover (which copy runs when is the handover's:
//! `handover::plan::spare`).
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

use super::instance::Instance;
use super::labels;
use super::labels::HANDOVER_GATE;

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
    let mut spec = template.spec.clone().unwrap_or_default();
    if let Some(gates) = spec.readiness_gates.as_mut() {
        gates.retain(|g| g.condition_type != HANDOVER_GATE);
    }
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
    let annotations = template
        .metadata
        .as_ref()
        .and_then(|m| m.annotations.clone());
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

#[cfg(test)]
mod tests;
