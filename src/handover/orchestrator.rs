//! The orchestrator: what the reconcile asks of warm handover, at two moments of one reconcile.
//!
//! - Before the list is published, [`Handover::hold`]: the change of the published list a scale makes,
//!   and what it holds while its copies run (the joining servers' publication, or the drained servers'
//!   removal); with [`Handover::gate`], the readiness gate on the workload's pod template.
//! - Once the list is applied, before the workload, [`Handover::step`]: starts the copies of the change
//!   ([`super::scale`]), and of the rollout: a Deployment's ([`super::rollout`]: copies into each new pod
//!   waiting behind its gate, the gate opened when they end) or a StatefulSet's ([`super::spare`]: through
//!   the spare server, and the partition that lets the next server go); then the progress of every
//!   running copy, for the status, and when to come back to show it.
//!
//! Every cause is a change of the servers that hold the keys ([`super::transition`]), copied by one
//! engine ([`super::engine`]). The decisions are the planner's ([`super::plan`]).

use std::time::Duration;

use futures::Stream;
use k8s_openapi::api::core::v1::PodTemplateSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::runtime::reflector::ObjectRef;

use super::engine::{Deps, Engine};
use super::error::Error;
use super::plan::rollout::{add_template_gate as add_gate, template_gate_wanted as gate_wanted};
use super::plan::scale::{self as plan_scale, Direction};
use super::view::{Hold, Rollout, View};
use crate::api::{Drain, Memcached, Server};
use crate::resources::Instance;
use crate::status::HandoverProgress;

/// How often a reconcile comes back while a copy runs, to show its progress (status writes stay paced).
pub const PROGRESS_EVERY: Duration = Duration::from_secs(1);

/// What the list's change is read from, before the list is published.
pub struct Holding<'a> {
    pub instance: &'a Instance<'a>,
    /// The list clients used: `status.servers` as last published.
    pub published: &'a [Server],
    /// The drain in effect (a scale-down's), with the list clients used before it.
    pub drain: Option<&'a Drain>,
    pub now: &'a Time,
}

/// What the step leaves for the workload, the status and the requeue.
#[derive(Debug, Default)]
pub struct Step {
    /// The copies running for the instance, by target slot.
    pub progress: Vec<HandoverProgress>,
    /// When to come back: a copy's progress, or the spare's start running late.
    pub wait: Option<Duration>,
    /// A StatefulSet's partition to apply: the pace's, or the live one while the server about to go is
    /// copied to the spare.
    pub partition: Option<i32>,
}

/// Warm handover, shared by every reconcile (the controller's context holds one).
pub struct Handover {
    engine: Engine,
}

impl Handover {
    pub fn new(deps: Deps) -> Self {
        Self {
            engine: Engine::new(deps),
        }
    }

    /// The instances to reconcile because one of their copies ended; taken once, by the controller.
    pub fn triggers(&self) -> impl Stream<Item = ObjectRef<Memcached>> + Send + 'static {
        self.engine.tasks.triggers()
    }

    /// Cancels the copies of an instance that is gone.
    pub fn forget_instance(&self, namespace: &str, name: &str) {
        self.engine.tasks.forget_instance(namespace, name);
    }

    /// Before the list is published: the change of the list the assigned `servers` make over what
    /// clients used (`holding`), and what it holds until its copies end (see [`Hold`]); joining servers
    /// held back lose their address in `servers`. Nothing is held past the change's time bound.
    pub fn hold(&self, holding: &Holding<'_>, servers: &mut [Server]) -> Hold {
        let instance = holding.instance;
        let handover = instance.spec.handover();
        let scheme = instance.spec.key_scheme().filter(|_| handover.enabled());
        let change = match holding.drain {
            Some(drain) => plan_scale::scale_down(scheme, Some(drain), servers),
            None => plan_scale::scale_up(scheme, holding.published, servers),
        };
        let holds = change.as_ref().is_some_and(|change| {
            let copies = self
                .engine
                .scale_copies(instance.namespace, instance.name, change);
            let timeout = self.engine.timeout_seconds(&handover);
            plan_scale::holds(change, &copies, holding.now, timeout)
        });
        let direction = change.as_ref().map(|c| c.direction);
        if holds && direction == Some(Direction::Up) {
            plan_scale::withhold(holding.published, servers);
        }
        Hold {
            keeps_drained: holds && direction == Some(Direction::Down),
            change,
        }
    }

    /// The readiness gate on the `desired` pod template, given the `live` one: added when a rollout
    /// replaces the servers anyway and can be `warm` (see [`gate_wanted`]); the live template's gate kept
    /// otherwise, so the gate alone never rolls the servers.
    pub fn gate(&self, warm: bool, desired: &mut PodTemplateSpec, live: Option<&PodTemplateSpec>) {
        if gate_wanted(warm, Some(&*desired), live) {
            add_gate(desired);
        }
    }

    /// The handover step of one reconcile (see the module doc).
    #[tracing::instrument(name = "handover", skip_all, fields(instance = view.instance.name))]
    pub async fn step(&self, view: View<'_>) -> Result<Step, Error> {
        let (namespace, name) = (view.instance.namespace, view.instance.name);
        super::scale::step(&self.engine, &view).await?;
        let mut wait = None;
        let mut partition = None;
        match view.rollout {
            Rollout::Deployment => super::rollout::step(&self.engine, &view).await?,
            Rollout::StatefulSet {
                template,
                pace,
                live,
            } => {
                let staging = super::spare::step(&self.engine, &view, template, pace, live).await?;
                partition = Some(staging.partition);
                wait = staging.wait;
            }
        }
        let progress = self.engine.tasks.progress(namespace, name);
        let wait = [wait, (!progress.is_empty()).then_some(PROGRESS_EVERY)]
            .into_iter()
            .flatten()
            .min();
        Ok(Step {
            progress,
            wait,
            partition,
        })
    }
}
