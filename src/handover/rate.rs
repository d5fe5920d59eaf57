//! The byte rate limit of a copy: a token bucket.
//!
//! Hand-rolled: the maintained limiter (governor) counts cells in a `u32` burst and refuses a request
//! larger than the burst, while one memcached item may be larger than a second's worth of bytes at a low
//! rate; this bucket lets a request go into debt and waits the debt off instead, which is ten lines.

use std::time::Duration;

use tokio::time::Instant;

/// A bucket of bytes refilled at `rate` per second, holding at most one second's worth. It starts empty,
/// so no window from the start of a copy sees more than the rate (a full bucket would let a copy send
/// twice the rate in its first second).
#[derive(Debug)]
pub struct TokenBucket {
    rate: f64,
    tokens: f64,
    updated: Instant,
}

impl TokenBucket {
    /// An empty bucket for `bytes_per_second` (at least 1).
    pub fn new(bytes_per_second: u64) -> Self {
        let rate = bytes_per_second.max(1) as f64;
        Self {
            rate,
            tokens: 0.0,
            updated: Instant::now(),
        }
    }

    /// Takes `bytes` and says how long to wait before sending them: zero while the bucket holds them, else
    /// the time the refill takes to pay the debt.
    pub fn take_at(&mut self, bytes: u64, now: Instant) -> Duration {
        let refilled = now.saturating_duration_since(self.updated).as_secs_f64() * self.rate;
        self.tokens = (self.tokens + refilled).min(self.rate) - bytes as f64;
        self.updated = now;
        if self.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-self.tokens / self.rate)
        }
    }

    /// Takes `bytes`, waiting as long as the rate requires.
    pub async fn take(&mut self, bytes: u64) {
        let wait = self.take_at(bytes, Instant::now());
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_bucket_is_empty_so_the_first_bytes_wait_their_share() {
        let now = Instant::now();
        let mut bucket = TokenBucket::new(1000);
        assert_eq!(bucket.take_at(500, now), Duration::from_millis(500));
        let later = now + Duration::from_millis(500);
        assert_eq!(bucket.take_at(1000, later), Duration::from_secs(1));
    }

    #[test]
    fn debt_is_paid_by_the_refill() {
        let now = Instant::now();
        let mut bucket = TokenBucket::new(1000);
        // Larger than the bucket: allowed, the wait pays the debt.
        assert_eq!(bucket.take_at(3000, now), Duration::from_secs(3));
        // Three seconds later the debt is paid and the bucket is empty.
        let later = now + Duration::from_secs(3);
        assert_eq!(bucket.take_at(100, later), Duration::from_millis(100));
    }

    #[test]
    fn an_idle_bucket_holds_one_second_at_most() {
        let now = Instant::now();
        let mut bucket = TokenBucket::new(1000);
        let later = now + Duration::from_secs(60);
        assert_eq!(bucket.take_at(1000, later), Duration::ZERO);
        assert_eq!(bucket.take_at(1000, later), Duration::from_secs(1));
    }

    #[test]
    fn over_a_long_copy_the_rate_holds() {
        let start = Instant::now();
        let mut bucket = TokenBucket::new(1_000_000);
        let mut now = start;
        // 10 MB in 64 KiB chunks, each sent when the bucket says so.
        for _ in 0..(10_000_000 / 65_536) {
            now += bucket.take_at(65_536, now);
        }
        let elapsed = now.duration_since(start).as_secs_f64();
        assert!((9.9..=10.1).contains(&elapsed), "{elapsed}");
    }
}
