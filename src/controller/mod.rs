//! The reconciler: the reconcile flow here, and the [`runtime`] that drives it.
//!
//! The kinds of children are one table ([`kinds`]). The flow, in the order one reconcile goes:
//! [`reconcile`] (validate, plan, apply, report), [`pool`] (slots, drain marks), [`secrets`] (the
//! referenced Secrets' hashes), [`children`] (apply only what differs), [`changes`] and [`events`] (what
//! changed, said once), [`pace`] (which status writes can wait) and [`error`]; warm handover is
//! [`crate::handover`]'s, which the context holds. The runtime: the watches and their caches, the turns
//! reconciles take, the retry backoff, the API server's reachability and read-your-writes.
//!
//! Everything the reconciler reads comes from in-memory caches (reflector stores) fed by label-scoped
//! watches, so a reconcile makes no read requests; it writes only when something differs.

mod apply;
pub mod backoff;
mod changes;
mod children;
mod error;
mod legacy_finalizer;
pub mod pace;
mod pool;
mod reconcile;
mod report;
mod secrets;
pub mod turns;
mod view;

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::runtime::events::Reporter;
use kube::runtime::reflector::ObjectRef;

pub use backoff::Backoff;
pub use error::Error;
pub use reconcile::{error_policy, reconcile};
pub use turns::Turns;

use crate::api::Memcached;
use crate::handover::{self, Handover};
use crate::metrics::Metrics;
use crate::resources::Defaults;
use crate::store::digest_key::{self, DigestKey, KeyLocation};
use crate::store::{Publisher, REPORTER, SecretReader, Stores, Writer, Written};

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
    /// Most reconciles applying at once (see [`turns`]).
    pub concurrency: u16,
    /// The cluster's DNS domain: the names a server's certificate may be valid for, when a warm handover
    /// connects to it over TLS.
    pub cluster_domain: String,
    /// Where the key of the Secrets' hash lives (`--digest-key-secret` in the operator's namespace).
    pub digest_key: KeyLocation,
    /// The longest a warm-handover copy may take, whatever its instance's `timeoutSeconds`
    /// (`--handover-max-timeout-seconds`).
    pub handover_max_timeout_seconds: u64,
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
        }
    }
}

pub use crate::store::Clock;

/// The system clock.
pub fn system_clock() -> Clock {
    Arc::new(|| Time(Timestamp::now()))
}

/// Shared state of every reconcile, built once: what it reads (`stores`), what it writes through
/// (`writer`), its settings and metrics, and what the process remembers per instance (retry backoff,
/// status pacing, turns, warm handovers), and the one reader of the Secrets' values.
pub struct Context {
    pub settings: Settings,
    pub stores: Stores,
    /// The client, read-your-writes and the event publisher.
    pub writer: Writer,
    pub metrics: Arc<Metrics>,
    pub backoff: Backoff,
    pub clock: Clock,
    /// The one reader of the Secrets' values (over `stores.secret_cache`).
    pub secrets: SecretReader,
    /// The key of the Secrets' hash in pod templates.
    pub digest_key: DigestKey,
    /// When each instance's status was last written, to pace the writes that can wait.
    pub pace: pace::Pace,
    /// Whose turn it is to reconcile, and to write a first status.
    pub turns: Turns,
    /// Warm handover: its copies, gates and spare servers (see [`crate::handover`]).
    pub handover: Handover,
}

impl Context {
    pub fn new(
        client: Client,
        settings: Settings,
        stores: Stores,
        metrics: Arc<Metrics>,
        reporter_instance: Option<String>,
        clock: Clock,
    ) -> Self {
        Self::sharing(
            client,
            settings,
            stores,
            metrics,
            reporter_instance,
            clock,
            Arc::default(),
        )
    }

    /// The context sharing `written` with the watches that end what it keeps (see
    /// [`crate::run::watch`]); [`Context::new`] keeps its own.
    pub fn sharing(
        client: Client,
        settings: Settings,
        stores: Stores,
        metrics: Arc<Metrics>,
        reporter_instance: Option<String>,
        clock: Clock,
        written: Arc<Written>,
    ) -> Self {
        let events = Arc::new(Publisher::new(
            client.clone(),
            Reporter {
                controller: REPORTER.to_owned(),
                instance: reporter_instance,
            },
            settings.side_step_timeout,
        ));
        let backoff = Backoff::new(settings.backoff_base, settings.backoff_max);
        let pace = pace::Pace::new(settings.status_pace);
        let turns = Turns::new(settings.concurrency);
        let digest_key = DigestKey::new(settings.digest_key.clone());
        let secrets = SecretReader::new(
            client.clone(),
            stores.secrets.clone(),
            stores.secret_cache.clone(),
            digest_key.clone(),
        );
        let writer = Writer {
            client,
            written,
            events,
        };
        let handover = Handover::new(handover::Deps {
            writer: writer.clone(),
            metrics: metrics.handovers(),
            secrets: secrets.clone(),
            pods: stores.pods.clone(),
            cluster_domain: settings.cluster_domain.clone(),
            clock: clock.clone(),
            max_timeout_seconds: settings.handover_max_timeout_seconds,
        });
        Self {
            settings,
            stores,
            writer,
            metrics,
            backoff,
            clock,
            secrets,
            digest_key,
            pace,
            turns,
            handover,
        }
    }

    /// Drops what this process keeps in memory about `mc`, which was just deleted: its retry backoff, its
    /// status pacing, the answer to the operator's latest write of it, and what was read of the Secrets
    /// only it names (TLS keys and auth files included). No reconcile follows a deletion
    /// (there is no finalizer to remove), so without this an instance that failed before it was deleted
    /// would keep its failure count for the life of the process. Called by the watch that sees it go.
    pub fn forget(&self, mc: &Memcached) {
        let (Some(namespace), Some(name)) = (
            mc.metadata.namespace.as_deref(),
            mc.metadata.name.as_deref(),
        ) else {
            return;
        };
        self.backoff.reset(&ObjectRef::from_obj(mc));
        self.pace.forget(namespace, name);
        self.handover.forget_instance(namespace, name);
        self.secrets.forget(namespace, name);
        self.metrics.forget_instance(namespace, name);
        self.writer.written.observe_deleted(mc, &());
    }
}
