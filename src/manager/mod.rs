//! The `run` command: API client, HTTP endpoints, leader election, the controller, and shutdown.
//!
//! Order of events: endpoints come up first (the kubelet probes a standby too); with `--leader-elect` the
//! replica waits for the Lease; the controller runs until SIGTERM/SIGINT or until the Lease is lost. On a
//! signal, in-flight reconciles finish, then the Lease is released so a standby can take it over. On a
//! lost Lease (taken over, or not renewed in time during an API-server outage) the process stops
//! reconciling and exits non-zero within [`LOST_LEASE_GRACE`], as controller-runtime does, and the
//! kubelet restarts it as a standby.
//!
//! API-server outages are survived in place: the client gives up on a connection attempt after
//! [`CONNECT_TIMEOUT`] and on a request without an answer after [`REQUEST_TIMEOUT`], watches retry within
//! seconds, `/readyz` reports the outage, and every instance is re-checked when the server answers again
//! (see [`crate::run::connectivity`]). Starting during an outage waits for the server.

pub mod budget;
pub mod http;
pub mod https;
pub mod leader;
pub mod metrics_auth;
pub mod server;
pub mod transport;

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::{Context as _, anyhow};
use kube::client::retry::RetryPolicy;
use kube::{Client, Config};
use tokio_util::sync::CancellationToken;
use tower::buffer::BufferLayer;
use tower::retry::RetryLayer;
use tower::timeout::TimeoutLayer;
use tracing::{error, info, warn};

use crate::cli::{RunArgs, bind_address, metrics_endpoint};
use crate::controller::Settings;
use crate::metrics::Metrics;
use crate::observe::{ObserveLayer, Observer};
use crate::resources::{Defaults, OperatorPods};
use crate::run::connectivity::Connectivity;
use crate::run::{self, RunOptions};
use crate::store::SecretReader;
use crate::store::digest_key::{DigestKey, KeyLocation};
use futures::FutureExt;
use http::Health;
use leader::{Election, Renewals};

/// Runs the operator until it is told to stop.
pub async fn run(args: RunArgs) -> anyhow::Result<ExitCode> {
    // Checked first: a refused setting fails the start before anything is read or sent.
    let metrics_at = metrics_endpoint(&args.metrics_bind_address, args.metrics_secure)
        .map_err(|e| anyhow!(e))?;
    let metrics = Arc::new(Metrics::default());
    let config = config().await?;
    let connectivity = Arc::new(Connectivity::new(metrics.clone()));
    let client = client(config.clone(), metrics.clone(), connectivity.clone())?;
    let health = Arc::new(Health {
        leader_election: args.leader_elect,
        connectivity: Some(connectivity.clone()),
        ..Health::default()
    });

    serve_endpoints(&args, metrics_at, &client, &metrics, &health).await?;

    let stop = CancellationToken::new();
    tokio::spawn(watch_signals(stop.clone()));

    let identity = identity();
    let mut election = None;
    if args.leader_elect {
        match lead(&config, &metrics, &args, &identity, &stop).await? {
            Some(won) => election = Some(won),
            None => return Ok(ExitCode::SUCCESS),
        }
    }
    health.leader.store(true, Ordering::Release);
    metrics.set_leader(true);

    let lost = election.as_mut().map(Election::lost).unwrap_or_default();
    let shutdown = either_cancelled(stop.clone(), lost.clone())
        .boxed()
        .shared();
    // The client of the watches: made as `client` was, but its own, so its own HTTP/2 connection, apart
    // from the one that writes. On one connection the watches shared the API server's handling of it
    // with a burst's writes, fell behind their events, and were closed by the server as unresponsive
    // (its watch cache gives each watcher a few events' room and a fraction of a second), to be
    // reopened, each a request, while the instances they were bringing in waited. Measured with `make
    // bench-real` (300 new instances, a real v1.28.7 API server on 2 shared cores, 2026-11-26): with
    // the watches on the writes' connection they were reopened 17 to 25 times during the burst
    // (7.06-7.08 requests per instance; the Memcached watch 5 to 7 times, while the garbage collector's
    // and the bench's watches of Memcacheds were never closed); on a connection of their own, 1 to 5
    // reopenings over six runs (7.00-7.02 requests per instance), in moments when the server also
    // closed other clients' watches. It costs one TLS connection more (about 80 KB).
    let watch_client = self::client(config.clone(), metrics.clone(), connectivity.clone())?;
    let watches = run::watch(
        &watch_client,
        &metrics,
        &connectivity,
        args.namespace.as_deref(),
        shutdown.clone(),
    )
    .await;
    // The operand stats collector: its own task, reading the same caches once they are filled, stopped
    // with the controller.
    // One key per process, shared by the reconciles and the collector: its Secret is read once.
    let digest_key = DigestKey::new(digest_key_location(&args, &config));
    let collector = (!args.stats_interval.is_zero()).then(|| {
        spawn_collector(
            &args,
            digest_key.clone(),
            &watches,
            &client,
            &metrics,
            &identity,
            shutdown.clone(),
        )
    });
    let options = RunOptions {
        namespace: args.namespace.clone(),
        settings: settings(&args, &config, collector.is_some()),
        reporter_instance: Some(identity),
        digest_key,
    };
    let controller = run::run(
        watches,
        client,
        metrics.clone(),
        connectivity,
        options,
        health.synced.clone(),
    );
    until_stopped(controller, &stop, &lost, SHUTDOWN_GRACE).await;
    if let Some(collector) = collector {
        collector.abort();
    }
    health.stopping.store(true, Ordering::Release);
    metrics.set_leader(false);
    Ok(exit(election, &lost, &stop).await)
}

/// Runs `controller` until it ends, which it does after a stop or a lost Lease once its in-flight
/// reconciles have finished; or until those reconciles have had their time: `grace` after a stop
/// ([`SHUTDOWN_GRACE`]), [`LOST_LEASE_GRACE`] after a lost Lease.
async fn until_stopped(
    controller: impl std::future::Future<Output = ()>,
    stop: &CancellationToken,
    lost: &CancellationToken,
    grace: Duration,
) {
    tokio::select! {
        () = controller => {}
        () = async {
            stop.cancelled().await;
            tokio::time::sleep(grace).await;
        } => warn!(?grace, "in-flight reconciles did not finish in time; exiting without them"),
        // In-flight reconciles get a moment to finish, not more: another replica may lead already.
        () = async {
            lost.cancelled().await;
            tokio::time::sleep(LOST_LEASE_GRACE).await;
        }, if !stop.is_cancelled() => {}
    }
}

/// How the operator exits once the controller stopped: a replica that lost the lease fails, so that it
/// restarts as a standby; one told to stop gives the lease up.
async fn exit(
    election: Option<Election>,
    lost: &CancellationToken,
    stop: &CancellationToken,
) -> ExitCode {
    if lost.is_cancelled() && !stop.is_cancelled() {
        error!("lost the leader lease; exiting so that this replica restarts as a standby");
        return ExitCode::FAILURE;
    }
    if let Some(election) = election {
        election.release().await;
    }
    info!("shut down cleanly");
    ExitCode::SUCCESS
}

/// Ends when `stop` or `lost` is cancelled: what stops the watches, the collector and the controller.
async fn either_cancelled(stop: CancellationToken, lost: CancellationToken) {
    tokio::select! {
        () = stop.cancelled() => {},
        () = lost.cancelled() => {},
    }
}

/// Serves the health probes and `/metrics` where the flags ask for them.
async fn serve_endpoints(
    args: &RunArgs,
    metrics_at: Option<(std::net::SocketAddr, bool)>,
    client: &Client,
    metrics: &Arc<Metrics>,
    health: &Arc<Health>,
) -> anyhow::Result<()> {
    if let Some(addr) = bind_address(&args.health_probe_bind_address).map_err(|e| anyhow!(e))? {
        let local = http::serve(addr, http::probes(health.clone()))
            .await
            .with_context(|| format!("cannot serve probes on {addr}"))?;
        info!(%local, "serving /healthz and /readyz");
    }
    match metrics_at {
        None => {}
        Some((addr, true)) => {
            let tls =
                https::server_config(args.metrics_cert_dir.as_deref(), args.metrics_enable_http2)
                    .context("no certificate for the metrics server")?;
            let authorizer = Arc::new(metrics_auth::Authorizer::new(client.clone()));
            let router = http::metrics(metrics.clone(), metrics_auth::Gate::new(Some(authorizer)));
            let local = https::serve(addr, router, tls)
                .await
                .with_context(|| format!("cannot serve metrics on {addr}"))?;
            let certificate = match &args.metrics_cert_dir {
                Some(dir) => dir.display().to_string(),
                None => "self-signed".to_owned(),
            };
            info!(%local, %certificate, "serving /metrics over HTTPS to authorized callers");
        }
        Some((addr, false)) => {
            let router = http::metrics(metrics.clone(), metrics_auth::Gate::new(None));
            let local = http::serve(addr, router)
                .await
                .with_context(|| format!("cannot serve metrics on {addr}"))?;
            // Info, not a warning: it is asked for, and bound to loopback only.
            info!(%local, "serving /metrics over plain HTTP without authentication (--metrics-secure=false)");
        }
    }
    Ok(())
}

/// Waits to lead: the election won, or `None` when the operator was stopped first.
async fn lead(
    config: &Config,
    metrics: &Arc<Metrics>,
    args: &RunArgs,
    identity: &str,
    stop: &CancellationToken,
) -> anyhow::Result<Option<Election>> {
    let Some(mut started) = start_election(config, metrics, args, identity, stop).await? else {
        info!("stopped before leader election could start");
        return Ok(None);
    };
    if !started.acquired(stop).await {
        info!("stopped before becoming leader");
        started.release().await;
        return Ok(None);
    }
    info!(%identity, "became leader");
    Ok(Some(started))
}

/// Starts the operand stats collector over the watches' caches.
fn spawn_collector(
    args: &RunArgs,
    digest_key: DigestKey,
    watches: &run::Watches,
    client: &Client,
    metrics: &Arc<Metrics>,
    identity: &str,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> tokio::task::JoinHandle<()> {
    let stores = &watches.stores;
    crate::telemetry::spawn(
        crate::telemetry::Settings {
            interval: args.stats_interval,
            status_interval: args.stats_status_interval,
            cluster_domain: args.cluster_domain.clone(),
        },
        crate::telemetry::Sources {
            client: client.clone(),
            memcacheds: stores.memcacheds.clone(),
            pods: crate::telemetry::IndexedPods {
                store: stores.pods.clone(),
                index: stores.pod_index.clone(),
            },
            secrets: SecretReader::new(
                client.clone(),
                stores.secrets.clone(),
                stores.secret_cache.clone(),
                digest_key,
            ),
        },
        metrics.operand(),
        Some(identity.to_owned()),
        watches.synced(),
        shutdown,
    )
}

/// The reconciler's settings from the flags.
fn settings(args: &RunArgs, config: &Config, stats_collected: bool) -> Settings {
    Settings {
        defaults: Defaults {
            image: args.memcached_image.clone(),
            operator_pods: operator_pods(),
            stats_collected,
            operator_image: args.operator_image.clone(),
        },
        requeue_after: args.requeue_interval,
        concurrency: args.concurrency,
        cluster_domain: args.cluster_domain.clone(),
        handover_max_timeout_seconds: args.handover_max_timeout_seconds,
        fleet_rollout_budget: args.fleet_rollout_budget,
        digest_key: digest_key_location(args, config),
        ..Settings::default()
    }
}

/// Where the operator's digest key lives: `--digest-key-secret` in the operator's own namespace.
fn digest_key_location(args: &RunArgs, config: &Config) -> KeyLocation {
    KeyLocation {
        namespace: own_namespace(args).unwrap_or_else(|| config.default_namespace.clone()),
        name: args.digest_key_secret.clone(),
    }
}

/// The operator's own namespace, where its Lease and digest key live: --leader-election-namespace, else
/// `POD_NAMESPACE` (set by the install from the downward API).
fn own_namespace(args: &RunArgs) -> Option<String> {
    args.leader_election_namespace.clone().or_else(|| {
        std::env::var("POD_NAMESPACE")
            .ok()
            .filter(|s| !s.is_empty())
    })
}

/// Longest wait for a connection (TCP and TLS) to the API server. kube's default of 30 s lets one attempt
/// made while the server's address drops packets (a restarting control-plane node, a load balancer without
/// backends) hang long after the server is back; a fresh attempt is cheaper.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest wait for the answer to a request (for a watch, for the response that starts it). The API server
/// ends ordinary requests after 60 s itself, so only a server that stopped answering on an open connection
/// reaches this; without it, a reconcile waiting for such an answer would hold its instance forever.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(65);
/// After the Lease is lost, how long in-flight reconciles may take before the process exits anyway.
pub const LOST_LEASE_GRACE: Duration = Duration::from_secs(2);
/// After SIGTERM/SIGINT, how long in-flight reconciles may take before the process exits anyway (they are
/// level-based: the next leader, or this operator's next start, does what they left undone). Within the
/// pod's grace period (10 s in `config/manager`), with time left to release the Lease; a reconcile waits
/// for an API server that stopped answering up to [`REQUEST_TIMEOUT`], far longer.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// The API server configuration (kubeconfig or in-cluster), with the timeouts above.
async fn config() -> anyhow::Result<Config> {
    let mut config = Config::infer()
        .await
        .context("no Kubernetes configuration found (KUBECONFIG, ~/.kube/config or in-cluster)")?;
    config.connect_timeout = Some(CONNECT_TIMEOUT);
    // kube's own retry of 429/503/504 answers waits up to 15 times with delays growing to 1000 s, so a
    // request to a starting or overloaded API server can hang for minutes inside the client; ours is
    // bounded (see `client`).
    config.default_retry = false;
    Ok(config)
}

/// A kube client (over HTTP/2 where the API server offers it: see [`transport`]) whose every request is
/// counted in the metrics and feeds `observer`; a 429/503/504 answer is retried at most 3 times within a
/// few seconds (honouring `Retry-After`), and the whole request ends after [`REQUEST_TIMEOUT`] without an
/// answer. Retries are counted as the requests they are.
fn client(
    config: Config,
    metrics: Arc<Metrics>,
    observer: impl Observer,
) -> anyhow::Result<Client> {
    let retry = RetryPolicy::new(Duration::from_millis(200), Duration::from_secs(2), 3, true)
        .context("invalid retry policy")?;
    let client = transport::builder(config)
        .context("cannot build the Kubernetes client")?
        .with_layer(&ObserveLayer::new(observer))
        .with_layer(&ObserveLayer::new(metrics))
        // The retry re-sends through a clone of what it wraps; kube's stack is boxed, not cloneable.
        .with_layer(&BufferLayer::new(1024))
        .with_layer(&RetryLayer::new(retry))
        .with_layer(&TimeoutLayer::new(REQUEST_TIMEOUT))
        .build();
    Ok(client)
}

/// The operator's own pods as instance NetworkPolicies must admit them, when it runs in a pod (the install
/// sets `POD_NAMESPACE` from the downward API).
fn operator_pods() -> Option<OperatorPods> {
    let namespace = std::env::var("POD_NAMESPACE")
        .ok()
        .filter(|s| !s.is_empty())?;
    Some(OperatorPods { namespace })
}

/// Starts the election, waiting (until `stop`) for an API server that does not answer yet.
async fn start_election(
    config: &Config,
    metrics: &Arc<Metrics>,
    args: &RunArgs,
    identity: &str,
    stop: &CancellationToken,
) -> anyhow::Result<Option<Election>> {
    let namespace = own_namespace(args).context("--leader-elect needs --leader-election-namespace or the POD_NAMESPACE environment variable")?;
    info!(lease = %args.leader_election_id, %namespace, %identity, "waiting to become leader");
    let mut delay = Duration::from_millis(500);
    let mut warned = false;
    loop {
        let renewals = Renewals::default();
        let client = client(config.clone(), metrics.clone(), renewals.clone())?;
        match Election::start(
            client,
            renewals,
            &args.leader_election_id,
            &namespace,
            identity,
        )
        .await
        {
            Ok(election) => return Ok(Some(election)),
            Err(error) if leader::retriable(&error) => {
                if !warned {
                    warn!(%error, "cannot reach the API server to start leader election; retrying");
                    warned = true;
                }
            }
            Err(error) => return Err(error).context("cannot start leader election"),
        }
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            () = stop.cancelled() => return Ok(None),
        }
        delay = (delay * 2).min(Duration::from_secs(4));
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn the_handover_maximum_reaches_the_reconciler() {
        use clap::Parser;
        let cli = crate::cli::Cli::try_parse_from([
            "memcached-operator",
            "--handover-max-timeout-seconds",
            "90",
        ])
        .unwrap();
        let config = Config::new("https://127.0.0.1:6443".parse().unwrap());
        let settings = settings(&cli.run, &config, true);
        assert_eq!(settings.handover_max_timeout_seconds, 90);
    }

    #[test]
    fn the_fleet_rollout_budget_reaches_the_reconciler() {
        use clap::Parser;
        let parse = |args: &[&str]| {
            let argv = std::iter::once("memcached-operator").chain(args.iter().copied());
            crate::cli::Cli::try_parse_from(argv)
        };
        let config = Config::new("https://127.0.0.1:6443".parse().unwrap());
        let budget =
            |args: &[&str]| settings(&parse(args).unwrap().run, &config, true).fleet_rollout_budget;
        use crate::resources::fleet::Budget;
        assert_eq!(budget(&[]), Budget::Percent(5));
        assert_eq!(
            budget(&["--fleet-rollout-budget", "3"]),
            Budget::Instances(3)
        );
        assert_eq!(budget(&["--fleet-rollout-budget=20%"]), Budget::Percent(20));
        assert!(parse(&["--fleet-rollout-budget", "0"]).is_err());
    }

    #[tokio::test]
    async fn a_stop_ends_the_wait_when_the_controller_ends_or_after_the_grace() {
        let (stop, lost) = (CancellationToken::new(), CancellationToken::new());
        let grace = Duration::from_millis(300);
        // A controller that ends once told to stop: no grace waited for.
        let ends = {
            let stop = stop.clone();
            async move { stop.cancelled().await }
        };
        stop.cancel();
        let started = Instant::now();
        until_stopped(ends, &stop, &lost, grace).await;
        assert!(started.elapsed() < grace, "{:?}", started.elapsed());

        // A controller whose reconciles never finish: the grace, then no more.
        let started = Instant::now();
        until_stopped(std::future::pending(), &stop, &lost, grace).await;
        let waited = started.elapsed();
        assert!(
            waited >= grace && waited < grace * 10,
            "{waited:?} for a grace of {grace:?}"
        );
    }
}
