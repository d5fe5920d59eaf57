//! Pacing of status writes: while an instance's pods come up, its status changes with every pod event
//! (a pod created, scheduled, started, ready), each a write of the whole status. Changes that only move
//! counts and conditions are written at most once per [`Pace::gap`] per instance; the reconcile that holds
//! one back asks to run again when the gap is over and writes the latest status then.
//!
//! Never held back: the acknowledgement of a spec change (`observedGeneration`), a change of the published
//! servers (the ready addresses in slot order, what clients see), of the number of slots once there are
//! any, of the drain (a later reconcile plans from it), and a new `Degraded` reason (someone has to act on
//! it). A pod that takes a slot but is not ready yet can wait: slot assignment is a pure function of the
//! stored slots and the pods, so the next reconcile assigns it the same way.
//!
//! A new instance's first status is never held: written on its first reconcile (`Progressing=True`,
//! `Creating`, the counts), so that `kubectl get memcached` right after `kubectl apply` shows progress, as a
//! Deployment's does. While it says `Creating`, the next status waits until the instance is `Available`
//! and done ([`settled`]), or something is wrong or the spec changed ([`urgent`]), or [`CREATING_HOLD`]
//! passed and it moved on (a pod more ready, another phase: [`moved_on`]): its pods being created,
//! scheduled and started, and its servers coming up one by one (published in the server list ConfigMap at
//! once), would otherwise each be a write. Measured on a real v1.28.7 API server with 300 new instances:
//! 3.5 status writes per instance with the gap alone, 2.8 when only the counts waited, 2 with this; with
//! 10 000 on 2 cores (2026-11-30), 2.12 while the hold's end alone let a write through (it said only that
//! the pod existed), 2.00 with [`moved_on`] (the second write up to 760 s after the first).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::api::MemcachedStatus;
use crate::status::{AVAILABLE, CREATING, DEGRADED, PROGRESSING, SCALING_UP, find};

type Key = (String, String);

/// How long the changes that can wait are held while the status says `Creating` (counted from the last
/// write), after which a status that moved on is written ([`moved_on`]): as long as a Deployment's default
/// progress deadline (`progressDeadlineSeconds`, 600 s), after which a pod that never gets ready is
/// reported as `Degraded` `ProgressDeadlineExceeded`; a pod that cannot be scheduled, pulled or started
/// is reported at once (`Degraded` reasons are never held).
///
/// It was 30 s, as long as a pod takes to start. Under a burst the control plane takes longer: measured on
/// a real v1.28.4 API server with 3 000 new instances (2026-11-28), the last were `Available` 180-300 s
/// after their first status, and each instance past the 30 s wrote its counts in between, a third status
/// write (3.00-3.05 per instance, against 2.0 at 300 instances).
pub const CREATING_HOLD: Duration = Duration::from_secs(600);

/// Status writes per instance, and the gap kept between those that can wait.
pub struct Pace {
    gap: Duration,
    last: Mutex<Writes>,
}

/// The last write per instance, and when the entries that hold nothing back any more were last dropped:
/// at most once per gap, so a burst of writes does not go through them all at every write.
#[derive(Default)]
struct Writes {
    at: HashMap<Key, Instant>,
    pruned: Option<Instant>,
}

impl Pace {
    /// Pacing with `gap` between the writes that can wait; zero turns it off.
    pub fn new(gap: Duration) -> Self {
        Self {
            gap,
            last: Mutex::default(),
        }
    }

    /// The gap kept between status writes that can wait.
    pub fn gap(&self) -> Duration {
        self.gap
    }

    /// Records that the status of `namespace/name` was written, or that its children just changed so
    /// that its status is about to move on by itself.
    pub fn wrote(&self, namespace: &str, name: &str) {
        self.wrote_at(namespace, name, Instant::now());
    }

    fn wrote_at(&self, namespace: &str, name: &str, now: Instant) {
        if self.gap.is_zero() {
            return;
        }
        // Entries are kept as long as they may hold something back.
        let keep = self.gap.max(CREATING_HOLD);
        let mut last = self.lock();
        if last
            .pruned
            .is_none_or(|at| now.saturating_duration_since(at) >= keep)
        {
            last.at
                .retain(|_, at| now.saturating_duration_since(*at) < keep);
            last.pruned = Some(now);
        }
        last.at.insert((namespace.to_owned(), name.to_owned()), now);
    }

    /// Forgets `namespace/name`, which was deleted.
    pub fn forget(&self, namespace: &str, name: &str) {
        let key = (namespace.to_owned(), name.to_owned());
        self.lock().at.remove(&key);
    }

    /// How long the change from `previous` to `new` must wait before it is written; `None` for now.
    pub fn hold(
        &self,
        namespace: &str,
        name: &str,
        previous: Option<&MemcachedStatus>,
        new: &MemcachedStatus,
    ) -> Option<Duration> {
        self.hold_at(namespace, name, previous, new, Instant::now())
    }

    fn hold_at(
        &self,
        namespace: &str,
        name: &str,
        previous: Option<&MemcachedStatus>,
        new: &MemcachedStatus,
        now: Instant,
    ) -> Option<Duration> {
        // The first status is never held (see the module documentation).
        let before = previous?;
        let creating = find(Some(before), PROGRESSING)
            .is_some_and(|c| c.status == "True" && c.reason == CREATING);
        let key = (namespace.to_owned(), name.to_owned());
        let written = self.lock().at.get(&key).copied();
        if creating {
            // Being created: said at once when done (`kubectl wait --for=condition=Available` waits for
            // it) or when something is wrong or the spec changed; the servers coming up one by one (in the
            // server list ConfigMap at once) wait with the counts, and after the hold only a status that
            // moved on is written.
            if settled(new) || urgent(previous, new) {
                return None;
            }
            let wait = self.gap.max(CREATING_HOLD);
            return match written.and_then(|at| left(wait, at, now)) {
                Some(left) => Some(left),
                None if moved_on(before, new) => None,
                None => Some(wait),
            };
        }
        if !can_wait(previous, new) {
            return None;
        }
        left(self.gap, written?, now)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Writes> {
        self.last.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// What is left at `now` of a wait of `wait` from `from`, in whole milliseconds rounded up (the resolution
/// of the runtime's timers); `None` once it is over.
fn left(wait: Duration, from: Instant, now: Instant) -> Option<Duration> {
    let left = wait.checked_sub(now.saturating_duration_since(from))?;
    let millis = left.as_nanos().div_ceil(1_000_000);
    (millis > 0).then(|| Duration::from_millis(u64::try_from(millis).unwrap_or(u64::MAX)))
}

/// Whether a status has something settled to say: `Available` with nothing in progress
/// (`Progressing=False`) and every server slot's pod ready. The status is computed from several caches,
/// each fed by its own watch, which catch up in any order: `Available` counts the workload's ready replicas
/// as well as the pods', so it can turn true before the pods' cache shows the pod ready (no server listed
/// yet), or before the workload's cache shows that its controller has seen it. Pure.
pub fn settled(status: &MemcachedStatus) -> bool {
    let holds = |type_| find(Some(status), type_).is_some_and(|c| c.status == "True");
    holds(AVAILABLE) && !holds(PROGRESSING) && status.servers.iter().all(|s| s.ready)
}

/// Whether a status still being created moved on from `before`, the last one written: more or fewer pods
/// ready, other servers published, or a phase other than the pods starting (`Creating`, `ScalingUp`). A
/// pod that exists but is not ready yet does not; the workload's controller reports one that never gets
/// ready (`ProgressDeadlineExceeded`, a `Degraded` reason: never held). Pure.
fn moved_on(before: &MemcachedStatus, new: &MemcachedStatus) -> bool {
    let starting = find(Some(new), PROGRESSING)
        .is_some_and(|c| c.status == "True" && (c.reason == CREATING || c.reason == SCALING_UP));
    before.ready_replicas != new.ready_replicas || published(before) != published(new) || !starting
}

/// The ready servers in slot order with their addresses: what clients see. Pure.
fn published(status: &MemcachedStatus) -> Vec<(i32, Option<&str>)> {
    status
        .servers
        .iter()
        .filter(|server| server.ready)
        .map(|server| (server.slot, server.address.as_deref()))
        .collect()
}

/// Whether the change from `previous` to `new` acknowledges a spec change (`observedGeneration`, unless
/// there was none yet), starts or ends a drain, or changes the `Degraded` condition's status or reason:
/// never held. Pure.
fn urgent(previous: Option<&MemcachedStatus>, new: &MemcachedStatus) -> bool {
    let degraded = |s: Option<&MemcachedStatus>| {
        find(s, DEGRADED)
            .filter(|c| c.status == "True")
            .map(|c| c.reason.clone())
    };
    let empty = MemcachedStatus::default();
    let before = previous.unwrap_or(&empty);
    let generation_seen = before.observed_generation.is_none()
        || before.observed_generation == new.observed_generation;
    !generation_seen || before.drain != new.drain || degraded(previous) != degraded(Some(new))
}

/// Whether the change from `previous` to `new` may wait: it leaves `observedGeneration` (unless there was
/// none yet), the published servers, the number of slots (unless there were none yet), the drain and the
/// `Degraded` condition's status and reason as they were. Pure.
pub fn can_wait(previous: Option<&MemcachedStatus>, new: &MemcachedStatus) -> bool {
    let empty = MemcachedStatus::default();
    let before = previous.unwrap_or(&empty);
    !urgent(previous, new)
        && published(before) == published(new)
        && (before.servers.is_empty() || before.servers.len() == new.servers.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{Drain, Server};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
    use k8s_openapi::jiff::Timestamp;

    fn degraded(status: &str, reason: &str) -> Condition {
        condition(DEGRADED, status, reason)
    }

    #[test]
    fn counts_and_conditions_can_wait_slots_drains_and_problems_cannot() {
        let before = MemcachedStatus {
            conditions: vec![degraded("False", "AsExpected")],
            ..Default::default()
        };
        let counts = MemcachedStatus {
            replicas: 1,
            nodes: vec!["cache-a".into()],
            ..before.clone()
        };
        assert!(can_wait(Some(&before), &counts));
        assert!(can_wait(None, &counts), "a first status without servers");

        let server = |pod: Option<&str>, ready: bool| Server {
            slot: 0,
            pod: pod.map(str::to_owned),
            address: pod.map(|_| "127.0.0.1:11211".to_owned()),
            ready,
        };
        let slot = MemcachedStatus {
            servers: vec![server(None, false)],
            ..counts.clone()
        };
        assert!(
            can_wait(Some(&counts), &slot),
            "the first slots, nobody in them"
        );
        let taken = MemcachedStatus {
            servers: vec![server(Some("cache-a"), false)],
            ..counts.clone()
        };
        assert!(
            can_wait(Some(&slot), &taken),
            "a pod that is not ready takes a slot"
        );
        let ready = MemcachedStatus {
            servers: vec![server(Some("cache-a"), true)],
            ..counts.clone()
        };
        assert!(!can_wait(Some(&taken), &ready), "a server is published");
        let more = MemcachedStatus {
            servers: vec![
                server(Some("cache-a"), true),
                Server {
                    slot: 1,
                    ..Default::default()
                },
            ],
            ..counts.clone()
        };
        assert!(!can_wait(Some(&ready), &more), "a slot more");
        let draining = MemcachedStatus {
            drain: Some(Drain {
                from_size: 2,
                to_size: 1,
                started_at: Time(Timestamp::UNIX_EPOCH),
                servers: Vec::new(),
            }),
            ..counts.clone()
        };
        assert!(!can_wait(Some(&counts), &draining), "a drain starts");
        let broken = MemcachedStatus {
            conditions: vec![degraded("True", "ImagePullBackOff")],
            ..counts.clone()
        };
        assert!(!can_wait(Some(&counts), &broken), "a new problem");
        let other = MemcachedStatus {
            conditions: vec![degraded("True", "CrashLoopBackOff")],
            ..counts.clone()
        };
        assert!(!can_wait(Some(&broken), &other), "another problem");
        let oom = MemcachedStatus {
            conditions: vec![degraded("True", "OOMKilled")],
            ..counts.clone()
        };
        assert!(!can_wait(Some(&counts), &oom), "an OOM kill");
        assert!(
            !can_wait(Some(&other), &oom),
            "a crash loop found OOM-killed"
        );
        assert!(can_wait(Some(&oom), &oom.clone()), "an OOM kill seen again");
        assert!(can_wait(Some(&broken), &broken.clone()));

        let seen = MemcachedStatus {
            observed_generation: Some(1),
            ..counts.clone()
        };
        assert!(can_wait(Some(&counts), &seen), "the first status");
        let changed = MemcachedStatus {
            observed_generation: Some(2),
            ..seen.clone()
        };
        assert!(
            !can_wait(Some(&seen), &changed),
            "a spec change is acknowledged"
        );
    }

    #[test]
    fn a_change_that_can_wait_waits_for_the_rest_of_the_gap() {
        let pace = Pace::new(Duration::from_secs(60));
        let before = MemcachedStatus::default();
        let counts = MemcachedStatus {
            replicas: 1,
            ..Default::default()
        };
        assert_eq!(
            pace.hold("ns", "a", Some(&before), &counts),
            None,
            "never written"
        );
        pace.wrote("ns", "a");
        let left = pace.hold("ns", "a", Some(&before), &counts).unwrap();
        assert!(left > Duration::from_secs(59) && left <= Duration::from_secs(60));
        assert_eq!(
            pace.hold("ns", "b", Some(&before), &counts),
            None,
            "per instance"
        );
        pace.forget("ns", "a");
        assert_eq!(
            pace.hold("ns", "a", Some(&before), &counts),
            None,
            "deleted"
        );

        let off = Pace::new(Duration::ZERO);
        off.wrote("ns", "a");
        assert_eq!(off.hold("ns", "a", Some(&before), &counts), None);
    }

    #[test]
    fn a_first_status_is_never_held_even_within_the_gap() {
        let pace = Pace::new(Duration::from_secs(60));
        let created = Instant::now();
        // The children were just created, which starts the gap for the changes that can wait.
        pace.wrote_at("ns", "a", created);
        let creating = MemcachedStatus {
            observed_generation: Some(1),
            replicas: 1,
            ..Default::default()
        };
        assert_eq!(pace.hold_at("ns", "a", None, &creating, created), None);
        let counts = MemcachedStatus {
            ready_replicas: 1,
            ..creating.clone()
        };
        assert!(
            pace.hold_at("ns", "a", Some(&creating), &counts, created)
                .is_some(),
            "the next change of counts waits for the gap"
        );
    }

    fn condition(type_: &str, status: &str, reason: &str) -> Condition {
        Condition {
            type_: type_.into(),
            status: status.into(),
            reason: reason.into(),
            message: String::new(),
            last_transition_time: Time(Timestamp::UNIX_EPOCH),
            observed_generation: None,
        }
    }

    #[test]
    fn while_creating_the_changes_that_can_wait_wait_longer_until_done() {
        let pace = Pace::new(Duration::from_secs(1));
        let written = Instant::now();
        pace.wrote_at("ns", "a", written);
        let status = |progressing: (&str, &str), available: &str| MemcachedStatus {
            conditions: vec![
                condition(AVAILABLE, available, "Any"),
                condition(PROGRESSING, progressing.0, progressing.1),
            ],
            replicas: 1,
            ..Default::default()
        };
        let creating = status(("True", CREATING), "False");
        let scaling = status(("True", "ScalingUp"), "False");
        let after = |secs: u64| written + Duration::from_secs(secs);
        assert_eq!(
            pace.hold_at("ns", "a", Some(&creating), &scaling, after(5)),
            Some(CREATING_HOLD - Duration::from_secs(5)),
            "the pods coming up: held well past the gap"
        );
        assert_eq!(
            pace.hold_at("ns", "a", Some(&creating), &scaling, after(600)),
            Some(CREATING_HOLD),
            "after the hold, a pod that exists but is not ready is not worth a write"
        );
        let one_ready = MemcachedStatus {
            ready_replicas: 1,
            ..scaling.clone()
        };
        assert_eq!(
            pace.hold_at("ns", "a", Some(&creating), &one_ready, after(600)),
            None,
            "and a pod more ready is, after the hold"
        );
        let reconciling = status(("True", "Reconciling"), "False");
        assert_eq!(
            pace.hold_at("ns", "a", Some(&creating), &reconciling, after(600)),
            None,
            "as is another phase"
        );
        assert_eq!(
            pace.hold_at("ns", "b", Some(&creating), &scaling, after(5)),
            Some(CREATING_HOLD),
            "nothing written since the operator started: the same rule"
        );
        assert_eq!(
            pace.hold_at("ns", "b", Some(&creating), &one_ready, after(5)),
            None
        );
        assert_eq!(
            pace.hold_at("ns", "a", Some(&scaling), &creating, after(5)),
            None,
            "after the creation, the gap"
        );
        let first_server = MemcachedStatus {
            servers: vec![crate::api::Server {
                slot: 0,
                pod: Some("a-0".into()),
                address: Some("10.0.0.1:11211".into()),
                ready: true,
            }],
            ..scaling.clone()
        };
        assert!(
            pace.hold_at("ns", "a", Some(&creating), &first_server, after(1))
                .is_some(),
            "a first server, not done yet: waits with the counts (the ConfigMap has it at once)"
        );
        let done = status(("False", "Complete"), "True");
        assert_eq!(
            pace.hold_at("ns", "a", Some(&creating), &done, after(1)),
            None,
            "Available and done: at once"
        );
        let broken = MemcachedStatus {
            conditions: vec![condition(DEGRADED, "True", "ImagePullFailed")],
            ..scaling.clone()
        };
        assert_eq!(
            pace.hold_at("ns", "a", Some(&creating), &broken, after(1)),
            None,
            "a problem: at once"
        );
        assert!(settled(&done) && !settled(&scaling));
    }
}
