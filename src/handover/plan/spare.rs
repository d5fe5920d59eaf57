//! A StatefulSet rollout's warm handover through the spare server (`resources::spare` builds it):
//! which copy runs when, and when the spare goes.
//!
//! A StatefulSet replaces a pod under the same name: the old server `<name>-i` is gone before the new
//! one starts, so there is no moment when both run to copy from one to the other. The operator therefore
//! runs a spare server of its own, the bare pod `<name>-handover`, for the length of a rollout:
//! 1. before the partition steps down to ordinal `i` (`resources::rollout::Pace::stepping`), the spare is
//!    emptied and server `i`'s items are copied to it;
//! 2. the new pod `i` starts behind the handover readiness gate; once its memcached runs, the spare's
//!    items are copied to it (add mode: what clients wrote to it meanwhile stays), and its gate opens;
//! 3. once no server is left to replace and no new pod waits, the spare is deleted.
//!
//! The published list does not change (the names are stable: the planner, [`super::copies`], has no key
//! to move for it), so what is copied is the whole server, to the spare and from it to its replacement.

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;

use super::rollout::GATE;
use crate::resources::rollout::on_revision;
use crate::resources::servers::{Member, is_ready};

/// The spare's IP when it can take a copy: ready, running, not on its way out.
pub fn usable(spare: &Member) -> Option<&str> {
    spare
        .ip
        .as_deref()
        .filter(|_| spare.ready && !spare.terminating)
}

/// Whether the spare has been starting for more than `timeout_seconds` (unschedulable, its image not
/// pulled): the rollout then goes on cold rather than wait for it.
pub fn late(spare: &Member, timeout_seconds: u64, now: Timestamp) -> bool {
    let Some(created) = spare.created else {
        return false;
    };
    let waited = now.as_second() - created.as_second();
    usable(spare).is_none() && u64::try_from(waited).is_ok_and(|w| w >= timeout_seconds)
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
