//! What one reconcile changed among an instance's children, recorded as one event per kind of change.
//!
//! An event is a write to the API server like any other. Creating an instance creates three or more
//! children (workload, Services, budget, ...); one `Created` event naming them all says the same as one
//! event per child, at a fraction of the cost. Each change is still logged on its own.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::Event;

use crate::store::Publisher;
use crate::store::events::{normal, warning};

/// Reason of the warning that credentials travel in the clear.
pub const CREDENTIALS_IN_CLEAR: &str = "CredentialsInClear";

/// The children changes of one reconcile, in the order they were made.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Changes {
    created: Vec<String>,
    scaled: Vec<String>,
    updated: Vec<String>,
    deleted: Vec<String>,
    workload: bool,
    /// The instance's pods were created or changed with auth on and TLS off: said with a warning.
    in_clear: Option<String>,
}

impl Changes {
    /// Records that the workload (Deployment or StatefulSet) was created, scaled or updated.
    pub fn workload(&mut self) {
        self.workload = true;
    }
    /// Whether the workload was created, scaled or updated.
    pub fn workload_changed(&self) -> bool {
        self.workload
    }
    /// `what` ("Deployment cache with 3 replicas") was created.
    pub fn created(&mut self, what: String) {
        self.created.push(what);
    }
    /// `what` ("Deployment cache from 1 to 3 replicas") was scaled.
    pub fn scaled(&mut self, what: String) {
        self.scaled.push(what);
    }
    /// `what` ("Service cache") was changed to match the spec.
    pub fn updated(&mut self, what: String) {
        self.updated.push(what);
    }
    /// `what` ("PodDisruptionBudget cache") was deleted because the spec no longer wants it.
    pub fn deleted(&mut self, what: String) {
        self.deleted.push(what);
    }

    /// The workload of instance `name` was created or its pods changed, with auth on and TLS off.
    pub fn credentials_in_clear(&mut self, name: &str) {
        self.in_clear = Some(name.to_owned());
    }

    /// The events that record these changes: at most one per reason. Pure.
    pub fn events(&self) -> Vec<Event> {
        let mut events = Vec::new();
        if !self.created.is_empty() {
            let note = format!("Created {}", self.created.join(", "));
            events.push(normal("Created", "Create", note));
        }
        if !self.scaled.is_empty() {
            let note = format!("Scaled {}", self.scaled.join(", "));
            events.push(normal("Scaled", "Scale", note));
        }
        if !self.updated.is_empty() {
            let note = format!("Updated {} to match the spec", self.updated.join(", "));
            events.push(normal("Updated", "Update", note));
        }
        if !self.deleted.is_empty() {
            let note = format!(
                "Deleted {}: the spec no longer wants {}",
                self.deleted.join(", "),
                if self.deleted.len() == 1 {
                    "it"
                } else {
                    "them"
                }
            );
            events.push(normal("Deleted", "Delete", note));
        }
        if let Some(name) = &self.in_clear {
            let note = format!(
                "Memcached {name} requires authentication without TLS: its clients, and the operator's warm \
                 handovers (and stats reads, with spec.security.auth.allowPlaintextStats), send credentials \
                 in the clear on the pod network. Set spec.security.tls to encrypt them (see \
                 docs/operations.md, Security)"
            );
            events.push(warning(CREDENTIALS_IN_CLEAR, "Warn", note));
        }
        events
    }

    /// Logs and publishes the events through `events` (best effort), and empties the record.
    pub async fn publish(&mut self, events: &Publisher, reference: &ObjectReference) {
        for event in self.events() {
            events.record(reference, event).await;
        }
        *self = Self::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn notes(changes: &Changes) -> Vec<(String, String)> {
        changes
            .events()
            .into_iter()
            .map(|e| (e.reason, e.note.unwrap_or_default()))
            .collect()
    }

    #[test]
    fn credentials_in_the_clear_are_a_warning() {
        let mut changes = Changes::default();
        changes.created("Deployment cache with 1 replicas".into());
        changes.credentials_in_clear("cache");
        let events = changes.events();
        let warned = events.last().unwrap();
        assert_eq!(warned.reason, CREDENTIALS_IN_CLEAR);
        assert_eq!(warned.type_, kube::runtime::events::EventType::Warning);
        assert!(
            warned
                .note
                .as_deref()
                .unwrap()
                .contains("spec.security.tls")
        );
    }

    #[test]
    fn one_event_per_reason_naming_every_child() {
        assert!(Changes::default().events().is_empty());
        let mut changes = Changes::default();
        changes.created("Deployment cache with 1 replicas".into());
        changes.created("Service cache".into());
        changes.updated("Service cache-headless".into());
        changes.deleted("PodDisruptionBudget cache".into());
        assert_eq!(
            notes(&changes),
            [
                (
                    "Created".to_owned(),
                    "Created Deployment cache with 1 replicas, Service cache".to_owned()
                ),
                (
                    "Updated".to_owned(),
                    "Updated Service cache-headless to match the spec".to_owned()
                ),
                (
                    "Deleted".to_owned(),
                    "Deleted PodDisruptionBudget cache: the spec no longer wants it".to_owned()
                ),
            ]
        );
        let mut scaled = Changes::default();
        scaled.scaled("Deployment cache from 1 to 3 replicas".into());
        scaled.deleted("NetworkPolicy cache".into());
        scaled.deleted("HorizontalPodAutoscaler cache".into());
        assert_eq!(
            notes(&scaled),
            [
                (
                    "Scaled".to_owned(),
                    "Scaled Deployment cache from 1 to 3 replicas".to_owned()
                ),
                (
                    "Deleted".to_owned(),
                    "Deleted NetworkPolicy cache, HorizontalPodAutoscaler cache: the spec no longer \
                     wants them"
                        .to_owned()
                ),
            ]
        );
    }
}
