//! A Deployment rollout's warm handover: whether the pod template carries the handover readiness gate,
//! which pods wait behind it, which old server each of them takes over from, and the change of the
//! published list that takeover makes.
//!
//! During a Deployment rollout (`maxSurge: 1, maxUnavailable: 0`) the new pod runs beside the old ones;
//! its readiness gate keeps it out of the Deployment controller's count (and out of the published list)
//! until the operator sets the gate's condition, so the old server it replaces still answers while its
//! items are copied over (the copies [`super::copies`] plans for [`takeover_lists`]).
//!
//! When the new pod is published: its gate open, it turns ready, and the Deployment controller removes
//! the old pod (the one with [`SOURCE_COST`]); once that pod terminates its slot is vacant, and the new
//! pod, ready and holding no slot, takes it (`resources::servers::assign_deployment`), so the published
//! list changes from the one with the old pod's address at that slot to the one with the new pod's. Until
//! the gate opens, the old pod and every other source of the copies run and stay in the list.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{PodReadinessGate, PodTemplateSpec};
use k8s_openapi::jiff::Timestamp;

use crate::api::Server;
use crate::resources::drift;
use crate::resources::servers::Member;

pub use crate::resources::labels::{HANDOVER_GATE as GATE, TEMPLATE_HASH_LABEL};
/// The pod-deletion cost given to the old server a copy reads, so that the ReplicaSet controller removes
/// exactly that pod once the new one is ready (the default is 0; the drained cost, -1000, still goes
/// first).
pub const SOURCE_COST: &str = "-100";

/// Whether the pod template carries the handover gate, given the `desired` Deployment (built without it)
/// and the `live` one.
///
/// Adding or removing a readiness gate changes the pod template, which by itself would replace every
/// server: so the gate moves only with a template change that replaces them anyway (one the live template,
/// apart from the gate, does not contain yet). Then it is there when `handover` (`spec.handover.enabled`
/// and a surge strategy: without a surge the old pod goes before the new one starts, and there is nothing
/// to copy from) says so; otherwise the live template's gate stays as it is. A new Deployment starts
/// without it: its servers have nothing to take over.
pub fn gate_wanted(handover: bool, desired: &Deployment, live: Option<&Deployment>) -> bool {
    template_gate_wanted(
        handover,
        desired.spec.as_ref().map(|s| &s.template),
        live.and_then(|d| d.spec.as_ref()).map(|s| &s.template),
    )
}

/// [`gate_wanted`] for any workload's pod template: the `desired` one (built without the gate) and the
/// `live` one. A StatefulSet rollout is handed over through the spare server (see [`super::spare`]), so
/// there `handover` is `spec.handover.enabled` alone.
pub fn template_gate_wanted(
    handover: bool,
    desired: Option<&PodTemplateSpec>,
    live: Option<&PodTemplateSpec>,
) -> bool {
    let Some(live) = live else {
        return false;
    };
    let live_gated = has_gate(live);
    let (Ok(mut live_template), Ok(desired_template)) = (
        serde_json::to_value(without_gate(live)),
        serde_json::to_value(desired),
    ) else {
        return live_gated;
    };
    if let Some(spec) = live_template
        .get_mut("spec")
        .and_then(|s| s.as_object_mut())
    {
        // An empty list the gate leaves behind is an absent field to the API server.
        if spec
            .get("readinessGates")
            .is_some_and(|g| g.as_array().is_some_and(Vec::is_empty))
        {
            spec.remove("readinessGates");
        }
    }
    let changes_anyway = !drift::contains(&live_template, &desired_template);
    if changes_anyway { handover } else { live_gated }
}

/// Whether `template` carries the handover gate.
pub fn has_gate(template: &PodTemplateSpec) -> bool {
    template
        .spec
        .as_ref()
        .and_then(|s| s.readiness_gates.as_ref())
        .is_some_and(|gates| gates.iter().any(|g| g.condition_type == GATE))
}

/// `template` without the handover gate.
pub fn without_gate(template: &PodTemplateSpec) -> PodTemplateSpec {
    let mut template = template.clone();
    if let Some(gates) = template
        .spec
        .as_mut()
        .and_then(|s| s.readiness_gates.as_mut())
    {
        gates.retain(|g| g.condition_type != GATE);
    }
    template
}

/// Adds the handover gate to `deployment`'s pod template.
pub fn add_gate(deployment: &mut Deployment) {
    if let Some(spec) = deployment.spec.as_mut() {
        add_template_gate(&mut spec.template);
    }
}

/// Adds the handover gate to `template`.
pub fn add_template_gate(template: &mut PodTemplateSpec) {
    if let Some(spec) = template.spec.as_mut() {
        spec.readiness_gates
            .get_or_insert_with(Vec::new)
            .push(PodReadinessGate {
                condition_type: GATE.to_owned(),
            });
    }
}

/// One gated pod and the server it takes over from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Takeover {
    /// The gated pod (the copy's target).
    pub pod: String,
    /// The slot it takes and the pod holding that slot now (the copy's source); `None` when it takes a
    /// vacant slot (a scale-up, or its old pod went first): nothing to copy.
    pub source: Option<(i32, String)>,
}

/// What each waiting pod takes over, oldest first. A waiting pod without a slot is a rollout's surge pod:
/// it takes over the lowest slot held by a ready, live pod of the oldest other ReplicaSet (the Deployment
/// controller scales down only old ReplicaSets, the oldest first: see `oldest_first`) that no other copy
/// reads. A waiting pod that holds a slot took a vacant one (a scale-up, or its old pod went first), and a
/// surge pod without such a slot left has no server to take over from either: both are listed without a
/// source, so that their gates open instead of holding them forever. `running` maps the pods whose copy
/// runs (left out) to their sources (read by no other copy).
pub fn takeovers(
    servers: &[Server],
    pods: &[Member],
    running: &BTreeMap<String, String>,
) -> Vec<Takeover> {
    let slotted: BTreeSet<&str> = servers.iter().filter_map(|s| s.pod.as_deref()).collect();
    let mut waiting: Vec<&Member> = pods
        .iter()
        .filter(|p| p.waiting && !p.terminating && !running.contains_key(&p.name))
        .collect();
    waiting.sort_by(|a, b| {
        (a.created.is_none(), a.created, &a.name).cmp(&(b.created.is_none(), b.created, &b.name))
    });
    let age = oldest_first(pods);
    let mut taken: BTreeSet<&str> = running.values().map(String::as_str).collect();
    let mut out = Vec::new();
    for pod in waiting {
        let source = if slotted.contains(pod.name.as_str()) {
            None
        } else {
            servers
                .iter()
                .filter_map(|server| {
                    let holder = pods.iter().find(|p| Some(&p.name) == server.pod.as_ref())?;
                    let usable = holder.ready
                        && !holder.terminating
                        && holder.ip.is_some()
                        && holder.template_hash != pod.template_hash
                        && !taken.contains(holder.name.as_str());
                    usable.then_some((server.slot, holder))
                })
                .min_by_key(|(slot, holder)| (age(&holder.template_hash), *slot))
        };
        if let Some((_, holder)) = source {
            taken.insert(holder.name.as_str());
        }
        out.push(Takeover {
            pod: pod.name.clone(),
            source: source.map(|(slot, holder)| (slot, holder.name.clone())),
        });
    }
    out
}

/// The published list now (`servers`, in slot order) and the one clients get once the takeover of `slot`
/// by the server at `entry` is published: the same list, `entry` at that slot's position. `None` when the
/// slot publishes no address (nothing to take over).
pub fn takeover_lists(
    servers: &[Server],
    slot: i32,
    entry: &str,
) -> Option<(Vec<String>, Vec<String>)> {
    let (old, slots) = super::moves::published(servers);
    let index = slots.iter().position(|s| *s == slot)?;
    let mut new = old.clone();
    new[index] = entry.to_owned();
    Some((old, new))
}

/// The rank of a ReplicaSet (by its template hash) in the order the Deployment controller scales old
/// ReplicaSets down: oldest first (`scaleDownOldReplicaSetsForRollingUpdate` sorts them by creation time).
///
/// Only one old ReplicaSet runs in a rollout that nothing interrupted; a template changed again mid-rollout
/// leaves two or more, and the copy must read the one whose pod goes next, or the new server takes the
/// slot of a pod that was not copied. The pods are cached, their ReplicaSets are not (a watch and a cache
/// of every ReplicaSet for a rare case): a ReplicaSet is at least as old as its oldest pod, and its pods
/// outlive the next ReplicaSet's creation unless all were replaced since (evicted, rescheduled), so the
/// oldest pod of each template ranks them. Pods without a creation time rank last.
fn oldest_first(pods: &[Member]) -> impl Fn(&Option<String>) -> usize + '_ {
    let mut oldest: BTreeMap<&Option<String>, Option<Timestamp>> = BTreeMap::new();
    for pod in pods {
        let entry = oldest.entry(&pod.template_hash).or_insert(pod.created);
        if let Some(created) = pod.created {
            *entry = Some(entry.map_or(created, |seen| seen.min(created)));
        }
    }
    let mut ranked: Vec<(&Option<String>, Option<Timestamp>)> = oldest.into_iter().collect();
    ranked.sort_by_key(|(hash, created)| (created.is_none(), *created, *hash));
    move |hash| {
        ranked
            .iter()
            .position(|(ranked, _)| *ranked == hash)
            .unwrap_or(usize::MAX)
    }
}

#[cfg(test)]
mod tests;
