//! The engine under every warm handover, whatever caused it ([`super::scale`], [`super::rollout`],
//! [`super::spare`]): the one registry of copies ([`super::tasks`]), the copies of a
//! [`Transition`] prepared one way (each entry found among the pods that serve it, reached as the
//! stats collector reaches a server), the gate opened on a pod, and the events and metrics.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::Resource;
use kube::api::Patch;
use serde_json::json;
use tracing::debug;

use super::bounds::Settings;
use super::copier::Copier;
use super::error::Error;
use super::metrics::HandoverMetrics;
use super::plan::rollout::GATE;
use super::plan::scale::{Change, Copies};
use super::tasks::{Prepared, Subject, Tasks};
use super::transition::{Endpoints, Transition};
use crate::api::{Memcached, WarmHandover};
use crate::connection::{ServerNames, Target};
use crate::resources::Instance;
use crate::resources::secrets::Owner;
use crate::store::cache::Cache;
use crate::store::events::{normal, warning};
use crate::store::pod_index::still_at;
use crate::store::{Clock, SecretReader, Writer};

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

/// The machinery every cause of a handover shares: the registry of copies, the writes and events, the
/// copies' preparation.
pub(super) struct Engine {
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

/// How a gate is opened: the condition's reason and message.
pub(super) struct Opened {
    pub(super) reason: &'static str,
    pub(super) message: String,
}

impl Engine {
    pub(super) fn new(deps: Deps) -> Self {
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
    pub(super) fn timeout_seconds(&self, spec: &WarmHandover) -> u64 {
        spec.timeout_seconds().min(self.max_timeout_seconds)
    }

    /// Where the copies of the scale `change` are; [`Copies::NotStarted`] when the instance's scale
    /// copies are for another change, or there are none.
    pub(super) fn scale_copies(&self, namespace: &str, instance: &str, change: &Change) -> Copies {
        let key = (namespace.to_owned(), instance.to_owned(), Subject::Scale);
        self.tasks
            .with(&key, |job| {
                (job.change.as_ref() == Some(change)).then(|| job.copies())
            })
            .flatten()
            .unwrap_or(Copies::NotStarted)
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
