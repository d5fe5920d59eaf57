//! What the process remembers per instance between reconciles: its retry backoff, when its status was
//! last written, its turn, its place in the fleet rollout, and the Secrets it names (their hashes, and
//! the served auth file this process wrote). None of it is in the cluster; a restart starts it afresh,
//! and [`Memory::forget`] drops it all when the instance is deleted.

use std::sync::Arc;

use kube::runtime::reflector::ObjectRef;

use super::backoff::Backoff;
use super::fleet::Fleet;
use super::pace::Pace;
use super::settings::Settings;
use super::turns::Turns;
use crate::metrics::Metrics;
use crate::store::SecretReader;

/// Per-instance memory of the process, kept for as long as the instance lives.
pub struct Memory {
    /// Failed reconciles per instance, and the delay before the next retry.
    pub backoff: Backoff,
    /// When each instance's status was last written, to pace the writes that can wait.
    pub pace: Pace,
    /// Whose turn it is to reconcile, and to write a first status.
    pub turns: Turns,
    /// The Secrets each instance names, read once per version through the one reader of their values
    /// (over `Stores::secret_cache`), and the served auth files this process wrote.
    pub secrets: SecretReader,
    /// The fleet rollout's slots and queue: which instance the operator's own template change rolls
    /// next.
    pub fleet: Fleet,
}

impl Memory {
    /// Nothing remembered yet, paced and bounded as `settings` say; `secrets` reads the Secrets' values.
    pub fn new(settings: &Settings, secrets: SecretReader, metrics: Arc<Metrics>) -> Self {
        Self {
            backoff: Backoff::new(settings.backoff_base, settings.backoff_max),
            pace: Pace::new(settings.status_pace),
            turns: Turns::new(settings.concurrency),
            secrets,
            fleet: Fleet::new(settings.fleet_rollout_budget, metrics),
        }
    }

    /// Drops what is remembered of instance `namespace/name`, which is gone: its failure count, its
    /// status pacing, and what was read of the Secrets only it names (TLS keys and auth files included).
    /// Its turn needs nothing: a wait for a turn ends by itself when its instance is gone.
    pub fn forget(&self, namespace: &str, name: &str) {
        self.backoff.reset(&ObjectRef::new(name).within(namespace));
        self.pace.forget(namespace, name);
        self.secrets.forget(namespace, name);
        self.fleet.forget(namespace, name);
    }
}
