//! When each instance got its children and became Available, as the fake API server's store sees the
//! writes ([`fake_apiserver::Store::on_change`]), at the moment they land.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use fake_apiserver::{ChangeKind, Fake};
use serde_json::Value;

/// The Services each instance has once its children exist: today's operator makes a client Service and a
/// headless one.
pub const SERVICES_PER_INSTANCE: usize = 2;

/// When each instance got its children and became Available.
#[derive(Default)]
pub struct Progress {
    /// Instance uids to watch for.
    pub expected: HashSet<String>,
    /// Per instance uid: whether its workload exists, and how many Services.
    children: HashMap<String, (bool, usize)>,
    complete: usize,
    available: HashSet<String>,
    pub children_at: Option<Instant>,
    pub available_at: Option<Instant>,
}

/// The progress of the instances, shared with the store's hook that keeps it.
#[derive(Clone, Default)]
pub struct Tracker(Arc<Mutex<Progress>>);

impl Tracker {
    /// Follows every change `fake` stores from now on.
    pub fn follow(fake: &Fake) -> Self {
        let tracker = Self::default();
        let progress = tracker.clone();
        fake.store().on_change(Box::new(move |change| {
            let mut progress = progress.lock();
            match (change.plural, change.kind) {
                ("memcacheds", ChangeKind::Added | ChangeKind::Modified) => {
                    progress.status_written(change.object)
                }
                ("deployments" | "statefulsets" | "services", ChangeKind::Added) => {
                    progress.child_created(change.plural, change.object)
                }
                _ => {}
            }
        }));
        tracker
    }

    /// The progress so far (the hook waits meanwhile).
    pub fn lock(&self) -> MutexGuard<'_, Progress> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Progress {
    fn child_created(&mut self, plural: &str, obj: &Value) {
        let Some(owner) = controller_uid(obj) else {
            return;
        };
        if !self.expected.contains(owner) {
            return;
        }
        let entry = self.children.entry(owner.to_owned()).or_default();
        let was_complete = entry.0 && entry.1 >= SERVICES_PER_INSTANCE;
        match plural {
            "deployments" | "statefulsets" => entry.0 = true,
            "services" => entry.1 += 1,
            _ => return,
        }
        if !was_complete && entry.0 && entry.1 >= SERVICES_PER_INSTANCE {
            self.complete += 1;
            if self.complete == self.expected.len() && self.children_at.is_none() {
                self.children_at = Some(Instant::now());
            }
        }
    }

    fn status_written(&mut self, mc: &Value) {
        let Some(uid) = mc["metadata"]["uid"].as_str() else {
            return;
        };
        let available = mc["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["type"] == "Available" && c["status"] == "True");
        if available {
            self.available.insert(uid.to_owned());
        } else {
            self.available.remove(uid);
        }
        if self.available.len() == self.expected.len()
            && !self.expected.is_empty()
            && self.available_at.is_none()
        {
            self.available_at = Some(Instant::now());
        }
    }

    /// Instances with all their children so far.
    pub fn complete(&self) -> usize {
        self.complete
    }

    /// Instances Available so far.
    pub fn available(&self) -> usize {
        self.available.len()
    }
}

fn controller_uid(obj: &Value) -> Option<&str> {
    obj["metadata"]["ownerReferences"]
        .as_array()?
        .iter()
        .find(|r| r["controller"] == true)?["uid"]
        .as_str()
}
