//! The fleet rollout: the operator's own changes of the pod template (a new version's builders, a changed
//! default, the digest key; see [`crate::resources::fleet`]) roll at most `--fleet-rollout-budget`
//! instances at a time, in (namespace, name) order, while an instance owner's change rolls at once.
//!
//! An instance whose template the operator changed keeps the template it runs and waits (`pending`)
//! until a slot is free and no instance before it waits; an instance holds a slot while its workload
//! rolls, whatever caused the rollout, so owners' rollouts take from the budget first and are never held.
//! A slot frees when the rollout's reconcile finds the workload settled, and the next instances in order
//! are made due at once. Nothing of this is kept outside the cluster: after a restart or a leader change
//! the rolling workloads are found rolling again (their status), the rolled ones record the cause of the
//! template they run (so none rolls twice), and the rest wait again. No turn is given before every
//! instance has been reconciled once since the start ([`Fleet::saw`]), so the slots count every rollout
//! under way and the order is the whole fleet's.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use futures::Stream;
use kube::runtime::reflector::ObjectRef;
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;

use crate::api::Memcached;
use crate::metrics::Metrics;
use crate::resources::fleet::Budget;
use crate::status::FleetWait;

type Key = (String, String);

/// What one reconcile found of its instance's workload.
#[derive(Clone, Copy, Debug)]
pub struct Found<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    /// Its workload rolls now (whatever caused it).
    pub rolling: bool,
    /// The operator changed its pod template, and the instance does not roll yet.
    pub wants: bool,
    /// Instances the operator manages, for a budget in percent.
    pub instances: usize,
}

/// The fleet's answer to a [`Found`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Turn {
    /// Apply the template as built; `started`: the instance's turn starts now (send its event).
    Go { started: bool },
    /// Keep the live template: the instance waits.
    Wait(FleetWait),
}

#[derive(Default)]
struct State {
    /// Instances reconciled since the start, until all have been (then emptied).
    seen: HashSet<Key>,
    /// Waiting for a turn, in order.
    pending: BTreeSet<Key>,
    /// Holding a slot: given a turn, or found rolling.
    rolling: BTreeSet<Key>,
    /// Given a turn by the fleet and not found settled since.
    granted: HashSet<Key>,
    /// The place last reported per waiting instance (see [`State::reported`]).
    reported: HashMap<Key, usize>,
}

/// The fleet's slots and queue (see the module doc).
pub struct Fleet {
    budget: Budget,
    metrics: Arc<Metrics>,
    /// Every instance has been reconciled once since the start.
    all_seen: AtomicBool,
    /// The instances managed, as the last reconcile counted them.
    instances: AtomicUsize,
    state: Mutex<State>,
    due: mpsc::UnboundedSender<ObjectRef<Memcached>>,
    due_stream: Mutex<Option<mpsc::UnboundedReceiver<ObjectRef<Memcached>>>>,
}

impl Fleet {
    pub fn new(budget: Budget, metrics: Arc<Metrics>) -> Self {
        let (due, due_stream) = mpsc::unbounded_channel();
        Self {
            budget,
            metrics,
            all_seen: AtomicBool::new(false),
            instances: AtomicUsize::new(0),
            state: Mutex::default(),
            due,
            due_stream: Mutex::new(Some(due_stream)),
        }
    }

    /// Counts instance `namespace/name` as reconciled since the start (every reconcile, whatever its
    /// outcome: an instance held by a bad spec must not hold the fleet); with `instances` managed.
    pub fn saw(&self, namespace: &str, name: &str, instances: usize) {
        self.instances.store(instances, Ordering::Relaxed);
        if self.all_seen.load(Ordering::Relaxed) {
            return;
        }
        let mut state = self.lock();
        state.seen.insert((namespace.to_owned(), name.to_owned()));
        if state.seen.len() >= instances {
            state.seen = HashSet::new();
            self.all_seen.store(true, Ordering::Relaxed);
            self.wake(&state, instances);
        }
    }

    /// The turn of the instance `found` describes.
    pub fn turn(&self, found: Found<'_>) -> Turn {
        let mut state = self.lock();
        if !found.rolling && !found.wants && state.is_empty() {
            return Turn::Go { started: false };
        }
        let key = (found.namespace.to_owned(), found.name.to_owned());
        let slots = self.budget.slots(found.instances);
        let turn = if found.rolling || (found.wants && state.granted.contains(&key)) {
            state.leave_queue(&key);
            state.rolling.insert(key);
            Turn::Go { started: false }
        } else if found.wants {
            state.pending.insert(key.clone());
            let place = state.pending.range(..&key).count() + 1;
            let free = slots.saturating_sub(state.rolling.len());
            if self.all_seen.load(Ordering::Relaxed) && place <= free {
                state.leave_queue(&key);
                state.rolling.insert(key.clone());
                state.granted.insert(key);
                Turn::Go { started: true }
            } else {
                let place = state.reported(key, place, slots);
                Turn::Wait(FleetWait { place, slots })
            }
        } else {
            state.leave_queue(&key);
            let freed = state.rolling.remove(&key);
            if state.granted.remove(&key) {
                self.metrics.fleet_rollout_completed();
            }
            if freed {
                self.wake(&state, found.instances);
            }
            Turn::Go { started: false }
        };
        self.metrics
            .set_fleet_rollout(state.pending.len(), state.rolling.len());
        turn
    }

    /// Takes instance `namespace/name` out of the queue: its reconcile stopped before its workload (a
    /// spec or Secret to fix), so it must not keep the instances after it waiting. It queues again,
    /// at its place in order, once it can be applied.
    pub fn set_aside(&self, namespace: &str, name: &str) {
        let mut state = self.lock();
        if state.pending.is_empty() {
            return;
        }
        let key = (namespace.to_owned(), name.to_owned());
        if state.pending.contains(&key) {
            state.leave_queue(&key);
            self.wake(&state, self.instances.load(Ordering::Relaxed));
            self.metrics
                .set_fleet_rollout(state.pending.len(), state.rolling.len());
        }
    }

    /// Drops instance `namespace/name`, which is gone; its slot goes to the next in order.
    pub fn forget(&self, namespace: &str, name: &str) {
        let instances = self.instances.load(Ordering::Relaxed);
        let mut state = self.lock();
        if state.is_empty() {
            return;
        }
        let key = (namespace.to_owned(), name.to_owned());
        state.leave_queue(&key);
        state.granted.remove(&key);
        if state.rolling.remove(&key) {
            self.wake(&state, instances);
        }
        self.metrics
            .set_fleet_rollout(state.pending.len(), state.rolling.len());
    }

    /// The instances whose turn may have come: a stream for the controller; taken once.
    pub fn due(&self) -> impl Stream<Item = ObjectRef<Memcached>> + Send + 'static + use<> {
        let receiver = self
            .due_stream
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        let receiver = receiver.unwrap_or_else(|| mpsc::unbounded_channel().1);
        UnboundedReceiverStream::new(receiver)
    }

    /// Makes the first waiting instances due, as many as there are free slots.
    fn wake(&self, state: &State, instances: usize) {
        if !self.all_seen.load(Ordering::Relaxed) {
            return;
        }
        let free = self
            .budget
            .slots(instances)
            .saturating_sub(state.rolling.len());
        for (namespace, name) in state.pending.iter().take(free) {
            let _ = self.due.send(ObjectRef::new(name).within(namespace));
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl State {
    fn is_empty(&self) -> bool {
        self.pending.is_empty() && self.rolling.is_empty() && self.granted.is_empty()
    }

    fn leave_queue(&mut self, key: &Key) {
        self.pending.remove(key);
        self.reported.remove(key);
    }

    /// The place to report for `key`, at `place` now: the one last reported until the place has halved
    /// (or grown, or is within two rounds of slots), so that the queue moving writes each waiting
    /// instance's status a few times (about log2 of its place), not once per instance ahead of it.
    fn reported(&mut self, key: Key, place: usize, slots: usize) -> usize {
        let last = self.reported.entry(key).or_insert(place);
        if place <= *last / 2 || place > *last || place <= 2 * slots {
            *last = place;
        }
        *last
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fleet(budget: &str) -> Fleet {
        Fleet::new(budget.parse().expect("budget"), Arc::default())
    }

    fn found(name: &str, rolling: bool, wants: bool) -> Found<'_> {
        Found {
            namespace: "ns",
            name,
            rolling,
            wants,
            instances: 10,
        }
    }

    const GO: Turn = Turn::Go { started: false };
    const STARTED: Turn = Turn::Go { started: true };

    fn waits(place: usize, slots: usize) -> Turn {
        Turn::Wait(FleetWait { place, slots })
    }

    fn seen_all(fleet: &Fleet, names: &[&str]) {
        for name in names {
            fleet.saw("ns", name, names.len());
        }
    }

    #[test]
    fn no_turn_before_every_instance_was_seen_then_in_order_within_the_budget() {
        let names = ["a", "b", "c", "d", "e", "f", "g", "h", "i", "j"];
        let fleet = fleet("2");
        let mut due = Box::pin(fleet.due());
        let mut next = || {
            use futures::StreamExt;
            let due: Option<ObjectRef<Memcached>> = futures::executor::block_on(due.next());
            due.expect("due").name
        };
        fleet.saw("ns", "c", 10);
        assert_eq!(fleet.turn(found("c", false, true)), waits(1, 2));
        fleet.saw("ns", "b", 10);
        assert_eq!(fleet.turn(found("b", false, true)), waits(1, 2));
        seen_all(&fleet, &names);
        // Every instance seen: the first two in order are made due.
        assert_eq!(next(), "b");
        assert_eq!(next(), "c");
        // An owner's rollout of `a` takes a slot first.
        assert_eq!(fleet.turn(found("a", true, false)), GO);
        assert_eq!(fleet.turn(found("b", false, true)), STARTED);
        assert_eq!(fleet.turn(found("c", false, true)), waits(1, 2));
        assert_eq!(fleet.turn(found("d", false, true)), waits(2, 2));
        // `b` applied its template and rolls; its apply retried keeps its turn.
        assert_eq!(fleet.turn(found("b", false, true)), GO);
        assert_eq!(fleet.turn(found("b", true, false)), GO);
        // `a` settles: `c` is due and starts.
        assert_eq!(fleet.turn(found("a", false, false)), GO);
        assert_eq!(next(), "c");
        assert_eq!(fleet.turn(found("c", false, true)), STARTED);
        assert_eq!(fleet.turn(found("d", false, true)), waits(1, 2));
        // `d`'s owner changes its spec: it rolls at once, out of the queue.
        assert_eq!(fleet.turn(found("d", true, false)), GO);
        assert_eq!(fleet.turn(found("e", false, true)), waits(1, 2));
        // `b` deleted: its slot is free, but `c` and `d` hold both.
        fleet.forget("ns", "b");
        assert_eq!(fleet.turn(found("e", false, true)), waits(1, 2));
        assert_eq!(fleet.turn(found("f", false, true)), waits(2, 2));
        // `c` and `d` settle; `e` is held by its spec: `f` is not kept waiting behind it.
        assert_eq!(fleet.turn(found("c", false, false)), GO);
        assert_eq!(fleet.turn(found("d", false, false)), GO);
        fleet.set_aside("ns", "e");
        assert_eq!(fleet.turn(found("f", false, true)), STARTED);
    }

    #[test]
    fn an_instance_rolled_by_its_turn_is_counted_once_settled() {
        let metrics = Arc::new(Metrics::default());
        let fleet = Fleet::new(Budget::Instances(1), metrics.clone());
        seen_all(&fleet, &["a"]);
        assert_eq!(fleet.turn(found("a", false, true)), STARTED);
        assert!(
            metrics
                .encode()
                .contains("fleet_rollout_instances{state=\"rolling\"} 1")
        );
        assert_eq!(fleet.turn(found("a", true, false)), GO);
        assert_eq!(fleet.turn(found("a", false, false)), GO);
        let encoded = metrics.encode();
        assert!(
            encoded.contains("fleet_rollout_completed_total 1"),
            "{encoded}"
        );
        assert!(encoded.contains("fleet_rollout_instances{state=\"rolling\"} 0"));
    }

    #[test]
    fn a_waiting_place_is_rewritten_when_it_halved() {
        let mut state = State::default();
        let key = ("ns".to_owned(), "x".to_owned());
        let places: Vec<usize> = [100, 90, 60, 50, 40, 26, 25, 12, 5, 4, 3]
            .into_iter()
            .map(|place| state.reported(key.clone(), place, 2))
            .collect();
        assert_eq!(places, [100, 100, 100, 50, 50, 50, 25, 12, 5, 4, 3]);
    }
}
