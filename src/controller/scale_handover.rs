//! Scale handovers under a declared client hashing: the copies a scale's change of the published list
//! needs ([`crate::resources::scale_handover`] plans them), run outside any reconcile, and the events
//! and metrics once they end.
//!
//! One change per instance at a time: a reconcile that plans another change (the pool moved on, a pod
//! became ready meanwhile) cancels the copies of the previous one and starts the new one's. Copies share
//! the rollout handovers' turns ([`super::handover::MOST_COPIES`] at once per operator) and their trigger:
//! a copy's end brings its instance back to reconcile, which lets the scale proceed once every copy ended.
//!
//! Nothing is kept outside memory beyond the list before a scale-down (`status.drain.servers`): after a
//! restart (or a change of leader) the reconcile finds no copies for the change and starts them again;
//! add semantics make a second copy of an item harmless. A scale-down's time bound runs from its drain's
//! start, kept in the status, so a restart never holds the drained pods longer; a scale-up's restarts with
//! its copies.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::Resource;
use kube::runtime::reflector::ObjectRef;
use tokio::sync::{Semaphore, mpsc};
use tokio::task::AbortHandle;
use tracing::{debug, info};

use super::handover::{PROGRESS_EVERY, Step, copier};
use super::{Context, Error};
use crate::api::{Memcached, Workload};
use crate::handover::dump::DumpError;
use crate::handover::{Copier, CopyError, Failure, Progress, Snapshot};
use crate::resources::scale_handover::{Change, Copies, Pair, filter, past};
use crate::resources::{Instance, servers};
use crate::status::HandoverProgress;
use crate::store::events::{normal, warning};

/// (namespace, instance).
type Key = (String, String);

/// The copies of one change of an instance's list.
struct Plan {
    /// Tells a copy's end which plan it belongs to, should the plan have been replaced meanwhile.
    id: u64,
    change: Change,
    /// When the copies started (a scale-up's time bound starts there).
    since: Time,
    copies: Vec<Copy>,
}

/// One (source, target) copy of a plan.
struct Copy {
    pair: Pair,
    source: String,
    target: String,
    state: State,
}

enum State {
    Running {
        progress: Arc<Progress>,
        task: Option<AbortHandle>,
    },
    /// Ended; reported (event, metrics) by the next reconcile.
    Ended(Ended),
    /// Ended and reported.
    Reported,
}

/// A pair ready to copy: its servers' pod names and its copier, or why there is none.
struct Prepared {
    pair: Pair,
    source: String,
    target: String,
    copier: Result<Copier, String>,
}

/// Tries a refused dump again this often: the source's dump for another copy (of this plan's
/// predecessor, or of a rollout) is ending.
const BUSY_PAUSE: Duration = Duration::from_millis(250);
/// ... and at most this many times (10 s).
const BUSY_RETRIES: usize = 40;

/// Runs `copier`, again while its source is busy with another dump.
async fn run(copier: Copier) -> Result<Snapshot, Failure> {
    let mut copier = copier;
    for _ in 0..BUSY_RETRIES {
        let again = copier.again();
        match copier.run().await {
            Err(failure) if busy(&failure) => {
                tokio::time::sleep(BUSY_PAUSE).await;
                copier = again;
            }
            other => return other,
        }
    }
    copier.run().await
}

fn busy(failure: &Failure) -> bool {
    matches!(&failure.error, CopyError::Dump(DumpError::Refused(answer)) if answer.starts_with("BUSY"))
}

/// How a copy ended.
enum Ended {
    Copied(Result<Snapshot, Failure>),
    /// Never started: a server of the pair has no pod with an IP, or the servers cannot be reached with
    /// the instance's Secrets.
    Skipped(String),
}

impl Drop for Copy {
    fn drop(&mut self) {
        if let State::Running {
            task: Some(task), ..
        } = &self.state
        {
            task.abort();
        }
    }
}

impl Plan {
    fn copies(&self) -> Copies {
        if self
            .copies
            .iter()
            .any(|c| matches!(c.state, State::Running { .. }))
        {
            Copies::Running {
                since: self.since.clone(),
            }
        } else {
            Copies::Ended
        }
    }
}

/// The operator's scale handovers, shared by every reconcile.
pub struct ScaleHandovers {
    plans: Arc<Mutex<HashMap<Key, Plan>>>,
    permits: Arc<Semaphore>,
    triggers: mpsc::UnboundedSender<ObjectRef<Memcached>>,
    ids: AtomicU64,
}

/// Stopping the operator drops the context and with it every copy.
impl Drop for ScaleHandovers {
    fn drop(&mut self) {
        self.lock().clear();
    }
}

impl ScaleHandovers {
    /// Sharing the rollout handovers' turns and trigger (`Handovers::shared`).
    pub fn new(
        (permits, triggers): (Arc<Semaphore>, mpsc::UnboundedSender<ObjectRef<Memcached>>),
    ) -> Self {
        Self {
            plans: Arc::default(),
            permits,
            triggers,
            ids: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<Key, Plan>> {
        self.plans.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Where the copies of `change` are; [`Copies::NotStarted`] when the instance's plan is another
    /// change, or there is none.
    pub fn copies(&self, namespace: &str, instance: &str, change: &Change) -> Copies {
        let key = (namespace.to_owned(), instance.to_owned());
        match self.lock().get(&key) {
            Some(plan) if &plan.change == change => plan.copies(),
            _ => Copies::NotStarted,
        }
    }

    /// Cancels the copies of an instance that is gone.
    pub fn forget_instance(&self, namespace: &str, name: &str) {
        self.lock()
            .retain(|(ns, instance), _| ns != namespace || instance != name);
    }

    /// Drops the instance's plan unless it is for `change`; whether one for `change` is kept.
    fn retire(&self, key: &Key, change: Option<&Change>) -> bool {
        let mut plans = self.lock();
        match (plans.get(key), change) {
            (Some(plan), Some(change)) if &plan.change == change => true,
            (Some(_), _) => {
                debug!(instance = %key.1, "the scale handover's list changed: its copies stop");
                plans.remove(key);
                false
            }
            (None, _) => false,
        }
    }

    /// Ends the running copies of the instance's plan as timed out (`timeout`), cancelling them.
    fn time_out(&self, key: &Key, timeout: Duration) {
        if let Some(plan) = self.lock().get_mut(key) {
            for copy in &mut plan.copies {
                if let State::Running { progress, .. } = &copy.state {
                    let failure = Failure {
                        error: CopyError::Timeout(timeout),
                        progress: progress.snapshot(),
                    };
                    // Dropping the old state's handle does not abort: the copy's Drop does, below.
                    let old = std::mem::replace(
                        &mut copy.state,
                        State::Ended(Ended::Copied(Err(failure))),
                    );
                    if let State::Running {
                        task: Some(task), ..
                    } = old
                    {
                        task.abort();
                    }
                }
            }
        }
    }

    /// Starts the copies of a new plan: one task per source server, which runs that server's copies one
    /// after the other (memcached runs one item dump at a time: a second one answers `BUSY`), each in
    /// its turn among the operator's copies. `prepared` holds, per pair, the copier or why it cannot run.
    fn start(&self, key: Key, change: Change, since: Time, prepared: Vec<Prepared>) {
        let id = self.ids.fetch_add(1, Ordering::Relaxed);
        let mut plans = self.lock();
        let trigger = ObjectRef::<Memcached>::new(&key.1).within(&key.0);
        let mut copies = Vec::with_capacity(prepared.len());
        let mut by_source: BTreeMap<usize, Vec<(usize, Copier)>> = BTreeMap::new();
        for (index, prepared) in prepared.into_iter().enumerate() {
            let state = match prepared.copier {
                Err(why) => State::Ended(Ended::Skipped(why)),
                Ok(copier) => {
                    let progress = copier.progress();
                    by_source
                        .entry(prepared.pair.source)
                        .or_default()
                        .push((index, copier));
                    State::Running {
                        progress,
                        task: None,
                    }
                }
            };
            copies.push(Copy {
                pair: prepared.pair,
                source: prepared.source,
                target: prepared.target,
                state,
            });
        }
        for jobs in by_source.into_values() {
            let indexes: Vec<usize> = jobs.iter().map(|(index, _)| *index).collect();
            let (shared, permits, triggers, trigger, task_key) = (
                self.plans.clone(),
                self.permits.clone(),
                self.triggers.clone(),
                trigger.clone(),
                key.clone(),
            );
            // Spawned while the plans are locked: a copy's end (which takes the lock) cannot come
            // before its plan is there.
            let task = tokio::spawn(async move {
                for (index, copier) in jobs {
                    let result = {
                        // The semaphore is never closed.
                        let _permit = permits.acquire().await;
                        run(copier).await
                    };
                    let mut plans = shared.lock().unwrap_or_else(|e| e.into_inner());
                    let copy = plans
                        .get_mut(&task_key)
                        .filter(|plan| plan.id == id)
                        .and_then(|plan| plan.copies.get_mut(index));
                    if let Some(copy) = copy {
                        // The task goes on with the source's next copy: this one must not abort it.
                        copy.state = State::Ended(Ended::Copied(result));
                    }
                    drop(plans);
                    let _ = triggers.send(trigger.clone());
                }
            });
            for index in indexes {
                if let Some(State::Running { task: handle, .. }) =
                    copies.get_mut(index).map(|c| &mut c.state)
                {
                    *handle = Some(task.abort_handle());
                }
            }
        }
        if copies
            .iter()
            .all(|c| !matches!(c.state, State::Running { .. }))
        {
            // Nothing runs to bring the instance back: it reports the plan at once.
            let _ = self.triggers.send(trigger);
        }
        plans.insert(
            key,
            Plan {
                id,
                change,
                since,
                copies,
            },
        );
    }

    /// The per-target reports of the copies that ended and were not reported yet, for targets whose
    /// copies all ended; marked reported, each copy that ran given to `record` (the metrics).
    fn take_reports(
        &self,
        key: &Key,
        mut record: impl FnMut(&Result<Snapshot, Failure>),
    ) -> Vec<Report> {
        let mut plans = self.lock();
        let Some(plan) = plans.get_mut(key) else {
            return Vec::new();
        };
        let mut by_target: BTreeMap<usize, Vec<&mut Copy>> = BTreeMap::new();
        for copy in &mut plan.copies {
            by_target.entry(copy.pair.target).or_default().push(copy);
        }
        let mut reports = Vec::new();
        for (target, copies) in by_target {
            let all_ended = copies
                .iter()
                .all(|c| !matches!(c.state, State::Running { .. }));
            let unreported = copies.iter().any(|c| matches!(c.state, State::Ended(_)));
            if !all_ended || !unreported {
                continue;
            }
            let mut report = Report {
                target: copies[0].target.clone(),
                slot: plan.change.slot(target),
                ..Report::default()
            };
            for copy in copies {
                let state =
                    std::mem::replace(&mut copy.state, State::Ended(Ended::Skipped(String::new())));
                copy.state = match state {
                    State::Ended(ended) => {
                        report.add(&copy.source, &ended);
                        if let Ended::Copied(result) = &ended {
                            record(result);
                        }
                        State::Reported
                    }
                    other => other,
                };
            }
            reports.push(report);
        }
        reports
    }

    /// How far the running copies are, summed per target slot.
    fn progress(&self, key: &Key) -> Vec<HandoverProgress> {
        let plans = self.lock();
        let Some(plan) = plans.get(key) else {
            return Vec::new();
        };
        let mut by_slot: BTreeMap<i32, HandoverProgress> = BTreeMap::new();
        for copy in &plan.copies {
            if let State::Running { progress, .. } = &copy.state {
                let slot = plan.change.slot(copy.pair.target);
                let now = progress.snapshot();
                let entry = by_slot.entry(slot).or_insert(HandoverProgress {
                    slot,
                    items: 0,
                    bytes: 0,
                });
                entry.items += now.copied;
                entry.bytes += now.bytes;
            }
        }
        by_slot.into_values().collect()
    }

    /// When the instance's copies started, and whether some still run.
    fn running_since(&self, key: &Key) -> Option<Time> {
        let plans = self.lock();
        let plan = plans.get(key)?;
        match plan.copies() {
            Copies::Running { since } => Some(since),
            Copies::NotStarted | Copies::Ended => None,
        }
    }
}

/// What one target server got from its copies, for its event.
#[derive(Debug, Default)]
struct Report {
    target: String,
    slot: i32,
    copied: u64,
    bytes: u64,
    /// Items the target held already: written by clients since, or copied by a plan this one replaced
    /// (a scale-up 3 -> 4 that became 3 -> 5 when the next server was ready).
    existing: u64,
    sources: usize,
    /// Why copies ended cold, by source.
    failures: Vec<String>,
    /// Whether a failure was a time bound.
    timed_out: bool,
}

impl Report {
    fn add(&mut self, source: &str, ended: &Ended) {
        self.sources += 1;
        match ended {
            Ended::Copied(Ok(done)) => {
                self.copied += done.copied;
                self.bytes += done.bytes;
                self.existing += done.existing;
            }
            Ended::Copied(Err(failure)) => {
                self.copied += failure.progress.copied;
                self.bytes += failure.progress.bytes;
                self.existing += failure.progress.existing;
                self.timed_out |= matches!(failure.error, CopyError::Timeout(_));
                self.failures.push(format!(
                    "from {source} ({}): {failure}",
                    failure.error.reason()
                ));
            }
            Ended::Skipped(why) => self.failures.push(format!("from {source}: {why}")),
        }
    }

    /// Whether the copies ended without finding anything to hand over or failing: no item moves to the
    /// target (copied, or there already).
    fn is_empty(&self) -> bool {
        self.copied == 0 && self.existing == 0 && self.failures.is_empty()
    }

    /// The event's reason and note.
    fn event(&self, change: &Change) -> (bool, String) {
        let scale = format!(
            "the scale from {} to {} servers",
            change.old.len(),
            change.new.len()
        );
        let there = match self.existing {
            0 => String::new(),
            n => format!("; {n} were there already"),
        };
        if self.failures.is_empty() {
            (
                true,
                format!(
                    "Copied {} items ({} bytes) that move to {} (slot {}) from {} servers for {scale}{there}",
                    self.copied, self.bytes, self.target, self.slot, self.sources
                ),
            )
        } else {
            (
                false,
                format!(
                    "Scale handover to {} (slot {}) for {scale} ended cold{} after {} items ({} bytes): {}",
                    self.target,
                    self.slot,
                    if self.timed_out { " (timeout)" } else { "" },
                    self.copied,
                    self.bytes,
                    self.failures.join("; ")
                ),
            )
        }
    }
}

/// The scale-handover step of a reconcile, after the published list was applied: starts the copies of
/// `change` (the change the pool planned, if any) unless they run, ends them past their time bound,
/// reports the targets whose copies ended (one `HandedOver` event, or a `HandoverFailed` Warning, per
/// target server; the metrics per copy), and reports the copies still running.
pub async fn step(
    ctx: &Context,
    mc: &Memcached,
    instance: &Instance<'_>,
    change: Option<&Change>,
    pods: &[Arc<Pod>],
) -> Result<Step, Error> {
    let key = (instance.namespace.to_owned(), instance.name.to_owned());
    let handovers = &ctx.scale_handovers;
    let known = handovers.retire(&key, change);
    let Some(change) = change else {
        return Ok(Step::default());
    };
    let now = (ctx.clock)();
    let timeout = instance.spec.handover().timeout_seconds();
    if !known {
        let started = change.started.as_ref().unwrap_or(&now);
        if past(started, &now, timeout) {
            // A restarted operator past the drain's time bound: the scale proceeds without copies.
            return Ok(Step::default());
        }
        let prepared = prepare(ctx, instance, change, pods).await;
        info!(
            direction = ?change.direction,
            old = change.old.len(),
            new = change.new.len(),
            copies = prepared.len(),
            "handing over the keys that change server"
        );
        handovers.start(key.clone(), change.clone(), now.clone(), prepared);
    }
    if let Some(since) = handovers.running_since(&key) {
        let start = change.started.as_ref().unwrap_or(&since);
        if past(start, &now, timeout) {
            handovers.time_out(&key, Duration::from_secs(timeout));
        }
    }
    let metrics = ctx.metrics.handovers();
    let reports = handovers.take_reports(&key, |result| {
        metrics.record(instance.namespace, instance.name, result);
    });
    for report in reports {
        if report.is_empty() {
            // A server that joins a pool of empty servers (an instance's first pods, ready one by one):
            // nothing was handed over, and an event per server would only be noise.
            debug!(target = %report.target, "scale handover: nothing to copy");
            continue;
        }
        let (done, note) = report.event(change);
        let event = if done {
            normal("HandedOver", "Handover", note)
        } else {
            warning("HandoverFailed", "Handover", note)
        };
        ctx.events.record(&mc.object_ref(&()), event).await;
    }
    let progress = handovers.progress(&key);
    let wait = (!progress.is_empty()).then_some(PROGRESS_EVERY);
    Ok(Step { progress, wait })
}

/// Per pair of `change`: its source and target pods' names, and the copier of the keys it moves (or why
/// there is none).
async fn prepare(
    ctx: &Context,
    instance: &Instance<'_>,
    change: &Change,
    pods: &[Arc<Pod>],
) -> Vec<Prepared> {
    let endpoints = endpoints(instance, pods);
    let handover = change.handover();
    let mut prepared = Vec::new();
    for pair in change.pairs() {
        let (from, to) = (&change.old[pair.source], &change.new[pair.target]);
        let source = endpoints.get(from.as_str());
        let target = endpoints.get(to.as_str());
        let name = |e: Option<&(String, String)>, entry: &str| {
            e.map_or_else(|| entry.to_owned(), |(pod, _)| pod.clone())
        };
        let (source_name, target_name) = (name(source, from), name(target, to));
        let copier = match (source, target, &handover) {
            (_, _, Err(invalid)) => Err(format!("cannot place keys: {invalid}")),
            (None, _, _) => Err(format!("no pod with an IP serves {from}")),
            (_, None, _) => Err(format!("no pod with an IP serves {to}")),
            (Some((sp, sip)), Some((tp, tip)), Ok(handover)) => {
                copier(ctx, instance, (sp, sip), (tp, tip))
                    .await
                    .map(|c| c.only(filter(handover.clone(), pair)))
            }
        };
        prepared.push(Prepared {
            pair,
            source: source_name,
            target: target_name,
            copier,
        });
    }
    prepared
}

/// The published entry each pod serves, with its name and IP: a Deployment pod's `podIP:port`, a
/// StatefulSet pod's stable DNS name (the copy reaches it by IP all the same).
fn endpoints(instance: &Instance<'_>, pods: &[Arc<Pod>]) -> HashMap<String, (String, String)> {
    let port = instance.spec.container_port;
    let prefix = format!("{}-", instance.name);
    pods.iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter_map(|pod| {
            let name = pod.metadata.name.clone()?;
            let ip = pod
                .status
                .as_ref()?
                .pod_ip
                .clone()
                .filter(|ip| !ip.is_empty())?;
            let entry = match instance.spec.workload {
                Workload::Deployment if ip.contains(':') => format!("[{ip}]:{port}"),
                Workload::Deployment => format!("{ip}:{port}"),
                Workload::StatefulSet => {
                    let ordinal: i32 = name.strip_prefix(&prefix)?.parse().ok()?;
                    servers::stable_address(instance, ordinal)
                }
            };
            Some((entry, (name, ip)))
        })
        .collect()
}

#[cfg(test)]
mod tests;
