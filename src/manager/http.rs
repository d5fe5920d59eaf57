//! HTTP endpoints: `/healthz` and `/readyz` for the kubelet, `/metrics` for Prometheus.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::manager::metrics_auth::{Gate, enforce};
use crate::manager::server::{self, Limits};
use crate::metrics::Metrics;
use crate::run::connectivity::{CRD_MISSING, Connectivity};
use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;

/// What the probes report.
#[derive(Debug, Default)]
pub struct Health {
    /// Whether this replica waits for a Lease at all.
    pub leader_election: bool,
    /// Whether this replica holds the Lease.
    pub leader: AtomicBool,
    /// Whether the controller's caches hold their initial lists.
    pub synced: Arc<AtomicBool>,
    /// Whether shutdown has begun.
    pub stopping: AtomicBool,
    /// Whether the API server answers (absent in tests that do not care).
    pub connectivity: Option<Arc<Connectivity>>,
}

impl Health {
    /// Ready: a standby replica (waiting for the Lease) is ready, since it is healthy and must not hold up
    /// a rollout of the operator; the replica that reconciles is ready once its caches are synced, and not
    /// while the Memcached CRD is missing (the answer says so, and how to install it) or the API server
    /// does not answer (it cannot watch then). Liveness stays true throughout: a restart would not install
    /// the CRD or bring the API server back.
    pub fn ready(&self) -> Result<&'static str, &'static str> {
        if self.stopping.load(Ordering::Acquire) {
            return Err("shutting down");
        }
        let reconciling = !self.leader_election || self.leader.load(Ordering::Acquire);
        if reconciling && self.connectivity.as_ref().is_some_and(|c| !c.serves_crd()) {
            return Err(CRD_MISSING);
        }
        let answers = self.connectivity.as_ref().is_none_or(|c| c.available());
        match (reconciling, self.synced.load(Ordering::Acquire), answers) {
            (false, _, _) => Ok("ok: standby, waiting for the leader lease"),
            (true, false, _) => Err("caches not synced yet"),
            (true, true, false) => Err("the API server does not answer; watches are retrying"),
            (true, true, true) => Ok("ok"),
        }
    }
}

/// Router for the probe endpoints.
pub fn probes(health: Arc<Health>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .with_state(health)
}

async fn readyz(State(health): State<Arc<Health>>) -> impl IntoResponse {
    match health.ready() {
        Ok(msg) => (StatusCode::OK, msg),
        Err(msg) => (StatusCode::SERVICE_UNAVAILABLE, msg),
    }
}

/// Router for the metrics endpoint, every request passing `gate` (concurrency limit, token check).
pub fn metrics(metrics: Arc<Metrics>, gate: Gate) -> Router {
    Router::new()
        .route("/metrics", get(metrics_handler))
        .route_layer(axum::middleware::from_fn_with_state(gate, enforce))
        .with_state(metrics)
}

async fn metrics_handler(State(metrics): State<Arc<Metrics>>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        metrics.encode(),
    )
}

/// Binds `addr` now (so a taken port fails the start) and serves `router` over plain HTTP/1.1 in the
/// background, within the default [`Limits`].
pub async fn serve(addr: SocketAddr, router: Router) -> std::io::Result<SocketAddr> {
    server::serve(addr, router, None, Limits::default()).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn get(addr: SocketAddr, path: &str) -> String {
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).await.unwrap();
        response
    }

    #[test]
    fn readiness_follows_role_and_sync() {
        let health = Health {
            leader_election: true,
            ..Health::default()
        };
        assert!(health.ready().is_ok(), "standby is ready");
        health.leader.store(true, Ordering::Release);
        assert_eq!(health.ready(), Err("caches not synced yet"));
        health.synced.store(true, Ordering::Release);
        assert_eq!(health.ready(), Ok("ok"));
        health.stopping.store(true, Ordering::Release);
        assert!(health.ready().is_err());

        let metrics = Arc::new(Metrics::default());
        let connectivity = Arc::new(Connectivity::new(metrics));
        let watching = Health {
            connectivity: Some(connectivity.clone()),
            ..Health::default()
        };
        watching.synced.store(true, Ordering::Release);
        assert_eq!(watching.ready(), Ok("ok"));
        connectivity.failed(std::time::Instant::now(), "connection refused");
        assert_eq!(
            watching.ready(),
            Err("the API server does not answer; watches are retrying")
        );
        connectivity.answered(std::time::Instant::now());
        assert_eq!(watching.ready(), Ok("ok"));
        connectivity.crd_missing(std::time::Instant::now());
        assert_eq!(watching.ready(), Err(CRD_MISSING), "says what is missing");
        connectivity.crd_served();
        assert_eq!(watching.ready(), Ok("ok"));

        let single = Health::default();
        assert!(
            single.ready().is_err(),
            "without leader election it reconciles, so it waits for sync"
        );
    }

    #[tokio::test]
    async fn endpoints_answer_over_http() {
        let health = Arc::new(Health::default());
        let probes_addr = serve("127.0.0.1:0".parse().unwrap(), probes(health.clone()))
            .await
            .unwrap();
        let metrics_addr = serve(
            "127.0.0.1:0".parse().unwrap(),
            metrics(Arc::new(Metrics::default()), Gate::new(None)),
        )
        .await
        .unwrap();

        assert!(
            get(probes_addr, "/healthz")
                .await
                .starts_with("HTTP/1.1 200")
        );
        assert!(
            get(probes_addr, "/readyz")
                .await
                .starts_with("HTTP/1.1 503")
        );
        health.synced.store(true, Ordering::Release);
        assert!(
            get(probes_addr, "/readyz")
                .await
                .starts_with("HTTP/1.1 200")
        );

        let body = get(metrics_addr, "/metrics").await;
        assert!(body.starts_with("HTTP/1.1 200"), "{body}");
        assert!(body.contains("memcached_operator_leader"), "{body}");
        assert!(body.contains("# EOF"), "{body}");
    }
}
