//! A scale's warm handover under a declared client hashing (`spec.clients.hashing`):
//! which change of the published list a scale makes, which (source, target) copies it needs and which keys
//! each takes, and whether the scale waits for them.
//!
//! - Scale-down N→M: the shorter list is published first (the drain, `resources::scaling`); the items
//!   that change owner are then copied to their new owners, and the drained pods go only once the drain
//!   time has passed and the copies ended. The list clients used before is kept in `status.drain.servers`,
//!   so a restarted operator knows which server held which keys (a Deployment's drained pods hold no slot
//!   any more).
//! - Scale-up M→N: a new slot whose pod is ready is held out of the published list while the items that
//!   will move to it are copied from their current owners; the new slots are published together once the
//!   copies ended, so clients never ask an empty server for keys it owns.
//!
//! Either way a key is copied from the server that owns it under the old list to the one that owns it
//! under the new list, one copy per (source, target) pair with keys to move (the planner's
//! [`super::copies`]), with add semantics, so a value clients wrote on the new owner since wins. A
//! handover never holds a scale for longer than `spec.handover.timeoutSeconds` ([`holds`]).

use std::collections::BTreeSet;
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use super::moves::{self, Copy, Pair, published};
use crate::api::{Drain, Server};
use crate::hashing::{Handover, InvalidEntry, Scheme};

/// Which way the scale goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// Servers leave the list: copies run while they drain.
    Down,
    /// Servers join the list: copies run before they are published.
    Up,
}

/// A change of the published list that a scale makes, under the clients' hashing.
#[derive(Clone, Debug, PartialEq)]
pub struct Change {
    pub direction: Direction,
    pub scheme: Scheme,
    /// The published `host:port` entries clients used before, in slot order.
    pub old: Vec<String>,
    /// The entries they use after, in slot order.
    pub new: Vec<String>,
    /// The slot of each entry of `new`.
    pub new_slots: Vec<i32>,
    /// When the copies' time bound started, when the status keeps it: a scale-down's drain start. A
    /// scale-up's starts with its copies.
    pub started: Option<Time>,
}

impl Change {
    /// The copies the change needs: every (source, target) pair between which keys can move
    /// ([`super::pairs`]).
    pub fn pairs(&self) -> Vec<Pair> {
        moves::pairs(Some(self.scheme), &self.old, &self.new)
    }

    /// The planner's copies of the change: one per pair, with the filter of the keys it moves.
    pub fn copies(&self) -> Result<Vec<Copy>, InvalidEntry> {
        moves::copies(Some(self.scheme), &self.old, &self.new)
    }

    /// Where each key is under both lists, built once and shared by the change's filters.
    pub fn handover(&self) -> Result<Arc<Handover>, InvalidEntry> {
        Handover::new(self.scheme, &self.old, &self.new).map(Arc::new)
    }

    /// The slot of `new[target]`.
    pub fn slot(&self, target: usize) -> i32 {
        self.new_slots.get(target).copied().unwrap_or(-1)
    }
}

/// The scale-down a drain makes: from the list it recorded (`drain.servers`) to the one published now.
/// `None` without a declared `scheme`, without a recorded list, or when no key moves to another server.
pub fn scale_down(
    scheme: Option<Scheme>,
    drain: Option<&Drain>,
    servers: &[Server],
) -> Option<Change> {
    let (scheme, drain) = (scheme?, drain?);
    let (new, new_slots) = published(servers);
    let change = Change {
        direction: Direction::Down,
        scheme,
        old: drain.servers.clone(),
        new,
        new_slots,
        started: Some(whole_seconds(&drain.started_at)),
    };
    (!change.pairs().is_empty()).then_some(change)
}

/// `time` without its fraction of a second, as the status keeps it: the drain a reconcile starts and
/// the one it reads back afterwards are the same change.
fn whole_seconds(time: &Time) -> Time {
    Timestamp::from_second(time.0.as_second()).map_or_else(|_| time.clone(), Time)
}

/// The scale-up `servers` (as assigned now, a ready pod's slot with its address) make over `previous`
/// (`status.servers`, as published): `None` without a declared `scheme`, when no slot gets its first
/// address, or when no key moves.
pub fn scale_up(scheme: Option<Scheme>, previous: &[Server], servers: &[Server]) -> Option<Change> {
    let scheme = scheme?;
    let joining = joining(previous, servers);
    if joining.is_empty() {
        return None;
    }
    let (old, _) = published(previous);
    let (new, new_slots) = published(servers);
    let change = Change {
        direction: Direction::Up,
        scheme,
        old,
        new,
        new_slots,
        started: None,
    };
    (!change.pairs().is_empty()).then_some(change)
}

/// The slots of `servers` with an address that `previous` did not publish: the servers a scale-up adds.
fn joining(previous: &[Server], servers: &[Server]) -> BTreeSet<i32> {
    let listed: BTreeSet<i32> = previous
        .iter()
        .filter(|s| s.address.is_some())
        .map(|s| s.slot)
        .collect();
    servers
        .iter()
        .filter(|s| s.address.is_some() && !listed.contains(&s.slot))
        .map(|s| s.slot)
        .collect()
}

/// Holds the joining servers out of the published list (their copies run): they keep their pod and
/// readiness, without an address.
pub fn withhold(previous: &[Server], servers: &mut [Server]) {
    let joining = joining(previous, servers);
    for server in servers.iter_mut().filter(|s| joining.contains(&s.slot)) {
        server.address = None;
    }
}

/// Where a change's copies are, as the operator's memory knows them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Copies {
    /// None started for this change (just planned, or the operator restarted).
    NotStarted,
    /// Started at `since`; some have not ended.
    Running { since: Time },
    /// Every copy ended: done, failed or timed out.
    Ended,
}

/// Whether the change still holds its scale (the drained pods' removal, or the joining servers'
/// publication): until its copies ended, and never past `timeout_seconds` from their start. A scale-down's
/// start is its drain's (kept in the status); a scale-up not started yet waits for its copies to start.
pub fn holds(change: &Change, copies: &Copies, now: &Time, timeout_seconds: u64) -> bool {
    let start = match copies {
        Copies::Ended => return false,
        Copies::NotStarted => change.started.as_ref(),
        Copies::Running { since } => change.started.as_ref().or(Some(since)),
    };
    start.is_none_or(|start| !past(start, now, timeout_seconds))
}

/// Whether `timeout_seconds` have passed since `start`.
pub fn past(start: &Time, now: &Time, timeout_seconds: u64) -> bool {
    let elapsed = now.0.as_second() - start.0.as_second();
    elapsed >= i64::try_from(timeout_seconds).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests;
