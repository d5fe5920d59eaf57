//! The workload's pod template in one reconcile, the same for a Deployment and a StatefulSet: warm
//! handover's gate on the template as built, then the fleet rollout's turn (see [`super::fleet`]): the
//! desired workload records the cause of its template ([`fleet::Cause`]); a template the operator changed
//! ([`fleet::changed`]: not the owner, through the spec or a Secret, nor someone by hand) waits for the
//! instance's turn, keeping the live template and the cause it was built for. The proxy's Deployment is
//! a second part of the same instance ([`Part`]): both roll in the instance's one turn.

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::PodTemplateSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;

use super::context::Context;
use super::fleet::{Found, Turn};
use super::view::View;
use crate::resources::proxy::identities;
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

/// Gates `desired`'s template when its rollout can be `warm`, then takes the instance's fleet turn for
/// it and, when the proxy is on, for the proxy's Deployment (`proxy`, see [`Part::of`]): one turn, one
/// slot for both. `Some` while the operator's change waits (the parts it changed then keep their live
/// templates: see [`Part::held`]).
pub(super) async fn template_turn<K: Templated>(
    ctx: &Context,
    view: &View<'_>,
    (warm, replicas): (bool, i32),
    (desired, live): (&mut K, Option<&K>),
    proxy: Option<&Part>,
) -> Option<FleetWait> {
    let (_, template) = desired.parts_mut()?;
    let built = drift::hash_of(template);
    let live_template = live.and_then(Templated::parts).map(|(_, t)| t);
    ctx.handover.gate(warm, template, live_template);
    let spec = fleet::spec_hash(view.instance.spec);
    let workload = Part::of(ctx, view.instance, (spec, built, replicas), &*desired, live).await;
    let wait = turn(ctx, view, [Some(&workload), proxy]).await;
    if let Some((meta, template)) = desired.parts_mut() {
        workload.held(wait.is_some()).apply(meta, template);
    }
    wait
}

/// One part of an instance whose pod template the fleet rollout paces: its workload, or its proxy's
/// Deployment (see the module doc).
pub(super) struct Part {
    /// What caused the template built now.
    cause: fleet::Cause,
    /// The part exists.
    live: bool,
    /// The operator changed its template and it does not roll yet: the live template and the cause it
    /// records, to keep while the instance waits (`None` otherwise).
    wants: Option<(PodTemplateSpec, Option<fleet::Cause>)>,
    /// It rolls now, whatever caused it.
    rolling: bool,
}

impl Part {
    /// The part `desired` against `live`, for `replicas` pods: `spec`, the hash of what its template
    /// reads of the spec ([`fleet::spec_hash`]); `built`, the hash of its template as built (before
    /// warm handover's gate).
    pub(super) async fn of<K: Templated>(
        ctx: &Context,
        instance: &Instance<'_>,
        (spec, built, replicas): (String, String, i32),
        desired: &K,
        live: Option<&K>,
    ) -> Part {
        let desired_template = desired.parts().map(|(_, t)| t);
        let desired_secrets = desired_template.and_then(owner_inputs);
        let cause = fleet::Cause {
            spec,
            template: built,
            key: match desired_secrets {
                Some(_) => digest_key_id(ctx, instance).await,
                None => None,
            },
        };
        let Some(((meta, template), status)) = live.and_then(|l| Some((l.parts()?, l.rollout())))
        else {
            return Part {
                cause,
                live: false,
                wants: None,
                rolling: false,
            };
        };
        let changes = !drift::contains(
            &serde_json::to_value(template).unwrap_or_default(),
            &serde_json::to_value(desired_template).unwrap_or_default(),
        );
        let recorded = fleet::recorded(meta);
        let secrets = (owner_inputs(template), desired_secrets);
        let changed = fleet::changed(
            recorded.as_ref(),
            &cause,
            (secrets.0.as_deref(), secrets.1.as_deref()),
        );
        let wants = changes && replicas > 0 && changed == fleet::Changed::Operator;
        Part {
            cause,
            live: true,
            // A spec its controller has not observed is a rollout starting, unless the template it
            // runs is the one that waits (then it is the waiting workload's own metadata, written
            // while it waits).
            rolling: status.replacing(replicas) || (status.unobserved() && !wants),
            wants: wants.then(|| (template.clone(), recorded)),
        }
    }

    /// What the turn leaves of the part's template: while the instance `waits`, a template the
    /// operator changed stays the live one with the cause it records; otherwise the template as built,
    /// with its cause.
    pub(super) fn held(&self, waits: bool) -> fleet::Held {
        match &self.wants {
            Some((template, recorded)) if waits => fleet::Held {
                cause: recorded.clone(),
                template: Some(template.clone()),
            },
            _ => fleet::Held {
                cause: Some(self.cause.clone()),
                template: None,
            },
        }
    }
}

/// The instance's turn for its `parts`: it rolls when one of them does, and wants a turn when the
/// operator changed one of them. A new instance (no part live) takes none.
async fn turn(ctx: &Context, view: &View<'_>, parts: [Option<&Part>; 2]) -> Option<FleetWait> {
    let parts = || parts.into_iter().flatten();
    if parts().all(|p| !p.live) {
        return None;
    }
    let instance = view.instance;
    let found = Found {
        namespace: instance.namespace,
        name: instance.name,
        rolling: parts().any(|p| p.rolling),
        wants: parts().any(|p| p.wants.is_some()),
        instances: ctx.stores.memcacheds.len(),
    };
    match ctx.memory.fleet.turn(found) {
        Turn::Go { started } => {
            if started {
                turn_started(ctx, view).await;
            }
            None
        }
        Turn::Wait(wait) => Some(wait),
    }
}

/// What the instance's owner, not the operator's builders, put into a template without it showing in
/// the spec: the hash of the Secrets it carries (see [`pod::SECRET_HASH_ANNOTATION`]) and, on a proxy's,
/// the trust epoch of its clients' CAs ([`identities::EPOCH_ANNOTATION`]).
fn owner_inputs(template: &PodTemplateSpec) -> Option<String> {
    let annotations = template.metadata.as_ref()?.annotations.as_ref()?;
    let secrets = annotations.get(pod::SECRET_HASH_ANNOTATION);
    let epoch = annotations.get(identities::EPOCH_ANNOTATION);
    match (secrets, epoch) {
        (None, None) => None,
        (secrets, None) => secrets.cloned(),
        (secrets, Some(epoch)) => Some(format!("{}/{epoch}", secrets.map_or("", String::as_str))),
    }
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn template(annotations: &[(&str, &str)]) -> PodTemplateSpec {
        let annotations: BTreeMap<String, String> = annotations
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        PodTemplateSpec {
            metadata: Some(ObjectMeta {
                annotations: Some(annotations),
                ..ObjectMeta::default()
            }),
            spec: None,
        }
    }

    /// A server's template is told by its Secrets' hash alone (as the causes recorded before the proxy
    /// took turns); a proxy's also by its clients' trust epoch, which its owner changes with the CA.
    #[test]
    fn the_owners_inputs_are_the_secrets_hash_and_the_proxys_trust_epoch() {
        let secrets = pod::SECRET_HASH_ANNOTATION;
        let epoch = identities::EPOCH_ANNOTATION;
        assert_eq!(owner_inputs(&template(&[])), None);
        assert_eq!(
            owner_inputs(&template(&[(secrets, "h1")])),
            Some("h1".into())
        );
        let proxy = owner_inputs(&template(&[(secrets, "h1"), (epoch, "e1")]));
        assert_eq!(proxy, Some("h1/e1".into()));
        let rotated = owner_inputs(&template(&[(secrets, "h1"), (epoch, "e2")]));
        assert_ne!(proxy, rotated, "a new epoch is the owner's change");
        assert_eq!(
            owner_inputs(&template(&[(epoch, "e1")])),
            Some("/e1".into())
        );
    }

    /// Only a part the operator changed keeps its live template while the instance waits.
    #[test]
    fn while_the_instance_waits_only_the_parts_the_operator_changed_keep_their_template() {
        let cause = |template: &str| fleet::Cause {
            spec: "s".into(),
            template: template.into(),
            key: None,
        };
        let live = template(&[("a", "b")]);
        let part = |wants: bool| Part {
            cause: cause("t2"),
            live: true,
            wants: wants.then(|| (live.clone(), Some(cause("t1")))),
            rolling: false,
        };
        let built = |c: fleet::Cause| fleet::Held {
            cause: Some(c),
            template: None,
        };
        let kept = fleet::Held {
            cause: Some(cause("t1")),
            template: Some(live.clone()),
        };
        assert_eq!(part(true).held(true), kept);
        assert_eq!(part(true).held(false), built(cause("t2")), "its turn");
        assert_eq!(
            part(false).held(true),
            built(cause("t2")),
            "the other part waits"
        );
        let new = Part {
            live: false,
            ..part(false)
        };
        assert_eq!(new.held(true), built(cause("t2")), "created as built");
    }
}
