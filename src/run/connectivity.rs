//! Whether the API server answers, as seen from every request the operator's client makes.
//!
//! An API-server outage is one cluster-wide condition, not a failure of each watch and each instance: the
//! operator logs it once when it begins and once when it ends, reports it on `/readyz` and in the metrics,
//! and when the server answers again it re-checks every instance at once instead of leaving each one to
//! its own (by then long) retry backoff. The signal comes from a tower layer in the kube client's stack, so
//! watches, lists, applies, events and status writes all feed it without instrumenting call sites.
//!
//! A request counts as answered when a response with a status below 500 arrives; transport errors
//! (connection refused, reset, timeouts) and 5xx answers (a server that is starting or overloaded) count as
//! not answered. The API server is reported unavailable only after a failure with no answered request in
//! the preceding [`Connectivity::FLAP_WINDOW`], so that one failed request among healthy ones (a watch
//! reconnecting to one bad replica of several behind a load balancer) does not flip the state back and forth.
//!
//! The API server may also answer and still not serve what the operator needs: the `Memcached` kind,
//! until its CRD is installed. The Memcached watch reports its 404s here ([`Connectivity::crd_missing`]):
//! the operator names the missing CRD and how to install it in one warning, repeated at most every
//! [`Connectivity::CRD_REPORT_EVERY`], and on `/readyz`, until a list succeeds
//! ([`Connectivity::crd_served`]); it starts reconciling then, by itself.
//!
//! The API server may also answer and refuse: right after a restart it answers 403 to every request until
//! its RBAC authorizer has synced (a second or more), and 5xx while it is starting. The first request it
//! grants (2xx) after any refused, failed or unanswered one is a resumption ([`Connectivity::resumptions`]):
//! every watch waiting to retry retries at once instead of sleeping out its delay (see
//! [`super::watch_retry`]).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tracing::{debug, info, warn};

use crate::metrics::Metrics;
use crate::observe::{Observer, Outcome, Sent, error_chain};

/// Why the operator cannot start while the Memcached CRD is not installed, and what to do: the warning
/// and `/readyz`'s answer.
pub const CRD_MISSING: &str = "the Memcached CRD (memcacheds.cache.example.com) is not installed; \
    install it with `make install` or `kubectl apply --server-side -k config/crd`";

/// The operator's view of the API server's availability.
pub struct Connectivity {
    state: Mutex<State>,
    /// Bumped every time the API server answers again after it was unavailable.
    recoveries: watch::Sender<u64>,
    /// Bumped every time the API server grants a request after one was refused or got no answer.
    resumptions: watch::Sender<u64>,
    metrics: Arc<Metrics>,
}

#[derive(Debug)]
struct State {
    /// When a request was last answered.
    last_answer: Option<Instant>,
    /// When the current outage began (`None` while available).
    unavailable_since: Option<Instant>,
    /// While the Memcached CRD is missing: when that was last reported.
    crd_reported: Option<Instant>,
    /// Whether a request was refused (401, 403, 429, 5xx) or got no answer since one was last granted.
    refused: bool,
}

impl Connectivity {
    /// A failure is an outage only if nothing was answered for this long before it.
    pub const FLAP_WINDOW: Duration = Duration::from_secs(1);
    /// How often a missing Memcached CRD is reported again while it stays missing.
    pub const CRD_REPORT_EVERY: Duration = Duration::from_secs(60);

    /// Starts out available: nothing has failed yet, and the start-up lists decide readiness anyway.
    pub fn new(metrics: Arc<Metrics>) -> Self {
        metrics.set_api_available(true);
        Self {
            state: Mutex::new(State {
                last_answer: None,
                unavailable_since: None,
                crd_reported: None,
                refused: false,
            }),
            recoveries: watch::Sender::new(0),
            resumptions: watch::Sender::new(0),
            metrics,
        }
    }

    /// Whether the API server answers.
    pub fn available(&self) -> bool {
        self.lock().unavailable_since.is_none()
    }

    /// Counts up once per recovery; subscribers re-check what the outage may have left undone.
    pub fn recoveries(&self) -> watch::Receiver<u64> {
        self.recoveries.subscribe()
    }

    /// Counts up once per resumption: the first request granted (2xx) after one was refused or got no
    /// answer. Subscribers (the watches' retries) retry what waits for the API server now.
    pub fn resumptions(&self) -> watch::Receiver<u64> {
        self.resumptions.subscribe()
    }

    /// Records a request the API server granted (2xx).
    pub fn granted(&self) {
        let resumed = std::mem::take(&mut self.lock().refused);
        if resumed {
            debug!(
                "the API server grants requests again; every watch waiting to retry retries now"
            );
            self.resumptions.send_modify(|n| *n = n.wrapping_add(1));
        }
    }

    /// Records a request the API server refused or did not answer.
    pub fn refused(&self) {
        self.lock().refused = true;
    }

    /// Records an answered request (at `now`).
    pub fn answered(&self, now: Instant) {
        let outage = {
            let mut state = self.lock();
            state.last_answer = Some(now);
            state.unavailable_since.take()
        };
        if let Some(since) = outage {
            let seconds = now.saturating_duration_since(since).as_secs_f64();
            info!(
                outage_seconds = format!("{seconds:.1}"),
                "the API server answers again; resuming watches and re-checking every instance"
            );
            self.metrics.set_api_available(true);
            self.recoveries.send_modify(|n| *n = n.wrapping_add(1));
        }
    }

    /// Records a request that got no usable answer (at `now`), with what went wrong.
    pub fn failed(&self, now: Instant, error: &str) {
        let began = {
            let mut state = self.lock();
            let recent_answer = state
                .last_answer
                .is_some_and(|at| now.saturating_duration_since(at) < Self::FLAP_WINDOW);
            if state.unavailable_since.is_some() || recent_answer {
                false
            } else {
                state.unavailable_since = Some(now);
                true
            }
        };
        if began {
            warn!(
                %error,
                "the API server does not answer; the operator keeps retrying, running pods are not touched"
            );
            self.metrics.set_api_available(false);
        }
    }

    /// Whether the API server serves the Memcached kind, as far as the operator knows: not after a 404 to
    /// its list, until a list succeeds.
    pub fn serves_crd(&self) -> bool {
        self.lock().crd_reported.is_none()
    }

    /// Records that the API server answered the Memcached list with 404 (at `now`): its CRD is not
    /// installed. Reported when first seen, and again every [`Self::CRD_REPORT_EVERY`] while it lasts.
    pub fn crd_missing(&self, now: Instant) {
        let report = {
            let mut state = self.lock();
            let due = state
                .crd_reported
                .is_none_or(|at| now.saturating_duration_since(at) >= Self::CRD_REPORT_EVERY);
            if due {
                state.crd_reported = Some(now);
            }
            due
        };
        if report {
            warn!("{CRD_MISSING}; the operator starts by itself once it is");
        }
    }

    /// Records that the Memcached list succeeded: the CRD is installed.
    pub fn crd_served(&self) {
        let was_missing = self.lock().crd_reported.take().is_some();
        if was_missing {
            info!("the Memcached CRD is installed now; starting");
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl std::fmt::Debug for Connectivity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connectivity")
            .field("state", &*self.lock())
            .finish_non_exhaustive()
    }
}

/// Every answer and failure of the client's requests feeds the state.
impl Observer for Arc<Connectivity> {
    fn observe(&self, _sent: &Sent, outcome: Outcome<'_>, now: Instant) {
        match outcome {
            Outcome::Answered(status, _) if status.is_server_error() => {
                self.refused();
                self.failed(now, &format!("HTTP {status}"));
            }
            Outcome::Answered(status, _) => {
                self.answered(now);
                if status.is_success() {
                    self.granted();
                } else if matches!(status.as_u16(), 401 | 403 | 429) {
                    self.refused();
                }
            }
            Outcome::Failed(error) => {
                self.refused();
                self.failed(now, &error_chain(error));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::observe::ObserveLayer;
    use http::{Request, Response};
    use tower::{BoxError, Layer, Service, ServiceExt};

    fn connectivity() -> (Arc<Metrics>, Connectivity) {
        let metrics = Arc::new(Metrics::default());
        (metrics.clone(), Connectivity::new(metrics))
    }

    #[test]
    fn an_outage_begins_on_a_failure_and_ends_on_the_next_answer() {
        let (metrics, c) = connectivity();
        let mut recoveries = c.recoveries();
        let t0 = Instant::now();
        assert!(c.available());
        assert!(
            metrics
                .encode()
                .contains("memcached_operator_api_available 1")
        );

        c.failed(t0, "connection refused");
        assert!(!c.available());
        assert!(
            metrics
                .encode()
                .contains("memcached_operator_api_available 0")
        );
        c.failed(t0 + Duration::from_secs(3), "connection refused");
        assert!(!c.available());
        assert!(!recoveries.has_changed().unwrap());

        c.answered(t0 + Duration::from_secs(4));
        assert!(c.available());
        assert!(recoveries.has_changed().unwrap());
        assert_eq!(*recoveries.borrow_and_update(), 1);
        assert!(
            metrics
                .encode()
                .contains("memcached_operator_api_available 1")
        );

        // Answers while available are no recovery.
        c.answered(t0 + Duration::from_secs(5));
        assert!(!recoveries.has_changed().unwrap());
    }

    #[test]
    fn one_failure_right_after_an_answer_is_no_outage() {
        let (_, c) = connectivity();
        let t0 = Instant::now();
        c.answered(t0);
        c.failed(t0 + Duration::from_millis(300), "reset by peer");
        assert!(
            c.available(),
            "a failure within the flap window of an answer"
        );
        c.failed(t0 + Duration::from_millis(1500), "reset by peer");
        assert!(
            !c.available(),
            "nothing answered for longer than the window"
        );
    }

    #[test]
    fn a_missing_crd_is_reported_at_most_once_a_minute_until_it_is_served() {
        let (_, c) = connectivity();
        let t0 = Instant::now();
        assert!(c.serves_crd());
        c.crd_missing(t0);
        assert!(!c.serves_crd());
        let reported = || c.lock().crd_reported;
        assert_eq!(reported(), Some(t0));
        for s in 1..60 {
            c.crd_missing(t0 + Duration::from_secs(s));
        }
        assert_eq!(reported(), Some(t0), "not again within a minute");
        c.crd_missing(t0 + Duration::from_secs(60));
        assert_eq!(
            reported(),
            Some(t0 + Duration::from_secs(60)),
            "again after one"
        );
        assert!(c.available(), "a 404 is an answer: the server is there");

        c.crd_served();
        assert!(c.serves_crd());
        c.crd_missing(t0 + Duration::from_secs(62));
        assert_eq!(
            reported(),
            Some(t0 + Duration::from_secs(62)),
            "missing again (the CRD was deleted): reported at once"
        );
    }

    #[test]
    fn the_crd_is_named_as_the_api_defines_it() {
        use kube::CustomResourceExt;
        let name = crate::api::Memcached::crd_name();
        assert!(CRD_MISSING.contains(&format!("({name})")), "{CRD_MISSING}");
    }

    /// One request through the client's layer, answered with `status`.
    async fn answered_with(c: &Arc<Connectivity>, status: u16) {
        let mut service = ObserveLayer::new(c.clone()).layer(tower::service_fn(
            move |_req: Request<()>| async move {
                Ok::<_, BoxError>(Response::builder().status(status).body(()).unwrap())
            },
        ));
        let request = Request::builder().uri("/x").body(()).unwrap();
        service.ready().await.unwrap().call(request).await.unwrap();
    }

    #[tokio::test]
    async fn the_first_request_granted_after_a_refusal_is_a_resumption() {
        let (_, c) = connectivity();
        let c = Arc::new(c);
        let mut resumptions = c.resumptions();
        answered_with(&c, 200).await;
        assert!(
            !resumptions.has_changed().unwrap(),
            "nothing was refused before"
        );
        // A restarted API server whose authorizer is not warm yet: 403 to everything, then 200.
        answered_with(&c, 403).await;
        answered_with(&c, 403).await;
        assert!(c.available(), "a 403 is an answer");
        assert!(!resumptions.has_changed().unwrap());
        answered_with(&c, 200).await;
        assert_eq!(
            *resumptions.borrow_and_update(),
            1,
            "the first grant after the 403s"
        );
        answered_with(&c, 201).await;
        assert!(
            !resumptions.has_changed().unwrap(),
            "one per run of refusals"
        );
        answered_with(&c, 503).await;
        answered_with(&c, 404).await;
        assert!(!resumptions.has_changed().unwrap(), "a 404 grants nothing");
        answered_with(&c, 200).await;
        assert_eq!(
            *resumptions.borrow_and_update(),
            2,
            "a 5xx is a refusal too"
        );
    }

    #[tokio::test]
    async fn the_layer_counts_5xx_and_transport_errors_as_failures() {
        let (_, c) = connectivity();
        let c = Arc::new(c);
        let respond = |status: u16| {
            tower::service_fn(move |_req: Request<()>| async move {
                Ok::<_, BoxError>(Response::builder().status(status).body(()).unwrap())
            })
        };
        let request = || Request::builder().uri("/x").body(()).unwrap();

        let mut unavailable = ObserveLayer::new(c.clone()).layer(respond(503));
        unavailable
            .ready()
            .await
            .unwrap()
            .call(request())
            .await
            .unwrap();
        assert!(!c.available(), "503 from a starting API server");

        let mut ok = ObserveLayer::new(c.clone()).layer(respond(404));
        ok.ready().await.unwrap().call(request()).await.unwrap();
        assert!(
            c.available(),
            "any answer below 500 means the server serves"
        );

        tokio::time::sleep(Connectivity::FLAP_WINDOW + Duration::from_millis(50)).await;
        let mut broken =
            ObserveLayer::new(c.clone()).layer(tower::service_fn(|_req: Request<()>| async {
                let cause = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
                Err::<Response<()>, BoxError>(Box::new(cause))
            }));
        let error = broken.ready().await.unwrap().call(request()).await;
        assert!(error.is_err());
        assert!(!c.available());
    }
}
