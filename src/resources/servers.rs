//! Server slots and the published server list.
//!
//! Every server has a slot `0 … size-1` that does not move, so the ordered list clients hash keys over
//! changes as little as possible:
//! - StatefulSet: slot = ordinal, address = the pod's stable DNS name behind the headless Service (the
//!   proxy's route lists the ready pods' addresses instead, in the same slot order: [`route_servers`]);
//! - Deployment: the operator assigns pods to slots and keeps the assignment in `status.servers`; a
//!   replacement pod takes the slot of the pod it replaces, and the slot's address (`podIP:port`) changes
//!   only once the replacement is ready.
//!
//! A slot enters the published list once its first pod is ready. The list is rendered into the ConfigMap
//! `<name>-servers` deterministically, so it is written only when its content changes; the ConfigMap is
//! created with the first published server, and kept current from then on (an empty list included).

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use k8s_openapi::jiff::Timestamp;
use serde_json::json;

use super::instance::Instance;
use super::labels::{HANDOVER_GATE, TEMPLATE_HASH_LABEL};
use super::service;
use crate::api::Server;

pub use crate::api::names::{CONFIG_MAP_SUFFIX, config_map_name};

/// ConfigMap key: one `host:port` per line, in slot order.
pub const SERVERS_KEY: &str = "servers";
/// ConfigMap key: the published `status.servers` entries as JSON.
pub const SERVERS_JSON_KEY: &str = "servers.json";
/// ConfigMap key: an mcrouter configuration with one pool of the servers.
pub const MCROUTER_KEY: &str = "mcrouter.json";
/// Pod annotation the ReplicaSet controller reads to pick which pods to remove on a scale-down: lower
/// cost goes first.
pub const DELETION_COST_ANNOTATION: &str = "controller.kubernetes.io/pod-deletion-cost";
/// The cost the operator gives drained pods (the default is 0), so that exactly those go.
pub const DRAINED_COST: &str = "-1000";

/// Whether `pod` reports the `Ready` condition true.
pub fn is_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The one view of a pod that slot assignment, the drain and the warm handover read (the servers' pods
/// and a StatefulSet rollout's spare server alike).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Member {
    pub name: String,
    pub ip: Option<String>,
    /// Its ReplicaSet's template hash ([`TEMPLATE_HASH_LABEL`]), for a Deployment's pods.
    pub template_hash: Option<String>,
    pub ready: bool,
    pub terminating: bool,
    pub created: Option<Timestamp>,
    /// Its containers are ready but a readiness gate holds it, and the handover gate's condition is not
    /// set yet: it waits for the operator's warm handover.
    pub waiting: bool,
    /// Whether the pod carries the operator's drained deletion cost.
    pub marked: bool,
}

impl Member {
    /// The view of `pod`; `None` for a pod without a name.
    ///
    /// The pods are cached without their spec (see `store::compact`), so whether a pod is gated is read
    /// from its status: a kubelet reports `Ready` as `ContainersReady` and every readiness gate, so
    /// containers ready and the pod not is a gate holding it; the only gate the operator's templates have
    /// is the handover's, and its condition not set yet means the operator has not opened it.
    pub fn of(pod: &Pod) -> Option<Self> {
        let name = pod.metadata.name.clone()?;
        let status = pod.status.as_ref();
        let condition = |type_: &str| {
            status
                .and_then(|s| s.conditions.as_ref())
                .and_then(|c| c.iter().find(|c| c.type_ == type_))
                .map(|c| c.status == "True")
        };
        let ready = is_ready(pod);
        let waiting = condition("ContainersReady") == Some(true)
            && !ready
            && condition(HANDOVER_GATE).is_none();
        Some(Self {
            name,
            ip: status
                .and_then(|s| s.pod_ip.clone())
                .filter(|ip| !ip.is_empty()),
            template_hash: pod
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(TEMPLATE_HASH_LABEL).cloned()),
            ready,
            terminating: pod.metadata.deletion_timestamp.is_some(),
            created: pod.metadata.creation_timestamp.as_ref().map(|t| t.0),
            waiting,
            marked: pod
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(DELETION_COST_ANNOTATION))
                .is_some_and(|cost| cost == DRAINED_COST),
        })
    }

    /// `ip:port` (`[ip]:port` for IPv6), once the pod is ready and has an IP.
    fn address(&self, port: i32) -> Option<String> {
        let ip = self.ip.as_deref().filter(|_| self.ready)?;
        Some(entry(ip, port))
    }
}

/// The published entry of a Deployment pod at `ip`: `ip:port`, `[ip]:port` for IPv6.
pub fn entry(ip: &str, port: i32) -> String {
    if ip.contains(':') {
        format!("[{ip}]:{port}")
    } else {
        format!("{ip}:{port}")
    }
}

/// Deployment slots `0 … count-1`. A slot keeps its pod (from `previous`) while that pod exists and is
/// not terminating; vacant slots, lowest first, take the unassigned live pods, ready ones first, then the
/// oldest (ties by name). A slot's address follows its pod only while the pod is ready; otherwise the
/// last published address stays.
///
/// Ready first: in a warm rollout the pod whose copy filled a slot is ready when that slot's old pod
/// goes, while the next surge pod already waits behind its gate, and creation times have whole seconds,
/// so both can look as old. By age and name alone the waiting pod took the slot (seen on v1.28.7 in a
/// rollout whose copies ended at once), so the items copied for it were on a pod that took another slot.
pub fn assign_deployment(
    previous: &[Server],
    members: &[Member],
    count: i32,
    port: i32,
) -> Vec<Server> {
    let live: BTreeMap<&str, &Member> = members
        .iter()
        .filter(|m| !m.terminating)
        .map(|m| (m.name.as_str(), m))
        .collect();
    let previous: BTreeMap<i32, &Server> = previous.iter().map(|s| (s.slot, s)).collect();
    let mut slots: Vec<Option<&Member>> = (0..count)
        .map(|slot| {
            let pod = previous.get(&slot)?.pod.as_deref()?;
            live.get(pod).copied()
        })
        .collect();
    let taken: BTreeSet<&str> = slots.iter().flatten().map(|m| m.name.as_str()).collect();
    let mut free: Vec<&Member> = live
        .values()
        .copied()
        .filter(|m| !taken.contains(m.name.as_str()))
        .collect();
    // A pod without a creation time (never from a real server) counts as the newest.
    free.sort_by(|a, b| {
        (!a.ready, a.created.is_none(), a.created, &a.name).cmp(&(
            !b.ready,
            b.created.is_none(),
            b.created,
            &b.name,
        ))
    });
    let mut free = free.into_iter();
    for slot in slots.iter_mut().filter(|s| s.is_none()) {
        *slot = free.next();
    }
    slots
        .into_iter()
        .zip(0..)
        .map(|(member, slot)| {
            let kept = previous.get(&slot).and_then(|s| s.address.clone());
            Server {
                slot,
                pod: member.map(|m| m.name.clone()),
                address: member.and_then(|m| m.address(port)).or(kept),
                ready: member.is_some_and(|m| m.ready),
            }
        })
        .collect()
}

/// StatefulSet slots `0 … count-1`: slot i is pod `<name>-i` at its stable DNS name, listed once the
/// pod has been ready (now or before, as `previous` shows).
pub fn assign_statefulset(
    instance: &Instance<'_>,
    previous: &[Server],
    members: &[Member],
    count: i32,
) -> Vec<Server> {
    (0..count)
        .map(|slot| {
            let name = format!("{}-{slot}", instance.name);
            let member = members.iter().find(|m| m.name == name && !m.terminating);
            let ready = member.is_some_and(|m| m.ready);
            let listed = previous
                .iter()
                .any(|s| s.slot == slot && s.address.is_some());
            Server {
                slot,
                pod: member.map(|m| m.name.clone()),
                address: (ready || listed).then(|| stable_address(instance, slot)),
                ready,
            }
        })
        .collect()
}

/// `<name>-<slot>.<name>-headless.<namespace>.svc:<port>`.
pub fn stable_address(instance: &Instance<'_>, slot: i32) -> String {
    format!(
        "{name}-{slot}.{headless}.{namespace}.svc:{port}",
        name = instance.name,
        headless = service::headless_name(instance.name),
        namespace = instance.namespace,
        port = instance.spec.container_port,
    )
}

/// The backends of the proxy's route for a StatefulSet: `published` (the slots, in slot order) with the
/// address of each slot that has one replaced by its pod's `ip:port` while the pod is ready. A slot whose
/// pod is not ready (restarting, or replaced and not ready yet) keeps its address in `routed` (the route
/// as last written, by slot: see [`routed_by_slot`]), as a Deployment's slot keeps its last address; one
/// that has none there keeps its DNS name.
///
/// Not the DNS names: memcached's proxy (1.6.45) resolves a backend's name with a blocking
/// `getaddrinfo` on the worker thread that owns the connection, at every reconnect, so a slow resolver
/// stalls every client of that worker; and a restarting pod's name answers NXDOMAIN until the pod is
/// ready, during which its slot's requests hang instead of failing (measured with `hack/proxy-names.py`:
/// docs/clients.md, "How the proxy names a StatefulSet's servers"). The published list (`<name>-servers`)
/// keeps the names: direct clients rely on them.
pub fn route_servers(
    published: &[Server],
    members: &[Member],
    port: i32,
    routed: &BTreeMap<i32, String>,
) -> Vec<Server> {
    published
        .iter()
        .map(|server| {
            let ready_pod = server
                .pod
                .as_deref()
                .and_then(|pod| members.iter().find(|m| m.name == pod && !m.terminating))
                .and_then(|m| m.address(port));
            let address = server.address.as_ref().map(|name| {
                ready_pod
                    .or_else(|| routed.get(&server.slot).cloned())
                    .unwrap_or_else(|| name.clone())
            });
            Server {
                address,
                ..server.clone()
            }
        })
        .collect()
}

/// The route as last written (`route`, its backends in order) by slot: its backends are the slots
/// `published` then (those with an address, in slot order), position by position. Empty when the two
/// do not have as many: then which backend was which slot is not known.
pub fn routed_by_slot(published: &[Server], route: &[String]) -> BTreeMap<i32, String> {
    let slots: Vec<i32> = published
        .iter()
        .filter(|s| s.address.is_some())
        .map(|s| s.slot)
        .collect();
    if slots.len() != route.len() {
        return BTreeMap::new();
    }
    slots.into_iter().zip(route.iter().cloned()).collect()
}

/// The live pods that hold none of `servers`' slots: on a Deployment mid-drain, the ones to remove.
pub fn unslotted<'a>(servers: &[Server], members: &'a [Member]) -> Vec<&'a Member> {
    let slotted: BTreeSet<&str> = servers.iter().filter_map(|s| s.pod.as_deref()).collect();
    members
        .iter()
        .filter(|m| !m.terminating && !slotted.contains(m.name.as_str()))
        .collect()
}

/// Deletion-cost changes for a Deployment's pods: while `draining`, every live pod without a slot gets the
/// mark (`true`) so the ReplicaSet removes exactly those; a marked pod that holds a slot (a cancelled
/// drain, or a drained pod that took over a vacant slot) loses it (`false`). Marks of pods that are on their
/// way out are kept after the drain, until the pods are gone.
pub fn drain_marks(servers: &[Server], members: &[Member], draining: bool) -> Vec<(String, bool)> {
    let slotted: BTreeSet<&str> = servers.iter().filter_map(|s| s.pod.as_deref()).collect();
    members
        .iter()
        .filter(|m| !m.terminating)
        .filter_map(|m| {
            let holds_slot = slotted.contains(m.name.as_str());
            if holds_slot && m.marked {
                Some((m.name.clone(), false))
            } else if !holds_slot && !m.marked && draining {
                Some((m.name.clone(), true))
            } else {
                None
            }
        })
        .collect()
}

/// Addresses of the ready servers, in slot order (`status.serverList`).
pub fn ready_addresses(servers: &[Server]) -> Vec<String> {
    servers
        .iter()
        .filter(|s| s.ready)
        .filter_map(|s| s.address.clone())
        .collect()
}

/// Whether `servers` have anything to publish: a slot with an address, which it gets once its first pod
/// is ready. Until then the ConfigMap `<name>-servers` is not created: created empty it would have to be
/// written again with the first server, and a client that mounts it waits for it either way.
pub fn publishes(servers: &[Server]) -> bool {
    servers.iter().any(|s| s.address.is_some())
}

/// The published list: the address of every slot that has one, in slot order (the `servers` key of the
/// ConfigMap `<name>-servers`, and the backends of the proxy's route configuration).
pub fn published_addresses(servers: &[Server]) -> Vec<&str> {
    servers
        .iter()
        .filter_map(|s| s.address.as_deref())
        .collect()
}

/// The ConfigMap `<name>-servers` with the published servers (those with an address), in slot order:
/// `servers` (one `host:port` per line), `servers.json` (the entries) and `mcrouter.json` (one pool,
/// `PoolRoute`). Every value ends with a newline; JSON keys are in a fixed order.
pub fn config_map(instance: &Instance<'_>, servers: &[Server]) -> ConfigMap {
    let published: Vec<&Server> = servers.iter().filter(|s| s.address.is_some()).collect();
    let addresses = published_addresses(servers);
    let lines: String = addresses.iter().map(|a| format!("{a}\n")).collect();
    let mcrouter = json!({
        "pools": {instance.name: {"servers": addresses}},
        "route": format!("PoolRoute|{}", instance.name),
    });
    // Serialising plain values cannot fail; struct fields keep their declared order.
    fn pretty<T: serde::Serialize>(value: &T) -> String {
        serde_json::to_string_pretty(value).unwrap_or_default() + "\n"
    }
    let mut metadata = instance.child_meta();
    metadata.name = Some(config_map_name(instance.name));
    ConfigMap {
        metadata,
        data: Some(BTreeMap::from([
            (SERVERS_KEY.to_owned(), lines),
            (SERVERS_JSON_KEY.to_owned(), pretty(&published)),
            (MCROUTER_KEY.to_owned(), pretty(&mcrouter)),
        ])),
        ..ConfigMap::default()
    }
}

#[cfg(test)]
mod tests;
