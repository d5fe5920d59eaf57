//! Prometheus metrics: what the reconciler does, and every request it makes to the API server.
//!
//! Names carry the `memcached_operator_` prefix. API requests are counted by a tower layer in the kube
//! client's stack, so every call (watches, applies, events, leases) is seen without instrumenting call
//! sites. The operand metrics (what each memcached server reports, see [`crate::telemetry::metrics`])
//! keep the memcached exporter's `memcached_` names, so they live in a registry of their own, without
//! the prefix, encoded into the same exposition.

use std::sync::Arc;
use std::time::Instant;

use http::Version;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::handover::metrics::HandoverMetrics;
use crate::observe::{Outcome, Sent};
use crate::telemetry::metrics::OperandMetrics;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ErrorLabels {
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WatchErrorLabels {
    resource: &'static str,
    reason: &'static str,
}

/// One of the operator's caches, by the resource its watch reads.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CacheLabels {
    resource: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    verb: &'static str,
    code: String,
}

/// One condition of one instance. The label is `condition`, not `type`: a scrape adds no such label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ConditionLabels {
    namespace: String,
    memcached: String,
    condition: &'static str,
}

/// The condition types [`Metrics::set_conditions`] exports, as the reconciler writes them.
const CONDITION_TYPES: [&str; 3] = [
    crate::status::AVAILABLE,
    crate::status::PROGRESSING,
    crate::status::DEGRADED,
];

/// The condition types exported only while the status has them (a feature's, while it is on).
const OPTIONAL_CONDITION_TYPES: [&str; 1] = [crate::status::PROXY_AVAILABLE];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FleetLabels {
    state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ProtocolLabels {
    protocol: &'static str,
}

/// The samples the operator's own registry encodes, as queries name them (a histogram's `_bucket`,
/// `_sum` and `_count`, a counter's `_total`). The unit test below encodes every metric and compares.
const OPERATOR_SERIES: &[&str] = &[
    "memcached_operator_reconcile_total",
    "memcached_operator_reconcile_errors_total",
    "memcached_operator_reconcile_duration_seconds_bucket",
    "memcached_operator_reconcile_duration_seconds_sum",
    "memcached_operator_reconcile_duration_seconds_count",
    "memcached_operator_managed_instances",
    "memcached_operator_leader",
    "memcached_operator_kube_requests_total",
    "memcached_operator_kube_responses_total",
    "memcached_operator_api_available",
    "memcached_operator_watch_errors_total",
    "memcached_operator_instance_condition",
    "memcached_operator_fleet_rollout_instances",
    "memcached_operator_fleet_rollout_completed_total",
    "memcached_operator_cache_objects",
    "memcached_operator_cache_bytes",
    "memcached_operator_stats_reads_total",
    "memcached_operator_certificate_refreshes_total",
    "memcached_operator_certificate_reloads_total",
];

/// Every sample name `/metrics` can carry: the operator's and the operand's (the exporter's names). The
/// Grafana dashboard and the alert rules are checked against it, so that a renamed metric fails a test
/// instead of leaving an empty panel or an alert that never fires.
pub fn exported_series() -> Vec<String> {
    OPERATOR_SERIES
        .iter()
        .chain(crate::handover::metrics::SERIES.iter())
        .map(|name| (*name).to_owned())
        .chain(crate::telemetry::metrics::series_names())
        .collect()
}

/// The operator's metrics and the registry they are exported from.
pub struct Metrics {
    registry: Registry,
    reconciles: Family<ResultLabels, Counter>,
    errors: Family<ErrorLabels, Counter>,
    duration: Histogram,
    instances: Gauge,
    leader: Gauge,
    requests: Family<RequestLabels, Counter>,
    responses: Family<ProtocolLabels, Counter>,
    api_available: Gauge,
    watch_errors: Family<WatchErrorLabels, Counter>,
    conditions: Family<ConditionLabels, Gauge>,
    fleet: Family<FleetLabels, Gauge>,
    fleet_completed: Counter,
    caches: CacheMetrics,
    operand_registry: Registry,
    operand: Arc<OperandMetrics>,
    handovers: Arc<HandoverMetrics>,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("memcached_operator");
        let reconciles = registered(
            &mut registry,
            "reconcile",
            "Reconciliations by result (success, error)",
            Family::<ResultLabels, Counter>::default(),
        );
        let errors = registered(
            &mut registry,
            "reconcile_errors",
            "Failed reconciliations by error kind",
            Family::<ErrorLabels, Counter>::default(),
        );
        let duration = registered(
            &mut registry,
            "reconcile_duration_seconds",
            "Time one reconciliation takes",
            Histogram::new(exponential_buckets(0.001, 2.0, 15)),
        );
        let instances = registered(
            &mut registry,
            "managed_instances",
            "Memcached objects the operator watches",
            Gauge::default(),
        );
        let leader = registered(
            &mut registry,
            "leader",
            "1 while this replica holds the leader lease (or runs without leader election), else 0",
            Gauge::default(),
        );
        let requests = registered(
            &mut registry,
            "kube_requests",
            "Kubernetes API requests by verb and HTTP status code (\"error\" when no response arrived)",
            Family::<RequestLabels, Counter>::default(),
        );
        let responses = registered(
            &mut registry,
            "kube_responses",
            "Kubernetes API answers by HTTP version (HTTP/2 where the API server offers it over TLS: one \
            connection for the writes, one for the watches; HTTP/1.1: one connection per request in \
            flight)",
            Family::<ProtocolLabels, Counter>::default(),
        );
        let api_available = registered(
            &mut registry,
            "api_available",
            "1 while the API server answers the operator's requests, 0 during an outage",
            Gauge::default(),
        );
        let watch_errors = registered(
            &mut registry,
            "watch_errors",
            "Failed or expired watches by resource and reason (expired: re-listed at once; failed: retried)",
            Family::<WatchErrorLabels, Counter>::default(),
        );
        let conditions = registered(
            &mut registry,
            "instance_condition",
            "1 while the instance's condition (Available, Progressing, Degraded; ProxyAvailable with the proxy on) is True, else 0; as the \
            leader last computed it",
            Family::<ConditionLabels, Gauge>::default(),
        );
        let fleet = registered(
            &mut registry,
            "fleet_rollout_instances",
            "Instances in the fleet rollout of the operator's own pod-template changes: pending (waiting \
            for a turn) and rolling (holding one of --fleet-rollout-budget's slots, whatever caused the \
            rollout)",
            Family::<FleetLabels, Gauge>::default(),
        );
        let fleet_completed = registered(
            &mut registry,
            "fleet_rollout_completed",
            "Instances whose turn in the fleet rollout ended with their workload settled",
            Counter::default(),
        );
        let caches = CacheMetrics::registered(&mut registry);
        let handovers = Arc::new(HandoverMetrics::default());
        handovers.register(&mut registry);
        let operand = Arc::new(OperandMetrics::default());
        let operand_registry = operand_registry(&operand);
        Self {
            registry,
            operand_registry,
            operand,
            handovers,
            reconciles,
            errors,
            duration,
            instances,
            leader,
            requests,
            responses,
            api_available,
            watch_errors,
            conditions,
            fleet,
            fleet_completed,
            caches,
        }
    }
}

/// What the operator's packed caches hold, by resource (their writers keep the gauges up to date).
struct CacheMetrics {
    objects: Family<CacheLabels, Gauge>,
    bytes: Family<CacheLabels, Gauge>,
}

impl CacheMetrics {
    fn registered(registry: &mut Registry) -> Self {
        let objects = registered(
            registry,
            "cache_objects",
            "Objects in the operator's packed cache of a resource (the children and pods it watches)",
            Family::<CacheLabels, Gauge>::default(),
        );
        let bytes = registered(
            registry,
            "cache_bytes",
            "Bytes the operator's cache of a resource holds: the objects' packed texts, names and map \
            entries (the maps' spare capacity, at most as much again, is not counted)",
            Family::<CacheLabels, Gauge>::default(),
        );
        Self { objects, bytes }
    }
}

/// Registers `metric` under `name` and hands it back.
fn registered<M>(registry: &mut Registry, name: &str, help: &str, metric: M) -> M
where
    M: prometheus_client::registry::Metric + Clone,
{
    registry.register(name, help, metric.clone());
    metric
}

/// The registry of the operand series (unprefixed: their names are the memcached exporter's), and the
/// operator's own counts of its stats reads and certificate reloads.
fn operand_registry(operand: &Arc<OperandMetrics>) -> Registry {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(operand.clone()));
    registry.register(
            "memcached_operator_stats_reads",
            "Reads of memcached servers' stats by result: ok, or why not (connect, timeout, tls, auth, closed, protocol, io, unreadable)",
            operand.reads(),
        );
    registry.register(
            "memcached_operator_certificate_refreshes",
            "refresh_certs commands sent to memcached servers presenting a certificate other than their TLS Secret's, by answer (ok, refused)",
            operand.refreshes(),
        );
    registry.register(
            "memcached_operator_certificate_reloads",
            "memcached servers seen presenting their TLS Secret's rotated certificate after refresh_certs (reloaded in place, no restart)",
            operand.reloads(),
        );
    registry
}

impl Metrics {
    /// The metrics in the Prometheus/OpenMetrics text format.
    pub fn encode(&self) -> String {
        use prometheus_client::encoding::text::{encode_eof, encode_registry};
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = encode_registry(&mut out, &self.registry);
        let _ = encode_registry(&mut out, &self.operand_registry);
        let _ = encode_eof(&mut out);
        out
    }

    /// The operand metrics, which the stats collector fills.
    pub fn operand(&self) -> Arc<OperandMetrics> {
        self.operand.clone()
    }

    /// The warm-handover counters, which the controller records each copy's result into.
    pub fn handovers(&self) -> Arc<HandoverMetrics> {
        self.handovers.clone()
    }

    /// Starts timing a reconciliation; the time is recorded when the returned guard drops.
    pub fn reconcile_timer(&self) -> ReconcileTimer<'_> {
        ReconcileTimer {
            histogram: &self.duration,
            start: Instant::now(),
        }
    }

    /// Counts a finished reconciliation; `error_kind` is `None` on success.
    pub fn reconciled(&self, error_kind: Option<&'static str>) {
        let result = if error_kind.is_some() {
            "error"
        } else {
            "success"
        };
        self.reconciles
            .get_or_create(&ResultLabels { result })
            .inc();
        if let Some(kind) = error_kind {
            self.errors.get_or_create(&ErrorLabels { kind }).inc();
        }
    }

    /// Sets the number of managed instances.
    pub fn set_instances(&self, n: usize) {
        self.instances.set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// Sets the fleet rollout's instances waiting for a turn and holding a slot.
    pub fn set_fleet_rollout(&self, pending: usize, rolling: usize) {
        for (state, n) in [("pending", pending), ("rolling", rolling)] {
            let n = i64::try_from(n).unwrap_or(i64::MAX);
            self.fleet.get_or_create(&FleetLabels { state }).set(n);
        }
    }

    /// Counts an instance whose turn in the fleet rollout ended with its workload settled.
    pub fn fleet_rollout_completed(&self) {
        self.fleet_completed.inc();
    }

    /// Sets whether this replica leads.
    pub fn set_leader(&self, leader: bool) {
        self.leader.set(i64::from(leader));
    }

    /// Sets whether the API server answers.
    pub fn set_api_available(&self, available: bool) {
        self.api_available.set(i64::from(available));
    }

    /// Counts a watch that failed (`reason` "failed") or expired and is re-listed ("expired").
    /// The gauges of the cache of `resource` (its objects, its bytes), for its writer to keep up to date.
    pub fn cache_gauges(&self, resource: &'static str) -> (Gauge, Gauge) {
        let labels = CacheLabels { resource };
        (
            self.caches.objects.get_or_create(&labels).clone(),
            self.caches.bytes.get_or_create(&labels).clone(),
        )
    }

    pub fn watch_error(&self, resource: &'static str, reason: &'static str) {
        self.watch_errors
            .get_or_create(&WatchErrorLabels { resource, reason })
            .inc();
    }

    /// Sets the conditions of one instance from its computed status: 1 for a condition that is True, 0
    /// otherwise (False, Unknown or absent). Alerts read `Degraded` here, without listing the objects.
    /// The optional ones (`ProxyAvailable`) are exported while the status has them, removed when it has not.
    pub fn set_conditions(&self, namespace: &str, name: &str, conditions: &[Condition]) {
        let labels = |condition| ConditionLabels {
            namespace: namespace.to_owned(),
            memcached: name.to_owned(),
            condition,
        };
        let status = |condition| conditions.iter().find(|c| c.type_ == condition);
        for condition in CONDITION_TYPES {
            let on = status(condition).is_some_and(|c| c.status == "True");
            self.conditions
                .get_or_create(&labels(condition))
                .set(i64::from(on));
        }
        for condition in OPTIONAL_CONDITION_TYPES {
            match status(condition) {
                Some(c) => {
                    let on = c.status == "True";
                    self.conditions
                        .get_or_create(&labels(condition))
                        .set(i64::from(on));
                }
                None => {
                    self.conditions.remove(&labels(condition));
                }
            }
        }
    }

    /// Removes the condition and handover series of an instance that is gone.
    pub fn forget_instance(&self, namespace: &str, name: &str) {
        self.handovers.forget_instance(namespace, name);
        for condition in CONDITION_TYPES.into_iter().chain(OPTIONAL_CONDITION_TYPES) {
            self.conditions.remove(&ConditionLabels {
                namespace: namespace.to_owned(),
                memcached: name.to_owned(),
                condition,
            });
        }
    }

    fn count_request(&self, verb: &'static str, code: String) {
        self.requests
            .get_or_create(&RequestLabels { verb, code })
            .inc();
    }

    fn count_response(&self, version: Version) {
        let protocol = match version {
            Version::HTTP_2 => "HTTP/2",
            Version::HTTP_11 => "HTTP/1.1",
            Version::HTTP_10 => "HTTP/1.0",
            Version::HTTP_3 => "HTTP/3",
            _ => "other",
        };
        self.responses
            .get_or_create(&ProtocolLabels { protocol })
            .inc();
    }
}

/// Records the reconcile duration on drop, so early returns are timed too.
pub struct ReconcileTimer<'a> {
    histogram: &'a Histogram,
    start: Instant,
}

impl Drop for ReconcileTimer<'_> {
    fn drop(&mut self) {
        self.histogram.observe(self.start.elapsed().as_secs_f64());
    }
}

/// The metrics count every API request by verb and status (`error` when no answer arrived), and every
/// answer by the HTTP version it came over.
impl crate::observe::Observer for Arc<Metrics> {
    fn observe(&self, sent: &Sent, outcome: Outcome<'_>, _now: Instant) {
        let code = match outcome {
            Outcome::Answered(status, version) => {
                self.count_response(version);
                status.as_u16().to_string()
            }
            Outcome::Failed(_) => "error".to_owned(),
        };
        self.count_request(sent.verb, code);
    }
}

#[cfg(test)]
mod tests;
