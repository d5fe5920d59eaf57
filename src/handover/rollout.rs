//! A Deployment rollout's handover: which gated pod takes over from which old server (the planner's
//! [`takeovers`]), the copies that fill it, and its gate opened when they end.
//!
//! The new pod waits behind its gate while the old servers still answer. It takes the slot of the old
//! server it replaces once that one goes, so the published list changes at that slot, from the old pod's
//! address to the new pod's: the copies are the planner's for that change ([`takeover_lists`], then
//! [`copies`]). Under `hashing: unknown`, `jump` or `modula` that is the old server's items to the new
//! one; under `ketama` or `rendezvous`, which hash the address, also the keys the new address takes from
//! every other server and the old server's keys that go to the others. Every source runs and stays in
//! the list while its copies run: the old pod goes only once the gate is open (its deletion cost makes it
//! the one the ReplicaSet controller removes), and the list changes only then.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use serde_json::json;
use tracing::{info, warn};

use super::engine::Engine;
use super::engine::{Opened, pod_key};
use super::error::{CopyError, Error, Failure};
use super::plan::published;
use super::plan::rollout::{SOURCE_COST, Takeover, takeover_lists, takeovers};
use super::progress::Snapshot;
use super::tasks::{Ended, Job, Meta, Prepared, State};
use super::transition::{Transition, by_name, endpoints};
use super::view::View;
use crate::api::Memcached;
use crate::resources::servers::{self, DELETION_COST_ANNOTATION, Member};
use crate::store::Force;

/// The Deployment rollout's part of the step: opens the gates of the pods whose copies ended,
/// starts the copies for each pod newly waiting behind its gate (or opens its gate at once when there
/// is nothing to copy, or `spec.handover.enabled` is false), and ends copies past their time bound.
pub(super) async fn step(h: &Engine, view: &View<'_>) -> Result<(), Error> {
    let (namespace, name) = (view.instance.namespace, view.instance.name);
    let members: Vec<Member> = view.pods.iter().filter_map(|p| Member::of(p)).collect();
    h.tasks.forget_gone(namespace, name, &members);
    for (pod, job) in h.tasks.take_ended(namespace, name) {
        finish(h, view.mc, (namespace, name), pod, job).await?;
    }
    let running = h.tasks.open(namespace, name);
    for takeover in takeovers(view.servers, &members, &running) {
        take_over(h, view, &members, takeover).await?;
    }
    let timeout = h.timeout_seconds(&view.instance.spec.handover());
    h.tasks.time_out(namespace, name, &h.now(), timeout);
    Ok(())
}

/// Starts the copies into the waiting pod of `takeover`, or opens its gate when there is nothing to
/// copy or the copies cannot start.
async fn take_over(
    h: &Engine,
    view: &View<'_>,
    members: &[Member],
    Takeover { pod, source }: Takeover,
) -> Result<(), Error> {
    let (namespace, name) = (view.instance.namespace, view.instance.name);
    let enabled = view.instance.spec.handover().enabled();
    let find = |pod: &str| members.iter().find(|m| m.name == pod && m.ip.is_some());
    let Some((slot, holder)) = source
        .and_then(|(slot, holder)| Some((slot, find(&holder)?)))
        .filter(|_| enabled)
    else {
        let opened = if enabled {
            Opened {
                reason: "NothingToCopy",
                message: format!("{pod} takes a slot no other server held: nothing to copy"),
            }
        } else {
            Opened {
                reason: "Disabled",
                message: format!("spec.handover.enabled is false: {pod} starts empty"),
            }
        };
        return h.open_gate((namespace, name), &pod, &opened).await;
    };
    let Some(target) = find(&pod) else {
        return Ok(());
    };
    let prepared = takeover_copies(h, view, slot, holder, target).await;
    if let Some(why) = prepared.iter().find_map(|p| p.copier.as_ref().err())
        && prepared.iter().all(|p| p.copier.is_err())
    {
        // Without the Secrets' material the servers cannot be reached: the rollout goes on cold.
        let message = format!(
            "Handover to {pod} (slot {slot}) from {} ended cold: {why}",
            holder.name
        );
        let opened = Opened {
            reason: "Failed",
            message: message.clone(),
        };
        h.open_gate((namespace, name), &pod, &opened).await?;
        h.tell(view.mc, false, message).await;
        return Ok(());
    }
    mark_source(h, namespace, view.pods, &holder.name).await;
    info!(target = %pod, source = %holder.name, slot, copies = prepared.len(), "handing over");
    let now = h.now();
    let meta = Meta {
        slot,
        source: holder.name.clone(),
        since: now.clone(),
        bound: (prepared.len() > 1).then_some(now),
        change: None,
    };
    h.tasks
        .start(pod_key(namespace, name, &pod), meta, prepared);
    Ok(())
}

/// The copies the takeover of `slot` by `target` needs: the planner's for the published list with
/// `target`'s address at that slot; the old server's every item when the slot publishes no address.
async fn takeover_copies(
    h: &Engine,
    view: &View<'_>,
    slot: i32,
    holder: &Member,
    target: &Member,
) -> Vec<Prepared> {
    let instance = view.instance;
    let (holder_ip, target_ip) = (
        holder.ip.as_deref().unwrap_or_default(),
        target.ip.as_deref().unwrap_or_default(),
    );
    let entry = servers::entry(target_ip, instance.spec.container_port);
    let (_, slots) = published(view.servers);
    let planned = takeover_lists(view.servers, slot, &entry)
        .map(|(old, new)| Transition::takeover(instance.spec.key_scheme(), old, new, slots))
        .filter(|t| t.copies().is_ok_and(|copies| !copies.is_empty()));
    let Some(transition) = planned else {
        let pods = by_name([(&holder.name, holder_ip), (&target.name, target_ip)]);
        let whole = Transition::whole(&holder.name, &target.name, slot);
        return h.prepare(instance, &pods, &whole).await;
    };
    let mut endpoints = endpoints(instance, view.pods);
    endpoints.insert(entry, (target.name.clone(), target_ip.to_owned()));
    h.prepare(instance, &endpoints, &transition).await
}

/// The copies into a gated pod ended: opens the pod's gate, counts each copy in the metrics and says
/// so in one event (`HandedOver`, or a `HandoverFailed` Warning). A gate that cannot be opened puts
/// the job back, for the retry of the reconcile this error brings.
pub(super) async fn finish(
    h: &Engine,
    mc: &Memcached,
    (namespace, name): (&str, &str),
    pod: String,
    job: Job,
) -> Result<(), Error> {
    let (opened, done) = outcome(&pod, &job);
    match h.open_gate((namespace, name), &pod, &opened).await {
        Ok(()) => {
            for copy in &job.copies {
                if let State::Ended(Ended::Copied(result)) = &copy.state {
                    h.metrics.record(namespace, name, result);
                }
            }
            h.tell(mc, done, opened.message).await;
            Ok(())
        }
        Err(error) => {
            h.tasks.put_back(pod_key(namespace, name, &pod), job);
            Err(error)
        }
    }
}

/// Gives the copy's source the [`SOURCE_COST`], so that the ReplicaSet controller removes exactly
/// that pod once the new one is ready (its slot is the one the copies fill); once is enough. A source
/// that went meanwhile needs none: the copy fails to reach it and ends cold.
async fn mark_source(h: &Engine, namespace: &str, pods: &[Arc<Pod>], source: &str) {
    let marked = pods.iter().any(|p| {
        p.metadata.name.as_deref() == Some(source)
            && p.annotations()
                .get(DELETION_COST_ANNOTATION)
                .map(String::as_str)
                == Some(SOURCE_COST)
    });
    if marked {
        return;
    }
    let patch = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": source, "annotations": {DELETION_COST_ANNOTATION: SOURCE_COST}}});
    let marked = h
        .writer
        .apply::<Pod, _>(namespace, source, &patch, Force::Yes);
    if let Err(error) = marked.await {
        warn!(pod = %source, %error, "cannot mark the handover's source pod");
    }
}

/// The gate condition a job that ended gets, its event's note, and whether it is a `HandedOver` one.
fn outcome(pod: &str, job: &Job) -> (Opened, bool) {
    let ended: Vec<(&str, &Ended)> = job
        .copies
        .iter()
        .filter_map(|c| match &c.state {
            State::Ended(ended) => Some((c.source.as_str(), ended)),
            State::Running { .. } | State::Reported => None,
        })
        .collect();
    match ended.as_slice() {
        [(_, Ended::Copied(result))] => {
            let opened = copied(pod, job.slot, &job.source, result);
            (opened, result.is_ok())
        }
        [(_, Ended::Skipped(why))] => (
            Opened {
                reason: "Failed",
                message: format!(
                    "Handover to {pod} (slot {}) from {} ended cold: {why}",
                    job.slot, job.source
                ),
            },
            false,
        ),
        _ => several(pod, job, &ended),
    }
}

/// [`outcome`] of a single copy.
fn copied(pod: &str, slot: i32, source: &str, result: &Result<Snapshot, Failure>) -> Opened {
    match result {
        Ok(done) if done.copied == 0 => Opened {
            reason: "NothingToCopy",
            message: format!(
                "{source} had no items to copy to {pod} (slot {slot}; {} listed, {:.1} s)",
                done.items_seen(),
                done.elapsed.as_secs_f64()
            ),
        },
        Ok(done) => Opened {
            reason: "Copied",
            message: format!(
                "Copied {} items ({} bytes) from {source} to {pod} for slot {slot} in {:.1} s",
                done.copied,
                done.bytes,
                done.elapsed.as_secs_f64()
            ),
        },
        Err(failure) => Opened {
            reason: match failure.error {
                CopyError::Timeout(_) => "TimedOut",
                _ => "Failed",
            },
            message: format!(
                "Handover to {pod} (slot {slot}) from {source} ended cold ({}): {failure}",
                failure.error.reason()
            ),
        },
    }
}

/// [`outcome`] of several copies (a takeover under a hashing of the addresses): the items of every
/// copy, and every failure.
fn several(pod: &str, job: &Job, ended: &[(&str, &Ended)]) -> (Opened, bool) {
    let (mut items, mut bytes, mut failures, mut timed_out) = (0, 0, Vec::new(), false);
    for (source, ended) in ended {
        let progress = match ended {
            Ended::Copied(Ok(done)) => done,
            Ended::Copied(Err(failure)) => {
                timed_out |= matches!(failure.error, CopyError::Timeout(_));
                failures.push(format!(
                    "from {source} ({}): {failure}",
                    failure.error.reason()
                ));
                &failure.progress
            }
            Ended::Skipped(why) => {
                failures.push(format!("from {source}: {why}"));
                continue;
            }
        };
        items += progress.copied;
        bytes += progress.bytes;
    }
    let (slot, source, copies) = (job.slot, &job.source, ended.len());
    let scope = format!(
        "the keys whose server changes when {pod} takes slot {slot} from {source} ({copies} copies)"
    );
    if failures.is_empty() {
        let reason = if items == 0 {
            "NothingToCopy"
        } else {
            "Copied"
        };
        let message = format!("Copied {items} items ({bytes} bytes) of {scope}");
        return (Opened { reason, message }, true);
    }
    let reason = if timed_out { "TimedOut" } else { "Failed" };
    let message = format!(
        "Handover of {scope} ended cold{} after {items} items ({bytes} bytes): {}",
        if timed_out { " (timeout)" } else { "" },
        failures.join("; ")
    );
    (Opened { reason, message }, false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn an_ended_copy_says_what_it_did_or_why_it_ended_cold() {
        let done = |copied| {
            Ok(Snapshot {
                copied,
                bytes: copied * 10,
                elapsed: Duration::from_millis(1500),
                ..Snapshot::default()
            })
        };
        let ok = copied("n", 2, "a", &done(3));
        assert_eq!(ok.reason, "Copied");
        assert_eq!(
            ok.message,
            "Copied 3 items (30 bytes) from a to n for slot 2 in 1.5 s"
        );
        assert_eq!(copied("n", 2, "a", &done(0)).reason, "NothingToCopy");
        let timed_out = Err(Failure {
            error: CopyError::Timeout(Duration::from_secs(1)),
            progress: Snapshot::default(),
        });
        let opened = copied("n", 2, "a", &timed_out);
        assert_eq!(opened.reason, "TimedOut");
        assert!(
            opened.message.contains("ended cold (timeout)"),
            "{}",
            opened.message
        );
    }

    #[tokio::test]
    async fn several_copies_say_all_they_copied_and_every_failure() {
        use crate::handover::tasks::Tasks;
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
        let tasks = Tasks::default();
        let meta = Meta {
            slot: 2,
            source: "old".into(),
            since: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
            bound: None,
            change: None,
        };
        tasks.start(pod_key("ns", "cache", "new"), meta, Vec::new());
        let (_, job) = tasks
            .take_ended("ns", "cache")
            .pop()
            .expect("ended at once");
        let ok = |copied| {
            Ended::Copied(Ok(Snapshot {
                copied,
                bytes: copied * 10,
                ..Snapshot::default()
            }))
        };
        let (opened, done) = several("new", &job, &[("old", &ok(3)), ("a", &ok(4))]);
        assert!(done);
        assert_eq!(opened.reason, "Copied");
        assert_eq!(
            opened.message,
            "Copied 7 items (70 bytes) of the keys whose server changes when new takes slot 2 from old \
             (2 copies)"
        );
        let timed_out = Ended::Copied(Err(Failure {
            error: CopyError::Timeout(Duration::from_secs(1)),
            progress: Snapshot {
                copied: 1,
                bytes: 10,
                ..Snapshot::default()
            },
        }));
        let skipped = Ended::Skipped("no pod with an IP serves 10.0.0.9:11211".into());
        let ended = [("old", &ok(3)), ("a", &timed_out), ("b", &skipped)];
        let (opened, done) = several("new", &job, &ended);
        assert!(!done);
        assert_eq!(opened.reason, "TimedOut");
        for part in [
            "ended cold (timeout) after 4 items (40 bytes)",
            "from a (timeout): not finished within 1s",
            "from b: no pod with an IP",
        ] {
            assert!(opened.message.contains(part), "{}", opened.message);
        }
        let (nothing, done) = several("new", &job, &[("old", &ok(0)), ("a", &ok(0))]);
        assert!(done);
        assert_eq!(nothing.reason, "NothingToCopy");
    }
}
