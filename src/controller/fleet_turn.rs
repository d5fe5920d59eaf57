//! The workload's pod template in one reconcile, the same for a Deployment and a StatefulSet: warm
//! handover's gate on the template as built, then the fleet rollout's turn (see [`super::fleet`]): the
//! desired workload records the cause of its template ([`fleet::Cause`]); a template the operator changed
//! ([`fleet::changed`]: not the owner, through the spec or a Secret, nor someone by hand) waits for the
//! instance's turn, keeping the live template and the cause it was built for.

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::PodTemplateSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;

use super::context::Context;
use super::fleet::{Found, Turn};
use super::view::View;
use crate::resources::{Instance, drift, fleet, pod};
use crate::status::{FleetWait, WorkloadStatus};
use crate::store::events::normal;

/// A workload kind with a pod template: its metadata, template and rollout status.
pub(super) trait Templated {
    fn parts(&self) -> Option<(&ObjectMeta, &PodTemplateSpec)>;
    fn parts_mut(&mut self) -> Option<(&mut ObjectMeta, &mut PodTemplateSpec)>;
    fn rollout(&self) -> WorkloadStatus;
}

/// Both workload kinds keep their template at `spec.template` and map their status the same way.
macro_rules! templated {
    ($($kind:ty),+) => {$(
        impl Templated for $kind {
            fn parts(&self) -> Option<(&ObjectMeta, &PodTemplateSpec)> {
                Some((&self.metadata, &self.spec.as_ref()?.template))
            }
            fn parts_mut(&mut self) -> Option<(&mut ObjectMeta, &mut PodTemplateSpec)> {
                Some((&mut self.metadata, &mut self.spec.as_mut()?.template))
            }
            fn rollout(&self) -> WorkloadStatus {
                WorkloadStatus::from(self)
            }
        }
    )+};
}
templated!(Deployment, StatefulSet);

/// Gates `desired`'s template when its rollout can be `warm`, then takes the fleet turn against `live`
/// for `replicas` pods: `Some` while the operator's change waits (the desired template is then the
/// live one).
pub(super) async fn template_turn<K: Templated>(
    ctx: &Context,
    view: &View<'_>,
    (warm, replicas): (bool, i32),
    desired: &mut K,
    live: Option<&K>,
) -> Option<FleetWait> {
    let (meta, template) = desired.parts_mut()?;
    let live = live.and_then(|l| Some((l.parts()?, l.rollout())));
    let built = drift::hash_of(template);
    ctx.handover
        .gate(warm, template, live.as_ref().map(|((_, t), _)| *t));
    let live = live.map(|((meta, template), status)| (meta, template, status));
    fleet_turn(ctx, view, (built, replicas), meta, template, live).await
}

/// The turn (see the module doc). `built`: the hash of the template as built (before warm handover's
/// gate); `live`: the workload's metadata, template and status; `replicas`: the pods it is to run.
async fn fleet_turn(
    ctx: &Context,
    view: &View<'_>,
    (built, replicas): (String, i32),
    desired_meta: &mut ObjectMeta,
    desired_template: &mut PodTemplateSpec,
    live: Option<(&ObjectMeta, &PodTemplateSpec, WorkloadStatus)>,
) -> Option<FleetWait> {
    let instance = view.instance;
    let desired_secrets = secret_hash(desired_template);
    let cause = fleet::Cause {
        spec: fleet::spec_hash(instance.spec),
        template: built,
        key: match desired_secrets {
            Some(_) => digest_key_id(ctx, instance).await,
            None => None,
        },
    };
    let Some((meta, template, status)) = live else {
        fleet::record(desired_meta, Some(&cause));
        return None;
    };
    let changes = !drift::contains(
        &serde_json::to_value(template).unwrap_or_default(),
        &serde_json::to_value(&*desired_template).unwrap_or_default(),
    );
    let recorded = fleet::recorded(meta);
    let secrets = (secret_hash(template), desired_secrets);
    let changed = fleet::changed(
        recorded.as_ref(),
        &cause,
        (secrets.0.as_deref(), secrets.1.as_deref()),
    );
    let wants = changes && replicas > 0 && changed == fleet::Changed::Operator;
    let found = Found {
        namespace: instance.namespace,
        name: instance.name,
        // A spec its controller has not observed is a rollout starting, unless the template it runs is
        // the one that waits (then it is the waiting workload's own metadata, written while it waits).
        rolling: status.replacing(replicas) || (status.unobserved() && !wants),
        wants,
        instances: ctx.stores.memcacheds.len(),
    };
    match ctx.memory.fleet.turn(found) {
        Turn::Go { started } => {
            fleet::record(desired_meta, Some(&cause));
            if started {
                turn_started(ctx, view).await;
            }
            None
        }
        Turn::Wait(wait) => {
            *desired_template = template.clone();
            fleet::record(desired_meta, recorded.as_ref());
            Some(wait)
        }
    }
}

/// The hash of the Secrets a template carries (see [`pod::SECRET_HASH_ANNOTATION`]).
fn secret_hash(template: &PodTemplateSpec) -> Option<String> {
    let annotations = template.metadata.as_ref()?.annotations.as_ref()?;
    annotations.get(pod::SECRET_HASH_ANNOTATION).cloned()
}

/// The event of an instance whose turn came.
async fn turn_started(ctx: &Context, view: &View<'_>) {
    let note = format!(
        "its turn in the fleet rollout came: the operator's new pod template rolls out now \
         (at most {} instances at a time)",
        ctx.settings.fleet_rollout_budget
    );
    let event = normal("FleetRolloutStarted", "Rollout", note);
    ctx.writer
        .events
        .send(&view.mc.object_ref(&()), event)
        .await;
}

/// A short identity of the digest key that hashes `instance`'s Secrets in its template, for
/// [`fleet::Cause::key`] (`None` when the key cannot be read: then the reconcile has failed before).
async fn digest_key_id(ctx: &Context, instance: &Instance<'_>) -> Option<String> {
    let key = ctx.memory.secrets.digest_key().await.ok()?;
    let owner = crate::resources::secrets::Owner {
        namespace: instance.namespace,
        uid: instance.uid(),
    };
    let id = crate::resources::secrets::keyed(key, &owner, "template-cause");
    Some(id.chars().take(16).collect())
}
