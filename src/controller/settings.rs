//! The reconciler's tunables, from the operator's flags (`cli` through `manager`).

use std::time::Duration;

use crate::handover;
use crate::resources::Defaults;
use crate::resources::fleet::{self, Budget};
use crate::store::digest_key::{self, KeyLocation};

/// Tunables of the reconciler.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Operator-wide defaults for the children (image).
    pub defaults: Defaults,
    /// Safety requeue after a successful reconcile, in case a watch event was missed.
    pub requeue_after: Duration,
    /// First retry delay after a failed reconcile; doubles per failure.
    pub backoff_base: Duration,
    /// Longest retry delay after failed reconciles.
    pub backoff_max: Duration,
    /// Time limit for best-effort side steps (events, status during deletion).
    pub side_step_timeout: Duration,
    /// Least time between two status writes of one instance that only move counts and conditions (see
    /// `pace`); zero writes every change at once.
    pub status_pace: Duration,
    /// Most reconciles applying at once (see [`super::turns`]).
    pub concurrency: u16,
    /// The cluster's DNS domain: the names a server's certificate may be valid for, when a warm handover
    /// connects to it over TLS.
    pub cluster_domain: String,
    /// Where the key of the Secrets' hash lives (`--digest-key-secret` in the operator's namespace).
    pub digest_key: KeyLocation,
    /// The longest a warm-handover copy may take, whatever its instance's `timeoutSeconds`
    /// (`--handover-max-timeout-seconds`).
    pub handover_max_timeout_seconds: u64,
    /// How many instances the operator's own changes of the pod template roll at once
    /// (`--fleet-rollout-budget`, see [`super::fleet`]).
    pub fleet_rollout_budget: Budget,
}

/// Default of [`Settings::concurrency`] (`--concurrency`).
pub const DEFAULT_CONCURRENCY: u16 = 64;

impl Default for Settings {
    fn default() -> Self {
        Self {
            defaults: Defaults::default(),
            requeue_after: Duration::from_secs(300),
            backoff_base: Duration::from_secs(1),
            backoff_max: Duration::from_secs(300),
            side_step_timeout: Duration::from_secs(5),
            status_pace: Duration::from_secs(1),
            concurrency: DEFAULT_CONCURRENCY,
            cluster_domain: crate::connection::DEFAULT_CLUSTER_DOMAIN.to_owned(),
            digest_key: KeyLocation {
                namespace: "default".to_owned(),
                name: digest_key::DEFAULT_SECRET.to_owned(),
            },
            handover_max_timeout_seconds: handover::DEFAULT_MAX_TIMEOUT_SECONDS,
            fleet_rollout_budget: fleet::DEFAULT_BUDGET,
        }
    }
}
