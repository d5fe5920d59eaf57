//! Event publishing with correct aggregation.
//!
//! kube's `Recorder` folds a repeated event into a series (one object, a count) keyed on type, reason,
//! action and object, but not on the note, so "Scaled from 1 to 3" followed by "Scaled from 3 to 5" would
//! show as the first note seen twice. Here each distinct note gets its own `Recorder`: identical events
//! still fold into a series, different ones stay separate. Recorders unused for longer than the series
//! window are dropped, and at most [`MOST_RECORDERS`] are kept (the least recently used goes first): each
//! holds a copy of its last event, and a burst of creations would otherwise keep one per instance for the
//! whole window. A dropped recorder only means that a repeat of its event starts a new series.

use std::collections::HashMap;
use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use tracing::{debug, info, warn};

/// How long a recorder (and so a series) is kept after its last use; kube's series window is 6 minutes.
const IDLE: Duration = Duration::from_secs(6 * 60);

/// Most recorders kept at once.
pub const MOST_RECORDERS: usize = 64;

/// Name the operator reports events under.
pub const REPORTER: &str = "memcached-operator";

/// Publishes the operator's events, one kube `Recorder` per distinct note (see the module doc).
pub struct Publisher {
    client: Client,
    reporter: Reporter,
    recorders: Mutex<HashMap<u64, (Recorder, Instant)>>,
    /// The bound of one best-effort publication ([`Publisher::send`]).
    timeout: Duration,
}

impl Publisher {
    pub fn new(client: Client, reporter: Reporter, timeout: Duration) -> Self {
        Self {
            client,
            reporter,
            recorders: Mutex::default(),
            timeout,
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
        if !recorders.contains_key(&key) && recorders.len() >= MOST_RECORDERS {
            let oldest = recorders
                .iter()
                .min_by_key(|(_, (_, used))| *used)
                .map(|(key, _)| *key);
            if let Some(oldest) = oldest {
                recorders.remove(&oldest);
            }
        }
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

// What the operator publishes, and how.

pub fn normal(reason: &str, action: &str, note: String) -> Event {
    event(EventType::Normal, reason, action, note)
}

pub fn warning(reason: &str, action: &str, note: String) -> Event {
    event(EventType::Warning, reason, action, note)
}

fn event(type_: EventType, reason: &str, action: &str, note: String) -> Event {
    Event {
        type_,
        reason: reason.to_owned(),
        // The Events API limits notes to 1 kB.
        note: Some(truncate(note, 1000)),
        action: action.to_owned(),
        secondary: None,
    }
}

fn truncate(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
    s
}

impl Publisher {
    /// Publishes an event within the publisher's bound; failures are logged, never returned: an event is
    /// not worth failing a reconcile.
    pub async fn send(&self, reference: &ObjectReference, event: Event) {
        match tokio::time::timeout(self.timeout, self.publish(&event, reference)).await {
            Ok(Ok(())) => {}
            // Unanswered: part of an outage, which is reported once on its own.
            Ok(Err(error @ (kube::Error::Service(_) | kube::Error::HyperError(_)))) => {
                debug!(%error, reason = %event.reason, "could not publish event")
            }
            Ok(Err(error)) => warn!(%error, reason = %event.reason, "could not publish event"),
            Err(_) => warn!(reason = %event.reason, "timed out publishing event"),
        }
    }

    /// Logs and publishes an event about what the operator changed (children, drain steps, copies).
    pub async fn record(&self, reference: &ObjectReference, event: Event) {
        info!(
            reason = %event.reason,
            note = event.note.as_deref().unwrap_or_default(),
            "changed"
        );
        self.send(reference, event).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn publisher() -> Publisher {
        let (service, _handle) = tower_test::mock::pair::<
            http::Request<kube::client::Body>,
            http::Response<kube::client::Body>,
        >();
        let client = Client::new(service, "default");
        let reporter = Reporter {
            controller: "test".into(),
            instance: None,
        };
        Publisher::new(client, reporter, Duration::from_secs(5))
    }

    fn event(note: &str) -> Event {
        Event {
            type_: EventType::Normal,
            reason: "Created".into(),
            note: Some(note.into()),
            action: "Create".into(),
            secondary: None,
        }
    }

    #[tokio::test]
    async fn recorders_are_per_note_and_bounded() {
        let publisher = publisher();
        let count = || publisher.recorders.lock().unwrap().len();
        publisher.recorder_for(&event("Created Deployment a"));
        publisher.recorder_for(&event("Created Deployment a"));
        assert_eq!(
            count(),
            1,
            "the same event shares its recorder (and series)"
        );
        for i in 0..200 {
            publisher.recorder_for(&event(&format!("Created Deployment {i}")));
        }
        assert_eq!(count(), MOST_RECORDERS);
        let newest = key(&event("Created Deployment 199"));
        assert!(publisher.recorders.lock().unwrap().contains_key(&newest));
        let evicted = key(&event("Created Deployment a"));
        assert!(!publisher.recorders.lock().unwrap().contains_key(&evicted));
    }

    #[test]
    fn truncate_respects_char_boundaries() {
        assert_eq!(truncate("héllo".into(), 2), "h");
        assert_eq!(truncate("hello".into(), 10), "hello");
    }
}
