//! The operator's copy slots ([`MOST_COPIES`](super::super::tasks::MOST_COPIES)), shared fairly among namespaces.
//!
//! A copy waits for a slot; when one is free, it goes to the waiting copy whose namespace holds the
//! fewest slots, the longest waiting among those. So a namespace that queues many copies (a scale of
//! many servers, many rollouts at once) takes every slot only while no other namespace waits: a copy of
//! another namespace gets the next slot that frees, ahead of the first namespace's queue, and with
//! several namespaces waiting the slots go round among them. A slot is never taken back from a running
//! copy: how long a copy holds one is bounded by its time bound (at most `--handover-max-timeout-seconds`)
//! and by the minimum rate (`Settings::min_bytes_per_window`), which ends a copy whose source drips.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Notify;

/// The slots and who waits for them.
pub(super) struct Slots {
    most: usize,
    state: Mutex<State>,
    /// Wakes the waiting copies to look again: a slot freed, a waiting copy left or took one.
    changed: Notify,
}

#[derive(Default)]
struct State {
    /// Slots held, per namespace (namespaces holding none are not listed).
    held: HashMap<String, usize>,
    /// The waiting copies, in the order they came: their ticket and namespace.
    waiting: Vec<(u64, String)>,
    next_ticket: u64,
}

impl State {
    fn held(&self) -> usize {
        self.held.values().sum()
    }

    /// The ticket the next free slot goes to.
    fn next(&self) -> Option<u64> {
        self.waiting
            .iter()
            .min_by_key(|(ticket, namespace)| {
                (self.held.get(namespace).copied().unwrap_or(0), *ticket)
            })
            .map(|(ticket, _)| *ticket)
    }
}

/// A slot held by a copy of `namespace`; given back when dropped.
pub(super) struct Slot {
    slots: Arc<Slots>,
    namespace: String,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut state = self.slots.lock();
        if let Some(held) = state.held.get_mut(&self.namespace) {
            *held -= 1;
            if *held == 0 {
                state.held.remove(&self.namespace);
            }
        }
        drop(state);
        self.slots.changed.notify_waiters();
    }
}

/// A copy's place in the queue: left when the copy stops waiting (it got its slot, or it was cancelled).
struct Waiting<'a> {
    slots: &'a Slots,
    ticket: u64,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.slots
            .lock()
            .waiting
            .retain(|(ticket, _)| *ticket != self.ticket);
        self.slots.changed.notify_waiters();
    }
}

impl Slots {
    pub(super) fn new(most: usize) -> Arc<Self> {
        Arc::new(Self {
            most,
            state: Mutex::default(),
            changed: Notify::new(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits for a slot for a copy of `namespace`, in its turn. Cancel-safe: a copy dropped while it
    /// waits leaves the queue.
    pub(super) async fn acquire(self: &Arc<Self>, namespace: &str) -> Slot {
        let ticket = {
            let mut state = self.lock();
            let ticket = state.next_ticket;
            state.next_ticket += 1;
            state.waiting.push((ticket, namespace.to_owned()));
            ticket
        };
        let _waiting = Waiting {
            slots: self,
            ticket,
        };
        loop {
            // Listening before looking: a change between the look and the wait is not missed.
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            {
                let mut state = self.lock();
                if state.held() < self.most && state.next() == Some(ticket) {
                    *state.held.entry(namespace.to_owned()).or_default() += 1;
                    // Leaving the queue (`_waiting`'s drop) wakes the others: another slot may be free.
                    return Slot {
                        slots: self.clone(),
                        namespace: namespace.to_owned(),
                    };
                }
            }
            changed.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// Whether `future` is done within a moment.
    async fn soon<T>(future: impl Future<Output = T>) -> Option<T> {
        tokio::time::timeout(Duration::from_millis(200), future)
            .await
            .ok()
    }

    #[tokio::test]
    async fn a_freed_slot_goes_to_the_namespace_holding_fewest_then_in_arrival_order() {
        let slots = Slots::new(2);
        let a1 = slots.acquire("a").await;
        let _a2 = slots.acquire("a").await;
        let a3 = tokio::spawn({
            let slots = slots.clone();
            async move { slots.acquire("a").await }
        });
        tokio::task::yield_now().await;
        let b1 = tokio::spawn({
            let slots = slots.clone();
            async move { slots.acquire("b").await }
        });
        tokio::task::yield_now().await;
        drop(a1);
        let b1 = soon(b1)
            .await
            .expect("b's copy gets the freed slot")
            .unwrap();
        assert!(
            !a3.is_finished(),
            "a's third copy waits: a holds one, as b does"
        );
        drop(b1);
        soon(a3).await.expect("then a's").unwrap();
    }

    #[tokio::test]
    async fn a_cancelled_wait_leaves_the_queue() {
        let slots = Slots::new(1);
        let held = slots.acquire("a").await;
        let cancelled = tokio::spawn({
            let slots = slots.clone();
            async move { slots.acquire("b").await }
        });
        tokio::task::yield_now().await;
        cancelled.abort();
        let _ = cancelled.await;
        let next = tokio::spawn({
            let slots = slots.clone();
            async move { slots.acquire("c").await }
        });
        drop(held);
        soon(next).await.expect("the slot goes to c").unwrap();
        assert!(slots.lock().waiting.is_empty());
    }
}
