//! Scale handovers under a declared client hashing: the copies a scale's change of the published list
//! needs (the planner's [`super::plan::copies`], the change from [`super::plan::scale`]), and the events
//! and metrics once they end.
//!
//! One change per instance at a time: a reconcile that plans another change (the pool moved on, a pod
//! became ready meanwhile) cancels the copies of the previous one and starts the new one's. Copies run in
//! the one registry ([`super::tasks`]), among every copy of the operator: a copy's end brings its instance
//! back to reconcile, which lets the scale proceed once every copy ended.
//!
//! Nothing is kept outside memory beyond the list before a scale-down (`status.drain.servers`): after a
//! restart (or a change of leader) the reconcile finds no copies for the change and starts them again;
//! add semantics make a second copy of an item harmless. A scale-down's time bound runs from its drain's
//! start, kept in the status, so a restart never holds the drained pods longer; a scale-up's restarts with
//! its copies.

use std::collections::BTreeMap;

use tracing::{debug, info};

use super::engine::Engine;
use super::error::{CopyError, Error, Failure};
use super::plan::scale::{Change, past};
use super::progress::Snapshot;
use super::tasks::{Ended, Key, Meta, State, Subject};
use super::transition::{Transition, endpoints};
use super::view::View;

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

/// The scale's part of the step, after the published list was applied: starts the copies of the
/// change the pool planned (if any) unless they run, ends them past their time bound, reports the
/// targets whose copies ended (one `HandedOver` event, or a `HandoverFailed` Warning, per target
/// server; the metrics per copy). Another change (or none) cancels the previous one's copies.
pub(super) async fn step(h: &Engine, view: &View<'_>) -> Result<(), Error> {
    let instance = view.instance;
    let key: Key = (
        instance.namespace.to_owned(),
        instance.name.to_owned(),
        Subject::Scale,
    );
    let known = h
        .tasks
        .with(&key, |job| job.change.as_ref() == view.hold.change.as_ref())
        .unwrap_or(false);
    if !known {
        if h.tasks.with(&key, |_| ()).is_some() {
            debug!(instance = %instance.name, "the scale handover's list changed: its copies stop");
        }
        h.tasks.forget(&key);
    }
    let Some(change) = view.hold.change.as_ref() else {
        return Ok(());
    };
    let now = h.now();
    let timeout = h.timeout_seconds(&instance.spec.handover());
    if !known {
        let started = change.started.as_ref().unwrap_or(&now);
        if past(started, &now, timeout) {
            // A restarted operator past the drain's time bound: the scale proceeds without copies.
            return Ok(());
        }
        let endpoints = endpoints(instance, view.pods);
        let prepared = h
            .prepare(instance, &endpoints, &Transition::scale(change))
            .await;
        info!(
            direction = ?change.direction,
            old = change.old.len(),
            new = change.new.len(),
            copies = prepared.len(),
            "handing over the keys that change server"
        );
        let meta = Meta {
            slot: -1,
            source: String::new(),
            since: now.clone(),
            bound: Some(change.started.clone().unwrap_or_else(|| now.clone())),
            change: Some(change.clone()),
        };
        h.tasks.start(key.clone(), meta, prepared);
    }
    h.tasks
        .time_out(instance.namespace, instance.name, &now, timeout);
    let reports = h
        .tasks
        .with(&key, |job| {
            take_reports(&mut job.copies, |result| {
                h.metrics.record(instance.namespace, instance.name, result);
            })
        })
        .unwrap_or_default();
    for report in reports {
        if report.is_empty() {
            // A server that joins a pool of empty servers (an instance's first pods, ready one by
            // one): nothing was handed over, and an event per server would only be noise.
            debug!(target = %report.target, "scale handover: nothing to copy");
            continue;
        }
        let (done, note) = report.event(change);
        h.tell(view.mc, done, note).await;
    }
    Ok(())
}

/// The per-target reports of the copies that ended and were not reported yet, for targets whose copies
/// all ended; marked reported, each copy that ran given to `record` (the metrics).
fn take_reports(
    copies: &mut [super::tasks::Copy],
    mut record: impl FnMut(&Result<Snapshot, Failure>),
) -> Vec<Report> {
    let mut by_target: BTreeMap<(i32, String), Vec<&mut super::tasks::Copy>> = BTreeMap::new();
    for copy in copies {
        by_target
            .entry((copy.slot, copy.target.clone()))
            .or_default()
            .push(copy);
    }
    let mut reports = Vec::new();
    for ((slot, target), copies) in by_target {
        let all_ended = copies
            .iter()
            .all(|c| !matches!(c.state, State::Running { .. }));
        let unreported = copies.iter().any(|c| matches!(c.state, State::Ended(_)));
        if !all_ended || !unreported {
            continue;
        }
        let mut report = Report {
            target,
            slot,
            ..Report::default()
        };
        for copy in copies {
            let state = std::mem::replace(&mut copy.state, State::Reported);
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

#[cfg(test)]
mod tests;
