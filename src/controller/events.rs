//! Event publishing with correct aggregation.
//!
//! kube's `Recorder` folds a repeated event into a series (one object, a count) keyed on type, reason,
//! action and object, but not on the note, so "Scaled from 1 to 3" followed by "Scaled from 3 to 5" would
//! show as the first note seen twice. Here each distinct note gets its own `Recorder`: identical events
//! still fold into a series, different ones stay separate. Recorders unused for longer than the series
//! window are dropped, which bounds memory.

use std::collections::HashMap;
use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};

/// How long a recorder (and so a series) is kept after its last use; kube's series window is 6 minutes.
const IDLE: Duration = Duration::from_secs(6 * 60);

pub struct Publisher {
    client: Client,
    reporter: Reporter,
    recorders: Mutex<HashMap<u64, (Recorder, Instant)>>,
}

impl Publisher {
    pub fn new(client: Client, reporter: Reporter) -> Self {
        Self {
            client,
            reporter,
            recorders: Mutex::default(),
        }
    }

    /// Publishes `event` about `regarding`.
    pub async fn publish(
        &self,
        event: &Event,
        regarding: &ObjectReference,
    ) -> Result<(), kube::Error> {
        let recorder = self.recorder_for(event);
        recorder.publish(event, regarding).await
    }

    fn recorder_for(&self, event: &Event) -> Recorder {
        let key = key(event);
        let now = Instant::now();
        let mut recorders = self.recorders.lock().unwrap_or_else(|e| e.into_inner());
        recorders.retain(|_, (_, used)| now.duration_since(*used) < IDLE);
        let entry = recorders.entry(key).or_insert_with(|| {
            (
                Recorder::new(self.client.clone(), self.reporter.clone()),
                now,
            )
        });
        entry.1 = now;
        entry.0.clone()
    }
}

fn key(event: &Event) -> u64 {
    let mut hasher = DefaultHasher::new();
    matches!(event.type_, EventType::Warning).hash(&mut hasher);
    event.reason.hash(&mut hasher);
    event.action.hash(&mut hasher);
    event.note.hash(&mut hasher);
    hasher.finish()
}
