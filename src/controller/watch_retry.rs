//! How every watch retries, and how its failures are reported.
//!
//! kube's default watch backoff (0.8 s doubling to 30 s, plus up to 100 % jitter, reset only after an event
//! arrives) is made for clients that may wait: after an API-server restart each watch's next attempt lands
//! up to a minute after the server is back, and the 410 `Expired` answer that a restarted server gives to
//! the old resource version counts as one more failure at the top of that curve before the watch re-lists.
//! An operator that owns running caches must notice changes within seconds, so:
//!
//! - failed attempts are retried after [`FIRST_RETRY`], doubling to at most [`LONGEST_RETRY`] (with jitter
//!   below twice that), so a watch resumes within a few seconds of the server answering, however long the
//!   outage; while the server is down that is a handful of cheap failed connects per second in all;
//! - an expired watch (410 `Gone` as a watch event) is re-listed at once and resets the curve: it is the
//!   API server's normal way of saying "re-list", not a failure;
//! - the first failure of a watch while the API server otherwise answers is a warning (a watch that fails
//!   alone usually means missing RBAC or an API that went away); failures during an outage are logged at
//!   debug level, since [`super::connectivity`] reports the outage once; expiries are debug-level too. All of
//!   them are counted in `memcached_operator_watch_errors_total`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::{Stream, StreamExt};
use kube::runtime::WatchStreamExt;
use kube::runtime::utils::Backoff;
use kube::runtime::watcher::{self, ExponentialBackoff};
use tracing::{debug, warn};

use super::connectivity::Connectivity;
use crate::metrics::Metrics;

/// Delay before the first retry of a failed watch.
pub const FIRST_RETRY: Duration = Duration::from_millis(250);
/// Longest delay between retries, before jitter (which adds up to as much again).
pub const LONGEST_RETRY: Duration = Duration::from_millis(1500);

/// What the watches report to.
#[derive(Clone)]
pub struct WatchReporting {
    pub metrics: Arc<Metrics>,
    pub connectivity: Arc<Connectivity>,
}

impl WatchReporting {
    /// `stream` (a [`watcher`]) with the retry policy above and its errors reported as `resource`.
    pub fn retrying<K, S>(
        &self,
        resource: &'static str,
        stream: S,
    ) -> impl Stream<Item = watcher::Result<watcher::Event<K>>> + Send + use<K, S>
    where
        K: Send,
        S: Stream<Item = watcher::Result<watcher::Event<K>>> + Send,
    {
        let expired = Arc::new(AtomicBool::new(false));
        let monitor = WatchMonitor {
            resource,
            expired: expired.clone(),
            failing: AtomicBool::new(false),
            reporting: self.clone(),
        };
        stream
            .inspect(move |result| monitor.observe(result))
            .backoff(WatchBackoff::new(expired))
    }
}

/// The retry delays of one watch: exponential with jitter, and none after an expiry.
pub struct WatchBackoff {
    curve: ExponentialBackoff,
    /// Set by the watch's monitor when the error about to be retried was an expiry.
    expired: Arc<AtomicBool>,
}

impl WatchBackoff {
    fn new(expired: Arc<AtomicBool>) -> Self {
        let curve = backon::ExponentialBuilder::default()
            .with_min_delay(FIRST_RETRY)
            .with_max_delay(LONGEST_RETRY)
            .with_factor(2.0)
            .with_jitter()
            .without_max_times();
        Self {
            curve: curve.into(),
            expired,
        }
    }
}

impl Iterator for WatchBackoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        if self.expired.swap(false, Ordering::AcqRel) {
            self.curve.reset();
            return Some(Duration::ZERO);
        }
        self.curve.next()
    }
}

impl Backoff for WatchBackoff {
    fn reset(&mut self) {
        self.curve.reset();
    }
}

/// Watches one watch's results.
struct WatchMonitor {
    resource: &'static str,
    expired: Arc<AtomicBool>,
    /// Whether the last result was a failure (so only the first of a run is a warning).
    failing: AtomicBool,
    reporting: WatchReporting,
}

impl WatchMonitor {
    fn observe<K>(&self, result: &watcher::Result<watcher::Event<K>>) {
        let resource = self.resource;
        let error = match result {
            Ok(_) => {
                self.failing.store(false, Ordering::Relaxed);
                return;
            }
            Err(error) => error,
        };
        if is_expiry(error) {
            // The watcher already went back to listing; the backoff lets it do so at once.
            self.expired.store(true, Ordering::Release);
            self.reporting.metrics.watch_error(resource, "expired");
            debug!(resource, %error, "watch expired; re-listing");
            return;
        }
        self.reporting.metrics.watch_error(resource, "failed");
        let first = !self.failing.swap(true, Ordering::Relaxed);
        if first && self.reporting.connectivity.available() {
            warn!(resource, %error, "watch failed; retrying");
        } else {
            debug!(resource, %error, "watch failed; retrying");
        }
    }
}

/// A watch the API server ended with 410 `Gone`: the watcher has dropped its resource version and lists
/// again on its next step. (A 410 answer to the watch request itself leaves the watcher on the same version,
/// so that one is retried with the normal delays.)
fn is_expiry(error: &watcher::Error) -> bool {
    matches!(error, watcher::Error::WatchError(status) if status.code == 410)
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::stream;
    use kube::core::Status;

    fn reporting() -> WatchReporting {
        let metrics = Arc::new(Metrics::default());
        WatchReporting {
            connectivity: Arc::new(Connectivity::new(metrics.clone())),
            metrics,
        }
    }

    fn gone() -> watcher::Error {
        let mut status = Status::failure("too old resource version: 1 (2)", "Expired");
        status.code = 410;
        watcher::Error::WatchError(Box::new(status))
    }

    fn refused() -> watcher::Error {
        watcher::Error::WatchFailed(kube::Error::Service("client error (Connect)".into()))
    }

    #[test]
    fn delays_stay_short_however_long_the_outage() {
        let mut backoff = WatchBackoff::new(Arc::new(AtomicBool::new(false)));
        let delays: Vec<Duration> = (0..50).map(|_| backoff.next().unwrap()).collect();
        assert!(
            delays[0] >= FIRST_RETRY && delays[0] < FIRST_RETRY * 2,
            "{delays:?}"
        );
        assert!(
            delays.iter().all(|d| *d < LONGEST_RETRY * 2),
            "every delay below twice the longest: {delays:?}"
        );
        assert!(
            delays[10..].iter().all(|d| *d >= LONGEST_RETRY),
            "{delays:?}"
        );
        backoff.reset();
        assert!(backoff.next().unwrap() < FIRST_RETRY * 2);
    }

    #[test]
    fn an_expiry_is_retried_at_once_and_resets_the_curve() {
        let expired = Arc::new(AtomicBool::new(false));
        let mut backoff = WatchBackoff::new(expired.clone());
        for _ in 0..10 {
            backoff.next();
        }
        expired.store(true, Ordering::Release);
        assert_eq!(backoff.next(), Some(Duration::ZERO));
        assert!(!expired.load(Ordering::Acquire), "the flag is consumed");
        assert!(
            backoff.next().unwrap() < FIRST_RETRY * 2,
            "back at the start"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn monitored_stream_counts_and_flags_errors() {
        let reporting = reporting();
        let items: Vec<watcher::Result<watcher::Event<()>>> = vec![
            Err(refused()),
            Err(refused()),
            Ok(watcher::Event::Init),
            Err(gone()),
            Ok(watcher::Event::InitDone),
        ];
        let out: Vec<_> = reporting
            .retrying("pods", stream::iter(items))
            .collect()
            .await;
        assert_eq!(out.len(), 5, "errors are passed on, not swallowed");
        let text = reporting.metrics.encode();
        assert!(
            text.contains(
                "memcached_operator_watch_errors_total{resource=\"pods\",reason=\"failed\"} 2"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "memcached_operator_watch_errors_total{resource=\"pods\",reason=\"expired\"} 1"
            ),
            "{text}"
        );
    }

    #[test]
    fn only_a_410_watch_event_is_an_expiry() {
        assert!(is_expiry(&gone()));
        assert!(!is_expiry(&refused()));
        let mut forbidden = Status::failure("forbidden", "Forbidden");
        forbidden.code = 403;
        assert!(!is_expiry(&watcher::Error::WatchError(Box::new(forbidden))));
    }
}
