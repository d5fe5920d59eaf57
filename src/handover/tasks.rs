//! The one registry of the operator's copies: every warm-handover copy (a Deployment rollout's, a
//! StatefulSet rollout's through the spare, a scale's) runs here, in a task of its own outside any
//! reconcile (it may take minutes).
//!
//! Copies are grouped in jobs, keyed by instance and [`Subject`]: the pod a rollout's copies fill (a
//! gated new server, or the spare), or the instance's scale. A reconcile never starts a second job for
//! the same key. A job's copies from one source run one after the other (memcached runs one item dump
//! at a time: a second one answers `BUSY`, which a copy waits out), each in its turn among the
//! operator's copies ([`MOST_COPIES`] at once, shared fairly among namespaces: [`slots`]). A copy's end brings its instance back to reconcile
//! ([`Tasks::triggers`]), which reports it: every write stays on the reconcile's path.
//!
//! Dropping a job (its pod or instance gone, another change planned, the operator stopping) aborts its
//! copies. Nothing is kept outside memory: after a restart (or a change of leader) the reconcile finds
//! no job and starts the copies again; add semantics make a second copy of an item harmless.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures::{Stream, StreamExt};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::runtime::reflector::ObjectRef;
use tokio::sync::mpsc;
use tokio::task::AbortHandle;
use tokio_stream::wrappers::UnboundedReceiverStream;

use super::copier::Copier;
use super::error::{CopyError, Failure};
use super::plan::scale::{Change, Copies, past};
use super::progress::{Progress, Snapshot};
use crate::api::Memcached;
use crate::resources::servers::Member;
use crate::status::HandoverProgress;

mod slots;
use slots::Slots;

/// Copies running at once per operator: each is one stream from one server to another, rate-limited on
/// its own, so a few at once keep the operator's share of the network (and its memory) small.
pub const MOST_COPIES: usize = 3;

/// What a job is for.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Subject {
    /// The copies that fill this pod: a gated new server, or a StatefulSet rollout's spare.
    Pod(String),
    /// The copies of the instance's scale.
    Scale,
}

/// (namespace, instance, subject).
pub type Key = (String, String, Subject);

/// Where a pod's job stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Some copies run.
    Running,
    /// Every copy ended; not reported yet.
    Ended,
    /// Reported, and the pod's gate opened: the pod cache does not show it yet, so a reconcile meanwhile
    /// must not take the pod for one still waiting (read-your-writes).
    Opened,
    /// A copy to the spare server ended and was reported: the spare holds the slot's items (as far as the
    /// copy got), and the partition may step down to it.
    Staged,
}

/// One job: its copies and what its report needs.
pub struct Job {
    id: u64,
    /// The slot the job fills (a pod's); a scale's targets have their own.
    pub slot: i32,
    /// The server read, for the report (a rollout's replaced pod, the spare's source).
    pub source: String,
    /// When its copies started.
    pub since: Time,
    /// When the job's own time bound started, if it has one besides each copy's (a scale's, a
    /// rollout's of several copies).
    pub bound: Option<Time>,
    /// A scale's change.
    pub change: Option<Change>,
    /// Reported (the gate opened, or the spare staged).
    pub closed: Option<Phase>,
    pub copies: Vec<Copy>,
}

/// One copy of a job.
pub struct Copy {
    pub source: String,
    pub target: String,
    /// The target's slot.
    pub slot: i32,
    pub state: State,
}

pub enum State {
    Running {
        progress: Arc<Progress>,
        task: Option<AbortHandle>,
    },
    /// Ended; reported by the next reconcile.
    Ended(Ended),
    /// Ended and reported.
    Reported,
}

/// How a copy ended.
pub enum Ended {
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

impl Job {
    /// A job with no copy, closed as `phase` (an opened gate, a staged spare).
    fn closed(slot: i32, phase: Phase, since: Time) -> Self {
        Self {
            id: 0,
            slot,
            source: String::new(),
            since,
            bound: None,
            change: None,
            closed: Some(phase),
            copies: Vec::new(),
        }
    }

    /// Whether some copy runs.
    pub fn running(&self) -> bool {
        self.copies
            .iter()
            .any(|c| matches!(c.state, State::Running { .. }))
    }

    pub fn phase(&self) -> Phase {
        match self.closed {
            Some(phase) => phase,
            None if self.running() => Phase::Running,
            None => Phase::Ended,
        }
    }

    /// Where a scale's copies are, as [`super::plan::scale::holds`] reads them.
    pub fn copies(&self) -> Copies {
        if self.running() {
            Copies::Running {
                since: self.since.clone(),
            }
        } else {
            Copies::Ended
        }
    }

    /// Ends the running copies as timed out (`timeout`), cancelling them.
    fn time_out(&mut self, timeout: Duration) {
        for copy in &mut self.copies {
            if let State::Running { progress, .. } = &copy.state {
                let failure = Failure {
                    error: CopyError::Timeout(timeout),
                    progress: progress.snapshot(),
                };
                // Dropping the old state's handle does not abort: the copy's Drop does, below.
                let old =
                    std::mem::replace(&mut copy.state, State::Ended(Ended::Copied(Err(failure))));
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

/// A copy ready to start: its servers' pod names, its target slot, and its copier (or why there is none).
pub struct Prepared {
    pub source: String,
    pub target: String,
    pub slot: i32,
    pub copier: Result<Copier, String>,
}

/// What a new job is: its slot, the server it reads, its time bound and a scale's change.
pub struct Meta {
    pub slot: i32,
    pub source: String,
    pub since: Time,
    pub bound: Option<Time>,
    pub change: Option<Change>,
}

/// The operator's copies, shared by every reconcile.
pub struct Tasks {
    jobs: Arc<Mutex<HashMap<Key, Job>>>,
    slots: Arc<Slots>,
    triggers: mpsc::UnboundedSender<ObjectRef<Memcached>>,
    receiver: Mutex<Option<mpsc::UnboundedReceiver<ObjectRef<Memcached>>>>,
    ids: AtomicU64,
}

/// Stopping the operator drops the context and with it every copy.
impl Drop for Tasks {
    fn drop(&mut self) {
        self.lock().clear();
    }
}

impl Default for Tasks {
    fn default() -> Self {
        let (triggers, receiver) = mpsc::unbounded_channel();
        Self {
            jobs: Arc::default(),
            slots: Slots::new(MOST_COPIES),
            triggers,
            receiver: Mutex::new(Some(receiver)),
            ids: AtomicU64::new(1),
        }
    }
}

impl Tasks {
    fn lock(&self) -> MutexGuard<'_, HashMap<Key, Job>> {
        self.jobs.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The instances to reconcile because one of their copies ended; taken once, by the controller.
    pub fn triggers(&self) -> impl Stream<Item = ObjectRef<Memcached>> + Send + 'static {
        let receiver = self
            .receiver
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        futures::stream::iter(receiver).flat_map(UnboundedReceiverStream::new)
    }

    /// Cancels the copies of an instance that is gone.
    pub fn forget_instance(&self, namespace: &str, name: &str) {
        self.lock()
            .retain(|(ns, instance, _), _| ns != namespace || instance != name);
    }

    /// Cancels the pod jobs of `instance` whose pod is not among `live` any more (or terminates), and
    /// forgets the opened gates the cache shows (their pods wait no more).
    pub fn forget_gone(&self, namespace: &str, instance: &str, live: &[Member]) {
        self.lock().retain(|(ns, name, subject), job| {
            let Subject::Pod(pod) = subject else {
                return true;
            };
            if ns != namespace || name != instance {
                return true;
            }
            let member = live.iter().find(|m| &m.name == pod && !m.terminating);
            match job.closed {
                Some(Phase::Opened) => member.is_some_and(|m| m.waiting),
                _ => member.is_some(),
            }
        });
    }

    /// Closes the job of `key` as `phase` (a gate opened, the spare staged for `slot`), until the pod
    /// goes or another job replaces it.
    pub fn close(&self, key: Key, slot: i32, phase: Phase, now: Time) {
        self.lock().insert(key, Job::closed(slot, phase, now));
    }

    /// The slot of the job of `key`, and where it stands.
    pub fn phase(&self, key: &Key) -> Option<(i32, Phase)> {
        self.lock().get(key).map(|job| (job.slot, job.phase()))
    }

    /// Forgets (and cancels) the job of `key`.
    pub fn forget(&self, key: &Key) {
        self.lock().remove(key);
    }

    /// Runs `f` on the job of `key`, if there is one.
    pub fn with<R>(&self, key: &Key, f: impl FnOnce(&mut Job) -> R) -> Option<R> {
        self.lock().get_mut(key).map(f)
    }

    /// Pod → the server its job reads, for the instance's pod jobs (an empty source once closed).
    pub fn open(&self, namespace: &str, instance: &str) -> BTreeMap<String, String> {
        self.lock()
            .iter()
            .filter_map(|((ns, name, subject), job)| match subject {
                Subject::Pod(pod) if ns == namespace && name == instance => {
                    Some((pod.clone(), job.source.clone()))
                }
                _ => None,
            })
            .collect()
    }

    /// The instance's pod jobs whose copies all ended, taken out (to report and close).
    pub fn take_ended(&self, namespace: &str, instance: &str) -> Vec<(String, Job)> {
        let mut jobs = self.lock();
        let ended: Vec<Key> = jobs
            .iter()
            .filter(|((ns, name, subject), job)| {
                ns == namespace
                    && name == instance
                    && matches!(subject, Subject::Pod(_))
                    && job.phase() == Phase::Ended
            })
            .map(|(key, _)| key.clone())
            .collect();
        ended
            .into_iter()
            .filter_map(|key| {
                let job = jobs.remove(&key)?;
                match key.2 {
                    Subject::Pod(pod) => Some((pod, job)),
                    Subject::Scale => None,
                }
            })
            .collect()
    }

    /// Puts back a job taken out whose report failed, for the retry.
    pub fn put_back(&self, key: Key, job: Job) {
        self.lock().insert(key, job);
    }

    /// Ends, as timed out, the running copies of the instance's jobs whose own time bound passed.
    pub fn time_out(&self, namespace: &str, instance: &str, now: &Time, timeout_seconds: u64) {
        for ((ns, name, _), job) in self.lock().iter_mut() {
            let past_bound = job
                .bound
                .as_ref()
                .is_some_and(|start| past(start, now, timeout_seconds));
            if ns == namespace && name == instance && past_bound && job.running() {
                job.time_out(Duration::from_secs(timeout_seconds));
            }
        }
    }

    /// How far the instance's running copies are, summed per target slot.
    pub fn progress(&self, namespace: &str, instance: &str) -> Vec<HandoverProgress> {
        let jobs = self.lock();
        let mut by_slot: BTreeMap<i32, HandoverProgress> = BTreeMap::new();
        let running = jobs
            .iter()
            .filter(|((ns, name, _), _)| ns == namespace && name == instance)
            .flat_map(|(_, job)| &job.copies);
        for copy in running {
            if let State::Running { progress, .. } = &copy.state {
                let now = progress.snapshot();
                let entry = by_slot.entry(copy.slot).or_insert(HandoverProgress {
                    slot: copy.slot,
                    items: 0,
                    bytes: 0,
                });
                entry.items += now.copied;
                entry.bytes += now.bytes;
            }
        }
        by_slot.into_values().collect()
    }

    /// Starts the job of `key`, unless there is one (a reconcile never starts a second job for a key:
    /// another change forgets the previous one first): one task per source server, which runs that
    /// server's copies one after the other, each in its turn among the operator's copies. A copy
    /// without a copier ends at once (skipped). When no copy runs, the instance is brought back at once
    /// to report the job.
    pub fn start(&self, key: Key, meta: Meta, prepared: Vec<Prepared>) {
        let id = self.ids.fetch_add(1, Ordering::Relaxed);
        let mut jobs = self.lock();
        if jobs.contains_key(&key) {
            return;
        }
        let trigger = ObjectRef::<Memcached>::new(&key.1).within(&key.0);
        let mut copies = Vec::with_capacity(prepared.len());
        let mut by_source: BTreeMap<String, Vec<(usize, Copier)>> = BTreeMap::new();
        for (index, prepared) in prepared.into_iter().enumerate() {
            let state = match prepared.copier {
                Err(why) => State::Ended(Ended::Skipped(why)),
                Ok(copier) => {
                    let progress = copier.progress();
                    by_source
                        .entry(prepared.source.clone())
                        .or_default()
                        .push((index, copier));
                    State::Running {
                        progress,
                        task: None,
                    }
                }
            };
            copies.push(Copy {
                source: prepared.source,
                target: prepared.target,
                slot: prepared.slot,
                state,
            });
        }
        for queue in by_source.into_values() {
            let indexes: Vec<usize> = queue.iter().map(|(index, _)| *index).collect();
            let task = tokio::spawn(self.queue(key.clone(), id, queue, trigger.clone()));
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
            let _ = self.triggers.send(trigger);
        }
        let job = Job {
            id,
            slot: meta.slot,
            source: meta.source,
            since: meta.since,
            bound: meta.bound,
            change: meta.change,
            closed: None,
            copies,
        };
        // Inserted while the jobs are locked: a copy's end (which takes the lock) cannot come before its
        // job is there.
        jobs.insert(key, job);
    }

    /// One source's copies of job `id`, one after the other; each end recorded and its instance
    /// triggered.
    fn queue(
        &self,
        key: Key,
        id: u64,
        queue: Vec<(usize, Copier)>,
        trigger: ObjectRef<Memcached>,
    ) -> impl Future<Output = ()> + Send + 'static {
        let (shared, slots, triggers) =
            (self.jobs.clone(), self.slots.clone(), self.triggers.clone());
        async move {
            for (index, copier) in queue {
                let result = {
                    let _slot = slots.acquire(&key.0).await;
                    copier.run().await
                };
                let mut jobs = shared.lock().unwrap_or_else(|e| e.into_inner());
                let copy = jobs
                    .get_mut(&key)
                    .filter(|job| job.id == id)
                    .and_then(|job| job.copies.get_mut(index));
                if let Some(copy) = copy {
                    // The task goes on with the source's next copy: this one must not abort it.
                    copy.state = State::Ended(Ended::Copied(result));
                }
                drop(jobs);
                let _ = triggers.send(trigger.clone());
            }
        }
    }
}

#[cfg(test)]
mod tests;
