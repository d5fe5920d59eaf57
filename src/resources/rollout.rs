//! Pacing a StatefulSet's rolling update: one server at a time, each warmed up for
//! `spec.rollout.warmupSeconds` before the next goes.
//!
//! A Deployment does this by itself (`minReadySeconds` with `maxUnavailable: 0`, `maxSurge: 1`). A
//! StatefulSet does not: its controller ignores `minReadySeconds` while it rolls out pods under
//! `podManagementPolicy: Parallel` (kubernetes/kubernetes#119234, #112066), so on a real v1.28 server the
//! servers of a pool were replaced 1.4 s and 2.0 s apart with `warmupSeconds: 8`. The operator therefore
//! steps `updateStrategy.rollingUpdate.partition` itself: the StatefulSet controller only replaces pods
//! whose ordinal is at least the partition, highest first, so
//! - a template change is applied with the partition at the highest ordinal: exactly one server goes;
//! - from then on the partition is at the highest server still to be replaced once every server above
//!   it (all replaced) is ready and has been ready for `warmupSeconds`, and one above it until then;
//! - once every server runs the new revision it is 0, where it stays between rollouts (a new pool's
//!   servers, all on the current revision, are never held back).
//!
//! With a warm handover (`spec.handover.enabled`) the operator paces the rollout even without a warmup: a
//! template change holds every server (the partition at `replicas`), and each step down waits until the
//! server about to go has been copied to the spare server (see [`super::spare`]); [`Pace::next`] says
//! which server that is.
//!
//! Everything is read from the live StatefulSet (its `updateRevision`) and the pods (their
//! `controller-revision-hash` label and `Ready` condition), never from memory, so the pace survives an
//! operator restart or a leader hand-over. Without a warmup the controller's own pace (the next pod once
//! the replaced one is ready) is the wanted one and the partition stays 0.

use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::drift;

/// Label the StatefulSet controller puts on each pod: the revision of the template it was made from.
pub const REVISION_LABEL: &str = "controller-revision-hash";

/// The partition to apply, and how long until it can move on by the clock alone (a server's warmup
/// ending), so the reconciler looks again then.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Pace {
    pub partition: i32,
    pub wait: Option<Duration>,
    /// The highest server still to be replaced, while a rollout the StatefulSet controller has taken in
    /// is under way: the next one to go, or the one going now.
    pub next: Option<i32>,
}

impl Pace {
    /// The server this pace lets the StatefulSet replace that the `live` partition still holds: the one
    /// a warm handover copies to the spare server before the partition steps down to it.
    pub fn stepping(&self, live_partition: i32) -> Option<i32> {
        self.next
            .filter(|next| *next == self.partition && self.partition < live_partition)
    }
}

/// The pace of `desired` (the StatefulSet about to be applied, `replicas` servers) given the `live` one
/// and the instance's `pods`, without a warm handover.
pub fn pace(
    desired: &StatefulSet,
    live: Option<&StatefulSet>,
    pods: &[&Pod],
    warmup_seconds: i32,
    now: &Time,
) -> Pace {
    paced(desired, live, pods, warmup_seconds, false, now)
}

/// [`pace`], with a warm `handover` or not: with one, a template change replaces no server yet (the
/// first has to be copied to the spare server before it goes), and the pace applies without a warmup too.
pub fn paced(
    desired: &StatefulSet,
    live: Option<&StatefulSet>,
    pods: &[&Pod],
    warmup_seconds: i32,
    handover: bool,
    now: &Time,
) -> Pace {
    let replicas = desired.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    let (Some(live), true) = (live, warmup_seconds > 0 || handover) else {
        // A new StatefulSet has no servers to keep warm; without a warmup the controller paces itself.
        return Pace::default();
    };
    let live_partition = partition_of(live);
    if template_changes(desired, live) {
        // One server goes, the highest; the rest wait for it to be warm. With a handover none goes yet.
        let partition = if handover { replicas } else { replicas - 1 };
        return Pace {
            partition: partition.max(0),
            wait: None,
            next: None,
        };
    }
    let status = live.status.as_ref();
    let observed = status.and_then(|s| s.observed_generation);
    let revision = status.and_then(|s| s.update_revision.as_deref());
    let (true, Some(revision)) = (observed >= live.metadata.generation, revision) else {
        // The controller has not taken in the last change yet: its revisions are not this spec's.
        return Pace {
            partition: live_partition,
            wait: None,
            next: None,
        };
    };
    let name = live.metadata.name.as_deref().unwrap_or_default();
    let pod = |ordinal: i32| {
        let pod_name = format!("{name}-{ordinal}");
        pods.iter()
            .find(|p| p.metadata.name.as_deref() == Some(pod_name.as_str()))
            .copied()
    };
    // The highest server still to be replaced (not on the new revision, or missing); none: no rollout.
    let Some(next) = (0..replicas)
        .rev()
        .find(|o| pod(*o).is_none_or(|p| !on_revision(p, revision)))
    else {
        return Pace::default();
    };
    // It may go once every server above it (all replaced) is warm; until then the partition holds it.
    let mut wait = None;
    for ordinal in next + 1..replicas {
        match pod(ordinal).map(|p| warmth(p, warmup_seconds, now)) {
            Some(Warmth::Warm) => {}
            Some(Warmth::WarmIn(left)) => wait = wait.max(Some(left)),
            Some(Warmth::Cold) | None => wait = wait.or(Some(Duration::ZERO)),
        }
    }
    match wait {
        None => Pace {
            partition: next,
            wait: None,
            next: Some(next),
        },
        Some(left) => Pace {
            partition: next + 1,
            // A server that is not ready yet wakes the reconciler when it is: no timer for it.
            wait: Some(left).filter(|l| !l.is_zero()),
            next: Some(next),
        },
    }
}

/// The partition `sts` applies now (0 when unset).
pub fn partition_of(sts: &StatefulSet) -> i32 {
    sts.spec
        .as_ref()
        .and_then(|s| s.update_strategy.as_ref())
        .and_then(|u| u.rolling_update.as_ref())
        .and_then(|r| r.partition)
        .unwrap_or(0)
}

/// Whether applying `desired` changes the live pod template (a new revision).
fn template_changes(desired: &StatefulSet, live: &StatefulSet) -> bool {
    let template = |s: &StatefulSet| {
        s.spec
            .as_ref()
            .map(|spec| serde_json::to_value(&spec.template).unwrap_or_default())
    };
    match (template(live), template(desired)) {
        (Some(live), Some(desired)) => !drift::contains(&live, &desired),
        _ => true,
    }
}

enum Warmth {
    Warm,
    WarmIn(Duration),
    Cold,
}

/// Whether `pod` runs `revision` (and is not on its way out).
pub fn on_revision(pod: &Pod, revision: &str) -> bool {
    pod.metadata.deletion_timestamp.is_none()
        && pod
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(REVISION_LABEL))
            .is_some_and(|r| r == revision)
}

/// Whether `pod` has been ready for `warmup_seconds`, measured as the workload controllers measure
/// `minReadySeconds`: from its `Ready` condition's transition time.
fn warmth(pod: &Pod, warmup_seconds: i32, now: &Time) -> Warmth {
    let ready_since = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready" && c.status == "True"))
        .and_then(|c| c.last_transition_time.as_ref());
    let Some(since) = ready_since else {
        return Warmth::Cold;
    };
    let left = since.0.as_second() + i64::from(warmup_seconds) - now.0.as_second();
    if left <= 0 {
        Warmth::Warm
    } else {
        Warmth::WarmIn(Duration::from_secs(left.unsigned_abs()))
    }
}

#[cfg(test)]
mod tests;
