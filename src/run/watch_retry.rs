//! How every watch retries, and how its failures are reported.
//!
//! kube's default watch backoff (0.8 s doubling to 30 s, plus up to 100 % jitter, reset only after an event
//! arrives) is made for clients that may wait, and a kube `Controller` puts one such backoff on the merged
//! stream of all its watches, so that an error in any watch pauses all of them. Through an API-server
//! restart that pause grows with every failed reconnect, and the 410 `Expired` answers that a restarted
//! server gives to the old resource versions each add one more round at the top of the curve before the
//! watches re-list: minutes without a reconcile after the server is back. An operator that owns running
//! caches must notice changes within seconds, so each watch handles its own errors here and passes none
//! on to the controller, and:
//!
//! - failed attempts are retried after [`FIRST_RETRY`], doubling to at most [`LONGEST_RETRY`] (with jitter
//!   below twice that), so a watch resumes within a few seconds of the server answering, however long the
//!   outage; while the server is down that is a handful of cheap failed connects per second in all;
//! - an expired watch (410 `Gone` as a watch event) is re-listed at once and resets the curve: it is the
//!   API server's normal way of saying "re-list", not a failure;
//! - the curve starts over only when the watch makes progress (a listed object, the end of a list, an
//!   event), not on the `Init` marker with which the watcher starts every list attempt, so a list that
//!   keeps failing is retried on the curve, not every quarter second;
//! - the first of a run of failures that the API server answered (403: missing RBAC; 404: an API that went
//!   away) is a warning; failures without an answer (refused, reset, timed out) are logged at debug level,
//!   since [`super::connectivity`] reports the outage once for all watches; expiries are debug-level too.
//!   All of them are counted in `memcached_operator_watch_errors_total`;
//! - the Memcached watch ([`retrying_memcacheds`]) reads a 404 as what it means there, the CRD is not
//!   installed, and reports it through [`Connectivity`] (one clear warning a minute, and `/readyz`) instead
//!   of a warning about a failed watch.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

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

/// `stream` (a [`watcher`]) with the retry policy above, its errors reported as `resource` and then
/// dropped.
pub fn retrying<K, S>(
    metrics: &Arc<Metrics>,
    resource: &'static str,
    stream: S,
) -> impl Stream<Item = watcher::Result<watcher::Event<K>>> + Send + use<K, S>
where
    K: Send,
    S: Stream<Item = watcher::Result<watcher::Event<K>>> + Send,
{
    monitored(metrics, resource, stream, None)
}

/// [`retrying`] for the watch of the `Memcached` kind itself: a 404 means that its CRD is not installed,
/// which `connectivity` reports, and a successful list that it is (again).
pub fn retrying_memcacheds<K, S>(
    metrics: &Arc<Metrics>,
    connectivity: Arc<Connectivity>,
    stream: S,
) -> impl Stream<Item = watcher::Result<watcher::Event<K>>> + Send + use<K, S>
where
    K: Send,
    S: Stream<Item = watcher::Result<watcher::Event<K>>> + Send,
{
    monitored(metrics, "memcacheds", stream, Some(connectivity))
}

fn monitored<K, S>(
    metrics: &Arc<Metrics>,
    resource: &'static str,
    stream: S,
    crd: Option<Arc<Connectivity>>,
) -> impl Stream<Item = watcher::Result<watcher::Event<K>>> + Send + use<K, S>
where
    K: Send,
    S: Stream<Item = watcher::Result<watcher::Event<K>>> + Send,
{
    let flags = Arc::new(Flags::default());
    let monitor = WatchMonitor {
        resource,
        flags: flags.clone(),
        failing: AtomicBool::new(false),
        metrics: metrics.clone(),
        crd,
    };
    stream
        .inspect(move |result| monitor.observe(result))
        .backoff(WatchBackoff::new(flags))
        // Handled here, so the controller never sees them: it puts one backoff of its own (kube's
        // default curve) on the merged stream of all its watches, so any one watch's error would pause
        // every watch, for longer with each error, until an event arrives.
        .filter(|result| std::future::ready(result.is_ok()))
}

/// What a watch's monitor tells its backoff about the result just seen.
#[derive(Debug, Default)]
struct Flags {
    /// The error about to be retried was an expiry.
    expired: AtomicBool,
    /// The last success was the `Init` marker of a list attempt, which is no progress.
    started_listing: AtomicBool,
}

/// The retry delays of one watch: exponential with jitter, and none after an expiry.
pub struct WatchBackoff {
    curve: ExponentialBackoff,
    /// Set by the watch's monitor.
    flags: Arc<Flags>,
}

impl WatchBackoff {
    fn new(flags: Arc<Flags>) -> Self {
        let curve = backon::ExponentialBuilder::default()
            .with_min_delay(FIRST_RETRY)
            .with_max_delay(LONGEST_RETRY)
            .with_factor(2.0)
            .with_jitter()
            .without_max_times();
        Self {
            curve: curve.into(),
            flags,
        }
    }
}

impl Iterator for WatchBackoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        if self.flags.expired.swap(false, Ordering::AcqRel) {
            self.curve.reset();
            return Some(Duration::ZERO);
        }
        self.curve.next()
    }
}

impl Backoff for WatchBackoff {
    /// Called on every successful item; the watcher's `Init`, which starts every list attempt, is none.
    fn reset(&mut self) {
        if !self.flags.started_listing.load(Ordering::Acquire) {
            self.curve.reset();
        }
    }
}

/// Watches one watch's results.
struct WatchMonitor {
    resource: &'static str,
    flags: Arc<Flags>,
    /// Whether the last result was a failure (so only the first of a run is a warning).
    failing: AtomicBool,
    metrics: Arc<Metrics>,
    /// For the watch of the Memcached kind: where a missing CRD is reported.
    crd: Option<Arc<Connectivity>>,
}

impl WatchMonitor {
    fn observe<K>(&self, result: &watcher::Result<watcher::Event<K>>) {
        let resource = self.resource;
        let error = match result {
            Ok(watcher::Event::Init) => {
                // Every list attempt starts with this, the failing ones too.
                self.flags.started_listing.store(true, Ordering::Release);
                return;
            }
            Ok(_) => {
                self.flags.started_listing.store(false, Ordering::Release);
                self.failing.store(false, Ordering::Relaxed);
                if let Some(crd) = &self.crd {
                    crd.crd_served();
                }
                return;
            }
            Err(error) => error,
        };
        if let Some(crd) = self.crd.as_ref().filter(|_| not_found(error)) {
            self.metrics.watch_error(resource, "failed");
            debug!(resource, %error, "the API server does not serve this kind; retrying");
            crd.crd_missing(Instant::now());
            return;
        }
        if is_expiry(error) {
            // The watcher already went back to listing; the backoff lets it do so at once.
            self.flags.expired.store(true, Ordering::Release);
            self.metrics.watch_error(resource, "expired");
            debug!(resource, %error, "watch expired; re-listing");
            return;
        }
        self.metrics.watch_error(resource, "failed");
        let first = !self.failing.swap(true, Ordering::Relaxed);
        if first && answered(error) {
            warn!(resource, %error, "watch failed; retrying");
        } else {
            debug!(resource, %error, "watch failed; retrying");
        }
    }
}

/// Whether the API server answered the failed request (403, 404, 500, ...): something about this watch
/// in particular, worth a warning. A failure without an answer (refused, reset, timed out) is an outage,
/// reported once by [`super::connectivity`] for all the watches.
fn answered(error: &watcher::Error) -> bool {
    match error {
        watcher::Error::InitialListFailed(e)
        | watcher::Error::WatchStartFailed(e)
        | watcher::Error::WatchFailed(e) => matches!(e, kube::Error::Api(_)),
        watcher::Error::WatchError(_) | watcher::Error::NoResourceVersion => true,
    }
}

/// Whether the API server answered 404: it does not serve the watched kind (or the namespace is gone).
fn not_found(error: &watcher::Error) -> bool {
    match error {
        watcher::Error::InitialListFailed(kube::Error::Api(status))
        | watcher::Error::WatchStartFailed(kube::Error::Api(status))
        | watcher::Error::WatchFailed(kube::Error::Api(status)) => status.code == 404,
        watcher::Error::WatchError(status) => status.code == 404,
        _ => false,
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
        let mut backoff = WatchBackoff::new(Arc::new(Flags::default()));
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
        let flags = Arc::new(Flags::default());
        let mut backoff = WatchBackoff::new(flags.clone());
        for _ in 0..10 {
            backoff.next();
        }
        flags.expired.store(true, Ordering::Release);
        assert_eq!(backoff.next(), Some(Duration::ZERO));
        assert!(
            !flags.expired.load(Ordering::Acquire),
            "the flag is consumed"
        );
        assert!(
            backoff.next().unwrap() < FIRST_RETRY * 2,
            "back at the start"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn monitored_stream_counts_and_flags_errors() {
        let metrics = Arc::new(Metrics::default());
        let items: Vec<watcher::Result<watcher::Event<()>>> = vec![
            Err(refused()),
            Err(refused()),
            Ok(watcher::Event::Init),
            Err(gone()),
            Ok(watcher::Event::InitDone),
        ];
        let out: Vec<_> = retrying(&metrics, "pods", stream::iter(items))
            .collect()
            .await;
        assert_eq!(
            out.len(),
            2,
            "errors are handled here, never passed on to the controller"
        );
        assert!(out.iter().all(Result::is_ok));
        let text = metrics.encode();
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

    fn list_not_found() -> watcher::Error {
        let mut status = Status::failure("404 page not found", "NotFound");
        status.code = 404;
        watcher::Error::InitialListFailed(kube::Error::Api(Box::new(status)))
    }

    /// A list that keeps failing: the watcher starts each attempt with `Init`, then fails.
    fn failing_lists(
        n: usize,
        error: fn() -> watcher::Error,
    ) -> Vec<watcher::Result<watcher::Event<()>>> {
        (0..n)
            .flat_map(|_| [Ok(watcher::Event::Init), Err(error())])
            .collect()
    }

    #[tokio::test(start_paused = true)]
    async fn a_list_that_keeps_failing_is_retried_on_the_curve() {
        let metrics = Arc::new(Metrics::default());
        let mut items = failing_lists(12, list_not_found);
        items.push(Ok(watcher::Event::Init));
        items.push(Ok(watcher::Event::InitDone));
        let start = tokio::time::Instant::now();
        let mut seen = Vec::new();
        let mut stream = Box::pin(retrying(&metrics, "pods", stream::iter(items)));
        while let Some(item) = stream.next().await {
            seen.push((item.is_ok(), start.elapsed()));
        }
        let took = start.elapsed();
        // 12 failures: at least the first delays of the curve, then the longest, not 12 quarter seconds.
        assert!(
            took >= FIRST_RETRY + LONGEST_RETRY * 8,
            "12 failed lists retried within {took:?}: the curve started over at every list attempt"
        );
        assert_eq!(seen.len(), 14, "13 Inits and the end of the list: {seen:?}");
        let text = metrics.encode();
        assert!(
            text.contains(
                "memcached_operator_watch_errors_total{resource=\"pods\",reason=\"failed\"} 12"
            ),
            "{text}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_memcached_watch_reports_a_missing_crd_until_it_lists() {
        let metrics = Arc::new(Metrics::default());
        let connectivity = Arc::new(Connectivity::new(metrics.clone()));
        let mut items = failing_lists(3, list_not_found);
        items.push(Ok(watcher::Event::Init));
        let mut stream = Box::pin(retrying_memcacheds(
            &metrics,
            connectivity.clone(),
            stream::iter(items).chain(stream::iter([Ok(watcher::Event::InitDone)])),
        ));
        for _ in 0..4 {
            assert!(matches!(
                stream.next().await,
                Some(Ok(watcher::Event::Init))
            ));
        }
        assert!(!connectivity.serves_crd(), "three lists answered 404");
        assert!(matches!(
            stream.next().await,
            Some(Ok(watcher::Event::InitDone))
        ));
        assert!(connectivity.serves_crd(), "listed at last");
    }

    #[test]
    fn only_failures_the_api_server_answered_are_worth_a_warning() {
        let mut forbidden = Status::failure("forbidden", "Forbidden");
        forbidden.code = 403;
        let forbidden = kube::Error::Api(Box::new(forbidden));
        assert!(answered(&watcher::Error::WatchStartFailed(forbidden)));
        assert!(!answered(&refused()));
        assert!(!answered(&watcher::Error::InitialListFailed(
            kube::Error::Service("timed out".into())
        )));
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
