//! The status: computed from what exists (`crate::status`, pure), written only when it changed and only
//! when the change cannot wait (`super::pace`), through the status subresource under the operator's field
//! manager; a new instance's first status while its reconcile waits for its turn; and the requeue that
//! follows.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::{Api, Resource, ResourceExt};
use serde_json::json;
use tracing::{debug, warn};

use super::view::latest;
use super::{Context, Error, pool};
use crate::api::{Drain, Memcached, MemcachedStatus, Server};
use crate::resources::{Instance, labels};
use crate::status::{self, DEGRADED, HandoverProgress, Observed, Problem, WorkloadStatus};
use crate::store::compact::Compact;
use crate::store::events::warning;

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
    let Some(mc) = ctx
        .written
        .fresher(&namespace, &name, &(), Some(latest(ctx, mc.clone())))
        .object
    else {
        return;
    };
    if mc.status.is_some() || Instance::new(&mc, &ctx.settings.defaults).is_err() {
        return;
    }
    let _slot = ctx.turns.first_status().await;
    let workload = pool::cached_workload(ctx, &mc)
        .unwrap_or_else(|| WorkloadStatus::pending(mc.spec.workload.as_str()));
    // Boxed, as the reconcile is: allocated once its slot comes.
    let write = Box::pin(report(
        &mc,
        ctx,
        Some(workload),
        None,
        None,
        valid_selector(&mc),
    ));
    if let Err(error) = write.await {
        debug!(%error, "could not write the first status; the reconcile will");
    }
}

/// The safety requeue, or sooner when something is due sooner (a held-back status, a drain).
pub(super) fn requeue_within<const N: usize>(ctx: &Context, due: [Option<Duration>; N]) -> Action {
    let after = due
        .into_iter()
        .flatten()
        .fold(ctx.settings.requeue_after, Duration::min);
    Action::requeue(after)
}

/// Records an error worth a condition in the status (best effort) and hands it back for the retry.
pub(super) async fn fail(
    mc: &Memcached,
    ctx: &Context,
    error: Error,
    workload: Option<WorkloadStatus>,
    selector: Option<String>,
) -> Error {
    // The retry after the error's backoff writes a status held back here.
    if let Some(problem) = error.problem()
        && let Err(e) = report(mc, ctx, workload, None, Some(problem), selector).await
    {
        warn!(error = %e, "could not record the failure in the status");
    }
    error
}

/// The selector for the status when the instance name is a valid label value, else none.
pub(super) fn valid_selector(mc: &Memcached) -> Option<String> {
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
}

/// Computes the status from what exists and writes it if it changed, unless the change can wait (see
/// [`super::pace`]): then it returns how long until it may be written.
/// `published` holds the server slots and drain this reconcile settled on, and the pods it read; without
/// it (nothing was applied) the stored slots and drain are kept, and the pods are read here.
pub(super) async fn report(
    mc: &Memcached,
    ctx: &Context,
    workload: Option<WorkloadStatus>,
    published: Option<Published>,
    problem: Option<Problem>,
    selector: Option<String>,
) -> Result<Option<Duration>, Error> {
    let Published {
        servers,
        drain,
        pods,
        handovers,
    } = published.unwrap_or_else(|| {
        let stored = mc.status.clone().unwrap_or_default();
        Published {
            servers: stored.servers,
            drain: stored.drain,
            pods: super::view::pods(&ctx.stores, mc),
            handovers: Vec::new(),
        }
    });
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
    };
    let new = status::compute(&observed, mc.status.as_ref(), &(ctx.clock)());
    let (namespace, name) = (mc.namespace().unwrap_or_default(), mc.name_any());
    ctx.metrics
        .set_conditions(&namespace, &name, &new.conditions);
    if mc.status.as_ref() == Some(&new) {
        return Ok(None);
    }
    if let Some(left) = ctx.pace.hold(&namespace, &name, mc.status.as_ref(), &new) {
        debug!(?left, "status change held back");
        return Ok(Some(left));
    }
    patch_status(mc, ctx, &new).await?;
    ctx.pace.wrote(&namespace, &name);

    // A new reason to be degraded is worth a Warning event; the same one again is not.
    let before = status::find(mc.status.as_ref(), DEGRADED);
    if let Some(degraded) = status::find(Some(&new), DEGRADED).filter(|c| c.status == "True")
        && before.is_none_or(|b| b.status != "True" || b.reason != degraded.reason)
    {
        let event = warning(&degraded.reason, "Reconcile", degraded.message.clone());
        ctx.events.send(&mc.object_ref(&()), event).await;
    }
    Ok(None)
}

/// Server-side applies the whole status through the status subresource. Fields the operator no longer
/// sets are removed, because it owns them all, except `stats`: the stats collector owns that under its
/// own field manager, so it is never sent here (sending it would take it over).
pub(super) async fn patch_status(
    mc: &Memcached,
    ctx: &Context,
    status: &MemcachedStatus,
) -> Result<(), Error> {
    let name = mc.name_any();
    // The answer is kept compact (read-your-writes); nothing else reads it.
    let api: Api<Compact<Memcached>> =
        Api::namespaced(ctx.client.clone(), &mc.namespace().unwrap_or_default());
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
    ctx.written.remember(Arc::new(written), &());
    Ok(())
}
