//! The orchestrator: what the reconcile asks of warm handover, once per reconcile ([`Handover::step`]).
//!
//! The reconcile calls it once the published list is applied, in its workload step: a Deployment's
//! after the Deployment, a StatefulSet's before it (the step decides the partition). Those two places
//! are one call per reconcile; both come after the list because a scale-down's copies start once the
//! shorter list is published, and a scale-up's joining servers, like a rollout's new server behind its
//! gate, are held out of the list the reconcile just applied until their copies ended. The step:
//!
//! 1. the scale's copies ([`super::scale`]): started for the change the pool planned, reported per
//!    target once they ended;
//! 2. the rollout's: a Deployment's ([`super::rollout`]: copies into each new pod waiting behind its
//!    gate, the gate opened when they end), or a StatefulSet's ([`super::spare`]: through the spare
//!    server, and the partition that lets the next server go);
//! 3. the progress of every running copy, for the status, and when to come back to show it.
//!
//! Every copy runs in the one registry ([`super::tasks`]). The decisions are the planner's
//! ([`super::plan`]); this side reads the cache, makes the few writes they call for (a gate, the source's
//! deletion cost, the spare pod), says what happened in events and counts each copy in the metrics.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use futures::Stream;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Pod, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::Resource;
use kube::api::Patch;
use kube::runtime::reflector::ObjectRef;
use serde_json::json;
use tracing::debug;

use super::copier::{Copier, Settings};
use super::error::Error;
use super::metrics::HandoverMetrics;
use super::plan::rollout::{
    GATE, add_template_gate as add_gate, template_gate_wanted as gate_wanted,
};
use super::plan::scale::{self as plan_scale, Change, Copies, Direction};
use super::tasks::{Prepared, Subject, Tasks};
use super::transition::{Endpoints, Transition};
use crate::api::{Drain, Memcached, Server, WarmHandover};
use crate::connection::{ServerNames, Target};
use crate::resources::Instance;
use crate::resources::rollout::Pace;
use crate::resources::secrets::Owner;
use crate::status::HandoverProgress;
use crate::store::cache::Cache;
use crate::store::events::{normal, warning};
use crate::store::pod_index::still_at;
use crate::store::{Clock, SecretReader, Writer};

/// How often a reconcile comes back while a copy runs, to show its progress (status writes stay paced).
pub const PROGRESS_EVERY: Duration = Duration::from_secs(1);

/// What warm handover needs of the operator, given once.
pub struct Deps {
    /// What its writes go through; its event publisher says `HandedOver` and `HandoverFailed`.
    pub writer: Writer,
    pub metrics: Arc<HandoverMetrics>,
    /// The one reader of the Secrets' values: the TLS material and the operator's credentials.
    pub secrets: SecretReader,
    /// The pod cache, where a StatefulSet rollout's spare server is found.
    pub pods: Cache<Pod>,
    /// The cluster's DNS domain: the names a server's certificate may be valid for.
    pub cluster_domain: String,
    pub clock: Clock,
    /// The longest any copy may take (`--handover-max-timeout-seconds`), whatever the spec says.
    pub max_timeout_seconds: u64,
}

/// Warm handover, shared by every reconcile (the controller's context holds one).
pub struct Handover {
    /// Every write (a gate, a source's deletion cost, the spare server) and event goes through it.
    pub(super) writer: Writer,
    pub(super) metrics: Arc<HandoverMetrics>,
    /// The TLS material and the operator's credentials, through the one Secret reader.
    secrets: SecretReader,
    pub(super) pods: Cache<Pod>,
    cluster_domain: String,
    pub(super) clock: Clock,
    pub(super) tasks: Tasks,
    max_timeout_seconds: u64,
}

/// What one reconcile hands the step: the instance, its server pods, the slots as this reconcile
/// publishes them, the scale the pool planned, and the rollout's workload.
pub struct View<'a> {
    pub mc: &'a Memcached,
    pub instance: &'a Instance<'a>,
    pub pods: &'a [Arc<Pod>],
    pub servers: &'a [Server],
    /// What [`Handover::hold`] answered before the list was published.
    pub hold: &'a Hold,
    pub rollout: Rollout<'a>,
}

/// What the list's change is read from, before the list is published.
pub struct Holding<'a> {
    pub instance: &'a Instance<'a>,
    /// The list clients used: `status.servers` as last published.
    pub published: &'a [Server],
    /// The drain in effect (a scale-down's), with the list clients used before it.
    pub drain: Option<&'a Drain>,
    pub now: &'a Time,
}

/// What the reconcile obeys before it publishes the list and applies the workload.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Hold {
    /// The change of the published list whose keys the copies move (a scale's), to hand the step.
    pub change: Option<Change>,
    /// Whether the drained servers stay (their copies run): the workload keeps its replicas.
    pub keeps_drained: bool,
}

/// The workload whose rollout hands over.
pub enum Rollout<'a> {
    Deployment,
    StatefulSet {
        /// The new pod template (the spare runs it).
        template: Option<&'a PodTemplateSpec>,
        /// The rollout's pace: the partition it would apply without a handover.
        pace: &'a Pace,
        /// The live StatefulSet (none before it exists).
        live: Option<&'a StatefulSet>,
    },
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

/// How a gate is opened: the condition's reason and message.
pub(super) struct Opened {
    pub(super) reason: &'static str,
    pub(super) message: String,
}

impl Handover {
    pub fn new(deps: Deps) -> Self {
        Self {
            secrets: deps.secrets,
            writer: deps.writer,
            metrics: deps.metrics,
            pods: deps.pods,
            cluster_domain: deps.cluster_domain,
            clock: deps.clock,
            tasks: Tasks::default(),
            max_timeout_seconds: deps.max_timeout_seconds,
        }
    }

    /// A copy's (or a job's) time bound: `spec.handover.timeoutSeconds`, at most the operator's maximum.
    pub fn timeout_seconds(&self, spec: &WarmHandover) -> u64 {
        spec.timeout_seconds().min(self.max_timeout_seconds)
    }

    /// The instances to reconcile because one of their copies ended; taken once, by the controller.
    pub fn triggers(&self) -> impl Stream<Item = ObjectRef<Memcached>> + Send + 'static {
        self.tasks.triggers()
    }

    /// Cancels the copies of an instance that is gone.
    pub fn forget_instance(&self, namespace: &str, name: &str) {
        self.tasks.forget_instance(namespace, name);
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
            let copies = self.scale_copies(instance.namespace, instance.name, change);
            let timeout = self.timeout_seconds(&handover);
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

    /// Where the copies of the scale `change` are; [`Copies::NotStarted`] when the instance's scale
    /// copies are for another change, or there are none.
    fn scale_copies(&self, namespace: &str, instance: &str, change: &Change) -> Copies {
        let key = (namespace.to_owned(), instance.to_owned(), Subject::Scale);
        self.tasks
            .with(&key, |job| {
                (job.change.as_ref() == Some(change)).then(|| job.copies())
            })
            .flatten()
            .unwrap_or(Copies::NotStarted)
    }

    /// The handover step of one reconcile (see the module doc).
    #[tracing::instrument(name = "handover", skip_all, fields(instance = view.instance.name))]
    pub async fn step(&self, view: View<'_>) -> Result<Step, Error> {
        let (namespace, name) = (view.instance.namespace, view.instance.name);
        super::scale::step(self, &view).await?;
        let mut wait = None;
        let mut partition = None;
        match view.rollout {
            Rollout::Deployment => super::rollout::step(self, &view).await?,
            Rollout::StatefulSet {
                template,
                pace,
                live,
            } => {
                let staging = super::spare::step(self, &view, template, pace, live).await?;
                partition = Some(staging.partition);
                wait = staging.wait;
            }
        }
        let progress = self.tasks.progress(namespace, name);
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

    pub(super) fn now(&self) -> Time {
        (self.clock)()
    }

    /// Says `note` about the instance: a `HandedOver` event when `done`, a `HandoverFailed` Warning
    /// otherwise.
    pub(super) async fn tell(&self, mc: &Memcached, done: bool, note: String) {
        let event = if done {
            normal("HandedOver", "Handover", note)
        } else {
            warning("HandoverFailed", "Handover", note)
        };
        self.writer.events.record(&mc.object_ref(&()), event).await;
    }
    /// The copies of `transition`, each with its source and target pods' names (found among
    /// `endpoints`) and its copier (or why there is none: a server no pod with an IP serves, Secrets that
    /// cannot be used, an entry the planner cannot place).
    pub(super) async fn prepare(
        &self,
        instance: &Instance<'_>,
        endpoints: &Endpoints,
        transition: &Transition,
    ) -> Vec<Prepared> {
        let copies = match transition.copies() {
            Ok(copies) => copies,
            Err(invalid) => {
                return vec![Prepared {
                    source: String::new(),
                    target: String::new(),
                    slot: -1,
                    copier: Err(format!("cannot place keys: {invalid}")),
                }];
            }
        };
        let mut prepared = Vec::with_capacity(copies.len());
        for copy in copies {
            let from = &transition.old[copy.pair.source];
            let to = &transition.new[copy.pair.target];
            let (source, target) = (endpoints.get(from), endpoints.get(to));
            let copier = match (source, target) {
                (None, _) => Err(format!("no pod with an IP serves {from}")),
                (_, None) => Err(format!("no pod with an IP serves {to}")),
                (Some((sp, sip)), Some((tp, tip))) => self
                    .copier(instance, (sp, sip), (tp, tip))
                    .await
                    .map(|c| match copy.filter {
                        Some(filter) => c.only(filter),
                        None => c,
                    })
                    .map(|c| {
                        if transition.empty_target {
                            c.emptying_target()
                        } else {
                            c
                        }
                    }),
            };
            let name = |e: Option<&(String, String)>, entry: &str| {
                e.map_or_else(|| entry.to_owned(), |(pod, _)| pod.clone())
            };
            prepared.push(Prepared {
                source: name(source, from),
                target: name(target, to),
                slot: transition.slot(copy.pair.target),
                copier,
            });
        }
        prepared
    }

    /// The copy from `source` to `target` ((pod, IP) each), bounded by `spec.handover`, reached as the
    /// stats collector reaches the servers (TLS, authentication); why not, when the Secrets cannot be
    /// used.
    async fn copier(
        &self,
        instance: &Instance<'_>,
        source: (&str, &str),
        target: (&str, &str),
    ) -> Result<Copier, String> {
        let transport = self
            .secrets
            .transport(
                instance.name,
                &Owner {
                    namespace: instance.namespace,
                    uid: instance.uid(),
                },
                instance.spec,
                &|_, _| None,
            )
            .await?;
        let port = u16::try_from(instance.spec.container_port)
            .map_err(|_| "the container port is out of range".to_owned())?;
        let server = |(pod, ip): (&str, &str)| -> Result<Target, String> {
            let ip: IpAddr = ip
                .parse()
                .map_err(|_| format!("pod {pod} has no valid IP"))?;
            let names = match transport.tls {
                Some(_) => ServerNames::for_pod(
                    instance.name,
                    instance.namespace,
                    pod,
                    &self.cluster_domain,
                ),
                None => ServerNames::default(),
            };
            Ok(Target {
                address: SocketAddr::new(ip, port),
                tls: transport.tls.clone(),
                names,
                credentials: transport.credentials.clone(),
                certificate: None,
                still_the_pod: Some(still_at(&self.pods, instance.namespace, pod, ip)),
            })
        };
        let settings = Settings::from_spec(&instance.spec.handover(), self.max_timeout_seconds);
        Ok(Copier::new(server(source)?, server(target)?, settings))
    }

    /// Sets the pod's handover condition `True` through its status subresource: a strategic-merge
    /// patch, which merges conditions by type, so the kubelet's own conditions are left as they are.
    /// Remembered until the pod cache shows it. A pod gone meanwhile needs nothing.
    pub(super) async fn open_gate(
        &self,
        (namespace, instance): (&str, &str),
        pod: &str,
        opened: &Opened,
    ) -> Result<(), Error> {
        let now = self.now();
        let patch = json!({"status": {"conditions": [{
            "type": GATE,
            "status": "True",
            "reason": opened.reason,
            "message": opened.message,
            "lastTransitionTime": now,
        }]}});
        let patched = self
            .writer
            .patch_status::<Pod, _>(namespace, pod, &Patch::Strategic(&patch))
            .await?;
        if patched.is_some() {
            debug!(%pod, reason = opened.reason, "opened the handover gate");
            let key = pod_key(namespace, instance, pod);
            self.tasks.close(key, -1, super::tasks::Phase::Opened, now);
        }
        Ok(())
    }
}

/// The registry key of the job that fills `pod`.
pub(super) fn pod_key(namespace: &str, instance: &str, pod: &str) -> super::tasks::Key {
    (
        namespace.to_owned(),
        instance.to_owned(),
        Subject::Pod(pod.to_owned()),
    )
}
