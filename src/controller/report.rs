//! The status: computed from what exists (`crate::status`, pure), written only when it changed and only
//! when the change cannot wait (`super::pace`), through the status subresource under the operator's field
//! manager; a new instance's first status while its reconcile waits for its turn; and the requeue that
//! follows.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, Resource, ResourceExt};
use serde_json::json;
use tracing::{debug, warn};

use super::context::Context;
use super::error::Error;
use super::settings::Settings;
use super::view::{Reads, latest, proxy_workload};
use crate::api::names::proxy_name;
use crate::api::{Drain, Memcached, MemcachedStatus, Server};
use crate::resources::{Instance, labels};
use crate::status::{
    self, DEGRADED, FleetWait, HandoverProgress, Observed, ObservedProxy, Problem, WorkloadStatus,
};
use crate::store::compact::Compact;
use crate::store::events::warning;
use crate::store::{Stores, Writer, Written};

/// Writes the first status of an instance that has none (`Progressing=True`, `Creating`, its counts) while
/// its reconcile waits for its turn, so that `kubectl get memcached` shows progress right after
/// `kubectl apply` however many reconciles are queued (see [`super::turns`]). It says what the
/// reconcile would have written after creating the workload, and the reconcile finds it (read-your-writes),
/// so it costs no request more. Skipped for an invalid spec, whose first status the reconcile writes as
/// `Degraded` in one write. A failure is left to the reconcile.
pub(super) async fn first_status(mc: &Arc<Memcached>, ctx: &Context) {
    let (Some(namespace), None) = (mc.namespace(), &mc.metadata.deletion_timestamp) else {
        return;
    };
    let name = mc.name_any();
    let cached = latest(&ctx.stores, mc.clone());
    let Some(mc) = ctx
        .writer
        .written
        .fresher(&namespace, &name, &(), Some(cached))
        .object
    else {
        return;
    };
    if mc.status.is_some() || Instance::new(&mc, &ctx.settings.defaults).is_err() {
        return;
    }
    let _slot = ctx.memory.turns.first_status().await;
    let reads = Reads::of(&ctx.stores, &mc);
    let workload =
        (reads.workload).unwrap_or_else(|| WorkloadStatus::pending(mc.spec.workload.as_str()));
    let stored = Published::stored(&mc, reads.pods);
    let selector = valid_selector(&mc);
    // Boxed, as the reconcile is: allocated once its slot comes.
    let write = Box::pin(report(&mc, ctx, Some(workload), stored, None, selector));
    if let Err(error) = write.await {
        debug!(%error, "could not write the first status; the reconcile will");
    }
}

/// What applying the children (`super::apply`) leaves for the status.
pub(super) struct Children {
    pub workload: WorkloadStatus,
    pub servers: Vec<Server>,
    pub drain: Option<Drain>,
    /// The instance's pods as the plan read them (decoded once per reconcile).
    pub pods: Vec<Arc<Pod>>,
    /// A problem that does not stop the rest (a child of a kind the cluster does not serve).
    pub problem: Option<Problem>,
    /// The warm-handover copies running.
    pub handovers: Vec<HandoverProgress>,
    /// The operator's change of the pod template, waiting for the instance's fleet-rollout turn.
    pub fleet: Option<FleetWait>,
    /// How long until a drain is due, a paced rollout may replace the next server, or a running copy's
    /// progress is shown.
    pub wait: Option<Duration>,
    /// The workload was created and the turn given up before the other children.
    pub yielded: bool,
    /// The instance's first status was written right after its workload was created (in a burst).
    pub wrote_first_status: bool,
}

/// How a reconcile ended, for its status.
pub(super) enum Outcome {
    /// Nothing applied until something changes (the spec, a Secret): a problem to report, then wait.
    Held(Problem),
    /// The children as applied.
    Applied(Box<Children>),
    /// A failure: recorded in the status when it is worth a condition, and retried after a backoff.
    Failed(Error),
}

/// Reports `outcome` in the status, and says when to come back.
pub(super) async fn outcome(
    mc: &Memcached,
    ctx: &Context,
    reads: Reads,
    outcome: Outcome,
) -> Result<Action, Error> {
    let selector = valid_selector(mc);
    let (workload, stored) = (reads.workload, Published::stored(mc, reads.pods));
    match outcome {
        Outcome::Held(problem) => {
            if let (Some(namespace), Some(name)) = (&mc.metadata.namespace, &mc.metadata.name) {
                ctx.memory.fleet.set_aside(namespace, name);
            }
            let held = report(mc, ctx, workload, stored, Some(problem), selector).await?;
            Ok(requeue_within(&ctx.settings, [held]))
        }
        Outcome::Applied(children) => applied(mc, ctx, *children, selector).await,
        Outcome::Failed(error) => Err(fail(mc, ctx, error, workload, stored, selector).await),
    }
}

/// Reports what was applied, and when to come back.
async fn applied(
    mc: &Memcached,
    ctx: &Context,
    applied: Children,
    selector: Option<String>,
) -> Result<Action, Error> {
    let published = Published {
        servers: applied.servers,
        drain: applied.drain,
        pods: applied.pods,
        handovers: applied.handovers,
        fleet: applied.fleet,
    };
    // Compared with the first status just written, not with the instance as it came (none): as this
    // operator wrote it, or as the cache holds it once the watch has brought that write. Only the status is
    // taken: the spec and generation stay the ones the children were applied from.
    let with_first_status;
    let mc = if applied.wrote_first_status {
        let (namespace, name) = (mc.namespace().unwrap_or_default(), mc.name_any());
        let cached = ctx.stores.memcacheds.get(&ObjectRef::from_obj(mc));
        let latest = ctx
            .writer
            .written
            .fresher(&namespace, &name, &(), cached)
            .object;
        with_first_status = Memcached {
            status: latest.and_then(|latest| latest.status.clone()),
            ..mc.clone()
        };
        &with_first_status
    } else {
        mc
    };
    let workload = Some(applied.workload);
    let held = report(mc, ctx, workload, published, applied.problem, selector).await?;
    Ok(requeue_within(&ctx.settings, [held, applied.wait]))
}

/// The safety requeue, or sooner when something is due sooner (a held-back status, a drain).
fn requeue_within<const N: usize>(settings: &Settings, due: [Option<Duration>; N]) -> Action {
    let after = due
        .into_iter()
        .flatten()
        .fold(settings.requeue_after, Duration::min);
    Action::requeue(after)
}

/// Records an error worth a condition in the status (best effort) and hands it back for the retry.
async fn fail(
    mc: &Memcached,
    ctx: &Context,
    error: Error,
    workload: Option<WorkloadStatus>,
    stored: Published,
    selector: Option<String>,
) -> Error {
    // The retry after the error's backoff writes a status held back here.
    if let Some(problem) = error.problem()
        && let Err(e) = report(mc, ctx, workload, stored, Some(problem), selector).await
    {
        warn!(error = %e, "could not record the failure in the status");
    }
    error
}

/// The selector for the status when the instance name is a valid label value, else none.
fn valid_selector(mc: &Memcached) -> Option<String> {
    let name = mc.name_any();
    let valid = name.len() <= 63 && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
    valid.then(|| labels::selector_string(&name))
}

/// The pool as one reconcile settled it, for its status.
pub(super) struct Published {
    pub servers: Vec<Server>,
    pub drain: Option<Drain>,
    pub pods: Vec<Arc<Pod>>,
    pub handovers: Vec<HandoverProgress>,
    pub fleet: Option<FleetWait>,
}

impl Published {
    /// The slots and drain as stored (nothing was applied), with the instance's `pods`.
    fn stored(mc: &Memcached, pods: Vec<Arc<Pod>>) -> Self {
        let stored = mc.status.clone().unwrap_or_default();
        Self {
            servers: stored.servers,
            drain: stored.drain,
            pods,
            handovers: Vec::new(),
            fleet: None,
        }
    }
}

/// Computes the status from what exists and writes it if it changed, unless the change can wait (see
/// [`super::pace`]): then it returns how long until it may be written.
/// `published` holds the server slots and drain this reconcile settled on, and the pods it read; without
/// it (nothing was applied) the stored slots and drain are kept, and the pods are read here.
pub(super) async fn report(
    mc: &Memcached,
    ctx: &Context,
    workload: Option<WorkloadStatus>,
    published: Published,
    problem: Option<Problem>,
    selector: Option<String>,
) -> Result<Option<Duration>, Error> {
    let Published {
        servers,
        drain,
        pods,
        handovers,
        fleet,
    } = published;
    let observed = Observed {
        generation: mc.metadata.generation,
        size: mc.spec.size,
        selector,
        workload,
        pods: pods.iter().map(Arc::as_ref).collect(),
        servers,
        drain,
        problem,
        handovers,
        proxy: observed_proxy(mc, &ctx.stores, &ctx.writer.written),
        fleet,
    };
    let new = status::compute(&observed, mc.status.as_ref(), &(ctx.clock)());
    let (namespace, name) = (mc.namespace().unwrap_or_default(), mc.name_any());
    ctx.metrics
        .set_conditions(&namespace, &name, &new.conditions);
    if mc.status.as_ref() == Some(&new) {
        return Ok(None);
    }
    let pace = &ctx.memory.pace;
    if let Some(left) = pace.hold(&namespace, &name, mc.status.as_ref(), &new) {
        debug!(?left, "status change held back");
        return Ok(Some(left));
    }
    patch_status(mc, &ctx.writer, &new).await?;
    pace.wrote(&namespace, &name);

    // A new reason to be degraded is worth a Warning event; the same one again is not.
    let before = status::find(mc.status.as_ref(), DEGRADED);
    if let Some(degraded) = status::find(Some(&new), DEGRADED).filter(|c| c.status == "True")
        && before.is_none_or(|b| b.status != "True" || b.reason != degraded.reason)
    {
        let event = warning(&degraded.reason, "Reconcile", degraded.message.clone());
        ctx.writer.events.send(&mc.object_ref(&()), event).await;
    }
    Ok(None)
}

/// The proxy for the status, while `spec.proxy.enabled`: its Deployment as this operator last saw it.
fn observed_proxy(mc: &Memcached, stores: &Stores, written: &Written) -> Option<ObservedProxy> {
    let proxy = mc.spec.proxy()?;
    Some(ObservedProxy {
        desired: proxy.replicas(),
        service: proxy_name(&mc.name_any()),
        port: mc.spec.container_port,
        deployment: proxy_workload(stores, written, mc),
    })
}

/// Server-side applies the whole status through the status subresource. Fields the operator no longer
/// sets are removed, because it owns them all, except `stats`: the stats collector owns that under its
/// own field manager, so it is never sent here (sending it would take it over).
pub(super) async fn patch_status(
    mc: &Memcached,
    writer: &Writer,
    status: &MemcachedStatus,
) -> Result<(), Error> {
    let name = mc.name_any();
    // The answer is kept compact (read-your-writes); nothing else reads it.
    let api: Api<Compact<Memcached>> = writer.api(&mc.namespace().unwrap_or_default());
    let status = MemcachedStatus {
        stats: None,
        ..status.clone()
    };
    let patch = json!({
        "apiVersion": Memcached::api_version(&()),
        "kind": Memcached::kind(&()),
        "status": status,
    });
    let written = api
        .patch_status(
            &name,
            &PatchParams::apply(labels::MANAGER_NAME).force(),
            &Patch::Apply(&patch),
        )
        .await
        .map_err(|source| Error::Status { name, source })?;
    writer.written.remember(Arc::new(written), &());
    Ok(())
}
