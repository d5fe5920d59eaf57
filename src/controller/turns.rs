//! Whose turn it is to reconcile: at most `--concurrency` reconciles apply at once, started in the order
//! they became due, and a new instance's first status is written while it waits for its turn.
//!
//! kube's controller can bound concurrency itself, but once its slots are full it keeps the due objects in
//! a set and starts each freed slot's next one in no particular order. Measured on a real v1.28.7 API
//! server with 300 instances created within 1.3 s and 64 slots (2026-11-26): a new instance waited a median
//! 4.6 s and at most 12.3 s for its workload, and its first status came after the whole reconcile (median
//! 5.9 s, at most 12.8 s). So the controller runs unbounded, and each reconcile waits here on a fair
//! semaphore (tokio's: first come, first served), whose permits are the concurrency. A waiting reconcile is
//! a small future: the reconcile's own state (about 45 KB with the objects it builds and compares) is
//! allocated when its turn comes.
//!
//! A reconcile that has to wait writes its new instance's first status meanwhile, with a permit of its own
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

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::{Notify, Semaphore, SemaphorePermit};
use tokio::time::Instant;

/// How long no new instance must have waited for its first turn before second turns are taken: longer
/// than the gaps between the starts of a burst's reconciles (the watch that brings new instances is closed
/// by the API server and reopened now and then during a burst; measured gaps up to 0.7 s).
pub const QUIET: Duration = Duration::from_secs(2);

/// The longest a second turn waits for new instances: so that a long stream of them does not hold the
/// Services (and so the `Available`) of the earlier ones back for its whole length.
pub const SECOND_TURN_HOLD: Duration = Duration::from_secs(10);

/// The permits of the reconciles that apply, and of first statuses; the new instances waiting for a turn.
#[derive(Debug)]
pub struct Turns {
    apply: Semaphore,
    first_status: Semaphore,
    /// New instances (no workload yet) waiting for a turn.
    new_waiting: AtomicUsize,
    /// New instances in their first turn.
    new_applying: AtomicUsize,
    /// When the last of them stopped waiting (got its turn, or went).
    new_waited: Mutex<Option<Instant>>,
    /// Told when `new_waiting` falls to 0.
    no_new_waiting: Notify,
}

impl Turns {
    /// At most `concurrency` reconciles apply at once (at least one), and at most as many first statuses
    /// are written at once.
    pub fn new(concurrency: u16) -> Self {
        let permits = usize::from(concurrency.max(1));
        Self {
            apply: Semaphore::new(permits),
            first_status: Semaphore::new(permits),
            new_waiting: AtomicUsize::new(0),
            new_applying: AtomicUsize::new(0),
            new_waited: Mutex::new(None),
            no_new_waiting: Notify::new(),
        }
    }

    /// A reconcile's turn, when one is free and nobody waits for one.
    pub fn try_apply(&self) -> Option<SemaphorePermit<'_>> {
        self.apply.try_acquire().ok()
    }

    /// Waits for a reconcile's turn, behind every reconcile that started waiting earlier.
    pub async fn apply(&self) -> SemaphorePermit<'_> {
        // Never closed: the semaphore lives as long as the context that owns it.
        self.apply
            .acquire()
            .await
            .unwrap_or_else(|_| unreachable!("the semaphore is never closed"))
    }

    /// Waits for a new instance's turn (see [`Turns::apply`]), counted among the new instances waiting
    /// while it waits.
    pub async fn apply_new(&self) -> SemaphorePermit<'_> {
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
    pub async fn second(&self) -> SemaphorePermit<'_> {
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

    #[tokio::test]
    async fn a_new_instance_that_stops_waiting_is_no_longer_counted() {
        let turns = Turns::new(1);
        let _held = turns.apply().await;
        let waiting = tokio::time::timeout(Duration::from_millis(20), turns.apply_new()).await;
        assert!(waiting.is_err(), "no turn is free");
        assert!(!turns.new_waiting());
    }
}
