//! The context every reconcile shares, built once per controller: what a reconcile reads, writes
//! through, counts and remembers. It never changes after it is built; what changes lives behind its
//! parts (the caches, the writer's read-your-writes, the [`Memory`] of each instance).
//!
//! The reconcile's steps take the part they need (the stores, the writer, the clock, the Secret reader)
//! rather than the whole context: only the reconcile, its apply step and its status report take it.

use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::runtime::events::Reporter;

use super::memory::Memory;
use super::settings::Settings;
use crate::api::Memcached;
use crate::handover::{self, Handover};
use crate::metrics::Metrics;
use crate::store::digest_key::DigestKey;
use crate::store::{Clock, Publisher, REPORTER, SecretReader, Stores, Writer, Written};

/// The system clock.
pub fn system_clock() -> Clock {
    Arc::new(|| Time(Timestamp::now()))
}

/// Shared state of every reconcile, built once: its settings, what it reads (`stores`), what it writes
/// through (`writer`), its metrics and clock, warm handover, and what the process remembers per instance
/// (`memory`).
pub struct Context {
    pub(crate) settings: Settings,
    pub(crate) stores: Stores,
    /// The client, read-your-writes and the event publisher.
    pub writer: Writer,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) clock: Clock,
    /// Per instance: retry backoff, status pacing, turns, the Secrets it names.
    pub memory: Memory,
    /// Warm handover: its copies, gates and spare servers (see [`crate::handover`]).
    pub(crate) handover: Handover,
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
        let secrets = secret_reader(
            &client,
            &stores,
            DigestKey::new(settings.digest_key.clone()),
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
            memory: Memory::new(&settings, secrets, metrics.clone()),
            settings,
            stores,
            writer,
            metrics,
            clock,
            handover,
        }
    }

    /// The context whose reconciles key the Secrets' hash with `digest_key` (one known in advance, or
    /// one shared with another context as within one process) instead of the key of
    /// `Settings::digest_key`, read or made when first needed.
    pub fn with_digest_key(mut self, digest_key: DigestKey) -> Self {
        self.memory.secrets = secret_reader(&self.writer.client, &self.stores, digest_key);
        self
    }

    /// Drops what this process keeps in memory about `mc`, which was just deleted: what it remembers of
    /// the instance ([`Memory::forget`]), its warm handovers, its metrics, and the answer to the
    /// operator's latest write of it. No reconcile follows a deletion (there is no finalizer to remove),
    /// so without this an instance that failed before it was deleted would keep its failure count for
    /// the life of the process. Called by the watch that sees it go.
    pub fn forget(&self, mc: &Memcached) {
        let (Some(namespace), Some(name)) = (
            mc.metadata.namespace.as_deref(),
            mc.metadata.name.as_deref(),
        ) else {
            return;
        };
        self.memory.forget(namespace, name);
        self.handover.forget_instance(namespace, name);
        self.metrics.forget_instance(namespace, name);
        self.writer.written.observe_deleted(mc, &());
    }
}

/// The one reader of the Secrets' values, over the stores' Secret cache.
fn secret_reader(client: &Client, stores: &Stores, digest_key: DigestKey) -> SecretReader {
    SecretReader::new(
        client.clone(),
        stores.secrets.clone(),
        stores.secret_cache.clone(),
        digest_key,
    )
}
