//! The cache side of reconcile: server slots, the drain of a scale-down, the pods' deletion-cost marks
//! and the published server list. Decisions come from the pure functions in `resources::servers` and
//! `resources::scaling`; this module reads the caches for them and makes the few writes they call for.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;
use tracing::warn;

use super::error::Error;
use crate::api::{Drain, Memcached, Server, Workload};
use crate::handover::{Handover, Hold, Holding};
use crate::resources::scaling::{self, Step};
use crate::resources::servers::{self, DELETION_COST_ANNOTATION, DRAINED_COST, Member};
use crate::resources::{Instance, labels};
use crate::store::{WriteError, Writer};

/// What this reconcile does about the pool.
pub struct Pool {
    /// Replicas to apply to the workload.
    pub replicas: i32,
    /// The published slots, in slot order.
    pub servers: Vec<Server>,
    /// `status.drain` from now on.
    pub drain: Option<Drain>,
    /// Drain changes worth an event.
    pub steps: Vec<Step>,
    /// How long until a drain is due.
    pub wait: Option<Duration>,
    /// Pods to mark with the drained deletion cost (`true`) or to clear (`false`).
    pub marks: Vec<(String, bool)>,
    /// What warm handover holds (see [`Handover::hold`](crate::handover::Handover::hold)): the change
    /// of the published list its copies are for, handed to its step.
    pub hold: Hold,
}

/// Plans the pool from the instance's `pods` (see [`pods`]): the drain, the slots, the marks a
/// Deployment's drained pods need, and the scale handover under a known key placement (the proxy's, or a
/// declared client hashing; it holds the drained pods' removal, or the joining servers' publication,
/// while its copies run, as `handover` tells them); drains and copies are timed from `now`.
pub fn plan(
    handover: &Handover,
    now: &Time,
    mc: &Memcached,
    instance: &Instance<'_>,
    pods: &[Arc<Pod>],
) -> Pool {
    let spec = instance.spec;
    let members: Vec<Member> = pods.iter().filter_map(|p| Member::of(p)).collect();
    let previous = mc.status.as_ref();
    let previous_servers = previous.map(|s| s.servers.as_slice()).unwrap_or_default();
    let published_before = i32::try_from(previous_servers.len())
        .ok()
        .filter(|n| *n > 0);
    let warm = spec.handover();
    let scheme = spec.key_scheme().filter(|_| warm.enabled());
    // Recorded in a drain that starts, for its handover (and a restarted operator's).
    let published_list: Vec<String> = match scheme {
        Some(_) => previous_servers
            .iter()
            .filter_map(|s| s.address.clone())
            .collect(),
        None => Vec::new(),
    };
    let mut input = scaling::Input {
        size: spec.size,
        published_before,
        previous: previous.and_then(|s| s.drain.as_ref()),
        now,
        drain_seconds: spec.drain_seconds(),
        removable: false,
        published_list: &published_list,
    };
    // The published count and the drain in effect do not depend on whether the drained pods can go yet.
    let pending = scaling::plan(&input);
    let published = pending.published;
    let mut servers = match spec.workload {
        Workload::Deployment => {
            servers::assign_deployment(previous_servers, &members, published, spec.container_port)
        }
        Workload::StatefulSet => {
            servers::assign_statefulset(instance, previous_servers, &members, published)
        }
    };
    let holding = Holding {
        instance,
        published: previous_servers,
        drain: pending.drain.as_ref(),
        now,
    };
    let hold = handover.hold(&holding, &mut servers);
    let copying_down = hold.keeps_drained;
    if spec.workload == Workload::StatefulSet {
        // Shrinking a StatefulSet removes the highest ordinals: exactly the drained slots.
        input.removable = !copying_down;
        return pool(scaling::plan(&input), servers, Vec::new(), hold);
    }
    input.removable = !copying_down
        && servers::unslotted(&servers, &members)
            .iter()
            .all(|m| m.marked);
    let plan = scaling::plan(&input);
    let marks = servers::drain_marks(&servers, &members, plan.drain.is_some());
    pool(plan, servers, marks, hold)
}

fn pool(plan: scaling::Plan, servers: Vec<Server>, marks: Vec<(String, bool)>, hold: Hold) -> Pool {
    Pool {
        replicas: plan.replicas,
        servers,
        drain: plan.drain,
        steps: plan.steps,
        wait: plan.wait,
        marks,
        hold,
    }
}

/// Marks (or clears) the drained deletion cost on each pod in `marks`: a server-side apply of only that
/// annotation, under the operator's field manager, so clearing it removes just what the operator set.
pub async fn apply_marks(
    writer: &Writer,
    instance: &Instance<'_>,
    marks: &[(String, bool)],
) -> Result<(), Error> {
    let api: Api<Pod> = writer.api(instance.namespace);
    let params = PatchParams::apply(labels::MANAGER_NAME).force();
    for (name, mark) in marks {
        let mut metadata = json!({"name": name});
        if *mark {
            metadata["annotations"] = json!({DELETION_COST_ANNOTATION: DRAINED_COST});
        }
        let patch = json!({"apiVersion": "v1", "kind": "Pod", "metadata": metadata});
        let error = match api.patch(name, &params, &Patch::Apply(&patch)).await {
            Ok(_) => continue,
            Err(error) => error,
        };
        // An apply of a pod that went after the cache saw it would create it: the API server refuses
        // that (403 without `create` on pods, else 422). Nothing to mark then; the next reconcile works
        // from the updated cache. Any other refusal is a real one.
        let gone = match &error {
            kube::Error::Api(status) if status.code == 404 => true,
            kube::Error::Api(status) if matches!(status.code, 403 | 422) => {
                matches!(api.get_opt(name).await, Ok(None))
            }
            _ => false,
        };
        if gone {
            warn!(pod = %name, "the pod to mark is gone; skipping it");
            continue;
        }
        return Err(WriteError::Apply {
            kind: "Pod".into(),
            name: name.clone(),
            source: error,
        }
        .into());
    }
    Ok(())
}
