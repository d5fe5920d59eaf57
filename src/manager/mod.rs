//! The `run` command: API client, HTTP endpoints, leader election, the controller, and shutdown.
//!
//! Order of events: endpoints come up first (the kubelet probes a standby too); with `--leader-elect` the
//! replica waits for the Lease; the controller runs until SIGTERM/SIGINT or until the Lease is lost. On a
//! signal, in-flight reconciles finish, then the Lease is released so a standby can take it over. On a
//! lost Lease the process exits non-zero without touching anything, as controller-runtime does, and the
//! kubelet restarts it as a standby.

pub mod http;
pub mod leader;

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use anyhow::{Context as _, anyhow};
use kube::client::ClientBuilder;
use kube::{Client, Config};
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::cli::{RunArgs, bind_address};
use crate::controller::{self, RunOptions, Settings};
use crate::metrics::{ApiMetricsLayer, Metrics};
use crate::resources::Defaults;
use http::Health;
use leader::Election;

/// Runs the operator until it is told to stop.
pub async fn run(args: RunArgs) -> anyhow::Result<ExitCode> {
    let metrics = Arc::new(Metrics::default());
    let client = client(metrics.clone()).await?;
    let health = Arc::new(Health {
        leader_election: args.leader_elect,
        ..Health::default()
    });

    if let Some(addr) = bind_address(&args.health_probe_bind_address).map_err(|e| anyhow!(e))? {
        let local = http::serve(addr, http::probes(health.clone()))
            .await
            .with_context(|| format!("cannot serve probes on {addr}"))?;
        info!(%local, "serving /healthz and /readyz");
    }
    if let Some(addr) = bind_address(&args.metrics_bind_address).map_err(|e| anyhow!(e))? {
        let local = http::serve(addr, http::metrics(metrics.clone()))
            .await
            .with_context(|| format!("cannot serve metrics on {addr}"))?;
        info!(%local, "serving /metrics");
    }

    let stop = CancellationToken::new();
    tokio::spawn(watch_signals(stop.clone()));

    let identity = identity();
    let mut election = None;
    if args.leader_elect {
        let namespace = args
            .leader_election_namespace
            .clone()
            .or_else(|| std::env::var("POD_NAMESPACE").ok().filter(|s| !s.is_empty()))
            .context("--leader-elect needs --leader-election-namespace or the POD_NAMESPACE environment variable")?;
        info!(lease = %args.leader_election_id, %namespace, %identity, "waiting to become leader");
        let mut started = Election::start(
            client.clone(),
            &args.leader_election_id,
            &namespace,
            &identity,
        )
        .await
        .context("cannot start leader election")?;
        if !started.acquired(&stop).await {
            info!("stopped before becoming leader");
            started.release().await;
            return Ok(ExitCode::SUCCESS);
        }
        info!(%identity, "became leader");
        election = Some(started);
    }
    health.leader.store(true, Ordering::Release);
    metrics.set_leader(true);

    let lost = election.as_mut().map(Election::lost).unwrap_or_default();
    let shutdown = {
        let (stop, lost) = (stop.clone(), lost.clone());
        async move {
            tokio::select! {
                () = stop.cancelled() => {},
                () = lost.cancelled() => {},
            }
        }
    };
    let options = RunOptions {
        namespace: args.namespace.clone(),
        concurrency: args.concurrency,
        settings: Settings {
            defaults: Defaults {
                image: args.memcached_image.clone(),
            },
            requeue_after: args.requeue_interval,
            ..Settings::default()
        },
        reporter_instance: Some(identity),
    };
    controller::run(
        client,
        metrics.clone(),
        options,
        health.synced.clone(),
        shutdown,
    )
    .await;
    health.stopping.store(true, Ordering::Release);
    metrics.set_leader(false);

    if lost.is_cancelled() && !stop.is_cancelled() {
        error!("lost the leader lease; exiting so that this replica restarts as a standby");
        return Ok(ExitCode::FAILURE);
    }
    if let Some(election) = election {
        election.release().await;
    }
    info!("shut down cleanly");
    Ok(ExitCode::SUCCESS)
}

/// A kube client whose every request is counted in the metrics.
async fn client(metrics: Arc<Metrics>) -> anyhow::Result<Client> {
    let config = Config::infer()
        .await
        .context("no Kubernetes configuration found (KUBECONFIG, ~/.kube/config or in-cluster)")?;
    let client = ClientBuilder::try_from(config)
        .context("cannot build the Kubernetes client")?
        .with_layer(&ApiMetricsLayer::new(metrics))
        .build();
    Ok(client)
}

/// This replica's name in the Lease and in Events: the pod name in a cluster, else host and process id.
fn identity() -> String {
    std::env::var("POD_NAME")
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| {
            let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "local".into());
            format!("{host}-{}", std::process::id())
        })
}

/// First SIGTERM/SIGINT: graceful stop. Second: exit at once.
async fn watch_signals(stop: CancellationToken) {
    shutdown_signal().await;
    info!("shutdown requested; finishing in-flight reconciles (signal again to force)");
    stop.cancel();
    shutdown_signal().await;
    warn!("forced shutdown");
    std::process::exit(130);
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = ctrl_c => {},
                    _ = term.recv() => {},
                }
            }
            Err(error) => {
                warn!(%error, "cannot listen for SIGTERM; only SIGINT stops the operator");
                let _ = ctrl_c.await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}
