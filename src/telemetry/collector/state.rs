//! What the collector holds and its tasks share ([`Collector`]): its settings, what it reads from, its
//! bounds on reads and writes in flight with their timeouts, and what it remembers of each instance
//! between collections.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::runtime::reflector::Store;
use tokio::sync::Semaphore;

use crate::api::Memcached;
use crate::store::{Cache, PodIndex, Publisher, SecretReader, Writer};
use crate::telemetry::client::{self, ProxyReading, ReadError, Reading, Target};
use crate::telemetry::episodes::{Counter, Episode};
use crate::telemetry::metrics::{InstanceKey, OperandMetrics};
use crate::telemetry::reload::Reload;

/// Longest time one server may take to answer (connect, TLS, auth, `stats`).
pub const READ_TIMEOUT: Duration = Duration::from_secs(2);
/// Most servers read at once, over all instances. At the [`READ_TIMEOUT`] that reads at least 16 dead
/// servers a second, so even a thousand unreachable pods finish in about a minute, while a healthy
/// server answers in about a millisecond; and it bounds the operator's open sockets.
pub const MAX_READS_IN_FLIGHT: usize = 32;
/// Most `status.stats` writes and events in flight at once. Writes are rare (only changes, at most one per
/// instance per `--stats-status-interval`), but the first collection after a leader change may find every
/// busy instance changed: this spreads that burst instead of sending one request per instance at once.
pub const MAX_WRITES_IN_FLIGHT: usize = 8;
/// Longest wait for a status write or an event, so a slow API server does not hold a collection.
pub(super) const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// How often to collect and to write.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Time between collections (`--stats-interval`).
    pub interval: Duration,
    /// Shortest time between two `status.stats` writes of one instance (`--stats-status-interval`).
    pub status_interval: Duration,
    /// The cluster's DNS domain (`--cluster-domain`): the suffix of the Service names a server's
    /// certificate may be valid for ([`ServerNames`](crate::telemetry::client::ServerNames)).
    pub cluster_domain: String,
}

/// Reads one server. The operator's is [`Network`]; tests may give their own.
pub trait Reader: Send + Sync + 'static {
    fn read(
        &self,
        target: Target,
        timeout: Duration,
    ) -> BoxFuture<'static, Result<Reading, ReadError>>;

    /// Reads one proxy pod.
    fn read_proxy(
        &self,
        target: Target,
        timeout: Duration,
    ) -> BoxFuture<'static, Result<ProxyReading, ReadError>>;
}

/// Reads over the network with [`client::read`].
pub struct Network;

impl Reader for Network {
    fn read(
        &self,
        target: Target,
        timeout: Duration,
    ) -> BoxFuture<'static, Result<Reading, ReadError>> {
        Box::pin(async move { client::read(&target, timeout).await })
    }

    fn read_proxy(
        &self,
        target: Target,
        timeout: Duration,
    ) -> BoxFuture<'static, Result<ProxyReading, ReadError>> {
        Box::pin(async move { client::read_proxy(&target, timeout).await })
    }
}

/// What the collector reads from.
pub struct Sources {
    pub client: Client,
    pub memcacheds: Store<Memcached>,
    pub pods: IndexedPods,
    /// The one reader of the Secrets' values: the TLS material and the operator's credentials.
    pub secrets: SecretReader,
}

/// The pod cache and its index by instance (see [`PodIndex`]).
#[derive(Clone)]
pub struct IndexedPods {
    pub store: Cache<Pod>,
    pub index: PodIndex,
}

/// What the collector remembers of one instance between collections.
#[derive(Default)]
pub(super) struct InstanceState {
    /// When this replica last wrote its `status.stats`.
    pub(super) last_write: Option<Instant>,
    /// Per pod: uptime and evictions at the previous collection.
    pub(super) counters: BTreeMap<String, Counter>,
    pub(super) episode: Episode,
    /// Why (some of) its servers could not be read at the previous collection, as logged.
    pub(super) problem: Option<String>,
    /// Whether this replica said that the operator presents the server certificate as its client
    /// certificate (`clientAuth` without `clientSecretName`).
    pub(super) identity_noted: bool,
    /// Servers still presenting a rotated certificate's predecessor.
    pub(super) reload: Reload,
    /// Per slot: the address its pod last had while ready (see `proxies::remember_routed`).
    pub(super) routed: BTreeMap<i32, String>,
}

/// The collector. Shared by its collection tasks.
pub struct Collector {
    pub(super) settings: Settings,
    /// The `status.stats` writes and the events go through it.
    pub(super) writer: Writer,
    pub(super) memcacheds: Store<Memcached>,
    pub(super) pods: IndexedPods,
    pub(super) secrets: SecretReader,
    pub(super) metrics: Arc<OperandMetrics>,
    pub(super) reader: Arc<dyn Reader>,
    pub(super) permits: Arc<Semaphore>,
    /// Bounds writes in flight ([`MAX_WRITES_IN_FLIGHT`]).
    pub(super) writes: Semaphore,
    pub(super) state: Mutex<HashMap<InstanceKey, InstanceState>>,
}

impl Collector {
    pub fn new(
        settings: Settings,
        sources: Sources,
        metrics: Arc<OperandMetrics>,
        events: Arc<Publisher>,
        reader: Arc<dyn Reader>,
    ) -> Self {
        Self {
            settings,
            secrets: sources.secrets,
            // Its own read-your-writes: nothing it writes is read back.
            writer: Writer {
                client: sources.client,
                written: Arc::default(),
                events,
            },
            memcacheds: sources.memcacheds,
            pods: sources.pods,
            metrics,
            reader,
            permits: Arc::new(Semaphore::new(MAX_READS_IN_FLIGHT)),
            writes: Semaphore::new(MAX_WRITES_IN_FLIGHT),
            state: Mutex::default(),
        }
    }

    pub(super) fn lock_state(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<InstanceKey, InstanceState>> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}
