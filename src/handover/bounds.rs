//! The bounds of one copy ([`Settings`]): its rate, its time, its batches, its minimum rate, and what it
//! holds in memory whatever its servers answer.

use std::sync::Arc;
use std::time::Duration;

use crate::api::WarmHandover;

/// The largest value a copy takes (memcached's `-I` allows up to 1 GiB): larger items are skipped, so
/// what the operator holds stays within one batch plus this, whatever the servers' settings.
pub const MAX_VALUE_BYTES: usize = 8 * 1024 * 1024;

/// The most one copy holds in memory, whatever its servers answer: 16 MiB (so the operator's
/// [`MOST_COPIES`](super::tasks::MOST_COPIES) copies hold at most 48 MiB). See `copy` for what adds up to it.
pub const COPY_MEMORY_BOUND: usize = 16 << 20;

/// The minimum rate of a copy ([`Settings::min_bytes_per_window`]): 64 KiB from the source within 30 s.
pub const MIN_BYTES_PER_WINDOW: u64 = 64 * 1024;
pub const PROGRESS_WINDOW: Duration = Duration::from_secs(30);

/// Selects the keys a copy takes (a scale handover: the keys that move to the target under the
/// clients' hashing). Called once per item listed, with the raw key.
pub type KeyFilter = Arc<dyn Fn(&[u8]) -> bool + Send + Sync>;

/// The bounds of one copy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settings {
    /// Value bytes stored per second, at most.
    pub max_bytes_per_second: u64,
    /// The whole copy's time bound.
    pub timeout: Duration,
    /// The bound of each request: opening a connection (with TLS and authentication), one dump line, one
    /// batch's fetch, one batch's store.
    pub request_timeout: Duration,
    /// Keys per batch, at most.
    pub batch_items: usize,
    /// The listed sizes of a batch's items, at most (a single larger item makes a batch of its own):
    /// what bounds the values held in memory. Lowered at low rates, so that the rate limit never leaves
    /// the source's dump unread for more than a quarter second per batch (see `copy`).
    pub batch_bytes: u64,
    /// The minimum rate, as the bytes the source must send within each `progress_window` (dump lines,
    /// fetched values): a copy under it ends as too slow, giving its slot back, unless it spent most of
    /// the window waiting for its own byte rate ([`CopyError::Slow`]).
    pub min_bytes_per_window: u64,
    pub progress_window: Duration,
}

/// The request bound: long enough for a 1 MiB batch over a slow link, short enough that a server that
/// stopped answering is given up well within a copy's time bound.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// The default of `--handover-max-timeout-seconds`: the longest any copy may take, whatever its
/// instance's `spec.handover.timeoutSeconds` (which allows up to 3600): a tenant's copies give the
/// operator's shared copy slots back within ten minutes.
pub const DEFAULT_MAX_TIMEOUT_SECONDS: u64 = 600;

impl Default for Settings {
    fn default() -> Self {
        Self::from_spec(&WarmHandover::default(), DEFAULT_MAX_TIMEOUT_SECONDS)
    }
}

impl Settings {
    /// The bounds `spec.handover` sets, its time bound at most `max_timeout_seconds` (the operator's
    /// `--handover-max-timeout-seconds`); batches of 64 keys and 1 MiB (round trips per megabyte are then
    /// few, and the values held stay small).
    pub fn from_spec(spec: &WarmHandover, max_timeout_seconds: u64) -> Self {
        let timeout = Duration::from_secs(spec.timeout_seconds().min(max_timeout_seconds));
        Self {
            max_bytes_per_second: spec.max_bytes_per_second(),
            timeout,
            request_timeout: DEFAULT_REQUEST_TIMEOUT.min(timeout),
            batch_items: 64,
            batch_bytes: 1024 * 1024,
            min_bytes_per_window: MIN_BYTES_PER_WINDOW,
            progress_window: PROGRESS_WINDOW,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_follow_the_spec_and_the_request_bound_never_exceeds_the_whole() {
        let settings = Settings::default();
        assert_eq!(settings.max_bytes_per_second, 64 * 1024 * 1024);
        assert_eq!(settings.timeout, Duration::from_secs(120));
        assert_eq!(settings.request_timeout, DEFAULT_REQUEST_TIMEOUT);
        let short = Settings::from_spec(
            &WarmHandover {
                timeout_seconds: Some(3),
                ..WarmHandover::default()
            },
            DEFAULT_MAX_TIMEOUT_SECONDS,
        );
        assert_eq!(short.request_timeout, Duration::from_secs(3));
    }

    #[test]
    fn the_operators_maximum_caps_the_specs_time_bound() {
        let hour = WarmHandover {
            timeout_seconds: Some(3600),
            ..WarmHandover::default()
        };
        let capped = Settings::from_spec(&hour, DEFAULT_MAX_TIMEOUT_SECONDS);
        assert_eq!(capped.timeout, Duration::from_secs(600));
        assert_eq!(
            Settings::from_spec(&hour, 3600).timeout,
            Duration::from_secs(3600)
        );
        let short = WarmHandover {
            timeout_seconds: Some(30),
            ..WarmHandover::default()
        };
        assert_eq!(
            Settings::from_spec(&short, 600).timeout,
            Duration::from_secs(30)
        );
    }
}
