//! The drain state machine: how a scale-down removes servers without surprising clients.
//!
//! When `size` goes down from N to M, the list without slots ≥ M is published first (status and
//! ConfigMap) while all N pods keep running; only `spec.scaling.drainSeconds` later is the workload
//! shrunk. The drain's start is kept in `status.drain`, so an operator restart continues the clock
//! instead of restarting it. Scaling back up during a drain cancels it.
//!
//! Pure: the reconciler passes what it read and applies what comes out.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::api::Drain;

/// What the drain state machine reads.
#[derive(Clone, Debug)]
pub struct Input<'a> {
    /// `spec.size`.
    pub size: i32,
    /// Slots published before this reconcile (`status.servers`), if any. A drain starts when the size
    /// drops below it. Read from the instance's own status rather than from the workload's cached replicas,
    /// which can lag behind the operator's last apply and would start a drain that is already over.
    pub published_before: Option<i32>,
    /// `status.drain` as stored.
    pub previous: Option<&'a Drain>,
    pub now: &'a Time,
    /// `spec.scaling.drainSeconds`.
    pub drain_seconds: i32,
    /// Whether the drained pods can be removed now: on a Deployment, whether every drained pod carries
    /// the deletion cost (as the pod cache shows), so the ReplicaSet removes those and no other; and
    /// whether the scale handover's copies ended (see `handover::plan::scale`).
    pub removable: bool,
    /// The published entries before this reconcile, recorded in a drain that starts (`Drain::servers`)
    /// when a scale handover will need them; empty otherwise.
    pub published_list: &'a [String],
}

/// A change worth an event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Slots `to … from-1` left the published list.
    Draining { from: i32, to: i32 },
    /// The drained servers are being removed.
    Drained { from: i32, to: i32 },
    /// A scale-up ended the drain; every server stays.
    Cancelled { from: i32, to: i32, size: i32 },
}

/// What to apply.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    /// Replicas for the workload.
    pub replicas: i32,
    /// Slots to publish (`0 … published-1`).
    pub published: i32,
    /// `status.drain` from now on.
    pub drain: Option<Drain>,
    /// What changed, in order.
    pub steps: Vec<Step>,
    /// How long until the drain is due, while waiting for it.
    pub wait: Option<Duration>,
}

/// The plan for `input`.
pub fn plan(input: &Input<'_>) -> Plan {
    let size = input.size;
    let mut steps = Vec::new();
    let drain = match input.previous {
        None => match input.published_before {
            Some(live) if live > size => {
                steps.push(Step::Draining {
                    from: live,
                    to: size,
                });
                Drain {
                    from_size: live,
                    to_size: size,
                    started_at: input.now.clone(),
                    servers: input.published_list.to_vec(),
                }
            }
            _ => return settled(size, steps),
        },
        Some(d) if size >= d.from_size => {
            steps.push(Step::Cancelled {
                from: d.from_size,
                to: d.to_size,
                size,
            });
            return settled(size, steps);
        }
        // Partly scaled back up: the slots that come back are published again, and the ones still
        // leaving have been drained since the recorded start.
        Some(d) if size > d.to_size => {
            steps.push(Step::Draining {
                from: d.from_size,
                to: size,
            });
            Drain {
                to_size: size,
                ..d.clone()
            }
        }
        // Scaled down further: the newly drained slots need a whole drain of their own.
        Some(d) if size < d.to_size => {
            steps.push(Step::Draining {
                from: d.from_size,
                to: size,
            });
            Drain {
                from_size: d.from_size,
                to_size: size,
                started_at: input.now.clone(),
                servers: d.servers.clone(),
            }
        }
        Some(d) => d.clone(),
    };
    let elapsed = input.now.0.as_second() - drain.started_at.0.as_second();
    let remaining =
        (i64::from(input.drain_seconds) - elapsed).clamp(0, i64::from(input.drain_seconds));
    if remaining == 0 && input.removable {
        steps.push(Step::Drained {
            from: drain.from_size,
            to: drain.to_size,
        });
        return settled(drain.to_size, steps);
    }
    Plan {
        replicas: drain.from_size,
        published: drain.to_size,
        // Due but not yet removable: the pod watch brings the instance back when the marks show.
        wait: (remaining > 0).then(|| Duration::from_secs(remaining.unsigned_abs())),
        drain: Some(drain),
        steps,
    }
}

fn settled(size: i32, steps: Vec<Step>) -> Plan {
    Plan {
        replicas: size,
        published: size,
        drain: None,
        steps,
        wait: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::Timestamp;

    fn at(second: i64) -> Time {
        Time(Timestamp::from_second(1_700_000_000 + second).unwrap())
    }

    fn input<'a>(
        size: i32,
        live: Option<i32>,
        previous: Option<&'a Drain>,
        now: &'a Time,
    ) -> Input<'a> {
        Input {
            size,
            published_before: live,
            previous,
            now,
            drain_seconds: 30,
            removable: true,
            published_list: &[],
        }
    }

    fn drain(from: i32, to: i32, started: i64) -> Drain {
        Drain {
            from_size: from,
            to_size: to,
            started_at: at(started),
            servers: Vec::new(),
        }
    }

    #[test]
    fn no_scale_down_means_no_drain() {
        let now = at(0);
        for (size, live) in [(3, None), (3, Some(3)), (5, Some(3)), (0, Some(0))] {
            let plan = plan(&input(size, live, None, &now));
            assert_eq!(plan, settled(size, vec![]), "{size} {live:?}");
        }
    }

    #[test]
    fn scale_down_publishes_first_and_removes_after_the_drain() {
        let now = at(0);
        let start = plan(&input(2, Some(3), None, &now));
        assert_eq!(start.replicas, 3, "every pod keeps running");
        assert_eq!(start.published, 2, "slot 2 leaves the list at once");
        assert_eq!(start.drain, Some(drain(3, 2, 0)));
        assert_eq!(start.steps, [Step::Draining { from: 3, to: 2 }]);
        assert_eq!(start.wait, Some(Duration::from_secs(30)));

        let later = at(12);
        let waiting = plan(&input(2, Some(3), start.drain.as_ref(), &later));
        assert_eq!(
            (waiting.replicas, waiting.published, waiting.steps.len()),
            (3, 2, 0)
        );
        assert_eq!(waiting.drain, start.drain, "the record is not rewritten");
        assert_eq!(waiting.wait, Some(Duration::from_secs(18)));

        let due = at(30);
        let done = plan(&input(2, Some(3), start.drain.as_ref(), &due));
        assert_eq!(done, settled(2, vec![Step::Drained { from: 3, to: 2 }]));
    }

    #[test]
    fn an_operator_restart_mid_drain_keeps_the_clock() {
        // A new operator knows nothing but the status: the drain started 25 s ago.
        let record = drain(5, 3, -25);
        let now = at(0);
        let plan = plan(&input(3, Some(5), Some(&record), &now));
        assert_eq!(plan.drain, Some(record));
        assert_eq!(plan.wait, Some(Duration::from_secs(5)));
        assert!(plan.steps.is_empty(), "no second Draining event");
    }

    #[test]
    fn scaling_back_up_cancels_the_drain() {
        let record = drain(3, 2, 0);
        let now = at(10);
        let plan = plan(&input(3, Some(3), Some(&record), &now));
        assert_eq!(
            plan,
            settled(
                3,
                vec![Step::Cancelled {
                    from: 3,
                    to: 2,
                    size: 3
                }]
            )
        );
        let above = super::plan(&input(4, Some(3), Some(&record), &now));
        assert_eq!((above.replicas, above.published, above.drain), (4, 4, None));
    }

    #[test]
    fn a_partial_scale_up_keeps_the_start_and_a_further_scale_down_restarts_it() {
        let record = drain(5, 2, 0);
        let now = at(10);
        let partial = plan(&input(3, Some(5), Some(&record), &now));
        assert_eq!(partial.drain, Some(drain(5, 3, 0)));
        assert_eq!(
            (partial.replicas, partial.published),
            (5, 3),
            "slot 2 is published again"
        );
        let further = plan(&input(1, Some(5), Some(&record), &now));
        assert_eq!(further.drain, Some(drain(5, 1, 10)));
        assert_eq!(further.wait, Some(Duration::from_secs(30)));
        assert_eq!(further.steps, [Step::Draining { from: 5, to: 1 }]);
    }

    #[test]
    fn zero_seconds_removes_at_once_but_only_when_removable() {
        let now = at(0);
        let mut zero = input(1, Some(3), None, &now);
        zero.drain_seconds = 0;
        assert_eq!(
            plan(&zero),
            settled(
                1,
                vec![
                    Step::Draining { from: 3, to: 1 },
                    Step::Drained { from: 3, to: 1 }
                ]
            )
        );
        zero.removable = false;
        let held = plan(&zero);
        assert_eq!((held.replicas, held.published, held.wait), (3, 1, None));
        assert_eq!(held.drain, Some(drain(3, 1, 0)));
    }

    #[test]
    fn a_start_in_the_future_waits_no_longer_than_the_drain() {
        let record = drain(3, 2, 600);
        let now = at(0);
        let plan = plan(&input(2, Some(3), Some(&record), &now));
        assert_eq!(plan.wait, Some(Duration::from_secs(30)));
    }
}
