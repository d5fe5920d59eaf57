//! Whose turn it is to reconcile: at most `--concurrency` reconciles apply at once, started in the order
//! they became due, and a new instance's first status is written while it waits for its turn.
//!
//! kube's controller can bound concurrency itself, but once its slots are full it keeps the due objects in
//! a set and starts each freed slot's next one in no particular order. Measured on a real v1.28.7 API
//! server with 300 instances created within 1.3 s and 64 slots (2026-11-26): a new instance waited a median
//! 4.6 s and at most 12.3 s for its workload, and its first status came after the whole reconcile (median
//! 5.9 s, at most 12.8 s). So the controller runs unbounded, and turns are taken here on a fair semaphore
//! (tokio's: first come, first served), whose permits are the concurrency. A reconcile that finds no turn
//! free does not wait in the controller: it ends, and a small task waits for the turn and makes the
//! instance due again with the turn reserved for it (see [`Turns::enqueue`] for why and the measurement).
//! The reconcile's own state (about 45 KB with the objects it builds and compares) is allocated when its
//! turn comes.
//!
//! The task that waits writes its new instance's first status meanwhile, with a permit of its own
//! from a second semaphore of the same size: it is one small write, and it must not wait behind the
//! reconciles of other instances, or `kubectl get memcached` would show nothing for as long as the queue
//! is long. A reconcile that finds a turn free writes the first status itself, after the workload (the
//! workload comes sooner that way).
//!
//! A new instance's turn ends with its workload while other new instances wait for theirs: its Services and
//! the rest come in a second turn, which waits until no new instance has waited for [`QUIET`] (see
//! [`Turns::second`]). Services are the slow writes (each allocates a ClusterIP); applied in the same turn,
//! they held the turns so long that, measured on a real v1.28.7 API server with 300 instances created
//! within 1.2-1.8 s (2026-11-26), the last workloads came 12.5-12.9 s after their instances (median
//! 6.0-7.6 s), where the control plane alone allows 0.6-0.9 s (`make bench ARGS="--real --floor"`: a
//! stand-in writing only each Deployment and first status).
//!
//! At the start of a burst nobody waits yet: the first `--concurrency` new instances take their turns at
//! once, and would each write their Services before their first status. They find each other instead
//! ([`Turns::first_pass`], [`Turns::other_new_instances`]) and write their first status right after their
//! workload, then go on with the Services in the same turn. Measured the same way: without that, those
//! first instances' statuses came last, up to 3.8-4.5 s after their instances (their Services took 2-3 s
//! under the burst); with it, every first status was written within 1.1-1.9 s. On a second machine, whose
//! control plane is faster: within 0.7-1.4 s in six runs, against 1.8-2.1 s without it in three.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures::{Stream, StreamExt};
use kube::runtime::reflector::ObjectRef;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, SemaphorePermit, mpsc};
use tokio::time::Instant;
use tokio_stream::wrappers::UnboundedReceiverStream;

use super::changes::Changes;
use crate::api::Memcached;

/// How long no new instance must have waited for its first turn before second turns are taken: longer
/// than the gaps between the starts of a burst's reconciles (the watch that brings new instances is closed
/// by the API server and reopened now and then during a burst; measured gaps up to 0.7 s).
pub const QUIET: Duration = Duration::from_secs(2);

/// The longest a second turn waits for new instances: so that a long stream of them does not hold the
/// Services (and so the `Available`) of the earlier ones back for its whole length.
pub const SECOND_TURN_HOLD: Duration = Duration::from_secs(10);

/// How long a turn reserved for an instance ([`Turns::reserve`]) waits for the instance's reconcile to
/// claim it before it is given back: the reconcile is due at once, so only an instance deleted in
/// between, or a trigger lost in a shutdown, leaves one unclaimed.
pub const CLAIM_WITHIN: Duration = Duration::from_secs(10);

/// (namespace, name) of an instance.
type Key = (String, String);

/// A turn taken for an instance while no reconcile of it ran, for its next reconcile to claim.
pub struct Reserved {
    pub turn: OwnedSemaphorePermit,
    /// For a second turn: what the first pass changed (published with what the second changes).
    pub second: Option<Changes>,
}

/// The instances waiting for a turn outside kube's controller, and the turns reserved for them.
#[derive(Default)]
struct Queue {
    waiting: HashSet<Key>,
    reserved: HashMap<Key, (u64, Reserved)>,
}

/// The permits of the reconciles that apply, and of first statuses; the new instances waiting for a turn.
pub struct Turns {
    apply: Arc<Semaphore>,
    first_status: Semaphore,
    /// New instances (no workload yet) waiting for a turn.
    new_waiting: AtomicUsize,
    /// New instances in their first turn.
    new_applying: AtomicUsize,
    /// When the last of them stopped waiting (got its turn, or went).
    new_waited: Mutex<Option<Instant>>,
    /// Told when `new_waiting` falls to 0.
    no_new_waiting: Notify,
    queue: Mutex<Queue>,
    reservations: AtomicU64,
    /// The instances whose reserved turn is due: a stream for the controller.
    due: mpsc::UnboundedSender<ObjectRef<Memcached>>,
    due_stream: Mutex<Option<mpsc::UnboundedReceiver<ObjectRef<Memcached>>>>,
}

impl std::fmt::Debug for Turns {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Turns")
            .field("free", &self.apply.available_permits())
            .field("new_waiting", &self.new_waiting.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl Turns {
    /// At most `concurrency` reconciles apply at once (at least one), and at most as many first statuses
    /// are written at once.
    pub fn new(concurrency: u16) -> Self {
        let permits = usize::from(concurrency.max(1));
        let (due, due_stream) = mpsc::unbounded_channel();
        Self {
            apply: Arc::new(Semaphore::new(permits)),
            first_status: Semaphore::new(permits),
            new_waiting: AtomicUsize::new(0),
            new_applying: AtomicUsize::new(0),
            new_waited: Mutex::new(None),
            no_new_waiting: Notify::new(),
            queue: Mutex::default(),
            reservations: AtomicU64::new(0),
            due,
            due_stream: Mutex::new(Some(due_stream)),
        }
    }

    /// A reconcile's turn, when one is free and nobody waits for one.
    pub fn try_apply(&self) -> Option<OwnedSemaphorePermit> {
        self.apply.clone().try_acquire_owned().ok()
    }

    /// Waits for a reconcile's turn, behind every reconcile that started waiting earlier.
    pub async fn apply(&self) -> OwnedSemaphorePermit {
        // Never closed: the semaphore lives as long as the context that owns it.
        self.apply
            .clone()
            .acquire_owned()
            .await
            .unwrap_or_else(|_| unreachable!("the semaphore is never closed"))
    }

    /// Waits for a new instance's turn (see [`Turns::apply`]), counted among the new instances waiting
    /// while it waits.
    pub async fn apply_new(&self) -> OwnedSemaphorePermit {
        self.new_waiting.fetch_add(1, Ordering::SeqCst);
        // Counted down however the wait ends, a reconcile dropped while it waits included.
        let _waiting = NewWaiting(self);
        self.apply().await
    }

    /// Whether a new instance waits for its turn: a new instance that has its workload then gives its turn
    /// up for them.
    pub fn new_waiting(&self) -> bool {
        self.new_waiting.load(Ordering::SeqCst) > 0
    }

    /// Counts a new instance's first turn among the new instances', for as long as the guard lives.
    pub fn first_pass(&self) -> FirstPass<'_> {
        self.new_applying.fetch_add(1, Ordering::SeqCst);
        FirstPass(self)
    }

    /// Whether, besides the caller (in its [`Turns::first_pass`]), a new instance waits for its turn or
    /// takes its first: a burst, in which a new instance writes its first status right after its workload.
    /// At the start of a burst nobody waits yet, and the first `--concurrency` instances find each other
    /// here.
    pub fn other_new_instances(&self) -> bool {
        self.new_waiting() || self.new_applying.load(Ordering::SeqCst) > 1
    }

    /// Waits for the second turn of a new instance that gave its first up: once no new instance has waited
    /// for [`QUIET`] (or after [`SECOND_TURN_HOLD`]), behind every reconcile waiting then.
    pub async fn second(&self) -> OwnedSemaphorePermit {
        let quiet = async {
            loop {
                // Created before the count is read, so that a fall to 0 in between still wakes it.
                let notified = self.no_new_waiting.notified();
                if self.new_waiting() {
                    notified.await;
                    continue;
                }
                let waited = *self.new_waited.lock().unwrap_or_else(|e| e.into_inner());
                match waited.map(|at| at + QUIET) {
                    Some(until) if until > Instant::now() => tokio::time::sleep_until(until).await,
                    _ => break,
                }
            }
        };
        // Either way it queues next.
        let _ = tokio::time::timeout(SECOND_TURN_HOLD, quiet).await;
        self.apply().await
    }

    /// Waits for a slot to write a first status in.
    pub async fn first_status(&self) -> SemaphorePermit<'_> {
        self.first_status
            .acquire()
            .await
            .unwrap_or_else(|_| unreachable!("the semaphore is never closed"))
    }
}

/// Turns waited for outside kube's controller. A reconcile that has to wait for its turn does not wait in
/// its slot of the controller: it hands the wait to a task of its own ([`Turns::enqueue`]) and ends; the
/// task takes the turn in order, reserves it for the instance ([`Turns::reserve`]) and makes it due
/// ([`Turns::due`]); the reconcile that follows claims it ([`Turns::claim`]).
///
/// Waiting in the slots, a burst of 3 000 new instances kept 3 000 reconciles in kube's runner, which on
/// every wake polls each running reconcile (`FutureHashMap`) and looks through every object held back
/// because its reconcile runs (`Scheduler::pending`): work proportional to the instances for every
/// event. A profile of the release build converging 3 000 instances on a real v1.28.4 API server
/// (`perf record`, 2026-11-28) put 57 % of the operator's CPU there (38 % the held-back scan, 18 % the
/// polls), and its CPU per instance grew 2.5x from 300 to 3 000 instances. A waiting task costs tokio
/// nothing until its turn comes.
impl Turns {
    /// Counts `instance` as waiting for a turn outside the controller; `false` when it already waits or
    /// has a turn reserved (its waiter or its claim will reconcile it).
    pub fn enqueue(&self, instance: &ObjectRef<Memcached>) -> bool {
        let key = key(instance);
        let mut queue = self.lock_queue();
        !queue.reserved.contains_key(&key) && queue.waiting.insert(key)
    }

    /// Whether a task waits for `instance`'s turn: its reconciles meanwhile leave the instance to it (a
    /// second turn waits for quiet before it queues, so a turn may be free while it waits).
    pub fn waits(&self, instance: &ObjectRef<Memcached>) -> bool {
        self.lock_queue().waiting.contains(&key(instance))
    }

    /// Reserves `reserved` for `instance`, which waited for it, and makes the instance due; returns the
    /// reservation's number for [`Turns::expire`].
    pub fn reserve(&self, instance: &ObjectRef<Memcached>, reserved: Reserved) -> u64 {
        let id = self.reservations.fetch_add(1, Ordering::Relaxed);
        let key = key(instance);
        {
            let mut queue = self.lock_queue();
            queue.waiting.remove(&key);
            queue.reserved.insert(key, (id, reserved));
        }
        // Closed only when the controller is gone: the reservation then expires.
        let _ = self.due.send(instance.clone());
        id
    }

    /// The turn reserved for `instance`, taken.
    pub fn claim(&self, instance: &ObjectRef<Memcached>) -> Option<Reserved> {
        let key = key(instance);
        self.lock_queue().reserved.remove(&key).map(|(_, r)| r)
    }

    /// Stops counting `instance` as waiting (it went while it waited).
    pub fn abandon(&self, instance: &ObjectRef<Memcached>) {
        let key = key(instance);
        self.lock_queue().waiting.remove(&key);
    }

    /// Gives back reservation `id` of `instance` if it is still unclaimed; whether it was.
    pub fn expire(&self, instance: &ObjectRef<Memcached>, id: u64) -> bool {
        let key = key(instance);
        let mut queue = self.lock_queue();
        match queue.reserved.get(&key) {
            Some((reserved, _)) if *reserved == id => queue.reserved.remove(&key).is_some(),
            _ => false,
        }
    }

    /// Instances waiting outside the controller, and turns reserved and not yet claimed.
    pub fn queued(&self) -> (usize, usize) {
        let queue = self.lock_queue();
        (queue.waiting.len(), queue.reserved.len())
    }

    /// The instances whose reserved turn is due, for the controller to reconcile; taken once.
    pub fn due(&self) -> impl Stream<Item = ObjectRef<Memcached>> + Send + 'static + use<> {
        let receiver = self
            .due_stream
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        futures::stream::iter(receiver).flat_map(UnboundedReceiverStream::new)
    }

    fn lock_queue(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn key(instance: &ObjectRef<Memcached>) -> Key {
    (
        instance.namespace.clone().unwrap_or_default(),
        instance.name.clone(),
    )
}

/// A new instance in its first turn, for as long as this lives.
pub struct FirstPass<'a>(&'a Turns);

impl Drop for FirstPass<'_> {
    fn drop(&mut self) {
        self.0.new_applying.fetch_sub(1, Ordering::SeqCst);
    }
}

/// One new instance waiting for its turn, for as long as this lives.
struct NewWaiting<'a>(&'a Turns);

impl Drop for NewWaiting<'_> {
    fn drop(&mut self) {
        *self.0.new_waited.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
        if self.0.new_waiting.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.no_new_waiting.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;

    /// The property kube's own bound lacks: a freed turn goes to whoever waited longest.
    #[tokio::test]
    async fn turns_go_in_the_order_they_were_asked_for() {
        let turns = Arc::new(Turns::new(1));
        let first = turns.apply().await;
        let (order_tx, mut order) = tokio::sync::mpsc::unbounded_channel();
        let mut waiting = Vec::new();
        for i in 0..20 {
            let (turns, order_tx) = (turns.clone(), order_tx.clone());
            waiting.push(tokio::spawn(async move {
                let _turn = turns.apply().await;
                order_tx.send(i).unwrap();
            }));
            // Each has asked before the next is spawned.
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        drop(first);
        for task in waiting {
            task.await.unwrap();
        }
        drop(order_tx);
        let mut seen = Vec::new();
        while let Some(i) = order.recv().await {
            seen.push(i);
        }
        assert_eq!(seen, (0..20).collect::<Vec<_>>());
    }

    #[tokio::test]
    async fn a_new_instance_in_its_first_turn_sees_the_others_waiting_or_in_theirs() {
        let turns = Arc::new(Turns::new(2));
        let mine = turns.first_pass();
        assert!(!turns.other_new_instances(), "alone");
        let other = turns.first_pass();
        assert!(turns.other_new_instances(), "another in its first turn");
        drop(other);
        assert!(!turns.other_new_instances());
        let _held = (turns.apply().await, turns.apply().await);
        let waiting = tokio::spawn({
            let turns = turns.clone();
            async move { drop(turns.apply_new().await) }
        });
        while !turns.new_waiting() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert!(turns.other_new_instances(), "another waiting for its turn");
        waiting.abort();
        let _ = waiting.await;
        assert!(!turns.other_new_instances());
        drop(mine);
    }

    #[tokio::test]
    async fn first_statuses_do_not_wait_for_reconciles() {
        let turns = Turns::new(2);
        let _a = turns.apply().await;
        let _b = turns.apply().await;
        assert_eq!(turns.apply.available_permits(), 0);
        let _slot = tokio::time::timeout(Duration::from_secs(1), turns.first_status())
            .await
            .expect("a first status waits only for other first statuses");
    }

    /// What the turns of `tasks` went in: each task sends its name once it has its turn.
    async fn order(
        tasks: Vec<tokio::task::JoinHandle<()>>,
        order_tx: tokio::sync::mpsc::UnboundedSender<&'static str>,
        mut order: tokio::sync::mpsc::UnboundedReceiver<&'static str>,
    ) -> Vec<&'static str> {
        for task in tasks {
            task.await.unwrap();
        }
        drop(order_tx);
        let mut seen = Vec::new();
        while let Some(what) = order.recv().await {
            seen.push(what);
        }
        seen
    }

    /// Spawns a task that takes a new instance's turn (or with `second`, a second turn) and says `what`.
    fn take(
        turns: &Arc<Turns>,
        order_tx: &tokio::sync::mpsc::UnboundedSender<&'static str>,
        what: &'static str,
        second: bool,
    ) -> tokio::task::JoinHandle<()> {
        let (turns, order_tx) = (turns.clone(), order_tx.clone());
        tokio::spawn(async move {
            let _turn = if second {
                turns.second().await
            } else {
                turns.apply_new().await
            };
            order_tx.send(what).unwrap();
            tokio::time::sleep(Duration::from_millis(5)).await;
        })
    }

    /// A second turn waits until no new instance waits for its turn, then queues as anyone does.
    #[tokio::test(start_paused = true)]
    async fn second_turns_go_after_every_new_instances_turn() {
        let turns = Arc::new(Turns::new(1));
        let held = turns.apply().await;
        let (order_tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let mut tasks = vec![take(&turns, &order_tx, "new 1", false)];
        tokio::time::sleep(Duration::from_millis(2)).await;
        assert!(turns.new_waiting());
        tasks.push(take(&turns, &order_tx, "second", true));
        tokio::time::sleep(Duration::from_millis(2)).await;
        // Asked after the second turn, but a new instance's all the same.
        tasks.push(take(&turns, &order_tx, "new 2", false));
        tokio::time::sleep(Duration::from_millis(2)).await;
        drop(held);
        assert_eq!(
            order(tasks, order_tx, rx).await,
            ["new 1", "new 2", "second"]
        );
        assert!(!turns.new_waiting());
    }

    /// A new instance that asks within the quiet time after the last one got its turn still goes first.
    #[tokio::test(start_paused = true)]
    async fn a_new_instance_within_the_quiet_time_goes_before_second_turns() {
        let turns = Arc::new(Turns::new(1));
        let held = turns.apply().await;
        let (order_tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let mut tasks = vec![take(&turns, &order_tx, "new 1", false)];
        tokio::time::sleep(Duration::from_millis(2)).await;
        tasks.push(take(&turns, &order_tx, "second", true));
        drop(held);
        // "new 1" has its turn and none waits; the next new instance comes within the quiet time.
        tokio::time::sleep(QUIET / 2).await;
        tasks.push(take(&turns, &order_tx, "new 2", false));
        assert_eq!(
            order(tasks, order_tx, rx).await,
            ["new 1", "new 2", "second"]
        );
    }

    /// Past the hold, a second turn queues with everyone: ahead of new instances that ask later.
    #[tokio::test(start_paused = true)]
    async fn a_second_turn_waits_for_new_instances_at_most_the_hold() {
        let turns = Arc::new(Turns::new(1));
        let held = turns.apply().await;
        let (order_tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let mut tasks = vec![take(&turns, &order_tx, "new, before", false)];
        tokio::time::sleep(Duration::from_millis(1)).await;
        tasks.push(take(&turns, &order_tx, "second", true));
        tokio::time::sleep(SECOND_TURN_HOLD + Duration::from_secs(5)).await;
        tasks.push(take(&turns, &order_tx, "new, after the hold", false));
        tokio::time::sleep(Duration::from_secs(5)).await;
        drop(held);
        assert_eq!(
            order(tasks, order_tx, rx).await,
            ["new, before", "second", "new, after the hold"]
        );
    }

    fn instance(name: &str) -> ObjectRef<Memcached> {
        ObjectRef::new(name).within("ns")
    }

    /// Reconciles that find no turn free leave the wait to tasks: each instance once, made due in the
    /// order they asked, its turn held for it until claimed.
    #[tokio::test]
    async fn waiting_instances_come_due_in_order_with_their_turn_reserved() {
        use futures::StreamExt as _;
        let turns = Arc::new(Turns::new(1));
        let mut due = Box::pin(turns.due());
        let held = turns.apply().await;
        let names = ["a", "b", "c", "d"];
        for name in names {
            assert!(turns.enqueue(&instance(name)), "{name} waits");
            assert!(!turns.enqueue(&instance(name)), "{name} waits once");
            let turns = turns.clone();
            tokio::spawn(async move {
                let turn = turns.apply().await;
                turns.reserve(&instance(name), Reserved { turn, second: None });
            });
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        assert_eq!(turns.queued(), (4, 0));
        drop(held);
        for name in names {
            let next = due.next().await.expect("due");
            assert_eq!(next.name, name);
            assert!(
                !turns.enqueue(&instance(name)),
                "reserved: not queued again"
            );
            assert!(turns.try_apply().is_none(), "the turn is held for {name}");
            let claimed = turns.claim(&instance(name)).expect("reserved for it");
            assert!(turns.claim(&instance(name)).is_none(), "claimed once");
            drop(claimed);
        }
        assert_eq!(turns.queued(), (0, 0));
    }

    /// A turn nobody claims is given back, and only the reservation it was: a later one stays.
    #[tokio::test]
    async fn an_unclaimed_turn_is_given_back() {
        let turns = Turns::new(1);
        let turn = turns.apply().await;
        let first = turns.reserve(&instance("a"), Reserved { turn, second: None });
        assert!(turns.try_apply().is_none());
        assert!(turns.expire(&instance("a"), first));
        let turn = turns.try_apply().expect("given back");
        let second = turns.reserve(&instance("a"), Reserved { turn, second: None });
        assert!(
            !turns.expire(&instance("a"), first),
            "not the reservation it was"
        );
        assert!(turns.claim(&instance("a")).is_some());
        assert!(!turns.expire(&instance("a"), second), "claimed already");
    }

    #[tokio::test]
    async fn a_new_instance_that_stops_waiting_is_no_longer_counted() {
        let turns = Turns::new(1);
        let _held = turns.apply().await;
        let waiting = tokio::time::timeout(Duration::from_millis(20), turns.apply_new()).await;
        assert!(waiting.is_err(), "no turn is free");
        assert!(!turns.new_waiting());
    }
}
