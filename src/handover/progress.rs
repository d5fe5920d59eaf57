//! How far a copy is: counters the copy updates as it goes and anyone holding the [`Progress`] reads
//! while it runs (the controller, for `Progressing` and for the metrics once it ends).

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Live counters of one copy. Shared (`Arc`) between the copy and its readers; each counter only grows.
#[derive(Debug, Default)]
pub struct Progress {
    started: OnceLock<Instant>,
    copied: AtomicU64,
    existing: AtomicU64,
    expired: AtomicU64,
    vanished: AtomicU64,
    filtered: AtomicU64,
    skipped: AtomicU64,
    bytes: AtomicU64,
    /// Bytes the source sent (dump lines, fetch answers and values, those read past included): what the
    /// minimum rate is judged on.
    read: AtomicU64,
    /// Microseconds the copy chose to wait for its own byte rate.
    paced: AtomicU64,
}

/// What the minimum rate is judged on ([`Progress::activity`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Activity {
    /// Bytes the source sent.
    pub read: u64,
    /// Time the copy waited for its own byte rate.
    pub paced: Duration,
}

/// What a copy has done, at one moment or in the end.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// Items stored on the target.
    pub copied: u64,
    /// Items the target already held (a client wrote them since): not overwritten.
    pub existing: u64,
    /// Items that had expired by the server's clock when the copy reached them.
    pub expired: u64,
    /// Items gone from the source between the dump and their fetch (deleted, evicted, or expired then).
    pub vanished: u64,
    /// Items whose key the copy's filter did not select (keys that stay where they are).
    pub filtered: u64,
    /// Items the copy cannot take: a key no text command can name (a binary key of more than 186
    /// bytes, stored through the binary protocol), a value larger than [`super::bounds::MAX_VALUE_BYTES`], or
    /// one larger than the size the dump listed for it (rewritten larger since, or not memcached's).
    pub skipped: u64,
    /// Value bytes stored on the target.
    pub bytes: u64,
    /// Time since the copy started.
    pub elapsed: Duration,
}

impl Snapshot {
    /// Every item the dump listed.
    pub fn items_seen(&self) -> u64 {
        self.copied + self.existing + self.expired + self.vanished + self.filtered + self.skipped
    }
}

impl Progress {
    pub(super) fn start(&self) {
        let _ = self.started.set(Instant::now());
    }

    pub(super) fn copied(&self, bytes: u64) {
        self.copied.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Items another walk of the same copy stored (the sweep's), with their value bytes.
    pub(super) fn add_copied(&self, items: u64, bytes: u64) {
        self.copied.fetch_add(items, Ordering::Relaxed);
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    pub(super) fn existing(&self) {
        self.existing.fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn expired(&self) {
        self.expired.fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn vanished(&self) {
        self.vanished.fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn filtered(&self) {
        self.filtered.fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn skipped(&self) {
        self.skipped.fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn read(&self, bytes: u64) {
        self.read.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Counts a wait for the copy's byte rate, as it starts.
    pub(super) fn paced(&self, wait: Duration) {
        let micros = u64::try_from(wait.as_micros()).unwrap_or(u64::MAX);
        self.paced.fetch_add(micros, Ordering::Relaxed);
    }

    /// What the source sent so far, and how long the copy waited for its own rate.
    pub fn activity(&self) -> Activity {
        Activity {
            read: self.read.load(Ordering::Relaxed),
            paced: Duration::from_micros(self.paced.load(Ordering::Relaxed)),
        }
    }

    /// The counters now. Each is read on its own, so a snapshot taken while the copy runs may be one item
    /// apart between counters; the final one is exact.
    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            copied: self.copied.load(Ordering::Relaxed),
            existing: self.existing.load(Ordering::Relaxed),
            expired: self.expired.load(Ordering::Relaxed),
            vanished: self.vanished.load(Ordering::Relaxed),
            filtered: self.filtered.load(Ordering::Relaxed),
            skipped: self.skipped.load(Ordering::Relaxed),
            bytes: self.bytes.load(Ordering::Relaxed),
            elapsed: self.started.get().map_or(Duration::ZERO, Instant::elapsed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_add_up_and_time_runs_from_the_start() {
        let progress = Progress::default();
        assert_eq!(progress.snapshot(), Snapshot::default());
        progress.start();
        progress.copied(10);
        progress.copied(5);
        progress.existing();
        progress.expired();
        progress.vanished();
        progress.filtered();
        progress.skipped();
        let snapshot = progress.snapshot();
        assert_eq!((snapshot.copied, snapshot.bytes), (2, 15));
        assert_eq!(snapshot.items_seen(), 7);
    }
}
