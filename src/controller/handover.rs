//! Deployment rollout handovers, driven by the reconcile: which gated pod takes over from which old
//! server ([`crate::resources::handover`] decides), the copies that run meanwhile, and the gates opened
//! when they end. The registry of copies ([`Handovers`]) also serves StatefulSet rollouts, whose copies go
//! through a spare server ([`super::spare`]).
//!
//! A copy runs in a task of its own, outside any reconcile (it may take minutes), at most
//! [`MOST_COPIES`] at once per operator; the rest wait for a turn, their time bound starting with the
//! copy. Copies are kept by the pod they copy to, so a reconcile never starts a second one for the same
//! pod. A copy's end brings its instance back to reconcile ([`Handovers::triggers`]), which opens the
//! pod's gate, says so in one event and counts it in the metrics: every write stays on the reconcile's
//! path. Copies are cancelled when their pod or instance goes, and when the operator stops (dropping the
//! context). Nothing is kept outside memory: after a restart (or a change of leader) a gated pod has no copy
//! here, and the reconcile starts a fresh one, or opens its gate when there is nothing to copy from.

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures::Stream;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Patch, PatchParams};
use kube::runtime::reflector::ObjectRef;
use kube::{Api, Resource, ResourceExt};
use serde_json::json;
use tokio::sync::{Semaphore, mpsc};
use tokio::task::AbortHandle;
use tracing::{debug, info, warn};

use super::{Context, Error};
use crate::api::{Memcached, Server};
use crate::connection::{ServerNames, Target};
use crate::handover::{Copier, CopyError, Failure, Progress, Settings, Snapshot};
use crate::resources::handover::{Candidate, GATE, SOURCE_COST, Takeover, takeovers};
use crate::resources::servers::DELETION_COST_ANNOTATION;
use crate::resources::{Instance, labels};
use crate::status::HandoverProgress;
use crate::store::events::{normal, warning};
use crate::store::secrets::{SecretReader, SecretValues};

/// Copies running at once per operator: each is one stream from one server to another, rate-limited on
/// its own, so a few at once keep the operator's share of the network (and its memory) small.
pub const MOST_COPIES: usize = 3;
/// How often a reconcile comes back while a copy runs, to show its progress (status writes stay paced).
pub const PROGRESS_EVERY: Duration = Duration::from_secs(1);

/// (namespace, pod) of a copy's target.
pub(super) type Key = (String, String);

/// One handover: the instance, the slot taken over, the pod read, and how far it is.
struct Entry {
    instance: String,
    slot: i32,
    source: String,
    state: State,
}

enum State {
    Running {
        progress: Arc<Progress>,
        task: Option<AbortHandle>,
    },
    /// Ended; the gate is opened by the next reconcile.
    Done(Result<Snapshot, Failure>),
    /// The gate was opened, and the pod cache does not show it yet: a reconcile meanwhile must not take
    /// the pod for one still waiting (read-your-writes).
    Opened,
    /// A copy to a StatefulSet rollout's spare server ended and was reported: the spare holds the slot's
    /// items (as far as the copy got), and the partition may step down to it (see `controller::spare`).
    Staged,
}

/// Where the copy to a pod stands ([`Handovers::copy_to`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    Running,
    Ended,
    Opened,
    Staged,
}

impl Drop for Entry {
    fn drop(&mut self) {
        if let State::Running {
            task: Some(task), ..
        } = &self.state
        {
            task.abort();
        }
    }
}

/// The operator's handovers, shared by every reconcile.
pub struct Handovers {
    entries: Arc<Mutex<HashMap<Key, Entry>>>,
    permits: Arc<Semaphore>,
    triggers: mpsc::UnboundedSender<ObjectRef<Memcached>>,
    receiver: Mutex<Option<mpsc::UnboundedReceiver<ObjectRef<Memcached>>>>,
    /// The TLS and authentication Secrets' values, read once per version (as the stats collector does).
    secrets: SecretValues,
}

/// Stopping the operator drops the context and with it every copy.
impl Drop for Handovers {
    fn drop(&mut self) {
        self.lock().clear();
    }
}

impl Default for Handovers {
    fn default() -> Self {
        let (triggers, receiver) = mpsc::unbounded_channel();
        Self {
            entries: Arc::default(),
            permits: Arc::new(Semaphore::new(MOST_COPIES)),
            triggers,
            receiver: Mutex::new(Some(receiver)),
            secrets: SecretValues::default(),
        }
    }
}

/// What a handover step leaves for the status and the requeue.
#[derive(Debug, Default)]
pub struct Step {
    /// The copies running for the instance, by slot.
    pub progress: Vec<HandoverProgress>,
    /// When to come back to show their progress.
    pub wait: Option<Duration>,
}

/// How a gate was opened: the condition's reason and message, and the event that says so.
pub(super) struct Opened {
    pub(super) reason: &'static str,
    pub(super) message: String,
}

impl Handovers {
    fn lock(&self) -> MutexGuard<'_, HashMap<Key, Entry>> {
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The instances to reconcile because one of their copies ended; taken once, by the controller.
    pub fn triggers(&self) -> impl Stream<Item = ObjectRef<Memcached>> + Send + 'static {
        let receiver = self
            .receiver
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        futures::stream::unfold(receiver, |receiver| async move {
            let mut receiver = receiver?;
            let next = receiver.recv().await?;
            Some((next, Some(receiver)))
        })
    }

    /// The copy turns and the trigger of a copy's end, shared with the scale handovers
    /// ([`super::scale_handover`]): every copy of the operator counts against [`MOST_COPIES`].
    pub(super) fn shared(&self) -> (Arc<Semaphore>, mpsc::UnboundedSender<ObjectRef<Memcached>>) {
        (self.permits.clone(), self.triggers.clone())
    }

    /// Cancels the copies of an instance that is gone.
    pub fn forget_instance(&self, namespace: &str, name: &str) {
        self.lock()
            .retain(|(ns, _), entry| ns != namespace || entry.instance != name);
    }

    /// Cancels the copies of `instance` whose target pod is not among `live` any more, and forgets the
    /// opened gates the cache shows (their pods wait no more).
    pub(super) fn forget_gone(&self, namespace: &str, instance: &str, live: &[Candidate]) {
        self.lock().retain(|(ns, pod), entry| {
            if ns != namespace || entry.instance != instance {
                return true;
            }
            let candidate = live.iter().find(|c| &c.name == pod && !c.terminating);
            match entry.state {
                State::Opened => candidate.is_some_and(|c| c.waiting),
                State::Running { .. } | State::Done(_) | State::Staged => candidate.is_some(),
            }
        });
    }

    /// Remembers that the gate of `pod` was opened, until the cache shows it.
    fn opened(&self, namespace: &str, instance: &str, pod: &str) {
        self.lock().insert(
            (namespace.to_owned(), pod.to_owned()),
            Entry {
                instance: instance.to_owned(),
                slot: -1,
                source: String::new(),
                state: State::Opened,
            },
        );
    }

    /// Remembers that the copy to the spare server `pod` for `slot` ended and was reported.
    pub(super) fn stage(&self, namespace: &str, instance: &str, pod: &str, slot: i32) {
        self.lock().insert(
            (namespace.to_owned(), pod.to_owned()),
            Entry {
                instance: instance.to_owned(),
                slot,
                source: String::new(),
                state: State::Staged,
            },
        );
    }

    /// The slot of the copy to `pod` known here, and where it stands.
    pub(super) fn copy_to(&self, namespace: &str, pod: &str) -> Option<(i32, Phase)> {
        let entries = self.lock();
        let entry = entries.get(&(namespace.to_owned(), pod.to_owned()))?;
        let phase = match entry.state {
            State::Running { .. } => Phase::Running,
            State::Done(_) => Phase::Ended,
            State::Opened => Phase::Opened,
            State::Staged => Phase::Staged,
        };
        Some((entry.slot, phase))
    }

    /// Forgets (and cancels) the copy to `pod`.
    pub(super) fn forget(&self, namespace: &str, pod: &str) {
        self.lock().remove(&(namespace.to_owned(), pod.to_owned()));
    }

    /// Target pod → source pod of the instance's handovers not closed yet (an empty source once its
    /// gate is opened).
    pub(super) fn open(&self, namespace: &str, instance: &str) -> BTreeMap<String, String> {
        self.lock()
            .iter()
            .filter(|((ns, _), entry)| ns == namespace && entry.instance == instance)
            .map(|((_, pod), entry)| (pod.clone(), entry.source.clone()))
            .collect()
    }

    pub(super) fn progress(&self, namespace: &str, instance: &str) -> Vec<HandoverProgress> {
        let mut progress: Vec<HandoverProgress> = self
            .lock()
            .iter()
            .filter(|((ns, _), entry)| ns == namespace && entry.instance == instance)
            .filter_map(|(_, entry)| match &entry.state {
                State::Running { progress, .. } => {
                    let now = progress.snapshot();
                    Some(HandoverProgress {
                        slot: entry.slot,
                        items: now.copied,
                        bytes: now.bytes,
                    })
                }
                State::Done(_) | State::Opened | State::Staged => None,
            })
            .collect();
        progress.sort_by_key(|p| p.slot);
        progress
    }

    /// The ended copies of the instance: (pod, slot, source, result), taken out.
    pub(super) fn take_done(
        &self,
        namespace: &str,
        instance: &str,
    ) -> Vec<(String, i32, String, Result<Snapshot, Failure>)> {
        let mut entries = self.lock();
        let done: Vec<Key> = entries
            .iter()
            .filter(|((ns, _), entry)| {
                ns == namespace
                    && entry.instance == instance
                    && matches!(entry.state, State::Done(_))
            })
            .map(|(key, _)| key.clone())
            .collect();
        done.into_iter()
            .filter_map(|key| {
                let mut entry = entries.remove(&key)?;
                let state = std::mem::replace(
                    &mut entry.state,
                    State::Running {
                        progress: Arc::default(),
                        task: None,
                    },
                );
                match state {
                    State::Done(result) => Some((key.1, entry.slot, entry.source.clone(), result)),
                    State::Running { .. } | State::Opened | State::Staged => None,
                }
            })
            .collect()
    }

    /// Puts back an ended copy whose gate could not be opened, for the retry.
    pub(super) fn put_back(
        &self,
        key: Key,
        instance: &str,
        slot: i32,
        source: String,
        result: Result<Snapshot, Failure>,
    ) {
        self.lock().insert(
            key,
            Entry {
                instance: instance.to_owned(),
                slot,
                source,
                state: State::Done(result),
            },
        );
    }

    /// Starts `copier` to pod `key` in a task of its own, unless a copy to that pod is already known.
    pub(super) fn start(
        &self,
        key: Key,
        instance: &str,
        slot: i32,
        source: String,
        copier: Copier,
    ) {
        let mut entries = self.lock();
        if entries.contains_key(&key) {
            return;
        }
        let progress = copier.progress();
        let (shared, permits, triggers) = (
            self.entries.clone(),
            self.permits.clone(),
            self.triggers.clone(),
        );
        let (task_key, trigger) = (
            key.clone(),
            ObjectRef::<Memcached>::new(instance).within(&key.0),
        );
        // Spawned while the entries are locked: the task's end (which takes the lock) cannot come
        // before its entry is there.
        let task = tokio::spawn(async move {
            // The semaphore is never closed.
            let _permit = permits.acquire_owned().await;
            let result = copier.run().await;
            let mut entries = shared.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(entry) = entries.get_mut(&task_key) {
                entry.state = State::Done(result);
            }
            drop(entries);
            let _ = triggers.send(trigger);
        });
        entries.insert(
            key,
            Entry {
                instance: instance.to_owned(),
                slot,
                source,
                state: State::Running {
                    progress,
                    task: Some(task.abort_handle()),
                },
            },
        );
    }
}

/// The handover step of a Deployment instance's reconcile: opens the gates of the copies that ended,
/// starts a copy for each pod newly waiting behind its gate (or opens its gate at once when there is
/// nothing to copy, or `spec.handover.enabled` is false), and reports the copies still running.
pub async fn step(
    ctx: &Context,
    mc: &Memcached,
    instance: &Instance<'_>,
    servers: &[Server],
    pods: &[Arc<Pod>],
) -> Result<Step, Error> {
    let (namespace, name) = (instance.namespace, instance.name);
    let candidates: Vec<Candidate> = pods.iter().filter_map(|p| Candidate::of(p)).collect();
    let handovers = &ctx.handovers;
    handovers.forget_gone(namespace, name, &candidates);

    for (pod, slot, source, result) in handovers.take_done(namespace, name) {
        finish(ctx, mc, (namespace, name), pod, slot, source, result).await?;
    }

    let enabled = instance.spec.handover().enabled();
    let running = handovers.open(namespace, name);
    for Takeover { pod, source } in takeovers(servers, &candidates, &running) {
        let source = source.and_then(|(slot, holder)| {
            let found = candidates.iter().find(|c| c.name == holder)?;
            Some((slot, holder, found.ip.clone()?))
        });
        let Some((slot, holder, source_ip)) = source.filter(|_| enabled) else {
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
            open_gate(ctx, (namespace, name), &pod, &opened).await?;
            continue;
        };
        let Some(target_ip) = candidates
            .iter()
            .find(|c| c.name == pod)
            .and_then(|c| c.ip.clone())
        else {
            continue;
        };
        let copier = match copier(ctx, instance, (&holder, &source_ip), (&pod, &target_ip)).await {
            Ok(copier) => copier,
            Err(why) => {
                // Without the Secrets' material the servers cannot be reached: the rollout goes on cold.
                let message =
                    format!("Handover to {pod} (slot {slot}) from {holder} ended cold: {why}");
                let opened = Opened {
                    reason: "Failed",
                    message: message.clone(),
                };
                open_gate(ctx, (namespace, name), &pod, &opened).await?;
                ctx.events
                    .record(
                        &mc.object_ref(&()),
                        warning("HandoverFailed", "Handover", message),
                    )
                    .await;
                continue;
            }
        };
        mark_source(ctx, namespace, pods, &holder).await?;
        info!(target = %pod, source = %holder, slot, "handing over");
        handovers.start((namespace.to_owned(), pod), name, slot, holder, copier);
    }

    let progress = handovers.progress(namespace, name);
    let wait = (!progress.is_empty()).then_some(PROGRESS_EVERY);
    Ok(Step { progress, wait })
}

/// A copy into a gated pod ended: opens the pod's gate, counts the copy in the metrics and says so in one
/// event (`HandedOver`, or a `HandoverFailed` Warning). A gate that cannot be opened puts the copy back,
/// for the retry of the reconcile this error brings.
pub(super) async fn finish(
    ctx: &Context,
    mc: &Memcached,
    (namespace, name): (&str, &str),
    pod: String,
    slot: i32,
    source: String,
    result: Result<Snapshot, Failure>,
) -> Result<(), Error> {
    let opened = outcome(&pod, slot, &source, &result);
    match open_gate(ctx, (namespace, name), &pod, &opened).await {
        Ok(()) => {
            ctx.metrics.handovers().record(namespace, name, &result);
            let event = match &result {
                Ok(_) => normal("HandedOver", "Handover", opened.message),
                Err(_) => warning("HandoverFailed", "Handover", opened.message),
            };
            ctx.events.record(&mc.object_ref(&()), event).await;
            Ok(())
        }
        Err(error) => {
            let key = (namespace.to_owned(), pod);
            ctx.handovers.put_back(key, name, slot, source, result);
            Err(error)
        }
    }
}

/// The gate condition an ended copy gets, and its event's note.
fn outcome(pod: &str, slot: i32, source: &str, result: &Result<Snapshot, Failure>) -> Opened {
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

/// Sets the pod's handover condition `True` through its status subresource: a strategic-merge patch,
/// which merges conditions by type, so the kubelet's own conditions are left as they are. Remembered until
/// the pod cache shows it. A pod gone meanwhile needs nothing.
pub(super) async fn open_gate(
    ctx: &Context,
    (namespace, instance): (&str, &str),
    pod: &str,
    opened: &Opened,
) -> Result<(), Error> {
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), namespace);
    let patch = json!({"status": {"conditions": [{
        "type": GATE,
        "status": "True",
        "reason": opened.reason,
        "message": opened.message,
        "lastTransitionTime": (ctx.clock)(),
    }]}});
    match api
        .patch_status(pod, &PatchParams::default(), &Patch::Strategic(&patch))
        .await
    {
        Ok(_) => {
            debug!(%pod, reason = opened.reason, "opened the handover gate");
            ctx.handovers.opened(namespace, instance, pod);
            Ok(())
        }
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        Err(source) => Err(Error::Apply {
            kind: "Pod".into(),
            name: pod.to_owned(),
            source,
        }),
    }
}

/// Gives the copy's source the [`SOURCE_COST`], so that the ReplicaSet controller removes exactly that
/// pod once the new one is ready (its slot is the one the copy fills); once is enough.
async fn mark_source(
    ctx: &Context,
    namespace: &str,
    pods: &[Arc<Pod>],
    source: &str,
) -> Result<(), Error> {
    let marked = pods.iter().any(|p| {
        p.metadata.name.as_deref() == Some(source)
            && p.annotations()
                .get(DELETION_COST_ANNOTATION)
                .map(String::as_str)
                == Some(SOURCE_COST)
    });
    if marked {
        return Ok(());
    }
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), namespace);
    let patch = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": source, "annotations": {DELETION_COST_ANNOTATION: SOURCE_COST}}});
    let params = PatchParams::apply(labels::MANAGER_NAME).force();
    match api.patch(source, &params, &Patch::Apply(&patch)).await {
        Ok(_) => Ok(()),
        Err(error) => {
            // A source that went meanwhile: the copy fails to reach it and ends cold.
            warn!(pod = %source, %error, "cannot mark the handover's source pod");
            Ok(())
        }
    }
}

/// The copy from `source` to `target` ((pod, IP) each), bounded by `spec.handover`, reached as the
/// stats collector reaches the servers (TLS, authentication); why not, when the Secrets cannot be used.
pub(super) async fn copier(
    ctx: &Context,
    instance: &Instance<'_>,
    source: (&str, &str),
    target: (&str, &str),
) -> Result<Copier, String> {
    let reader = SecretReader {
        client: ctx.client.clone(),
        store: ctx.stores.secrets.clone(),
        values: ctx.handovers.secrets.clone(),
    };
    let transport = reader
        .transport(instance.namespace, instance.spec, &|_, _| None)
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
                &ctx.settings.cluster_domain,
            ),
            None => ServerNames::default(),
        };
        Ok(Target {
            address: SocketAddr::new(ip, port),
            tls: transport.tls.clone(),
            names,
            credentials: transport.credentials.clone(),
            certificate: None,
        })
    };
    let settings = Settings::from_spec(&instance.spec.handover());
    Ok(Copier::new(server(source)?, server(target)?, settings))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::handover::refused_copier;
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
        let copied = outcome("n", 2, "a", &done(3));
        assert_eq!(copied.reason, "Copied");
        assert_eq!(
            copied.message,
            "Copied 3 items (30 bytes) from a to n for slot 2 in 1.5 s"
        );
        assert_eq!(outcome("n", 2, "a", &done(0)).reason, "NothingToCopy");
        let timed_out = Err(Failure {
            error: CopyError::Timeout(Duration::from_secs(1)),
            progress: Snapshot::default(),
        });
        let opened = outcome("n", 2, "a", &timed_out);
        assert_eq!(opened.reason, "TimedOut");
        assert!(
            opened.message.contains("ended cold (timeout)"),
            "{}",
            opened.message
        );
    }

    fn candidate(name: &str, waiting: bool) -> Candidate {
        Candidate {
            name: name.into(),
            waiting,
            ..Candidate::default()
        }
    }

    #[tokio::test]
    async fn one_copy_per_pod_its_end_taken_once_and_the_instance_triggered() {
        use futures::StreamExt;
        let handovers = Handovers::default();
        let mut triggers = Box::pin(handovers.triggers());
        let key = ("ns".to_owned(), "new".to_owned());
        handovers.start(key.clone(), "cache", 1, "old".into(), refused_copier());
        handovers.start(key.clone(), "cache", 1, "other".into(), refused_copier());
        assert_eq!(
            handovers.open("ns", "cache"),
            BTreeMap::from([("new".to_owned(), "old".to_owned())]),
            "a second start for the same pod is no second copy"
        );
        assert_eq!(
            triggers.next().await,
            Some(ObjectRef::new("cache").within("ns"))
        );
        let done = handovers.take_done("ns", "cache");
        assert_eq!(done.len(), 1);
        let (pod, slot, source, result) = &done[0];
        assert_eq!((pod.as_str(), *slot, source.as_str()), ("new", 1, "old"));
        assert_eq!(
            result.as_ref().map_err(|f| f.error.reason()).unwrap_err(),
            "connect"
        );
        assert!(handovers.take_done("ns", "cache").is_empty(), "taken once");
    }

    #[tokio::test]
    async fn an_opened_gate_is_remembered_until_the_pod_waits_no_more() {
        let handovers = Handovers::default();
        handovers.opened("ns", "cache", "new");
        handovers.forget_gone("ns", "cache", &[candidate("new", true)]);
        assert!(
            handovers.open("ns", "cache").contains_key("new"),
            "the cache does not show the condition yet: not waiting for a copy"
        );
        handovers.forget_gone("ns", "cache", &[candidate("new", false)]);
        assert!(handovers.open("ns", "cache").is_empty());
    }

    #[tokio::test]
    async fn a_copy_to_the_spare_is_staged_until_the_spare_goes() {
        let handovers = Handovers::default();
        handovers.start(
            ("ns".into(), "cache-handover".into()),
            "cache",
            3,
            "cache-3".into(),
            refused_copier(),
        );
        assert_eq!(
            handovers
                .copy_to("ns", "cache-handover")
                .map(|(slot, _)| slot),
            Some(3)
        );
        let spare = candidate("cache-handover", false);
        handovers.stage("ns", "cache", "cache-handover", 3);
        assert_eq!(
            handovers.copy_to("ns", "cache-handover"),
            Some((3, Phase::Staged))
        );
        assert!(handovers.progress("ns", "cache").is_empty(), "no copy runs");
        assert!(
            handovers.take_done("ns", "cache").is_empty(),
            "nothing to report"
        );
        handovers.forget_gone("ns", "cache", std::slice::from_ref(&spare));
        assert!(handovers.copy_to("ns", "cache-handover").is_some());
        handovers.forget_gone("ns", "cache", &[]);
        assert_eq!(
            handovers.copy_to("ns", "cache-handover"),
            None,
            "the spare went"
        );
    }

    #[tokio::test]
    async fn a_copy_whose_pod_or_instance_goes_is_cancelled() {
        let handovers = Handovers::default();
        // A listener that accepts and never answers keeps the copy running.
        let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let target = Target::plain(silent.local_addr().unwrap());
        let copier = || Copier::new(target.clone(), target.clone(), Settings::default());
        handovers.start(("ns".into(), "a".into()), "cache", 0, "x".into(), copier());
        handovers.start(("ns".into(), "b".into()), "cache", 1, "y".into(), copier());
        assert_eq!(handovers.progress("ns", "cache").len(), 2);
        handovers.forget_gone("ns", "cache", &[candidate("b", true)]);
        assert_eq!(handovers.open("ns", "cache").len(), 1);
        handovers.forget_instance("ns", "cache");
        assert!(handovers.open("ns", "cache").is_empty());
    }

    #[tokio::test]
    async fn stopping_the_operator_closes_the_copies_connections() {
        use tokio::io::AsyncReadExt;
        let handovers = Handovers::default();
        let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let target = Target::plain(silent.local_addr().unwrap());
        let copier = Copier::new(target.clone(), target, Settings::default());
        handovers.start(("ns".into(), "a".into()), "cache", 0, "x".into(), copier);
        let (mut accepted, _) = silent.accept().await.unwrap();
        drop(handovers);
        let mut buf = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(5), accepted.read_to_end(&mut buf))
            .await
            .expect("the copy's connection closes when the operator's handovers are dropped");
        assert!(read.is_ok());
    }
}
