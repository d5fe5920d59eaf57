//! The controller loop: the instances' own watch, and the controller that reconciles them on every
//! change the watches of [`super::caches`] report, until shutdown. When the API server answers again
//! after an outage, every instance is reconciled at once (see [`super::connectivity`]).

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use futures::{StreamExt, TryStreamExt};
use kube::runtime::controller::{Config as ControllerConfig, Controller};
use kube::runtime::reflector;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use tokio::sync::watch;
use tracing::{debug, info, warn};

use super::cached_watch::from_cache;
use super::caches::Watches;
use super::connectivity::Connectivity;
use super::first_lists::{mark_synced, reconcile_when_synced, stopped_before_listing};
use super::triggers::{pod_owner, referencing};
use super::watch_retry::retrying_memcacheds;
use crate::api::Memcached;
use crate::controller::{Context, Settings, error_policy, system_clock};
use crate::metrics::Metrics;
use crate::store::compact::trim_instance;
use crate::store::digest_key::DigestKey;

/// Where and how to run the controller.
pub struct RunOptions {
    /// Watch only this namespace; all namespaces when `None`.
    pub namespace: Option<String>,
    /// Reconciler tunables.
    pub settings: Settings,
    /// Identity of this replica in the events it records (the pod name).
    pub reporter_instance: Option<String>,
    /// The process's one digest key (the stats collector shares it: read once per process).
    pub digest_key: DigestKey,
}

/// Runs the controller over `watches` until shutdown (theirs); in-flight reconciles finish first.
/// `synced` turns true once every cache has its initial list.
pub async fn run(
    watches: Watches,
    client: Client,
    metrics: Arc<Metrics>,
    connectivity: Arc<Connectivity>,
    options: RunOptions,
    synced: Arc<AtomicBool>,
) {
    tokio::spawn(mark_synced(watches.synced(), synced));
    let Watches {
        stores,
        namespace,
        written,
        instances: (mc_api, mc_writer),
        instances_listed: (mc_listed_tx, mc_listed),
        children_synced,
        streams,
        shutdown,
    } = watches;
    let stopped_unlisted = stopped_before_listing(shutdown.clone(), mc_listed);
    let memcacheds = stores.memcacheds.clone();
    let ctx = Arc::new(
        Context::sharing(
            client,
            options.settings,
            stores,
            metrics,
            options.reporter_instance,
            system_clock(),
            written,
        )
        .with_digest_key(options.digest_key),
    );
    let mc_stream = instances(&ctx, &connectivity, mc_api, mc_writer, mc_listed_tx);

    info!(
        namespace = namespace.as_deref().unwrap_or("<all>"),
        concurrency = ctx.settings.concurrency,
        "starting controller"
    );
    let instances = memcacheds.clone();
    let controller = Controller::for_stream(mc_stream, memcacheds)
        .watches_stream(streams.pods, pod_owner)
        .watches_stream(streams.secrets, move |secret| {
            referencing(&instances.state(), &secret)
        })
        // Unbounded here: the reconciles take turns themselves, in order, and wait for them outside the
        // controller (see `turns`).
        .with_config(ControllerConfig::default())
        .reconcile_on(streams.children)
        // The instances whose warm-handover copy ended, to open the new server's gate.
        .reconcile_on(futures::stream::select(
            streams.foreign,
            ctx.handover.triggers(),
        ))
        // The instances whose turn, waited for outside the controller, came (see `turns`).
        .reconcile_on(ctx.memory.turns.due())
        // The instances whose turn in the fleet rollout may have come (see `controller::fleet`).
        .reconcile_on(ctx.memory.fleet.due())
        .reconcile_all_on(recoveries(&connectivity, ctx.clone()))
        .graceful_shutdown_on(shutdown)
        .run(
            move |mc, ctx| reconcile_when_synced(mc, ctx, children_synced.clone()),
            error_policy,
            ctx,
        )
        .for_each(|result| async move {
            if let Err(error) = result {
                log_controller_error(error);
            }
        });
    tokio::select! {
        () = controller => info!("controller stopped"),
        () = stopped_unlisted => {
            info!("controller stopped before the instances were listed; no reconcile had started");
        }
    }
}

/// The instances' watch, filling their cache: each instance changed, for the controller. Built once the
/// context exists: a deletion it sees makes the context forget the instance (no reconcile follows a
/// deletion). Its cache sees the deletion first, so a failure counted after this is dropped by the error
/// policy. `listed` turns true at the end of each complete list.
fn instances(
    ctx: &Arc<Context>,
    connectivity: &Arc<Connectivity>,
    api: Api<Memcached>,
    writer: reflector::store::Writer<Memcached>,
    listed: watch::Sender<bool>,
) -> impl futures::Stream<Item = Result<Memcached, watcher::Error>> + Send + 'static {
    let forget = ctx.clone();
    let written = ctx.writer.written.clone();
    // A 404 here means that the CRD is not installed: reported through `connectivity` (and `/readyz`).
    retrying_memcacheds(
        &ctx.metrics,
        connectivity.clone(),
        watcher(api, from_cache(watcher::Config::default())),
    )
    .modify(trim_instance)
    .reflect(writer)
    .inspect_ok(move |event| match event {
        watcher::Event::InitDone => {
            listed.send_replace(true);
        }
        watcher::Event::Delete(mc) => forget.forget(mc),
        // The cache holds it now: a status or finalizer write it has caught up with need not be kept.
        watcher::Event::Apply(mc) => written.observe_cached(mc, &()),
        _ => {}
    })
    .applied_objects()
}

/// Logs what the controller's stream reports: reconcile failures are logged by the reconcile itself;
/// these are queue or watch problems.
fn log_controller_error<E: std::error::Error>(
    error: kube::runtime::controller::Error<E, watcher::Error>,
) {
    match error {
        kube::runtime::controller::Error::ReconcilerFailed(..) => {}
        kube::runtime::controller::Error::ObjectNotFound(obj) => {
            debug!(%obj, "object gone before its reconcile ran")
        }
        other => warn!(error = %other, "controller error"),
    }
}

/// Fires once each time the API server answers again after an outage, after clearing every instance's
/// retry backoff: what failed during the outage failed because of it, and is retried now, level-based,
/// together with whatever changed meanwhile.
fn recoveries(
    connectivity: &Connectivity,
    ctx: Arc<Context>,
) -> impl futures::Stream<Item = ()> + Send + 'static {
    futures::stream::unfold(
        (connectivity.recoveries(), ctx),
        |(mut recoveries, ctx)| async move {
            recoveries.changed().await.ok()?;
            ctx.memory.backoff.reset_all();
            Some(((), (recoveries, ctx)))
        },
    )
}
