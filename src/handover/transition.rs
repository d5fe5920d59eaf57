//! What every warm handover copies for, whatever caused it: the servers holding the keys change from
//! `old` to `new` (entries in slot order, under the clients' hashing), and the planner
//! ([`super::plan::copies`]) says which keys move from which server to which.
//!
//! - A scale changes the published list's length ([`Transition::scale`]).
//! - A Deployment rollout's new pod takes the slot of the old server it replaces: the list changes at
//!   that slot, from the old pod's address to the new pod's ([`Transition::takeover`]).
//! - A StatefulSet rollout keeps its stable names, so no key changes server by name: the server behind
//!   a name is replaced, which is a change from the old server to the spare, then from the spare to the
//!   new pod, each one server's every item ([`Transition::whole`]).
//!
//! The engine ([`super::engine`]) prepares the copies of any transition the same way: each entry found
//! among the pods that serve it ([`endpoints`]), each copy reached as the stats collector reaches a
//! server.

use std::collections::HashMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;

use super::plan::scale::Change;
use super::plan::{self, Copy};
use crate::api::Workload;
use crate::hashing::{InvalidEntry, Scheme};
use crate::resources::Instance;
use crate::resources::servers::{self, entry};

/// One change of the servers that hold the keys.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Transition {
    /// The clients' hashing (`None`: unknown, or a whole server's items).
    pub scheme: Option<Scheme>,
    pub old: Vec<String>,
    pub new: Vec<String>,
    /// The slot of each entry of `new`.
    pub slots: Vec<i32>,
    /// Whether each target is emptied first: the operator's own spare server, which no client uses.
    pub empty_target: bool,
}

impl Transition {
    /// The change a scale makes.
    pub fn scale(change: &Change) -> Self {
        Self {
            scheme: Some(change.scheme),
            old: change.old.clone(),
            new: change.new.clone(),
            slots: change.new_slots.clone(),
            empty_target: false,
        }
    }

    /// A rollout's takeover: the published list before and after a new pod takes a slot, `slots` the
    /// slot of each entry.
    pub fn takeover(
        scheme: Option<Scheme>,
        old: Vec<String>,
        new: Vec<String>,
        slots: Vec<i32>,
    ) -> Self {
        Self {
            scheme,
            old,
            new,
            slots,
            empty_target: false,
        }
    }

    /// Every item of the server `from` to the server `to`, for `slot`.
    pub fn whole(from: &str, to: &str, slot: i32) -> Self {
        Self {
            scheme: None,
            old: vec![from.to_owned()],
            new: vec![to.to_owned()],
            slots: vec![slot],
            empty_target: false,
        }
    }

    /// The same, its target emptied first.
    pub fn emptying_target(mut self) -> Self {
        self.empty_target = true;
        self
    }

    /// The planner's copies: one per pair of servers between which keys move, with their keys.
    pub fn copies(&self) -> Result<Vec<Copy>, InvalidEntry> {
        plan::copies(self.scheme, &self.old, &self.new)
    }

    /// The slot of `new[target]`.
    pub fn slot(&self, target: usize) -> i32 {
        self.slots.get(target).copied().unwrap_or(-1)
    }
}

/// Each entry a copy may name, with the pod that serves it: its name and IP.
pub(super) type Endpoints = HashMap<String, (String, String)>;

/// The published entry each of `pods` serves: a Deployment pod's `podIP:port`, a StatefulSet pod's
/// stable DNS name (the copy reaches it by IP all the same).
pub(super) fn endpoints(instance: &Instance<'_>, pods: &[Arc<Pod>]) -> Endpoints {
    let port = instance.spec.container_port;
    let prefix = format!("{}-", instance.name);
    pods.iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter_map(|pod| {
            let name = pod.metadata.name.clone()?;
            let ip = pod
                .status
                .as_ref()?
                .pod_ip
                .clone()
                .filter(|ip| !ip.is_empty())?;
            let entry = match instance.spec.workload {
                Workload::Deployment => entry(&ip, port),
                Workload::StatefulSet => {
                    let ordinal: i32 = name.strip_prefix(&prefix)?.parse().ok()?;
                    servers::stable_address(instance, ordinal)
                }
            };
            Some((entry, (name, ip)))
        })
        .collect()
}

/// The entries of two pods known by name (a whole server's copy): each pod's name is its entry.
pub(super) fn by_name(pods: [(&str, &str); 2]) -> Endpoints {
    pods.into_iter()
        .map(|(pod, ip)| (pod.to_owned(), (pod.to_owned(), ip.to_owned())))
        .collect()
}
