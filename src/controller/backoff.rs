//! Per-object exponential backoff with jitter for failed reconciles.
//!
//! Each instance has its own failure count, so one broken instance neither slows down nor speeds up the
//! retries of another; jitter spreads the retries of instances that failed together (an API outage).
//!
//! Hand-made because kube-runtime 5's `Controller` keeps no failure count: its error policy answers each
//! failure with one `Action`, so the count per object has to live somewhere, and the curve itself is the
//! few lines of [`delay`]. kube's own backoffs (`backon`, through `watcher::default_backoff`) pace one
//! stream, not a map of objects.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use kube::runtime::reflector::ObjectRef;
use rand::Rng;

use crate::api::Memcached;

/// Failure counts per instance and the curve that turns them into delays.
#[derive(Debug)]
pub struct Backoff {
    base: Duration,
    max: Duration,
    failures: Mutex<HashMap<ObjectRef<Memcached>, u32>>,
}

impl Backoff {
    pub fn new(base: Duration, max: Duration) -> Self {
        Self {
            base,
            max,
            failures: Mutex::default(),
        }
    }

    /// Counts a failure of `key` and returns how long to wait before retrying it.
    pub fn next_delay(&self, key: &ObjectRef<Memcached>) -> Duration {
        let attempt = {
            let mut failures = self.failures.lock().unwrap_or_else(|e| e.into_inner());
            let count = failures.entry(key.clone()).or_insert(0);
            *count = count.saturating_add(1);
            *count
        };
        delay(self.base, self.max, attempt, rand::rng().random::<f64>())
    }

    /// Forgets the failures of `key` after it reconciled successfully (or went away).
    pub fn reset(&self, key: &ObjectRef<Memcached>) {
        self.failures
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(key);
    }

    /// Forgets every failure: after an API-server outage, whose failures say nothing about the instances.
    pub fn reset_all(&self) {
        self.failures
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }

    /// Number of failures recorded in a row for `key`.
    pub fn failures(&self, key: &ObjectRef<Memcached>) -> u32 {
        self.failures
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(key)
            .copied()
            .unwrap_or(0)
    }
}

/// `base * 2^(attempt-1)` capped at `max`, then scaled into `[1/2, 1]` of itself by `jitter ∈ [0, 1)`.
pub fn delay(base: Duration, max: Duration, attempt: u32, jitter: f64) -> Duration {
    let exponent = attempt.saturating_sub(1).min(31);
    let ceiling = base.saturating_mul(1u32 << exponent).min(max);
    ceiling.mul_f64(0.5 + jitter.clamp(0.0, 1.0) / 2.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: Duration = Duration::from_secs(1);
    const MAX: Duration = Duration::from_secs(300);

    #[test]
    fn grows_exponentially_up_to_the_cap() {
        let ceilings: Vec<u64> = (1..=12)
            .map(|a| delay(BASE, MAX, a, 1.0).as_secs())
            .collect();
        assert_eq!(ceilings, [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300, 300]);
        assert_eq!(delay(BASE, MAX, u32::MAX, 1.0), MAX);
    }

    #[test]
    fn jitter_keeps_at_least_half_the_delay() {
        assert_eq!(delay(BASE, MAX, 4, 0.0), Duration::from_secs(4));
        assert_eq!(delay(BASE, MAX, 4, 0.5), Duration::from_secs(6));
    }

    #[test]
    fn counts_are_per_object_and_reset_on_success() {
        let backoff = Backoff::new(BASE, MAX);
        let a = ObjectRef::new("a").within("ns");
        let b = ObjectRef::new("b").within("ns");
        for _ in 0..3 {
            backoff.next_delay(&a);
        }
        let d = backoff.next_delay(&b);
        assert!(d <= BASE, "first failure of b is not slowed by a's: {d:?}");
        assert_eq!(backoff.failures(&a), 3);
        backoff.reset(&a);
        assert_eq!(backoff.failures(&a), 0);
        assert_eq!(backoff.failures(&b), 1);
    }
}
