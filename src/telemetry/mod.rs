//! Operand telemetry: the operator reads memcached's own `stats` from every ready pod.
//!
//! - [`stats`]: the pure parser of a `stats` reply.
//! - [`proxy`]: what a proxy pod (`spec.proxy`) says of itself: its counters and the servers it marks
//!   down (pure parsers), matched to the published list.
//! - [`client`]: one connection to one server (plain TCP or TLS, ASCII auth), bounded by a timeout.
//! - [`collector`]: the task that reads every ready server and proxy pod every `--stats-interval` and
//!   feeds the rest.
//! - [`metrics`]: the per-pod series on `/metrics` (the memcached exporter's names).
//! - [`summary`]: `status.stats` from the servers read, and when to write it (pure).
//! - [`episodes`]: when evictions start and stop, for one Warning event per episode (pure).
//! - [`in_clear`]: whether an instance with auth and without TLS may be read (its spec's opt-in).
//! - [`reload`]: which servers still present a rotated certificate's predecessor, and when to ask them
//!   to reload it (`refresh_certs`) (pure).
//!
//! The TLS material and credentials an instance's Secrets give are read by [`crate::store::secrets`].

pub mod client;
pub mod collector;
pub mod episodes;
pub mod in_clear;
pub mod metrics;
pub mod proxy;
pub mod reload;
pub mod stats;
pub mod summary;

use std::future::Future;
use std::sync::Arc;

use kube::runtime::events::Reporter;
use tokio::task::JoinHandle;

pub use collector::{Collector, IndexedPods, Network, Reader, Settings, Sources};

use crate::store::events::{Publisher, REPORTER};

/// Starts the collector as its own task: it waits for `ready` (the caches hold their initial lists; a
/// collection before would miss instances and pods) and then collects until `shutdown`. Events are
/// recorded as the reconciler's are, under the operator's name and this replica's identity.
pub fn spawn(
    settings: Settings,
    sources: Sources,
    metrics: Arc<metrics::OperandMetrics>,
    reporter_instance: Option<String>,
    ready: impl Future<Output = bool> + Send + 'static,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> JoinHandle<()> {
    let events = Arc::new(Publisher::new(
        sources.client.clone(),
        Reporter {
            controller: REPORTER.to_owned(),
            instance: reporter_instance,
        },
        std::time::Duration::from_secs(5),
    ));
    let collector = Arc::new(Collector::new(
        settings,
        sources,
        metrics,
        events,
        Arc::new(Network),
    ));
    tokio::spawn(async move {
        let shutdown = shutdown;
        tokio::pin!(shutdown);
        tokio::select! {
            ready = ready => if !ready { return },
            () = &mut shutdown => return,
        }
        collector.run(shutdown).await;
    })
}
