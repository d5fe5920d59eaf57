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
//! - and every watch waiting to retry retries at once when the API server grants a request again after
//!   refusing or missing one ([`Connectivity::resumptions`]): a restarted API server answers 403 to
//!   everything until its RBAC authorizer has synced, then grants everything, and the watches were
//!   resuming one by one over up to 3 s, each at the end of its own delay (measured on a real v1.28.7 API
//!   server that refused the operator's watches until its role was bound again, three runs: the last kind
//!   0.6-1.8 s after the first granted request, the Memcached watch 1.0-1.5 s after the role was bound;
//!   with this, every kind within 0.02 s of the first granted request, four runs). A watch's delay is cut
//!   short at most once per run of failures ([`super::retry_pause`]), so one kind that stays refused
//!   while everything else is granted is still retried on the curve, not at every grant;
//! - an expired watch (410 `Gone` as a watch event) is re-listed at once and resets the curve: it is the
//!   API server's normal way of saying "re-list", not a failure;
//! - the curve starts over only when the watch makes progress (a listed object, the end of a list, an
//!   event), not on the `Init` marker with which the watcher starts every list attempt, so a list that
//!   keeps failing is retried on the curve, not every quarter second;
//! - the first of a run of failures that the API server answered (403: missing RBAC; 404: an API that went
//!   away) is a warning; failures without an answer (refused, reset, timed out) are logged at debug level,
//!   since [`super::connectivity`] reports the outage once for all watches; expiries are debug-level too.
//!   After an outage the answers that refuse are expected for a moment (a restarted API server refuses
//!   until its authorizer has synced): a run that began without an answer is warned about only once the
//!   API server has refused it for [`STILL_REFUSED`], so a kind that stays refused is named in the log,
//!   and one refused for a second after a restart is not. All of them are counted in
//!   `memcached_operator_watch_errors_total`;
//! - the Memcached watch ([`retrying_memcacheds`]) reads a 404 as what it means there, the CRD is not
//!   installed, and reports it through [`Connectivity`] (one clear warning a minute, and `/readyz`) instead
//!   of a warning about a failed watch.

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use futures::{Stream, StreamExt};
use kube::runtime::utils::Backoff;
use kube::runtime::watcher::{self, ExponentialBackoff};
use tokio::sync::watch;
use tracing::{debug, warn};

use super::connectivity::Connectivity;
use super::retry_pause::{Pauses, paced};
use crate::metrics::Metrics;

/// Delay before the first retry of a failed watch.
pub const FIRST_RETRY: Duration = Duration::from_millis(250);
/// Longest delay between retries, before jitter (which adds up to as much again).
pub const LONGEST_RETRY: Duration = Duration::from_millis(1500);
/// How long the API server must have refused a watch whose run of failures began without an answer (an
/// outage) before that is a warning.
pub const STILL_REFUSED: Duration = Duration::from_secs(5);

/// What the retries of every watch share: the metrics their errors are counted in, and the API server's
/// resumptions that cut their delays short.
#[derive(Clone)]
pub struct Retries {
    pub metrics: Arc<Metrics>,
    resumptions: watch::Receiver<u64>,
}

impl Retries {
    pub fn new(metrics: Arc<Metrics>, connectivity: &Connectivity) -> Self {
        Self {
            metrics,
            resumptions: connectivity.resumptions(),
        }
    }
}

/// `stream` (a [`watcher`]) with the retry policy above, its errors reported as `resource` and then
/// dropped.
pub fn retrying<K, S>(
    retries: &Retries,
    resource: &'static str,
    stream: S,
) -> impl Stream<Item = watcher::Result<watcher::Event<K>>> + Send + use<K, S>
where
    K: Send,
    S: Stream<Item = watcher::Result<watcher::Event<K>>> + Send + 'static,
{
    monitored(retries, resource, stream, None)
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
    S: Stream<Item = watcher::Result<watcher::Event<K>>> + Send + 'static,
{
    let retries = Retries::new(metrics.clone(), &connectivity);
    monitored(&retries, "memcacheds", stream, Some(connectivity))
}

fn monitored<K, S>(
    retries: &Retries,
    resource: &'static str,
    stream: S,
    crd: Option<Arc<Connectivity>>,
) -> impl Stream<Item = watcher::Result<watcher::Event<K>>> + Send + use<K, S>
where
    K: Send,
    S: Stream<Item = watcher::Result<watcher::Event<K>>> + Send + 'static,
{
    let flags = Arc::new(Flags::default());
    let monitor = WatchMonitor {
        resource,
        flags: flags.clone(),
        run: Mutex::default(),
        metrics: retries.metrics.clone(),
        crd,
    };
    let observed = stream.inspect(move |result| monitor.observe(result));
    paced(
        observed,
        WatchBackoff::new(flags),
        retries.resumptions.clone(),
        resource,
    )
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

impl Pauses for WatchBackoff {
    /// Called on every successful item; the watcher's `Init`, which starts every list attempt, is no
    /// progress.
    fn reset_on_progress(&mut self) -> bool {
        let progress = !self.flags.started_listing.load(Ordering::Acquire);
        if progress {
            self.curve.reset();
        }
        progress
    }
}

impl Backoff for WatchBackoff {
    fn reset(&mut self) {
        self.reset_on_progress();
    }
}

/// Watches one watch's results.
struct WatchMonitor {
    resource: &'static str,
    flags: Arc<Flags>,
    /// The run of failures the watch is in (so that one warning at most is given for it).
    run: Mutex<Run>,
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
                *self.run.lock().unwrap_or_else(|e| e.into_inner()) = Run::default();
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
        let warn = (self.run.lock().unwrap_or_else(|e| e.into_inner()))
            .worth_a_warning(answered(error), Instant::now());
        if warn {
            warn!(resource, %error, "watch failed; retrying");
        } else {
            debug!(resource, %error, "watch failed; retrying");
        }
    }
}

/// The run of failures a watch is in, since its last progress.
#[derive(Debug, Default)]
struct Run {
    failing: bool,
    /// When the API server first answered a failed request of the run.
    first_answered: Option<Instant>,
    warned: bool,
}

impl Run {
    /// Records a failure (answered by the API server or not, at `now`): whether it is the run's warning.
    /// A run that begins with an answer is warned about at once; one that began without (an outage)
    /// once the API server has refused it for [`STILL_REFUSED`].
    fn worth_a_warning(&mut self, answered: bool, now: Instant) -> bool {
        let began = !std::mem::replace(&mut self.failing, true);
        if !answered || self.warned {
            return false;
        }
        let first = *self.first_answered.get_or_insert(now);
        self.warned = began || now.saturating_duration_since(first) >= STILL_REFUSED;
        self.warned
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

    /// The retries of watches whose client reports to the returned `Connectivity`.
    fn retries(metrics: &Arc<Metrics>) -> (Retries, Arc<Connectivity>) {
        let connectivity = Arc::new(Connectivity::new(metrics.clone()));
        (Retries::new(metrics.clone(), &connectivity), connectivity)
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
        let out: Vec<_> = retrying(&retries(&metrics).0, "pods", stream::iter(items))
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
        let mut stream = Box::pin(retrying(&retries(&metrics).0, "pods", stream::iter(items)));
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

    fn list_forbidden() -> watcher::Error {
        let mut status = Status::failure("pods is forbidden", "Forbidden");
        status.code = 403;
        watcher::Error::InitialListFailed(kube::Error::Api(Box::new(status)))
    }

    /// A restarted API server refuses (403) the relists until its authorizer is warm, then grants
    /// everything: the watch, by then waiting out a delay of 1.5 s or more, lists at once once another
    /// request was granted, not at the end of its delay.
    #[tokio::test(start_paused = true)]
    async fn a_waiting_watch_retries_at_once_when_the_api_server_grants_again() {
        let metrics = Arc::new(Metrics::default());
        let (retries, connectivity) = retries(&metrics);
        let mut items = failing_lists(6, list_forbidden);
        items.push(Ok(watcher::Event::Init));
        let mut stream = Box::pin(retrying(&retries, "pods", stream::iter(items)));
        for _ in 0..6 {
            assert!(matches!(
                stream.next().await,
                Some(Ok(watcher::Event::Init))
            ));
        }
        // The sixth list is refused next; another request is granted 10 ms later.
        let granted = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(10)).await;
            connectivity.refused();
            connectivity.granted();
        });
        let refused_at = tokio::time::Instant::now();
        assert!(matches!(
            stream.next().await,
            Some(Ok(watcher::Event::Init))
        ));
        let waited = refused_at.elapsed();
        granted.await.unwrap();
        assert!(
            waited < Duration::from_millis(100),
            "the watch listed again {waited:?} after its refusal, though the API server granted a request \
             after 10 ms"
        );
    }

    /// A kind that stays refused while every other request is granted is retried on the curve: a
    /// resumption cuts a delay short once per run of failures, not at every grant.
    #[tokio::test(start_paused = true)]
    async fn a_kind_that_stays_refused_does_not_spin_on_other_grants() {
        let metrics = Arc::new(Metrics::default());
        let (retries, connectivity) = retries(&metrics);
        let granting = tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(50)).await;
                connectivity.refused();
                connectivity.granted();
            }
        });
        let start = tokio::time::Instant::now();
        let items = failing_lists(12, list_forbidden);
        let stream = retrying(&retries, "pods", stream::iter(items));
        assert_eq!(stream.count().await, 12, "twelve list attempts");
        let took = start.elapsed();
        granting.abort();
        // Eleven delays: 0.25 s, 0.5 s, 1 s and eight of at least 1.5 s, one of them cut short.
        assert!(
            took >= LONGEST_RETRY * 8,
            "12 refused lists retried within {took:?} under constant grants"
        );
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
    fn a_refusal_is_warned_about_at_once_unless_it_follows_an_outage_and_ends_soon() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut run = Run::default();
        assert!(
            run.worth_a_warning(true, t0),
            "a run that begins with a refusal"
        );
        assert!(!run.worth_a_warning(true, at(10)), "once per run");

        // A restart: refused connections, then 403s while the authorizer syncs.
        let mut run = Run::default();
        assert!(!run.worth_a_warning(false, t0));
        assert!(!run.worth_a_warning(true, at(1)));
        assert!(!run.worth_a_warning(true, at(4)));
        assert!(
            run.worth_a_warning(true, at(6)),
            "refused for 5 s after the outage: it stays refused"
        );
        assert!(!run.worth_a_warning(true, at(9)));
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
