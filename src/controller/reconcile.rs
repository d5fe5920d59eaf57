//! Reconcile: finalizer → validate → build → apply (only what differs) → status (only when it differs).

use std::sync::Arc;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType};
use kube::runtime::finalizer::{Event as FinalizerEvent, finalizer};
use kube::runtime::reflector::ObjectRef;
use kube::{Api, Resource, ResourceExt};
use serde_json::json;
use tracing::{debug, info, warn};

use super::children::{self, Applied};
use super::{Context, Error};
use crate::api::{FINALIZER, Memcached, MemcachedStatus};
use crate::resources::{Instance, deployment, labels, service};
use crate::status::{self, DEGRADED, Observed, Problem};

/// Reconciles one instance. Idempotent and level-based: it never asks why it was called.
pub async fn reconcile(mc: Arc<Memcached>, ctx: Arc<Context>) -> Result<Action, Error> {
    let _timer = ctx.metrics.reconcile_timer();
    ctx.metrics.set_instances(ctx.stores.memcacheds.len());
    let key = ObjectRef::from_obj(mc.as_ref());
    let result = match mc.namespace() {
        None => Err(Error::Malformed("it has no namespace".into())),
        Some(namespace) => {
            let api: Api<Memcached> = Api::namespaced(ctx.client.clone(), &namespace);
            finalizer(&api, FINALIZER, mc.clone(), |event| async {
                match event {
                    FinalizerEvent::Apply(mc) => apply(&mc, &ctx).await,
                    FinalizerEvent::Cleanup(mc) => cleanup(&mc, &ctx).await,
                }
            })
            .await
            .map_err(Error::from)
        }
    };
    match &result {
        Ok(action) => {
            ctx.backoff.reset(&key);
            ctx.metrics.reconciled(None);
            debug!(memcached = %key, ?action, "reconciled");
        }
        Err(error) => {
            ctx.metrics.reconciled(Some(error.kind()));
            warn!(memcached = %key, %error, "reconcile failed");
            let event = warning("ReconcileFailed", "Reconcile", error.to_string());
            publish(&ctx, &mc.object_ref(&()), event).await;
        }
    }
    result
}

/// Retry policy for failed reconciles: per-object exponential backoff with jitter.
pub fn error_policy(mc: Arc<Memcached>, _error: &Error, ctx: Arc<Context>) -> Action {
    Action::requeue(ctx.backoff.next_delay(&ObjectRef::from_obj(mc.as_ref())))
}

async fn apply(mc: &Memcached, ctx: &Context) -> Result<Action, Error> {
    let requeue = Action::requeue(ctx.settings.requeue_after);
    let instance = match Instance::new(mc, &ctx.settings.defaults) {
        Ok(instance) => instance,
        Err(invalid) => {
            // Nothing can be applied until the object changes: report it and wait; retrying cannot help.
            report(mc, ctx, None, Some(invalid.into()), None).await?;
            return Ok(requeue);
        }
    };
    let selector = Some(labels::selector_string(instance.name));
    match apply_children(mc, &instance, ctx).await {
        Ok(deployment) => {
            report(mc, ctx, Some(&deployment), None, selector).await?;
            Ok(requeue)
        }
        Err(error) => {
            if let Some(problem) = error.problem() {
                let cached = ctx
                    .stores
                    .deployments
                    .get(&ObjectRef::new(instance.name).within(instance.namespace));
                if let Err(e) = report(mc, ctx, cached.as_deref(), Some(problem), selector).await {
                    warn!(error = %e, "could not record the failure in the status");
                }
            }
            Err(error)
        }
    }
}

/// Applies the Deployment and the Service (in that order) and records what changed as events.
async fn apply_children(
    mc: &Memcached,
    instance: &Instance<'_>,
    ctx: &Context,
) -> Result<Arc<Deployment>, Error> {
    let reference = mc.object_ref(&());
    let desired = deployment::deployment(instance);
    let replicas = desired
        .spec
        .as_ref()
        .and_then(|s| s.replicas)
        .unwrap_or_default();
    let applied = children::ensure(ctx, instance, desired, &ctx.stores.deployments).await?;
    if applied.changed {
        let name = instance.name;
        let event = match previous_replicas(&applied) {
            None => normal(
                "Created",
                "Create",
                format!("Created Deployment {name} with {replicas} replicas"),
            ),
            Some(before) if before != replicas => normal(
                "Scaled",
                "Scale",
                format!("Scaled Deployment {name} from {before} to {replicas} replicas"),
            ),
            Some(_) => normal(
                "Updated",
                "Update",
                format!("Updated Deployment {name} to match the spec"),
            ),
        };
        info!(memcached = %instance.name, namespace = %instance.namespace, reason = %event.reason, "applied Deployment");
        publish(ctx, &reference, event).await;
    }

    let service = children::ensure(
        ctx,
        instance,
        service::service(instance),
        &ctx.stores.services,
    )
    .await?;
    if service.changed {
        let name = instance.name;
        let event = match service.previous {
            None => normal("Created", "Create", format!("Created Service {name}")),
            Some(_) => normal(
                "Updated",
                "Update",
                format!("Updated Service {name} to match the spec"),
            ),
        };
        info!(memcached = %instance.name, namespace = %instance.namespace, reason = %event.reason, "applied Service");
        publish(ctx, &reference, event).await;
    }
    Ok(applied.current)
}

fn previous_replicas(applied: &Applied<Deployment>) -> Option<i32> {
    let previous = applied.previous.as_ref()?;
    Some(previous.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1))
}

/// Computes the status from what exists and writes it if it changed.
async fn report(
    mc: &Memcached,
    ctx: &Context,
    deployment: Option<&Deployment>,
    problem: Option<Problem>,
    selector: Option<String>,
) -> Result<(), Error> {
    let name = mc.name_any();
    let namespace = mc.namespace();
    let pods: Vec<Arc<Pod>> = ctx.stores.pods.state_filter(|pod| {
        pod.metadata.namespace == namespace
            && pod.labels().get(labels::INSTANCE_KEY) == Some(&name)
            && pod.labels().get(labels::NAME_KEY).map(String::as_str) == Some(labels::APP_NAME)
    });
    let observed = Observed {
        generation: mc.metadata.generation,
        size: mc.spec.size,
        selector,
        deployment,
        pods: pods.iter().map(Arc::as_ref).collect(),
        problem,
    };
    let new = status::compute(&observed, mc.status.as_ref(), &(ctx.clock)());
    if mc.status.as_ref() == Some(&new) {
        return Ok(());
    }
    patch_status(mc, ctx, &new).await?;

    // A new reason to be degraded is worth a Warning event; the same one again is not.
    let before = status::find(mc.status.as_ref(), DEGRADED);
    if let Some(degraded) = status::find(Some(&new), DEGRADED).filter(|c| c.status == "True")
        && before.is_none_or(|b| b.status != "True" || b.reason != degraded.reason)
    {
        let event = warning(&degraded.reason, "Reconcile", degraded.message.clone());
        publish(ctx, &mc.object_ref(&()), event).await;
    }
    Ok(())
}

/// Server-side applies the whole status through the status subresource. Fields the operator no longer
/// sets are removed, because it owns them all.
async fn patch_status(
    mc: &Memcached,
    ctx: &Context,
    status: &MemcachedStatus,
) -> Result<(), Error> {
    let name = mc.name_any();
    let api: Api<Memcached> =
        Api::namespaced(ctx.client.clone(), &mc.namespace().unwrap_or_default());
    let patch = json!({
        "apiVersion": Memcached::api_version(&()),
        "kind": Memcached::kind(&()),
        "status": status,
    });
    api.patch_status(
        &name,
        &PatchParams::apply(labels::MANAGER_NAME).force(),
        &Patch::Apply(&patch),
    )
    .await
    .map_err(|source| Error::Status { name, source })?;
    Ok(())
}

/// Deletion: record it, mark the status, let the finalizer go. Every step is best-effort and time-bounded,
/// so deletion never waits on a failing side step; the children go by garbage collection.
async fn cleanup(mc: &Memcached, ctx: &Context) -> Result<Action, Error> {
    let name = mc.name_any();
    info!(memcached = %name, namespace = ?mc.namespace(), "finalizing");
    let event = warning(
        "Deleting",
        "Delete",
        format!(
            "Deleting Memcached {name}; its Deployment and Service are removed by garbage collection"
        ),
    );
    publish(ctx, &mc.object_ref(&()), event).await;

    let new = status::finalizing(mc.status.as_ref(), mc.metadata.generation, &(ctx.clock)());
    if mc.status.as_ref() != Some(&new) {
        match tokio::time::timeout(ctx.settings.side_step_timeout, patch_status(mc, ctx, &new))
            .await
        {
            Ok(Ok(())) => {}
            Ok(Err(error)) => {
                warn!(%error, "could not mark the Memcached as finalizing; continuing")
            }
            Err(_) => warn!("timed out marking the Memcached as finalizing; continuing"),
        }
    }
    Ok(Action::await_change())
}

fn normal(reason: &str, action: &str, note: String) -> Event {
    event(EventType::Normal, reason, action, note)
}

fn warning(reason: &str, action: &str, note: String) -> Event {
    event(EventType::Warning, reason, action, note)
}

fn event(type_: EventType, reason: &str, action: &str, note: String) -> Event {
    Event {
        type_,
        reason: reason.to_owned(),
        // The Events API limits notes to 1 kB.
        note: Some(truncate(note, 1000)),
        action: action.to_owned(),
        secondary: None,
    }
}

fn truncate(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
    s
}

/// Publishes an event; failures are logged, never returned: an event is not worth failing a reconcile.
async fn publish(ctx: &Context, reference: &ObjectReference, event: Event) {
    match tokio::time::timeout(
        ctx.settings.side_step_timeout,
        ctx.events.publish(&event, reference),
    )
    .await
    {
        Ok(Ok(())) => {}
        Ok(Err(error)) => warn!(%error, reason = %event.reason, "could not publish event"),
        Err(_) => warn!(reason = %event.reason, "timed out publishing event"),
    }
}

#[cfg(test)]
mod tests {
    use super::truncate;

    #[test]
    fn truncate_respects_char_boundaries() {
        assert_eq!(truncate("héllo".into(), 2), "h");
        assert_eq!(truncate("hello".into(), 10), "hello");
    }
}
