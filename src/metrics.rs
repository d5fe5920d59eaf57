//! Prometheus metrics: what the reconciler does, and every request it makes to the API server.
//!
//! Names carry the `memcached_operator_` prefix. API requests are counted by a tower layer in the kube
//! client's stack, so every call (watches, applies, events, leases) is seen without instrumenting call
//! sites.

use std::sync::Arc;
use std::task::{Context as TaskContext, Poll};
use std::time::Instant;

use futures::future::BoxFuture;
use http::{Method, Request, Response};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ErrorLabels {
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    verb: &'static str,
    code: String,
}

/// The operator's metrics and the registry they are exported from.
pub struct Metrics {
    registry: Registry,
    reconciles: Family<ResultLabels, Counter>,
    errors: Family<ErrorLabels, Counter>,
    duration: Histogram,
    instances: Gauge,
    leader: Gauge,
    requests: Family<RequestLabels, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("memcached_operator");
        let reconciles = Family::<ResultLabels, Counter>::default();
        registry.register(
            "reconcile",
            "Reconciliations by result (success, error)",
            reconciles.clone(),
        );
        let errors = Family::<ErrorLabels, Counter>::default();
        registry.register(
            "reconcile_errors",
            "Failed reconciliations by error kind",
            errors.clone(),
        );
        let duration = Histogram::new(exponential_buckets(0.001, 2.0, 15));
        registry.register(
            "reconcile_duration_seconds",
            "Time one reconciliation takes",
            duration.clone(),
        );
        let instances = Gauge::default();
        registry.register(
            "managed_instances",
            "Memcached objects the operator watches",
            instances.clone(),
        );
        let leader = Gauge::default();
        registry.register(
            "leader",
            "1 while this replica holds the leader lease (or runs without leader election), else 0",
            leader.clone(),
        );
        let requests = Family::<RequestLabels, Counter>::default();
        registry.register(
            "kube_requests",
            "Kubernetes API requests by verb and HTTP status code (\"error\" when no response arrived)",
            requests.clone(),
        );
        Self {
            registry,
            reconciles,
            errors,
            duration,
            instances,
            leader,
            requests,
        }
    }
}

impl Metrics {
    /// The metrics in the Prometheus/OpenMetrics text format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }

    /// Starts timing a reconciliation; the time is recorded when the returned guard drops.
    pub fn reconcile_timer(&self) -> ReconcileTimer<'_> {
        ReconcileTimer {
            histogram: &self.duration,
            start: Instant::now(),
        }
    }

    /// Counts a finished reconciliation; `error_kind` is `None` on success.
    pub fn reconciled(&self, error_kind: Option<&'static str>) {
        let result = if error_kind.is_some() {
            "error"
        } else {
            "success"
        };
        self.reconciles
            .get_or_create(&ResultLabels { result })
            .inc();
        if let Some(kind) = error_kind {
            self.errors.get_or_create(&ErrorLabels { kind }).inc();
        }
    }

    /// Sets the number of managed instances.
    pub fn set_instances(&self, n: usize) {
        self.instances.set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// Sets whether this replica leads.
    pub fn set_leader(&self, leader: bool) {
        self.leader.set(i64::from(leader));
    }

    fn count_request(&self, verb: &'static str, code: String) {
        self.requests
            .get_or_create(&RequestLabels { verb, code })
            .inc();
    }
}

/// Records the reconcile duration on drop, so early returns are timed too.
pub struct ReconcileTimer<'a> {
    histogram: &'a Histogram,
    start: Instant,
}

impl Drop for ReconcileTimer<'_> {
    fn drop(&mut self) {
        self.histogram.observe(self.start.elapsed().as_secs_f64());
    }
}

/// The Kubernetes verb of a request, from its method and (for GET) whether it is a watch.
/// A plain GET is reported as `get` whether it reads one object or lists many.
pub fn verb<B>(request: &Request<B>) -> &'static str {
    match *request.method() {
        Method::GET => {
            let watch = request
                .uri()
                .query()
                .is_some_and(|q| q.split('&').any(|kv| kv == "watch=true" || kv == "watch=1"));
            if watch { "watch" } else { "get" }
        }
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE => "delete",
        _ => "other",
    }
}

/// Tower layer that counts API requests in [`Metrics`].
#[derive(Clone)]
pub struct ApiMetricsLayer {
    metrics: Arc<Metrics>,
}

impl ApiMetricsLayer {
    pub fn new(metrics: Arc<Metrics>) -> Self {
        Self { metrics }
    }
}

impl<S> tower::Layer<S> for ApiMetricsLayer {
    type Service = ApiMetricsService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        ApiMetricsService {
            inner,
            metrics: self.metrics.clone(),
        }
    }
}

/// Service produced by [`ApiMetricsLayer`].
#[derive(Clone)]
pub struct ApiMetricsService<S> {
    inner: S,
    metrics: Arc<Metrics>,
}

impl<S, ReqBody, ResBody> tower::Service<Request<ReqBody>> for ApiMetricsService<S>
where
    S: tower::Service<Request<ReqBody>, Response = Response<ResBody>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut TaskContext<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let verb = verb(&request);
        let metrics = self.metrics.clone();
        let future = self.inner.call(request);
        Box::pin(async move {
            let result = future.await;
            let code = match &result {
                Ok(response) => response.status().as_u16().to_string(),
                Err(_) => "error".to_owned(),
            };
            metrics.count_request(verb, code);
            result
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower::{Layer, Service, ServiceExt};

    #[test]
    fn verbs_from_method_and_watch_flag() {
        let req = |m: Method, uri: &str| Request::builder().method(m).uri(uri).body(()).unwrap();
        assert_eq!(
            verb(&req(
                Method::GET,
                "/apis/apps/v1/deployments?watch=true&resourceVersion=1"
            )),
            "watch"
        );
        assert_eq!(
            verb(&req(Method::GET, "/apis/apps/v1/deployments?limit=500")),
            "get"
        );
        assert_eq!(
            verb(&req(
                Method::PATCH,
                "/apis/apps/v1/namespaces/a/deployments/b"
            )),
            "patch"
        );
        assert_eq!(
            verb(&req(
                Method::POST,
                "/apis/events.k8s.io/v1/namespaces/a/events"
            )),
            "create"
        );
    }

    #[tokio::test]
    async fn layer_counts_requests_and_encodes_every_metric() {
        let metrics = Arc::new(Metrics::default());
        let inner = tower::service_fn(|_req: Request<()>| async {
            Ok::<_, std::convert::Infallible>(Response::builder().status(409).body(()).unwrap())
        });
        let mut svc = ApiMetricsLayer::new(metrics.clone()).layer(inner);
        let req = Request::builder()
            .method(Method::PATCH)
            .uri("/x")
            .body(())
            .unwrap();
        svc.ready().await.unwrap().call(req).await.unwrap();
        metrics.reconciled(None);
        metrics.reconciled(Some("apply"));
        metrics.set_leader(true);
        metrics.set_instances(2);
        drop(metrics.reconcile_timer());

        let text = metrics.encode();
        for line in [
            "memcached_operator_kube_requests_total{verb=\"patch\",code=\"409\"} 1",
            "memcached_operator_reconcile_total{result=\"success\"} 1",
            "memcached_operator_reconcile_total{result=\"error\"} 1",
            "memcached_operator_reconcile_errors_total{kind=\"apply\"} 1",
            "memcached_operator_leader 1",
            "memcached_operator_managed_instances 2",
            "memcached_operator_reconcile_duration_seconds_count 1",
        ] {
            assert!(text.contains(line), "missing {line:?} in\n{text}");
        }
    }
}
