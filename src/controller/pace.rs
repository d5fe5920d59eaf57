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
//! A new instance's first status waits for something settled to say: written while its pods come up, it
//! would say only "creating", and be written again moments later with the first ready server. So an
//! instance that has no status yet gets its first one once it is `Available` and done (see [`settled`]),
//! or has a `Degraded` reason, or when [`Pace::first_within`] has passed since this process created its
//! children, whichever comes first. With no record of that creation (after a restart) the first status is
//! not held for it.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::api::MemcachedStatus;
use crate::status::{AVAILABLE, DEGRADED, PROGRESSING, find};

type Key = (String, String);

/// Status writes per instance, and the gap kept between those that can wait.
pub struct Pace {
    gap: Duration,
    first_within: Duration,
    last: Mutex<Writes>,
}

/// The last write per instance, when this process first changed each instance's children (the start of
/// the wait of a first status), and when the entries that hold nothing back any more were last dropped:
/// at most once per the shorter of the two waits, so a burst of writes does not go through them all at
/// every write.
#[derive(Default)]
struct Writes {
    at: HashMap<Key, Instant>,
    since: HashMap<Key, Instant>,
    pruned: Option<Instant>,
}

impl Pace {
    /// Pacing with `gap` between the writes that can wait, and first statuses held for at most
    /// `first_within`; zero turns either off.
    pub fn new(gap: Duration, first_within: Duration) -> Self {
        Self {
            gap,
            first_within,
            last: Mutex::default(),
        }
    }

    /// The gap kept between status writes that can wait.
    pub fn gap(&self) -> Duration {
        self.gap
    }

    /// The longest a new instance's first status is held, from the creation of its children.
    pub fn first_within(&self) -> Duration {
        self.first_within
    }

    /// Records that the status of `namespace/name` was written, or that its children just changed so
    /// that its status is about to move on by itself. The first such record of an instance starts the
    /// wait of its first status (which only matters while it has none).
    pub fn wrote(&self, namespace: &str, name: &str) {
        self.wrote_at(namespace, name, Instant::now());
    }

    fn wrote_at(&self, namespace: &str, name: &str, now: Instant) {
        if self.gap.is_zero() && self.first_within.is_zero() {
            return;
        }
        let (gap, first_within) = (self.gap, self.first_within);
        let every = [gap, first_within]
            .into_iter()
            .filter(|d| !d.is_zero())
            .min()
            .unwrap_or_default();
        let mut last = self.lock();
        if last
            .pruned
            .is_none_or(|at| now.saturating_duration_since(at) >= every)
        {
            last.at
                .retain(|_, at| now.saturating_duration_since(*at) < gap);
            last.since
                .retain(|_, at| now.saturating_duration_since(*at) < first_within);
            last.pruned = Some(now);
        }
        let key = (namespace.to_owned(), name.to_owned());
        if !first_within.is_zero() {
            last.since.entry(key.clone()).or_insert(now);
        }
        if !gap.is_zero() {
            last.at.insert(key, now);
        }
    }

    /// Forgets `namespace/name`, which was deleted.
    pub fn forget(&self, namespace: &str, name: &str) {
        let key = (namespace.to_owned(), name.to_owned());
        let mut last = self.lock();
        last.at.remove(&key);
        last.since.remove(&key);
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
        let key = (namespace.to_owned(), name.to_owned());
        let last = self.lock();
        if previous.is_none() {
            if settled(new) {
                return None;
            }
            // Held until the deadline, and no longer: not for the rest of a gap either.
            if let Some(since) = last.since.get(&key) {
                return left(self.first_within, *since, now);
            }
        }
        if !can_wait(previous, new) {
            return None;
        }
        left(self.gap, *last.at.get(&key)?, now)
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

/// Whether a first status has something settled to say: the instance is `Degraded` for a reason, or it is
/// `Available` with nothing in progress (`Progressing=False`) and every server slot's pod ready. The
/// status is computed from several caches, each fed by its own watch, which catch up in any order:
/// `Available` counts the workload's ready replicas as well as the pods', so it can turn true before the
/// pods' cache shows the pod ready (no server listed yet), or before the workload's cache shows that its
/// controller has seen it (`Progressing=True`, `Reconciling`). Written then, the first status would be
/// written again a moment later. Pure.
pub fn settled(status: &MemcachedStatus) -> bool {
    let holds = |type_| find(Some(status), type_).is_some_and(|c| c.status == "True");
    holds(DEGRADED)
        || (holds(AVAILABLE) && !holds(PROGRESSING) && status.servers.iter().all(|s| s.ready))
}

/// Whether the change from `previous` to `new` may wait: it leaves `observedGeneration` (unless there was
/// none yet), the published servers, the number of slots (unless there were none yet), the drain and the
/// `Degraded` condition's status and reason as they were. Pure.
pub fn can_wait(previous: Option<&MemcachedStatus>, new: &MemcachedStatus) -> bool {
    let degraded = |s: Option<&MemcachedStatus>| {
        find(s, DEGRADED)
            .filter(|c| c.status == "True")
            .map(|c| c.reason.clone())
    };
    let published = |s: &MemcachedStatus| -> Vec<(i32, Option<String>)> {
        s.servers
            .iter()
            .filter(|server| server.ready)
            .map(|server| (server.slot, server.address.clone()))
            .collect()
    };
    let empty = MemcachedStatus::default();
    let before = previous.unwrap_or(&empty);
    // A spec change is acknowledged at once (`observedGeneration`), except on the first status.
    let generation_seen = before.observed_generation.is_none()
        || before.observed_generation == new.observed_generation;
    generation_seen
        && published(before) == published(new)
        && (before.servers.is_empty() || before.servers.len() == new.servers.len())
        && before.drain == new.drain
        && degraded(previous) == degraded(Some(new))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{Drain, Server};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
    use k8s_openapi::jiff::Timestamp;

    fn degraded(status: &str, reason: &str) -> Condition {
        Condition {
            type_: DEGRADED.into(),
            status: status.into(),
            reason: reason.into(),
            message: String::new(),
            last_transition_time: Time(Timestamp::UNIX_EPOCH),
            observed_generation: None,
        }
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
        let pace = Pace::new(Duration::from_secs(60), Duration::ZERO);
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

        let off = Pace::new(Duration::ZERO, Duration::ZERO);
        off.wrote("ns", "a");
        assert_eq!(off.hold("ns", "a", Some(&before), &counts), None);
    }

    fn condition(type_: &str, status: &str, reason: &str) -> Condition {
        Condition {
            type_: type_.into(),
            ..degraded(status, reason)
        }
    }

    /// A first status while the pods come up: a Deployment with one pod, not ready.
    fn progressing() -> MemcachedStatus {
        MemcachedStatus {
            conditions: vec![
                condition(AVAILABLE, "False", "ReplicasNotReady"),
                condition(PROGRESSING, "True", "ScalingUp"),
                degraded("False", "AsExpected"),
            ],
            observed_generation: Some(1),
            replicas: 1,
            ..Default::default()
        }
    }

    /// [`progressing`] with other `Available`, `Progressing` and `Degraded` (status, reason).
    fn with_conditions(
        available: (&str, &str),
        progressing_: (&str, &str),
        degraded_: (&str, &str),
    ) -> MemcachedStatus {
        MemcachedStatus {
            conditions: vec![
                condition(AVAILABLE, available.0, available.1),
                condition(PROGRESSING, progressing_.0, progressing_.1),
                degraded(degraded_.0, degraded_.1),
            ],
            ..progressing()
        }
    }

    const SECOND: Duration = Duration::from_secs(1);
    const WITHIN: Duration = Duration::from_secs(30);

    #[test]
    fn a_first_status_is_held_while_the_pods_come_up() {
        let pace = Pace::new(SECOND, WITHIN);
        let created = Instant::now();
        pace.wrote_at("ns", "a", created);
        let held = |after: Duration| pace.hold_at("ns", "a", None, &progressing(), created + after);
        assert_eq!(held(Duration::ZERO), Some(WITHIN));
        assert_eq!(
            held(Duration::from_secs(12)),
            Some(Duration::from_secs(18)),
            "until the deadline, well past the gap"
        );
        // The children changing again (a scale during the creation) does not move the deadline.
        pace.wrote_at("ns", "a", created + Duration::from_secs(20));
        assert_eq!(held(Duration::from_secs(25)), Some(Duration::from_secs(5)));
    }

    #[test]
    fn a_first_status_is_written_at_once_when_available_or_degraded() {
        let pace = Pace::new(SECOND, WITHIN);
        let created = Instant::now();
        pace.wrote_at("ns", "a", created);
        let available = with_conditions(
            ("True", "AllReplicasReady"),
            ("False", "Complete"),
            ("False", "AsExpected"),
        );
        assert_eq!(pace.hold_at("ns", "a", None, &available, created), None);
        let scaled_to_zero = MemcachedStatus {
            replicas: 0,
            ..with_conditions(
                ("True", "ScaledToZero"),
                ("False", "Complete"),
                ("False", "AsExpected"),
            )
        };
        assert_eq!(
            pace.hold_at("ns", "a", None, &scaled_to_zero, created),
            None,
            "available without any server, and without waiting for the gap either"
        );
        let failing = with_conditions(
            ("False", "ReplicasNotReady"),
            ("True", "ScalingUp"),
            ("True", "ImagePullFailed"),
        );
        assert_eq!(pace.hold_at("ns", "a", None, &failing, created), None);
        assert!(settled(&available) && settled(&scaled_to_zero) && settled(&failing));
        assert!(!settled(&progressing()) && !settled(&MemcachedStatus::default()));

        // The workload counts the pod ready before the pods' cache shows it: no server to list yet.
        let ahead_of_the_pods = MemcachedStatus {
            servers: vec![Server {
                slot: 0,
                pod: Some("cache-a".into()),
                address: None,
                ready: false,
            }],
            ..available.clone()
        };
        assert!(!settled(&ahead_of_the_pods));
        // The pods' cache is ahead of the workload's: its controller has not been seen at work yet.
        let ahead_of_the_workload = MemcachedStatus {
            conditions: vec![
                condition(AVAILABLE, "True", "AllReplicasReady"),
                condition(PROGRESSING, "True", "Reconciling"),
                degraded("False", "AsExpected"),
            ],
            replicas: 0,
            ..available.clone()
        };
        assert!(!settled(&ahead_of_the_workload));
        assert_eq!(
            pace.hold_at("ns", "a", None, &ahead_of_the_pods, created),
            Some(WITHIN)
        );
        let listed = MemcachedStatus {
            servers: vec![Server {
                slot: 0,
                pod: Some("cache-a".into()),
                address: Some("10.0.0.1:11211".into()),
                ready: true,
            }],
            ..available
        };
        assert_eq!(pace.hold_at("ns", "a", None, &listed, created), None);
    }

    #[test]
    fn a_first_status_is_written_once_the_deadline_has_passed() {
        let pace = Pace::new(SECOND, WITHIN);
        let created = Instant::now();
        pace.wrote_at("ns", "a", created);
        let at = |after: Duration| pace.hold_at("ns", "a", None, &progressing(), created + after);
        assert_eq!(at(WITHIN), None);
        assert_eq!(at(Duration::from_secs(45)), None);
        // Entries past both waits are dropped by a later write (of any instance).
        pace.wrote_at("ns", "b", created + Duration::from_secs(45));
        assert_eq!(pace.lock().since.len(), 1, "only b's wait is kept");
    }

    #[test]
    fn a_first_status_without_a_record_of_the_creation_is_written_at_once() {
        // After a restart: the children exist, nobody here created them.
        let pace = Pace::new(SECOND, WITHIN);
        assert_eq!(pace.hold("ns", "a", None, &progressing()), None);
        // Held for the first status only: once there is one, counts wait for the gap as usual.
        pace.wrote("ns", "a");
        let left = pace
            .hold(
                "ns",
                "a",
                Some(&progressing()),
                &MemcachedStatus {
                    ready_replicas: 1,
                    ..progressing()
                },
            )
            .unwrap();
        assert!(left <= SECOND, "{left:?}");
        // Turned off, nothing is held for it.
        let off = Pace::new(SECOND, Duration::ZERO);
        off.wrote("ns", "a");
        let first = off.hold("ns", "a", None, &progressing());
        assert!(
            first.is_some_and(|left| left <= SECOND),
            "only the gap: {first:?}"
        );
    }
}
