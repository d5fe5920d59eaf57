//! A StatefulSet rollout's handover: the spare server's life, the copy of each server about to be
//! replaced to the spare before the partition steps down to it, the copy from the spare to the new pod
//! behind its gate, and the gates opened when those end (the planner's [`super::plan::spare`] decides
//! which copy runs when).
//!
//! The copies run in the one registry, as every copy does. A copy to the spare is kept under the spare's
//! name, one at a time; once it ended and was reported it stays there as staged (the slot the spare
//! holds) until the next one replaces it or the spare goes. Nothing else is kept: after an operator
//! restart, a server not yet stepped to is copied to the spare afresh, and a new pod waiting behind its
//! gate at the partition takes the spare's items, which the partition only reaches once they are there.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Pod, PodTemplateSpec};
use kube::api::DeleteParams;
use tracing::{debug, info, warn};

use super::engine::Engine;
use super::engine::{Opened, pod_key};
use super::error::Error;
use super::plan::spare::{gate_pending, late, needed, ordinal, takes_from_spare, usable};
use super::tasks::{Ended, Meta, Phase, Prepared, State};
use super::transition::{Transition, by_name};
use super::view::View;
use crate::api::Memcached;
use crate::resources::rollout::{self, Pace};
use crate::resources::servers::Member;
use crate::resources::{Instance, spare};
use crate::store::Force;

/// What the StatefulSet part of the step leaves for the workload and the requeue.
pub(super) struct Staging {
    pub(super) partition: i32,
    pub(super) wait: Option<Duration>,
}

/// What one reconcile knows of a StatefulSet rollout.
struct Rolling<'a> {
    view: &'a View<'a>,
    spare_name: String,
    /// The spare server, when it runs (the instance's own).
    spare: Option<Member>,
    /// The server pods and the spare (never taken for a waiting pod).
    members: Vec<Member>,
    live_partition: Option<i32>,
    enabled: bool,
}

/// What [`Handover::stage`] did.
enum Started {
    /// The copy to the spare runs.
    Copying,
    /// The spare is not ready yet: the pod watch brings the instance back when it is, or the clock
    /// when it is late.
    Waiting(Option<Duration>),
    /// Nothing to copy, or the spare is late: the server goes cold (staged as copied).
    Cold,
}

/// The StatefulSet rollout's part of the step, given the new pod `template`, the rollout's `pace`
/// and the `live` StatefulSet (none before it exists).
pub(super) async fn step(
    h: &Engine,
    view: &View<'_>,
    template: Option<&PodTemplateSpec>,
    pace: &Pace,
    live: Option<&StatefulSet>,
) -> Result<Staging, Error> {
    let rolling = rolling(h, view, live);
    let (namespace, name) = (view.instance.namespace, view.instance.name);
    h.tasks.forget_gone(namespace, name, &rolling.members);
    report_ended(h, &rolling).await?;
    fill_waiting(h, &rolling).await?;
    let (partition, wait) = next_server(h, &rolling, template, pace).await?;
    let update_revision = live
        .and_then(|s| s.status.as_ref())
        .and_then(|s| s.update_revision.as_deref());
    retire_spare(h, &rolling, pace, update_revision).await?;
    Ok(Staging { partition, wait })
}

fn rolling<'a>(h: &Engine, view: &'a View<'a>, live: Option<&StatefulSet>) -> Rolling<'a> {
    let instance = view.instance;
    let spare_name = spare::name(instance.name);
    let spare_pod = h
        .pods
        .get(instance.namespace, &spare_name)
        .ok()
        .flatten()
        .filter(|p| owned(p, instance));
    let spare = spare_pod.as_deref().and_then(Member::of);
    let mut members: Vec<Member> = view.pods.iter().filter_map(|p| Member::of(p)).collect();
    if let Some(spare) = &spare {
        members.push(Member {
            waiting: false,
            ..spare.clone()
        });
    }
    Rolling {
        view,
        spare_name,
        spare,
        members,
        live_partition: live.map(rollout::partition_of),
        enabled: instance.spec.handover().enabled(),
    }
}

/// Copies that ended: to the spare, the slot it now holds; to a new pod, its gate.
async fn report_ended(h: &Engine, r: &Rolling<'_>) -> Result<(), Error> {
    let (namespace, name) = (r.view.instance.namespace, r.view.instance.name);
    for (pod, job) in h.tasks.take_ended(namespace, name) {
        if pod != r.spare_name {
            super::rollout::finish(h, r.view.mc, (namespace, name), pod, job).await?;
            continue;
        }
        // Counted as every copy is: a StatefulSet server's handover is two copies, to the spare and
        // from it, and a failure of either is one `HandoverFailed` event and one failure in the
        // metrics.
        let (slot, source) = (job.slot, &job.source);
        for copy in &job.copies {
            match &copy.state {
                State::Ended(Ended::Copied(result)) => {
                    h.metrics.record(namespace, name, result);
                    match result {
                        Ok(done) => info!(
                            source = %source, slot, items = done.copied, "copied to the spare server"
                        ),
                        Err(failure) => {
                            let note = format!(
                                "Copy of {source} (slot {slot}) to the spare server {} ended cold ({}): \
                                 {failure}; the rollout replaces it with what was copied",
                                r.spare_name,
                                failure.error.reason()
                            );
                            h.tell(r.view.mc, false, note).await;
                        }
                    }
                }
                State::Ended(Ended::Skipped(why)) => {
                    stage_cold(h, r, slot, why).await;
                }
                State::Running { .. } | State::Reported => {}
            }
        }
        let key = pod_key(namespace, name, &r.spare_name);
        h.tasks.close(key, slot, Phase::Staged, h.now());
    }
    Ok(())
}

/// New pods waiting behind their gate: the one the rollout just replaced takes the spare's items.
async fn fill_waiting(h: &Engine, r: &Rolling<'_>) -> Result<(), Error> {
    let (namespace, name) = (r.view.instance.namespace, r.view.instance.name);
    let running = h.tasks.open(namespace, name);
    let staged = h
        .tasks
        .phase(&pod_key(namespace, name, &r.spare_name))
        .map(|(slot, _)| slot);
    for pod in r
        .members
        .iter()
        .filter(|m| m.waiting && !m.terminating && !running.contains_key(&m.name))
    {
        // Without a spare (none was needed, or it could not be created: that was reported) there is
        // nothing to copy from.
        let from_spare = ordinal(name, &pod.name).filter(|o| {
            r.spare.is_some()
                && r.live_partition
                    .is_some_and(|p| takes_from_spare(*o, p, staged))
        });
        let opened = match (r.enabled, from_spare) {
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
            (true, Some(slot)) => match copy_from_spare(h, r, pod, slot).await {
                Some(opened) => opened,
                None => continue,
            },
        };
        h.open_gate((namespace, name), &pod.name, &opened).await?;
    }
    Ok(())
}

/// Starts the copy from the spare to `pod` for `slot`: `None` once it runs (or the pod has no IP
/// yet), the gate to open when it cannot.
async fn copy_from_spare(h: &Engine, r: &Rolling<'_>, pod: &Member, slot: i32) -> Option<Opened> {
    let instance = r.view.instance;
    let target_ip = pod.ip.as_deref()?;
    let Some(spare_ip) = r.spare.as_ref().and_then(usable) else {
        let message = format!(
            "Handover to {} (slot {slot}) ended cold: no spare server holds its items",
            pod.name
        );
        return Some(cold(h, r.view.mc, message).await);
    };
    let whole = Transition::whole(&r.spare_name, &pod.name, slot);
    let prepared = one(
        h,
        instance,
        [(&r.spare_name, spare_ip), (&pod.name, target_ip)],
        whole,
    )
    .await;
    match &prepared.copier {
        Ok(_) => {
            info!(target = %pod.name, source = %r.spare_name, slot, "handing over");
            start_one(h, r, &pod.name, slot, prepared);
            None
        }
        Err(why) => {
            let message = format!(
                "Handover to {} (slot {slot}) from {} ended cold: {why}",
                pod.name, r.spare_name
            );
            Some(cold(h, r.view.mc, message).await)
        }
    }
}

/// The one copy of a whole server's `transition` between `pods` ((name, IP) each).
async fn one(
    h: &Engine,
    instance: &Instance<'_>,
    pods: [(&str, &str); 2],
    transition: Transition,
) -> Prepared {
    let prepared = h.prepare(instance, &by_name(pods), &transition).await;
    prepared.into_iter().next().unwrap_or_else(|| Prepared {
        source: pods[0].0.to_owned(),
        target: pods[1].0.to_owned(),
        slot: transition.slot(0),
        copier: Err("the source and the target are one server".to_owned()),
    })
}

/// Starts the one copy of a job filling `pod` (a new server, or the spare) for `slot`.
fn start_one(h: &Engine, r: &Rolling<'_>, pod: &str, slot: i32, prepared: Prepared) {
    let instance = r.view.instance;
    let meta = Meta {
        slot,
        source: prepared.source.clone(),
        since: h.now(),
        bound: None,
        change: None,
    };
    let key = pod_key(instance.namespace, instance.name, pod);
    h.tasks.start(key, meta, vec![prepared]);
}

/// The server the pace lets go next is copied to the spare first: the partition to apply, and when
/// to come back for a spare still starting.
async fn next_server(
    h: &Engine,
    r: &Rolling<'_>,
    template: Option<&PodTemplateSpec>,
    pace: &Pace,
) -> Result<(i32, Option<Duration>), Error> {
    let (namespace, name) = (r.view.instance.namespace, r.view.instance.name);
    let Some(live) = r.live_partition else {
        return Ok((pace.partition, None));
    };
    let Some(ordinal) = pace.stepping(live).filter(|_| r.enabled) else {
        return Ok((pace.partition, None));
    };
    let key = pod_key(namespace, name, &r.spare_name);
    match h.tasks.phase(&key) {
        Some((slot, Phase::Staged)) if slot == ordinal => {
            info!(
                ordinal,
                "the spare server holds the next server's items: replacing it"
            );
            Ok((pace.partition, None))
        }
        Some((slot, Phase::Running | Phase::Ended)) if slot == ordinal => Ok((live, None)),
        _ => {
            h.tasks.forget(&key);
            Ok(match stage(h, r, template, ordinal).await? {
                Started::Copying | Started::Waiting(None) => (live, None),
                Started::Waiting(Some(left)) => (live, Some(left)),
                Started::Cold => (pace.partition, None),
            })
        }
    }
}

/// The copy of server `ordinal` to the spare, started once the spare runs (created here when there
/// is none).
async fn stage(
    h: &Engine,
    r: &Rolling<'_>,
    template: Option<&PodTemplateSpec>,
    ordinal: i32,
) -> Result<Started, Error> {
    let instance = r.view.instance;
    let timeout = h.timeout_seconds(&instance.spec.handover());
    let source_name = format!("{}-{ordinal}", instance.name);
    let Some(spare) = r.spare.as_ref().filter(|s| !s.terminating) else {
        if r.spare.is_none()
            && let Some(template) = template
            && let Err(error) = create_spare(h, instance, template).await
        {
            // A refusal (an install without `create` on pods, a quota) must not hold the rollout.
            if error.unanswered() {
                return Err(error);
            }
            stage_cold(h, r, ordinal, &error.to_string()).await;
            return Ok(Started::Cold);
        }
        return Ok(Started::Waiting(None));
    };
    let now = h.now().0;
    let Some(spare_ip) = usable(spare) else {
        if late(spare, timeout, now) {
            let why = format!(
                "the spare server {} did not start within {timeout} s",
                r.spare_name
            );
            stage_cold(h, r, ordinal, &why).await;
            return Ok(Started::Cold);
        }
        let started = spare.created.map_or(0, |c| c.as_second());
        let left = (started + i64::try_from(timeout).unwrap_or(i64::MAX) - now.as_second()).max(1);
        return Ok(Started::Waiting(Some(Duration::from_secs(
            left.unsigned_abs(),
        ))));
    };
    let source = r
        .members
        .iter()
        .find(|m| m.name == source_name && m.ready && !m.terminating)
        .and_then(|m| m.ip.as_deref());
    let Some(source_ip) = source else {
        // A server that is not ready holds nothing clients reach: it goes as it is.
        debug!(pod = %source_name, "the next server is not ready: nothing to copy");
        let key = pod_key(instance.namespace, instance.name, &r.spare_name);
        h.tasks.close(key, ordinal, Phase::Staged, h.now());
        return Ok(Started::Cold);
    };
    let pods = [(source_name.as_str(), source_ip), (&r.spare_name, spare_ip)];
    let whole = Transition::whole(&source_name, &r.spare_name, ordinal).emptying_target();
    let prepared = one(h, instance, pods, whole).await;
    match &prepared.copier {
        Ok(_) => {
            info!(source = %source_name, slot = ordinal, "copying to the spare server");
            start_one(h, r, &r.spare_name, ordinal, prepared);
            Ok(Started::Copying)
        }
        Err(why) => {
            stage_cold(h, r, ordinal, why).await;
            Ok(Started::Cold)
        }
    }
}

/// The spare goes once nothing is left for it to do.
async fn retire_spare(
    h: &Engine,
    r: &Rolling<'_>,
    pace: &Pace,
    update_revision: Option<&str>,
) -> Result<(), Error> {
    let (namespace, name) = (r.view.instance.namespace, r.view.instance.name);
    let copying = !h.tasks.progress(namespace, name).is_empty();
    let rolling = pace.next.is_some() || pace.partition > 0;
    let at_partition = r.live_partition.map(|p| format!("{name}-{p}"));
    let partition_pod = r
        .view
        .pods
        .iter()
        .find(|p| p.metadata.name.as_ref() == at_partition.as_ref());
    let waiting = r.members.iter().any(|m| m.waiting && !m.terminating)
        || (at_partition.is_some()
            && gate_pending(partition_pod.map(Arc::as_ref), update_revision));
    if let Some(state) = &r.spare
        && !state.terminating
        && !needed(r.enabled, rolling, copying, waiting)
    {
        remove_spare(h, namespace, &r.spare_name).await?;
        h.tasks.forget(&pod_key(namespace, name, &r.spare_name));
    }
    Ok(())
}

/// Lets server `ordinal` go without a copy, with a warning that says why.
async fn stage_cold(h: &Engine, r: &Rolling<'_>, ordinal: i32, why: &str) {
    let instance = r.view.instance;
    let note = format!(
        "Handover of {}-{ordinal} (slot {ordinal}) ended cold: {why}",
        instance.name
    );
    h.tell(r.view.mc, false, note).await;
    let key = pod_key(instance.namespace, instance.name, &r.spare_name);
    h.tasks.close(key, ordinal, Phase::Staged, h.now());
}

/// A new pod that gets nothing from the spare: one `HandoverFailed` Warning saying why, and the
/// gate's `Failed` condition to set.
async fn cold(h: &Engine, mc: &Memcached, message: String) -> Opened {
    h.tell(mc, false, message.clone()).await;
    Opened {
        reason: "Failed",
        message,
    }
}

/// Creates the spare server from the new pod `template` (server-side apply, the operator's field
/// manager).
async fn create_spare(
    h: &Engine,
    instance: &Instance<'_>,
    template: &PodTemplateSpec,
) -> Result<(), Error> {
    let pod = spare::spare(instance, template);
    let name = spare::name(instance.name);
    // Not forced: a pod of that name that is not the operator's answers 409 and is left alone.
    h.writer
        .apply::<Pod, _>(instance.namespace, &name, &pod, Force::No)
        .await?;
    info!(pod = %name, "created the spare server for the rollout's handovers");
    Ok(())
}

/// Deletes the spare server; one already gone needs nothing. A refusal is logged, not failed: it
/// must not hold the instance's reconciles (the spare is garbage-collected with the instance anyway).
async fn remove_spare(h: &Engine, namespace: &str, name: &str) -> Result<(), Error> {
    let params = DeleteParams::default();
    match h.writer.delete::<Pod>(namespace, name, &params).await {
        Ok(true) => {
            info!(pod = %name, "removed the spare server: the rollout is over");
            Ok(())
        }
        Ok(false) => Ok(()),
        Err(error) => {
            if error.unanswered() {
                return Err(error);
            }
            warn!(%error, "cannot remove the spare server");
            Ok(())
        }
    }
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
