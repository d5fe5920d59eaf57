//! StatefulSet rollout handovers, driven by the reconcile: the spare server's life, the copy of each
//! server about to be replaced to the spare before the partition steps down to it, the copy from the
//! spare to the new pod behind its gate, and the gates opened when those end ([`crate::resources::spare`]
//! decides which copy runs when).
//!
//! The copies are the Deployment handover's ([`super::handover::Handovers`]): the same tasks, turns
//! ([`super::handover::MOST_COPIES`] at once), progress, triggers and events. A copy to the spare is kept
//! under the spare's name, one at a time; once it ended and was reported it stays there as `Staged` (the
//! slot the spare holds) until the next one replaces it or the spare goes. Nothing else is kept: after an
//! operator restart, a server not yet stepped to is copied to the spare afresh, and a new pod waiting
//! behind its gate at the partition takes the spare's items, which the partition only reaches once they
//! are there.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Pod, PodTemplateSpec};
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::{Api, Resource};
use tracing::{debug, info, warn};

use super::handover::{Opened, PROGRESS_EVERY, Phase, copier, finish, open_gate};
use super::{Context, Error};
use crate::api::Memcached;
use crate::resources::handover::Candidate;
use crate::resources::rollout::{self, Pace};
use crate::resources::spare::{self, Spare};
use crate::resources::{Instance, labels};
use crate::status::HandoverProgress;
use crate::store::events::warning;

/// What the StatefulSet handover step leaves for the workload, the status and the requeue.
#[derive(Debug, Default)]
pub struct Staging {
    /// The partition to apply: the pace's, or the live one while the server about to go is copied to
    /// the spare.
    pub partition: i32,
    /// The copies running for the instance, by slot.
    pub progress: Vec<HandoverProgress>,
    /// When to come back: a copy's progress, or the spare's start running late.
    pub wait: Option<Duration>,
}

/// The handover step of a StatefulSet instance's reconcile, given the rollout's `pace`, the `live`
/// StatefulSet (none before it exists), the new pod `template` and the instance's server `pods`.
pub async fn step(
    ctx: &Context,
    mc: &Memcached,
    instance: &Instance<'_>,
    template: Option<&PodTemplateSpec>,
    pace: &Pace,
    live: Option<&StatefulSet>,
    pods: &[Arc<Pod>],
) -> Result<Staging, Error> {
    let live_partition = live.map(rollout::partition_of);
    let update_revision = live
        .and_then(|s| s.status.as_ref())
        .and_then(|s| s.update_revision.as_deref());
    let (namespace, name) = (instance.namespace, instance.name);
    let handovers = &ctx.handovers;
    let enabled = instance.spec.handover().enabled();
    let spare_name = spare::name(name);
    let spare_pod = ctx
        .stores
        .pods
        .get(namespace, &spare_name)
        .ok()
        .flatten()
        .filter(|p| owned(p, instance));
    let spare = spare_pod.as_deref().map(Spare::of);
    let mut candidates: Vec<Candidate> = pods.iter().filter_map(|p| Candidate::of(p)).collect();
    if let Some(pod) = &spare_pod
        && let Some(candidate) = Candidate::of(pod)
    {
        candidates.push(Candidate {
            waiting: false,
            ..candidate
        });
    }
    handovers.forget_gone(namespace, name, &candidates);

    // Copies that ended: to the spare, the slot it now holds; to a new pod, its gate.
    for (pod, slot, source, result) in handovers.take_done(namespace, name) {
        if pod == spare_name {
            // Counted as every copy is: a StatefulSet server's handover is two copies, to the spare and
            // from it, and a failure of either is one `HandoverFailed` event and one failure in the metrics.
            ctx.metrics.handovers().record(namespace, name, &result);
            match &result {
                Ok(done) => info!(
                    source = %source, slot, items = done.copied, "copied to the spare server"
                ),
                Err(failure) => {
                    let note = format!(
                        "Copy of {source} (slot {slot}) to the spare server {spare_name} ended cold ({}): \
                         {failure}; the rollout replaces it with what was copied",
                        failure.error.reason()
                    );
                    ctx.events
                        .record(
                            &mc.object_ref(&()),
                            warning("HandoverFailed", "Handover", note),
                        )
                        .await;
                }
            }
            handovers.stage(namespace, name, &spare_name, slot);
            continue;
        }
        finish(ctx, mc, (namespace, name), pod, slot, source, result).await?;
    }

    // New pods waiting behind their gate: the one the rollout just replaced takes the spare's items.
    let running = handovers.open(namespace, name);
    let staged = handovers
        .copy_to(namespace, &spare_name)
        .map(|(slot, _)| slot);
    for pod in candidates
        .iter()
        .filter(|c| c.waiting && !c.terminating && !running.contains_key(&c.name))
    {
        let ordinal = spare::ordinal(name, &pod.name);
        // Without a spare (none was needed, or it could not be created: that was reported) there is
        // nothing to copy from.
        let from_spare = ordinal.filter(|o| {
            spare.is_some()
                && live_partition.is_some_and(|p| spare::takes_from_spare(*o, p, staged))
        });
        let opened = match (enabled, from_spare) {
            (false, _) => Opened {
                reason: "Disabled",
                message: format!("spec.handover.enabled is false: {} starts empty", pod.name),
            },
            (true, None) => Opened {
                reason: "NothingToCopy",
                message: format!(
                    "{} takes a slot no spare server holds items for: nothing to copy",
                    pod.name
                ),
            },
            (true, Some(slot)) => {
                let Some(target_ip) = pod.ip.as_deref() else {
                    continue;
                };
                let Some(spare_ip) = spare.as_ref().and_then(Spare::usable) else {
                    let message = format!(
                        "Handover to {} (slot {slot}) ended cold: no spare server holds its items",
                        pod.name
                    );
                    let opened = cold(ctx, mc, message).await;
                    open_gate(ctx, (namespace, name), &pod.name, &opened).await?;
                    continue;
                };
                match copier(
                    ctx,
                    instance,
                    (&spare_name, spare_ip),
                    (&pod.name, target_ip),
                )
                .await
                {
                    Ok(copier) => {
                        info!(target = %pod.name, source = %spare_name, slot, "handing over");
                        let key = (namespace.to_owned(), pod.name.clone());
                        handovers.start(key, name, slot, spare_name.clone(), copier);
                        continue;
                    }
                    Err(why) => {
                        let message = format!(
                            "Handover to {} (slot {slot}) from {spare_name} ended cold: {why}",
                            pod.name
                        );
                        cold(ctx, mc, message).await
                    }
                }
            }
        };
        open_gate(ctx, (namespace, name), &pod.name, &opened).await?;
    }

    // The server the pace lets go next is copied to the spare first.
    let mut partition = pace.partition;
    let mut wait = None;
    if let Some(live) = live_partition
        && let Some(ordinal) = pace.stepping(live).filter(|_| enabled)
    {
        match handovers.copy_to(namespace, &spare_name) {
            Some((slot, Phase::Staged)) if slot == ordinal => {
                info!(
                    ordinal,
                    "the spare server holds the next server's items: replacing it"
                );
            }
            Some((slot, Phase::Running | Phase::Ended)) if slot == ordinal => partition = live,
            _ => {
                partition = live;
                handovers.forget(namespace, &spare_name);
                let stage = Stage {
                    ctx,
                    mc,
                    instance,
                    spare_name: &spare_name,
                    ordinal,
                };
                match stage.start(spare.as_ref(), template, &candidates).await? {
                    Started::Copying | Started::Waiting(None) => {}
                    Started::Waiting(Some(left)) => wait = Some(left),
                    Started::Cold => partition = pace.partition,
                }
            }
        }
    }

    // The spare goes once nothing is left for it to do.
    let progress = handovers.progress(namespace, name);
    let rolling = pace.next.is_some() || pace.partition > 0;
    let at_partition = live_partition.map(|p| format!("{name}-{p}"));
    let partition_pod = pods
        .iter()
        .find(|p| p.metadata.name.as_ref() == at_partition.as_ref());
    let waiting = candidates.iter().any(|c| c.waiting && !c.terminating)
        || (at_partition.is_some()
            && spare::gate_pending(partition_pod.map(Arc::as_ref), update_revision));
    if let Some(state) = &spare
        && !state.terminating
        && !spare::needed(enabled, rolling, !progress.is_empty(), waiting)
    {
        remove(ctx, namespace, &spare_name).await?;
        handovers.forget(namespace, &spare_name);
    }
    let wait = [wait, (!progress.is_empty()).then_some(PROGRESS_EVERY)]
        .into_iter()
        .flatten()
        .min();
    Ok(Staging {
        partition,
        progress,
        wait,
    })
}

/// Whether `pod` is the instance's own (its controller owner reference): a pod of that name someone else
/// made is neither used nor removed.
fn owned(pod: &Pod, instance: &Instance<'_>) -> bool {
    pod.metadata
        .owner_references
        .as_deref()
        .unwrap_or_default()
        .iter()
        .any(|o| o.controller == Some(true) && o.uid == instance.uid())
}

/// What [`Stage::start`] did.
enum Started {
    /// The copy to the spare runs.
    Copying,
    /// The spare is not ready yet: the pod watch brings the instance back when it is, or the clock
    /// when it is late.
    Waiting(Option<Duration>),
    /// Nothing to copy, or the spare is late: the server goes cold (staged as copied).
    Cold,
}

/// The copy of server `ordinal` to the spare, about to start.
struct Stage<'a> {
    ctx: &'a Context,
    mc: &'a Memcached,
    instance: &'a Instance<'a>,
    spare_name: &'a str,
    ordinal: i32,
}

impl Stage<'_> {
    async fn start(
        &self,
        spare: Option<&Spare>,
        template: Option<&PodTemplateSpec>,
        candidates: &[Candidate],
    ) -> Result<Started, Error> {
        let (ctx, instance) = (self.ctx, self.instance);
        let (namespace, name) = (instance.namespace, instance.name);
        let timeout = instance.spec.handover().timeout_seconds();
        let source_name = format!("{name}-{}", self.ordinal);
        let Some(spare) = spare.filter(|s| !s.terminating) else {
            if spare.is_none()
                && let Some(template) = template
                && let Err(error) = create(ctx, instance, template).await
            {
                // A refusal (an install without `create` on pods, a quota) must not hold the rollout.
                if error.unanswered() {
                    return Err(error);
                }
                self.cold(&error.to_string()).await;
                return Ok(Started::Cold);
            }
            return Ok(Started::Waiting(None));
        };
        let now = (ctx.clock)().0;
        let Some(spare_ip) = spare.usable() else {
            if spare.late(timeout, now) {
                self.cold(&format!(
                    "the spare server {} did not start within {timeout} s",
                    self.spare_name
                ))
                .await;
                return Ok(Started::Cold);
            }
            let started = spare.created.map_or(0, |c| c.as_second());
            let left =
                (started + i64::try_from(timeout).unwrap_or(i64::MAX) - now.as_second()).max(1);
            return Ok(Started::Waiting(Some(Duration::from_secs(
                left.unsigned_abs(),
            ))));
        };
        let source = candidates
            .iter()
            .find(|c| c.name == source_name && c.ready && !c.terminating)
            .and_then(|c| c.ip.as_deref());
        let Some(source_ip) = source else {
            // A server that is not ready holds nothing clients reach: it goes as it is.
            debug!(pod = %source_name, "the next server is not ready: nothing to copy");
            ctx.handovers
                .stage(namespace, name, self.spare_name, self.ordinal);
            return Ok(Started::Cold);
        };
        match copier(
            ctx,
            instance,
            (&source_name, source_ip),
            (self.spare_name, spare_ip),
        )
        .await
        {
            Ok(copier) => {
                info!(source = %source_name, slot = self.ordinal, "copying to the spare server");
                let key = (namespace.to_owned(), self.spare_name.to_owned());
                ctx.handovers.start(
                    key,
                    name,
                    self.ordinal,
                    source_name,
                    copier.emptying_target(),
                );
                Ok(Started::Copying)
            }
            Err(why) => {
                self.cold(&why).await;
                Ok(Started::Cold)
            }
        }
    }

    /// Lets server `ordinal` go without a copy, with a warning that says why.
    async fn cold(&self, why: &str) {
        let (namespace, name) = (self.instance.namespace, self.instance.name);
        let note = format!(
            "Handover of {name}-{} (slot {}) ended cold: {why}",
            self.ordinal, self.ordinal
        );
        self.ctx
            .events
            .record(
                &self.mc.object_ref(&()),
                warning("HandoverFailed", "Handover", note),
            )
            .await;
        self.ctx
            .handovers
            .stage(namespace, name, self.spare_name, self.ordinal);
    }
}

/// Creates the spare server from the new pod `template` (server-side apply, the operator's field
/// manager).
async fn create(
    ctx: &Context,
    instance: &Instance<'_>,
    template: &PodTemplateSpec,
) -> Result<(), Error> {
    let pod = spare::spare(instance, template);
    let name = spare::name(instance.name);
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), instance.namespace);
    let params = PatchParams::apply(labels::MANAGER_NAME).force();
    api.patch(&name, &params, &Patch::Apply(&pod))
        .await
        .map_err(|source| Error::Apply {
            kind: "Pod".into(),
            name: name.clone(),
            source,
        })?;
    info!(pod = %name, "created the spare server for the rollout's handovers");
    Ok(())
}

/// Deletes the spare server; one already gone needs nothing. A refusal is logged, not failed: it must
/// not hold the instance's reconciles (the spare is garbage-collected with the instance anyway).
async fn remove(ctx: &Context, namespace: &str, name: &str) -> Result<(), Error> {
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), namespace);
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => {
            info!(pod = %name, "removed the spare server: the rollout is over");
            Ok(())
        }
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        Err(source) => {
            let error = Error::Delete {
                kind: "Pod".into(),
                name: name.to_owned(),
                source,
            };
            if error.unanswered() {
                return Err(error);
            }
            warn!(%error, "cannot remove the spare server");
            Ok(())
        }
    }
}

/// A new pod that gets nothing from the spare: one `HandoverFailed` Warning saying why, and the gate's
/// `Failed` condition to set.
async fn cold(ctx: &Context, mc: &Memcached, message: String) -> Opened {
    ctx.events
        .record(
            &mc.object_ref(&()),
            warning("HandoverFailed", "Handover", message.clone()),
        )
        .await;
    Opened {
        reason: "Failed",
        message,
    }
}
