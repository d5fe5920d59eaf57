//! Reconcile: the legacy finalizer's removal (older instances only) → validate → plan the pool (slots,
//! drain) → build → apply (only what differs) → status (only when it differs).
//!
//! A deleted instance needs nothing from the operator: its children carry its controller owner reference,
//! so garbage collection removes them, and the watch that sees it go drops what the operator kept about it
//! in memory (see `Context::forget`).

use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use std::fmt::Debug;
use std::hash::Hash;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, Resource, ResourceExt};
use serde_json::json;
use tracing::{Instrument, debug, info, info_span, warn};

use super::changes::Changes;
use super::children::{self, Source};
use super::legacy_finalizer;
use super::pool;
use super::secrets::{self, Resolved};
use super::{Context, Error};
use crate::api::{Drain, Memcached, MemcachedStatus, Server, Workload};
use crate::handover::plan::rollout as gate;
use crate::handover::{Rollout, View};
use crate::resources::scaling::Step;
use crate::resources::{
    Instance, autoscaler, deployment, labels, network_policy, pdb, pod, rollout, servers, service,
    service_monitor, statefulset,
};
use crate::status::{self, DEGRADED, HandoverProgress, Observed, Problem, WorkloadStatus};
use crate::store::cache::Cache;
use crate::store::compact::{Compact, Compactable};
use crate::store::events::{normal, warning};

/// Reconciles one instance. Idempotent and level-based: it never asks why it was called.
///
/// Everything logged on the way carries the instance through the `reconcile` span (`memcached`,
/// `namespace`), inside kube's own `reconciling object` span (the object and what triggered it).
///
/// It takes its turn first (see [`runtime::turns`](super::turns)). When it has to wait for one, a
/// new instance's first status is written meanwhile, and the instance is read again from its cache
/// afterwards: it may have changed, or gone, while it waited.
pub async fn reconcile(mc: Arc<Memcached>, ctx: Arc<Context>) -> Result<Action, Error> {
    let span = info_span!(
        "reconcile",
        memcached = %mc.name_any(),
        namespace = %mc.metadata.namespace.as_deref().unwrap_or_default(),
    );
    async move {
        let key = ObjectRef::from_obj(mc.as_ref());
        let new = pool::cached_workload(&ctx, &mc).is_none();
        let (mc, turn) = match ctx.turns.try_apply() {
            Some(turn) => (mc, turn),
            None => {
                let wait = async {
                    if new {
                        ctx.turns.apply_new().await
                    } else {
                        ctx.turns.apply().await
                    }
                };
                let (_, turn) = tokio::join!(first_status(&mc, &ctx), wait);
                match ctx.stores.memcacheds.get(&key) {
                    Some(latest) => (latest, turn),
                    None => {
                        debug!("deleted while waiting for its turn");
                        return Ok(Action::await_change());
                    }
                }
            }
        };
        let mut pass = Pass {
            may_yield: true,
            ..Pass::default()
        };
        let first_pass = new.then(|| ctx.turns.first_pass());
        // Boxed: a reconcile waiting for its turn stays a small future; this part's state is allocated
        // when the turn comes.
        let result = Box::pin(reconcile_in_span(mc, ctx.clone(), &mut pass)).await;
        drop(first_pass);
        drop(turn);
        if !pass.yielded {
            return result;
        }
        debug!(
            "gave the turn up after creating the workload; the other children come in a second turn"
        );
        let turn = ctx.turns.second().await;
        let Some(mc) = ctx.stores.memcacheds.get(&key) else {
            debug!("deleted while waiting for its second turn");
            return Ok(Action::await_change());
        };
        pass.may_yield = false;
        let result = Box::pin(reconcile_in_span(mc, ctx.clone(), &mut pass)).await;
        drop(turn);
        result
    }
    .instrument(span)
    .await
}

/// A reconcile's passes: a new instance's first ends once its workload is created when other new
/// instances wait for their turns, and a second turn applies the rest (see [`super::turns`]).
#[derive(Debug, Default)]
struct Pass {
    /// Whether this pass may end after creating the workload.
    may_yield: bool,
    /// Set when it did.
    yielded: bool,
    /// What the first pass changed, published with what the second changes (one `Created` event).
    changes: Changes,
}

/// Writes the first status of an instance that has none (`Progressing=True`, `Creating`, its counts) while
/// its reconcile waits for its turn, so that `kubectl get memcached` shows progress right after
/// `kubectl apply` however many reconciles are queued (see [`super::turns`]). It says what the
/// reconcile would have written after creating the workload, and the reconcile finds it (read-your-writes),
/// so it costs no request more. Skipped for an invalid spec, whose first status the reconcile writes as
/// `Degraded` in one write. A failure is left to the reconcile.
async fn first_status(mc: &Arc<Memcached>, ctx: &Context) {
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

async fn reconcile_in_span(
    mc: Arc<Memcached>,
    ctx: Arc<Context>,
    pass: &mut Pass,
) -> Result<Action, Error> {
    let _timer = ctx.metrics.reconcile_timer();
    ctx.metrics.set_instances(ctx.stores.memcacheds.len());
    ctx.written.prune();
    let key = ObjectRef::from_obj(mc.as_ref());
    let result = reconcile_instance(mc.clone(), &ctx, pass).await;
    match &result {
        Ok(action) => {
            ctx.backoff.reset(&key);
            ctx.metrics.reconciled(None);
            debug!(?action, "reconciled");
        }
        Err(error) if error.unanswered() => {
            // The API server did not answer: the outage is reported once, not per retry, and an event
            // could not be published either. The retry follows the backoff, and the end of the outage
            // reconciles every instance at once.
            ctx.metrics.reconciled(Some(error.kind()));
            debug!(%error, "reconcile failed: the API server did not answer");
        }
        Err(error) => {
            ctx.metrics.reconciled(Some(error.kind()));
            warn!(%error, "reconcile failed");
            let event = warning("ReconcileFailed", "Reconcile", error.to_string());
            ctx.events.send(&mc.object_ref(&()), event).await;
        }
    }
    result
}

/// The instance as its cache holds it now, or `mc` if the cache no longer holds it (deleted meanwhile: the
/// reconcile goes on from `mc`, as it did before this was asked, and the deletion is handled as it comes).
///
/// The copy a reconcile was started with was read when it was queued, and may be older than the cache by
/// the time the reconcile asks `written` for the fresher of the two: if the watch has meanwhile brought this
/// operator's own status write, `written` has dropped its kept answer (the cache caught up), and the old
/// copy, without that status, would be taken for the latest and the same status written again. The
/// cache's current copy closes that window.
fn latest(ctx: &Context, mc: Arc<Memcached>) -> Arc<Memcached> {
    ctx.stores
        .memcacheds
        .get(&ObjectRef::from_obj(mc.as_ref()))
        .unwrap_or(mc)
}

/// The legacy finalizer's removal (see [`legacy_finalizer`]), then apply, unless the instance is being
/// deleted. The instance is read as this operator last wrote it when the cache has not caught up with that
/// write yet.
async fn reconcile_instance(
    mc: Arc<Memcached>,
    ctx: &Context,
    pass: &mut Pass,
) -> Result<Action, Error> {
    let Some(namespace) = mc.namespace() else {
        return Err(Error::Malformed("it has no namespace".into()));
    };
    let name = mc.name_any();
    let mc = latest(ctx, mc);
    let mc = ctx
        .written
        .fresher(&namespace, &name, &(), Some(mc.clone()))
        .object
        .unwrap_or(mc);
    let deleting = mc.metadata.deletion_timestamp.is_some();
    let mc = match legacy_finalizer::remove_patch(&mc) {
        None => mc,
        Some(patch) => {
            let api: Api<Memcached> = Api::namespaced(ctx.client.clone(), &namespace);
            let Some(patched) = legacy_finalizer::remove(&api, &mc, patch).await? else {
                // Deleted meanwhile (or another replica removed the finalizer of a deleted instance just
                // before, as after a leader hand-over): the work is done.
                debug!("already deleted; nothing left to do");
                return Ok(Action::await_change());
            };
            info!("removed the finalizer an earlier build of the operator added");
            if deleting {
                return Ok(Action::await_change());
            }
            // Reconciled as stored now, and kept (read-your-writes): a reconcile that runs before the
            // watch brings the patch back must not send it again.
            let mut patched = patched;
            crate::store::compact::trim_instance(&mut patched);
            if let Ok(kept) = Compact::encode(&patched) {
                ctx.written.remember(Arc::new(kept), &());
            }
            Arc::new(patched)
        }
    };
    if deleting {
        // Held by someone else's finalizer: its children go by garbage collection once it is gone, and
        // nothing written now would outlive it.
        debug!("being deleted; nothing to do");
        return Ok(Action::await_change());
    }
    apply(&mc, ctx, pass).await
}

/// Retry policy for failed reconciles: per-object exponential backoff with jitter.
///
/// A failure counted for an instance that is gone from the cache is dropped again: no reconcile (and so no
/// reset) follows a deletion, and the watch that saw the deletion may have forgotten the instance just
/// before this failure was counted. Counting first and looking second leaves no window where both miss it.
pub fn error_policy(mc: Arc<Memcached>, _error: &Error, ctx: Arc<Context>) -> Action {
    let key = ObjectRef::from_obj(mc.as_ref());
    let delay = ctx.backoff.next_delay(&key);
    if ctx.stores.memcacheds.get(&key).is_none() {
        ctx.backoff.reset(&key);
    }
    Action::requeue(delay)
}

async fn apply(mc: &Memcached, ctx: &Context, pass: &mut Pass) -> Result<Action, Error> {
    let workload = || pool::cached_workload(ctx, mc);
    let instance = match Instance::new(mc, &ctx.settings.defaults) {
        Ok(instance) => instance,
        Err(invalid) => {
            // Nothing is applied until the spec changes: the pods keep running as they were, and retrying
            // cannot help, so report it and wait.
            let selector = valid_selector(mc);
            let held = report(mc, ctx, workload(), None, Some(invalid.into()), selector).await?;
            return Ok(requeue_within(ctx, [held]));
        }
    };
    let selector = Some(labels::selector_string(instance.name));
    if let Some(changed) = pool::workload_changed(ctx, &instance, mc) {
        let held = report(mc, ctx, workload(), None, Some(changed), selector).await?;
        return Ok(requeue_within(ctx, [held]));
    }
    let secret_hash = match secrets::resolve(ctx, &instance).await {
        Ok(Resolved::Ready(hash)) => hash,
        Ok(Resolved::Missing(missing)) => {
            // The Secret watch brings the instance back as soon as the Secret appears or changes.
            let held = report(mc, ctx, workload(), None, Some(missing.into()), selector).await?;
            return Ok(requeue_within(ctx, [held]));
        }
        Err(error) => {
            return Err(fail(mc, ctx, error, workload(), selector).await);
        }
    };
    let mut changes = std::mem::take(&mut pass.changes);
    let carried_workload = changes.workload_changed();
    let applied = apply_children(
        mc,
        &instance,
        secret_hash.as_deref(),
        ctx,
        &mut changes,
        pass.may_yield,
    )
    .await;
    if changes.workload_changed() && !carried_workload {
        // The workload's status, and so the instance's, moves on within a moment by itself.
        ctx.pace.wrote(instance.namespace, instance.name);
    }
    if matches!(&applied, Ok(applied) if applied.yielded) {
        // Published with the second pass's: one `Created` event for all the children.
        pass.yielded = true;
        pass.changes = changes;
    } else {
        // What was changed is recorded even when a later child failed.
        changes.publish(ctx, &mc.object_ref(&())).await;
    }
    match applied {
        Ok(applied) => {
            let published = Some(Published {
                servers: applied.servers,
                drain: applied.drain,
                pods: applied.pods,
                handovers: applied.handovers,
            });
            // Compared with the first status just written, not with the instance as it came (none): as
            // this operator wrote it, or as the cache holds it once the watch has brought that write. Only
            // the status is taken: the spec and generation stay the ones the children were applied from.
            let with_first_status;
            let mc = if applied.wrote_first_status {
                let (namespace, name) = (mc.namespace().unwrap_or_default(), mc.name_any());
                let cached = ctx.stores.memcacheds.get(&ObjectRef::from_obj(mc));
                let latest = ctx.written.fresher(&namespace, &name, &(), cached).object;
                with_first_status = Memcached {
                    status: latest.and_then(|latest| latest.status.clone()),
                    ..mc.clone()
                };
                &with_first_status
            } else {
                mc
            };
            let held = report(
                mc,
                ctx,
                Some(applied.workload),
                published,
                applied.problem,
                selector,
            )
            .await?;
            Ok(requeue_within(ctx, [held, applied.wait]))
        }
        Err(error) => Err(fail(mc, ctx, error, workload(), selector).await),
    }
}

/// The safety requeue, or sooner when something is due sooner (a held-back status, a drain).
fn requeue_within<const N: usize>(ctx: &Context, due: [Option<Duration>; N]) -> Action {
    let after = due
        .into_iter()
        .flatten()
        .fold(ctx.settings.requeue_after, Duration::min);
    Action::requeue(after)
}

/// Records an error worth a condition in the status (best effort) and hands it back for the retry.
async fn fail(
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
fn valid_selector(mc: &Memcached) -> Option<String> {
    let name = mc.name_any();
    let valid = name.len() <= 63 && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
    valid.then(|| labels::selector_string(&name))
}

/// What [`apply_children`] leaves for the status.
struct Children {
    workload: WorkloadStatus,
    servers: Vec<Server>,
    drain: Option<Drain>,
    /// The instance's pods as the plan read them (decoded once per reconcile).
    pods: Vec<Arc<Pod>>,
    /// A problem that does not stop the rest (a ServiceMonitor the cluster cannot serve).
    problem: Option<Problem>,
    /// The warm-handover copies running.
    handovers: Vec<HandoverProgress>,
    /// How long until a drain is due, a paced rollout may replace the next server, or a running copy's
    /// progress is shown.
    wait: Option<Duration>,
    /// The workload was created and the turn given up before the other children (see [`Pass`]).
    yielded: bool,
    /// The instance's first status was written right after its workload was created (in a burst).
    wrote_first_status: bool,
}

/// Applies the children in a fixed order (drain marks, server list ConfigMap, workload, Services,
/// PodDisruptionBudget, NetworkPolicy, HorizontalPodAutoscaler, ServiceMonitor), removes the optional
/// ones that are no longer wanted, and records what changed in `changes`. The server list goes before
/// the workload, so a scale-down is published before any server is removed; it exists only once there was
/// a server to publish.
///
/// When `may_yield`, the workload was created now and other new instances wait for their turns, it stops
/// after the workload (see [`Pass`]). When other new instances take their first turns meanwhile (a burst
/// that nobody waits in yet), the instance's first status is written right after its workload.
async fn apply_children(
    mc: &Memcached,
    instance: &Instance<'_>,
    secret_hash: Option<&str>,
    ctx: &Context,
    changes: &mut Changes,
    may_yield: bool,
) -> Result<Children, Error> {
    let reference = mc.object_ref(&());
    let stores = &ctx.stores;
    let (client, ns) = (&ctx.client, instance.namespace);
    let pods = pool::pods(ctx, mc);
    let plan = pool::plan(ctx, mc, instance, &pods);
    let scope = Scope { ctx, instance };
    unclaimed_names(&scope)?;
    for step in &plan.steps {
        if let Step::Cancelled { from, to, size } = step {
            let note = format!(
                "Cancelled the drain from {from} to {to} servers: spec.size is {size} again; every server stays"
            );
            ctx.events
                .record(&reference, normal("DrainCancelled", "Scale", note))
                .await;
        }
    }
    pool::apply_marks(ctx, instance, &plan.marks).await?;

    // The server list is created with the first published server, in the one write that fills it; from
    // then on it is kept current, an empty list included.
    let list = servers::config_map(instance, &plan.servers);
    let name = list.name_any();
    let source = scope.source(&stores.children.config_maps, &());
    if servers::publishes(&plan.servers) || children::cached(instance, &name, &source)?.is_some() {
        let api = Api::namespaced(client.clone(), ns);
        let applied = children::ensure(instance, list, &source, api).await?;
        // Not an event: it comes with the first ready server, not with the instance's creation, and the
        // list changes with every server that comes and goes. One event per instance says "Created".
        if applied.changed && applied.previous.is_none() {
            info!(
                config_map = %name,
                "created the server list with the first ready server"
            );
        }
    }
    for step in &plan.steps {
        if let Step::Draining { from, to } = step {
            let note = format!(
                "Draining: published {to} of {from} servers; the other {} go after {} s",
                from - to,
                instance.spec.drain_seconds()
            );
            ctx.events
                .record(&reference, normal("Draining", "Scale", note))
                .await;
        }
    }

    // The handover step, once, in the workload's arm (see `handover::engine`).
    let view = |rollout| View {
        mc,
        instance,
        pods: &pods,
        servers: &plan.servers,
        scale: plan.scale.as_ref(),
        rollout,
    };
    // How long until a StatefulSet rollout may move on to the next server, or a copy's progress is shown.
    let rollout_wait;
    let handovers;
    let created_workload;
    let workload = match instance.spec.workload {
        Workload::Deployment => {
            let mut desired = deployment::deployment(instance, plan.replicas, secret_hash);
            let live = children::cached(
                instance,
                instance.name,
                &scope.source(&stores.children.deployments, &()),
            )?;
            // Without a surge the old pod goes before the new one starts: nothing to copy from.
            created_workload = live.is_none();
            let handover =
                instance.spec.handover().enabled() && !pod::hard_anti_affinity(instance.spec);
            if gate::gate_wanted(handover, &desired, live.as_deref()) {
                gate::add_gate(&mut desired);
            }
            let applied = ensure_workload(
                &scope,
                desired,
                &stores.children.deployments,
                plan.replicas,
                changes,
                |d| d.spec.as_ref().and_then(|s| s.replicas),
            )
            .await?;
            // The list a scale changes is published (or held back) above; its copies run from here on.
            let step = ctx.handover.step(view(Rollout::Deployment)).await?;
            handovers = step.progress;
            rollout_wait = step.wait;
            WorkloadStatus::from(applied.as_ref())
        }
        Workload::StatefulSet => {
            let mut desired = statefulset::statefulset(instance, plan.replicas, secret_hash, 0);
            let source = scope.source(&stores.children.statefulsets, &());
            let live = children::cached(instance, instance.name, &source)?;
            created_workload = live.is_none();
            let enabled = instance.spec.handover().enabled();
            let template = |s: &StatefulSet| s.spec.as_ref().map(|s| s.template.clone());
            let live_template = live.as_deref().and_then(template);
            if gate::template_gate_wanted(
                enabled,
                template(&desired).as_ref(),
                live_template.as_ref(),
            ) && let Some(spec) = desired.spec.as_mut()
            {
                gate::add_template_gate(&mut spec.template);
            }
            let pod_refs: Vec<&Pod> = pods.iter().map(Arc::as_ref).collect();
            let pace = rollout::paced(
                &desired,
                live.as_deref(),
                &pod_refs,
                instance.spec.warmup_seconds(),
                enabled,
                &(ctx.clock)(),
            );
            let rollout = Rollout::StatefulSet {
                template: desired.spec.as_ref().map(|s| &s.template),
                pace: &pace,
                live: live.as_deref(),
            };
            let staging = ctx.handover.step(view(rollout)).await?;
            statefulset::set_partition(&mut desired, staging.partition.unwrap_or(pace.partition));
            handovers = staging.progress;
            rollout_wait = [pace.wait, staging.wait].into_iter().flatten().min();
            let applied = ensure_workload(
                &scope,
                desired,
                &stores.children.statefulsets,
                plan.replicas,
                changes,
                |s| s.spec.as_ref().and_then(|s| s.replicas),
            )
            .await?;
            WorkloadStatus::from(applied.as_ref())
        }
    };
    if may_yield && created_workload && ctx.turns.new_waiting() {
        return Ok(Children {
            workload,
            servers: plan.servers,
            drain: plan.drain,
            pods,
            problem: None,
            handovers,
            wait: None,
            yielded: true,
            wrote_first_status: false,
        });
    }
    // At the start of a burst nobody waits for a turn yet: the first new instances take theirs at once and
    // find each other here. Their first statuses go now, not after their Services (each allocates a
    // ClusterIP, the slowest writes of a burst); their Services follow in the same turn.
    let wrote_first_status =
        created_workload && mc.status.is_none() && ctx.turns.other_new_instances();
    if wrote_first_status {
        let early = Published {
            servers: plan.servers.clone(),
            drain: plan.drain.clone(),
            pods: pods.clone(),
            handovers: handovers.clone(),
        };
        let selector = Some(labels::selector_string(instance.name));
        report(mc, ctx, Some(workload.clone()), Some(early), None, selector).await?;
    }
    for step in &plan.steps {
        if let Step::Drained { from, to } = step {
            let note = format!(
                "Drained: removing {} servers after the drain ({from} to {to})",
                from - to
            );
            ctx.events
                .record(&reference, normal("Drained", "Scale", note))
                .await;
        }
    }

    let services: Api<Compact<Service>> = Api::namespaced(client.clone(), ns);
    for desired in [service::service(instance), service::headless(instance)] {
        let name = desired.name_any();
        let desired = Some(desired);
        sync_child(
            &scope,
            &name,
            desired,
            &scope.source(&stores.children.services, &()),
            services.clone(),
            changes,
        )
        .await?;
    }
    let pdbs: Api<Compact<PodDisruptionBudget>> = Api::namespaced(client.clone(), ns);
    sync_child(
        &scope,
        instance.name,
        pdb::pdb(instance),
        &scope.source(&stores.children.pdbs, &()),
        pdbs,
        changes,
    )
    .await?;
    let network_policies: Api<Compact<NetworkPolicy>> = Api::namespaced(client.clone(), ns);
    sync_child(
        &scope,
        instance.name,
        network_policy::network_policy(instance),
        &scope.source(&stores.children.network_policies, &()),
        network_policies,
        changes,
    )
    .await?;
    let autoscalers: Api<Compact<HorizontalPodAutoscaler>> = Api::namespaced(client.clone(), ns);
    sync_child(
        &scope,
        instance.name,
        autoscaler::autoscaler(instance),
        &scope.source(&stores.children.autoscalers, &()),
        autoscalers,
        changes,
    )
    .await?;

    let mut problem = None;
    let monitor = service_monitor::service_monitor(instance);
    match &stores.service_monitors {
        Some(store) => {
            let resource = service_monitor::api_resource();
            let api = Api::namespaced_with(client.clone(), ns, &resource);
            let source = scope.source(store, &resource);
            sync_child(&scope, instance.name, monitor, &source, api, changes).await?;
        }
        None if monitor.is_some() => {
            problem = Some(Problem {
                reason: "ServiceMonitorUnavailable".into(),
                message: "spec.monitoring.serviceMonitor is enabled, but the cluster did not serve \
                          monitoring.coreos.com/v1 ServiceMonitor when the operator started; install the \
                          Prometheus Operator CRDs and restart the operator, or disable the ServiceMonitor"
                    .into(),
            });
        }
        None => {}
    }
    Ok(Children {
        workload,
        servers: plan.servers,
        drain: plan.drain,
        pods,
        problem,
        handovers,
        wait: [plan.wait, rollout_wait].into_iter().flatten().min(),
        yielded: false,
        wrote_first_status,
    })
}

/// Applies the workload (`replicas` of them) and records it as created, scaled or updated.
async fn ensure_workload<K>(
    scope: &Scope<'_>,
    desired: K,
    store: &Cache<K>,
    replicas: i32,
    changes: &mut Changes,
    replicas_of: fn(&K) -> Option<i32>,
) -> Result<Arc<K>, Error>
where
    K: Compactable<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Debug
        + Send
        + Sync,
{
    let (instance, kind) = (scope.instance, K::kind(&()));
    let api = Api::namespaced(scope.ctx.client.clone(), instance.namespace);
    let applied = children::ensure(instance, desired, &scope.source(store, &()), api).await?;
    if applied.changed {
        changes.workload();
        let name = instance.name;
        // A workload without replicas has the API server's default, 1.
        let before = applied
            .previous
            .as_deref()
            .map(|p| replicas_of(p).unwrap_or(1));
        match before {
            None => changes.created(format!("{kind} {name} with {replicas} replicas")),
            Some(before) if before != replicas => changes.scaled(format!(
                "{kind} {name} from {before} to {replicas} replicas"
            )),
            Some(_) => changes.updated(format!("{kind} {name}")),
        }
    }
    applied.current()
}

/// The instance being reconciled, and where its children are read from.
struct Scope<'a> {
    ctx: &'a Context,
    instance: &'a Instance<'a>,
}

impl Scope<'_> {
    fn source<'s, K>(&'s self, store: &'s Cache<K>, dt: &'s K::DynamicType) -> Source<'s, K>
    where
        K: Resource + 'static,
        K::DynamicType: Eq + Hash,
    {
        Source {
            store,
            written: &self.ctx.written,
            dt,
            foreign: &self.ctx.stores.foreign,
        }
    }
}

/// Refuses, before anything is written, an instance whose server list, workload or Services would have
/// the name of an object the operator does not manage; the optional children are checked as they are
/// applied.
fn unclaimed_names(scope: &Scope<'_>) -> Result<(), Error> {
    let (stores, name) = (&scope.ctx.stores, scope.instance.name);
    let instance = scope.instance;
    children::unclaimed(
        instance,
        &servers::config_map_name(name),
        &scope.source(&stores.children.config_maps, &()),
    )?;
    match instance.spec.workload {
        Workload::Deployment => children::unclaimed(
            instance,
            name,
            &scope.source(&stores.children.deployments, &()),
        )?,
        Workload::StatefulSet => children::unclaimed(
            instance,
            name,
            &scope.source(&stores.children.statefulsets, &()),
        )?,
    }
    let services = scope.source(&stores.children.services, &());
    children::unclaimed(instance, name, &services)?;
    children::unclaimed(instance, &service::headless_name(name), &services)
}

/// Applies the optional child `name` as `desired`, or deletes it when nothing is desired (and the cache
/// shows one), and records what changed.
async fn sync_child<K>(
    scope: &Scope<'_>,
    name: &str,
    desired: Option<K>,
    source: &Source<'_, K>,
    api: Api<Compact<K>>,
    changes: &mut Changes,
) -> Result<(), Error>
where
    K: Compactable + Debug + Send + Sync,
    K::DynamicType: Clone + Eq + Hash,
{
    let what = format!("{} {name}", K::kind(source.dt));
    match desired {
        Some(desired) => {
            let applied = children::ensure(scope.instance, desired, source, api).await?;
            match (applied.changed, applied.previous.is_some()) {
                (true, false) => changes.created(what),
                (true, true) => changes.updated(what),
                (false, _) => {}
            }
        }
        None => {
            if children::remove(scope.instance, name, source, api).await? {
                changes.deleted(what);
            }
        }
    }
    Ok(())
}

/// The pool as one reconcile settled it, for its status.
struct Published {
    servers: Vec<Server>,
    drain: Option<Drain>,
    pods: Vec<Arc<Pod>>,
    handovers: Vec<HandoverProgress>,
}

/// Computes the status from what exists and writes it if it changed, unless the change can wait (see
/// [`super::pace`]): then it returns how long until it may be written.
/// `published` holds the server slots and drain this reconcile settled on, and the pods it read; without
/// it (nothing was applied) the stored slots and drain are kept, and the pods are read here.
async fn report(
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
            pods: pool::pods(ctx, mc),
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
async fn patch_status(
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
