//! Reconcile: the legacy finalizer's removal (older instances only) → validate → plan the pool (slots,
//! drain) → build and apply the children ([`super::apply`], only what differs) → status
//! ([`super::report`], only when it differs).
//!
//! A reconcile reads its instance's pods and children once, through a [`View`], and writes through the
//! context's client, read-your-writes and event publisher.
//!
//! A deleted instance needs nothing from the operator: its children carry its controller owner reference,
//! so garbage collection removes them, and the watch that sees it go drops what the operator kept about it
//! in memory (see `Context::forget`).

use std::sync::Arc;

use kube::Api;
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use tracing::{Instrument, debug, info, warn};

use super::apply;
use super::changes::Changes;
use super::context::Context;
use super::error::Error;
use super::legacy_finalizer;
use super::report::{self, Outcome, first_status};
use super::turns::{CLAIM_WITHIN, Reserved};
use super::view::{Reads, Stop, View, latest};
use crate::api::Memcached;
use crate::resources::Instance;
use crate::store::compact::Compact;
use crate::store::events::warning;

/// Reconciles one instance. Idempotent and level-based: it never asks why it was called.
///
/// Everything logged on the way carries the instance through the `reconcile` span (`memcached`,
/// `namespace`), inside kube's own `reconciling object` span (the object and what triggered it); the span
/// ends with the reconcile's `outcome`: `reconciled`, `failed`, `waiting` (for a turn) or `yielded` (the
/// turn given up after creating the workload, the rest in a second turn).
///
/// It takes its turn first (see [`turns`](super::turns)): one reserved for it, or a free one. When none is
/// free it ends at once and a task of its own waits for the turn (writing a new instance's first status
/// meanwhile), then makes the instance due again with the turn reserved for it.
#[tracing::instrument(
    skip_all,
    fields(
        memcached = %mc.name_any(),
        namespace = %mc.metadata.namespace.as_deref().unwrap_or_default(),
        outcome = tracing::field::Empty,
    ),
)]
pub async fn reconcile(mc: Arc<Memcached>, ctx: Arc<Context>) -> Result<Action, Error> {
    let key = ObjectRef::from_obj(mc.as_ref());
    let new = Reads::of(&ctx.stores, &mc).workload.is_none();
    let turns = &ctx.memory.turns;
    let (turn, mut pass) = match turns.claim(&key) {
        Some(Reserved {
            turn,
            second: Some(changes),
        }) => (turn, Pass::second(changes)),
        Some(Reserved { turn, second: None }) => (turn, Pass::first()),
        None if turns.waits(&key) => return Ok(ended("waiting")),
        None => match turns.try_apply() {
            Some(turn) => (turn, Pass::first()),
            None => {
                wait_for_turn(mc, &ctx, key, Waited::First { new });
                return Ok(ended("waiting"));
            }
        },
    };
    let first_pass = (new && pass.may_yield).then(|| turns.first_pass());
    // Boxed: this part's state is allocated when the turn comes.
    let result = Box::pin(reconcile_in_span(mc.clone(), ctx.clone(), &mut pass)).await;
    drop(first_pass);
    drop(turn);
    if !pass.yielded || result.is_err() {
        let outcome = if result.is_ok() {
            "reconciled"
        } else {
            "failed"
        };
        tracing::Span::current().record("outcome", outcome);
        return result;
    }
    debug!(
        "gave the turn up after creating the workload; the other children come in a second turn"
    );
    wait_for_turn(mc, &ctx, key, Waited::Second(pass.changes));
    Ok(ended("yielded"))
}

/// Ends a reconcile that waits for a turn (`outcome` in its span): no requeue, the task that waits for
/// the turn makes the instance due when it comes.
fn ended(outcome: &'static str) -> Action {
    tracing::Span::current().record("outcome", outcome);
    Action::await_change()
}

/// The turn a waiter takes: a first one (for a new instance, counted among the new instances waiting, and
/// its first status written meanwhile), or a second one after a first pass that gave its turn up.
enum Waited {
    First { new: bool },
    Second(Changes),
}

/// Hands the wait for `key`'s turn to a task of its own, unless one already waits for it (see
/// [`turns`](super::turns)): the task takes the turn in order, reserves it for the instance and makes it
/// due; a reservation nobody claims within [`CLAIM_WITHIN`] is given back.
fn wait_for_turn(
    mc: Arc<Memcached>,
    ctx: &Arc<Context>,
    key: ObjectRef<Memcached>,
    waited: Waited,
) {
    if !ctx.memory.turns.enqueue(&key) {
        return;
    }
    let ctx = ctx.clone();
    let span = tracing::Span::current();
    tokio::spawn(
        async move {
            let (turn, second) = match waited {
                Waited::First { new } => {
                    let wait = async {
                        if new {
                            ctx.memory.turns.apply_new().await
                        } else {
                            ctx.memory.turns.apply().await
                        }
                    };
                    let (_, turn) = tokio::join!(first_status(&mc, &ctx), wait);
                    (turn, None)
                }
                Waited::Second(changes) => (ctx.memory.turns.second().await, Some(changes)),
            };
            if ctx.stores.memcacheds.get(&key).is_none() {
                debug!("deleted while waiting for its turn");
                ctx.memory.turns.abandon(&key);
                return;
            }
            let id = ctx.memory.turns.reserve(&key, Reserved { turn, second });
            // The context is not kept alive for this: a stopped controller's turns go with it.
            let weak = Arc::downgrade(&ctx);
            drop((ctx, mc));
            tokio::time::sleep(CLAIM_WITHIN).await;
            if weak.upgrade().is_some_and(|ctx| ctx.memory.turns.expire(&key, id)) {
                warn!(within = ?CLAIM_WITHIN, "a turn reserved for the instance was not claimed; given back");
            }
        }
        .instrument(span),
    );
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

impl Pass {
    fn first() -> Self {
        Self {
            may_yield: true,
            ..Self::default()
        }
    }

    fn second(changes: Changes) -> Self {
        Self {
            changes,
            ..Self::default()
        }
    }
}

async fn reconcile_in_span(
    mc: Arc<Memcached>,
    ctx: Arc<Context>,
    pass: &mut Pass,
) -> Result<Action, Error> {
    let _timer = ctx.metrics.reconcile_timer();
    ctx.metrics.set_instances(ctx.stores.memcacheds.len());
    ctx.writer.written.prune();
    let key = ObjectRef::from_obj(mc.as_ref());
    let result = reconcile_instance(mc.clone(), &ctx, pass).await;
    // Whatever the outcome: an instance that cannot be applied must not hold the fleet rollout back.
    if let (Some(namespace), Some(name)) = (&mc.metadata.namespace, &mc.metadata.name) {
        let instances = ctx.stores.memcacheds.len();
        ctx.memory.fleet.saw(namespace, name, instances);
    }
    match &result {
        Ok(action) => {
            ctx.memory.backoff.reset(&key);
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
            ctx.writer.events.send(&mc.object_ref(&()), event).await;
        }
    }
    result
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
    let mc = latest(&ctx.stores, mc);
    let mc = ctx
        .writer
        .written
        .fresher(&namespace, &name, &(), Some(mc.clone()))
        .object
        .unwrap_or(mc);
    let deleting = mc.metadata.deletion_timestamp.is_some();
    let mc = match legacy_finalizer::remove_patch(&mc) {
        None => mc,
        Some(patch) => {
            let api: Api<Memcached> = ctx.writer.api(&namespace);
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
                ctx.writer.written.remember(Arc::new(kept), &());
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
    let delay = ctx.memory.backoff.next_delay(&key);
    if ctx.stores.memcacheds.get(&key).is_none() {
        ctx.memory.backoff.reset(&key);
    }
    Action::requeue(delay)
}

/// Validates, applies the children, and reports the outcome in the status.
async fn apply(mc: &Memcached, ctx: &Context, pass: &mut Pass) -> Result<Action, Error> {
    let reads = Reads::of(&ctx.stores, mc);
    let outcome = match Instance::new(mc, &ctx.settings.defaults) {
        // Nothing is applied until the spec changes: the pods keep running as they were, and retrying
        // cannot help, so report it and wait.
        Err(invalid) => Outcome::Held(invalid.into()),
        Ok(instance) => match View::read(
            &ctx.stores,
            &ctx.writer.written,
            &ctx.memory.secrets,
            mc,
            &instance,
            &reads,
        )
        .await
        {
            Ok(view) => apply_children(ctx, &view, pass).await,
            Err(Stop::Held(problem)) => Outcome::Held(problem),
            Err(Stop::Failed(error)) => Outcome::Failed(error),
        },
    };
    report::outcome(mc, ctx, reads, outcome).await
}

/// Applies the children of the instance `view` reads, and records what changed.
async fn apply_children(ctx: &Context, view: &View<'_>, pass: &mut Pass) -> Outcome {
    let instance = view.instance;
    let mut changes = std::mem::take(&mut pass.changes);
    let carried_workload = changes.workload_changed();
    let applied = apply::children(ctx, view, &mut changes, pass.may_yield).await;
    if changes.workload_changed() && !carried_workload {
        // The workload's status, and so the instance's, moves on within a moment by itself.
        ctx.memory.pace.wrote(instance.namespace, instance.name);
    }
    if matches!(&applied, Ok(applied) if applied.yielded) {
        // Published with the second pass's: one `Created` event for all the children.
        pass.yielded = true;
        pass.changes = changes;
    } else {
        // What was changed is recorded even when a later child failed.
        changes
            .publish(&ctx.writer.events, &view.mc.object_ref(&()))
            .await;
    }
    match applied {
        Ok(children) => Outcome::Applied(Box::new(children)),
        Err(error) => Outcome::Failed(error),
    }
}
