//! The handover series on `/metrics`, per instance: copies, items by outcome, bytes, seconds, and
//! failures by reason. The controller records each copy's result with [`HandoverMetrics::record`] when
//! it ends (the engine itself knows no instance).

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use super::error::{CopyError, Failure};
use super::progress::Snapshot;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct InstanceLabels {
    namespace: String,
    memcached: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ItemLabels {
    namespace: String,
    memcached: String,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FailureLabels {
    namespace: String,
    memcached: String,
    reason: &'static str,
}

/// The item outcomes counted, as [`Snapshot`] names them.
const OUTCOMES: [&str; 6] = [
    "copied", "existing", "expired", "vanished", "filtered", "skipped",
];

/// The sample names these metrics encode, for [`crate::metrics::exported_series`].
pub const SERIES: [&str; 5] = [
    "memcached_operator_handovers_total",
    "memcached_operator_handover_items_total",
    "memcached_operator_handover_bytes_total",
    "memcached_operator_handover_seconds_total",
    "memcached_operator_handover_failures_total",
];

/// Counters of finished copies, per instance.
#[derive(Debug, Default)]
pub struct HandoverMetrics {
    copies: Family<InstanceLabels, Counter>,
    items: Family<ItemLabels, Counter>,
    bytes: Family<InstanceLabels, Counter>,
    seconds: Family<InstanceLabels, Counter<f64, AtomicU64>>,
    failures: Family<FailureLabels, Counter>,
}

impl HandoverMetrics {
    /// Registers the series in `registry` (the operator's, prefixed `memcached_operator_`).
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "handovers",
            "Warm-handover copies finished (done or stopped), per instance",
            self.copies.clone(),
        );
        registry.register(
            "handover_items",
            "Items listed by warm-handover copies by outcome: copied, existing (kept: the target had \
             a newer value), expired, vanished (gone from the source before fetched), filtered (not \
             moving), skipped (a binary key over 186 bytes, a value over 8 MiB or over its listed size)",
            self.items.clone(),
        );
        registry.register(
            "handover_bytes",
            "Value bytes stored by warm-handover copies",
            self.bytes.clone(),
        );
        registry.register(
            "handover_seconds",
            "Time spent in warm-handover copies",
            self.seconds.clone(),
        );
        registry.register(
            "handover_failures",
            "Warm-handover copies stopped before their end, by reason (connect, tls, auth, closed, io, \
             timeout, stalled, refused, protocol)",
            self.failures.clone(),
        );
    }

    /// Counts one finished copy of instance `name` in `namespace`: its items, bytes and time, and its
    /// failure's reason when it stopped early (what it copied until then counts too).
    pub fn record(&self, namespace: &str, name: &str, result: &Result<Snapshot, Failure>) {
        let instance = InstanceLabels {
            namespace: namespace.to_owned(),
            memcached: name.to_owned(),
        };
        let progress = match result {
            Ok(summary) => summary,
            Err(failure) => {
                self.failures
                    .get_or_create(&FailureLabels {
                        namespace: namespace.to_owned(),
                        memcached: name.to_owned(),
                        reason: failure.error.reason(),
                    })
                    .inc();
                &failure.progress
            }
        };
        self.copies.get_or_create(&instance).inc();
        let counts = [
            progress.copied,
            progress.existing,
            progress.expired,
            progress.vanished,
            progress.filtered,
            progress.skipped,
        ];
        for (outcome, count) in OUTCOMES.into_iter().zip(counts) {
            self.items
                .get_or_create(&ItemLabels {
                    namespace: namespace.to_owned(),
                    memcached: name.to_owned(),
                    outcome,
                })
                .inc_by(count);
        }
        self.bytes.get_or_create(&instance).inc_by(progress.bytes);
        self.seconds
            .get_or_create(&instance)
            .inc_by(progress.elapsed.as_secs_f64());
    }

    /// Removes the series of an instance that is gone.
    pub fn forget_instance(&self, namespace: &str, name: &str) {
        let instance = InstanceLabels {
            namespace: namespace.to_owned(),
            memcached: name.to_owned(),
        };
        self.copies.remove(&instance);
        self.bytes.remove(&instance);
        self.seconds.remove(&instance);
        for outcome in OUTCOMES {
            self.items.remove(&ItemLabels {
                namespace: namespace.to_owned(),
                memcached: name.to_owned(),
                outcome,
            });
        }
        for reason in CopyError::REASONS {
            self.failures.remove(&FailureLabels {
                namespace: namespace.to_owned(),
                memcached: name.to_owned(),
                reason,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use prometheus_client::encoding::text::encode;

    use super::*;

    fn encoded(metrics: &HandoverMetrics) -> String {
        let mut registry = Registry::with_prefix("memcached_operator");
        metrics.register(&mut registry);
        let mut out = String::new();
        encode(&mut out, &registry).expect("encodes");
        out
    }

    #[test]
    fn a_done_and_a_failed_copy_are_counted_per_instance() {
        let metrics = HandoverMetrics::default();
        let done = Snapshot {
            copied: 10,
            existing: 2,
            bytes: 1000,
            elapsed: Duration::from_millis(1500),
            ..Snapshot::default()
        };
        metrics.record("cache", "a", &Ok(done));
        metrics.record(
            "cache",
            "a",
            &Err(Failure {
                error: CopyError::Timeout(Duration::from_secs(1)),
                progress: Snapshot {
                    copied: 5,
                    bytes: 500,
                    ..Snapshot::default()
                },
            }),
        );
        let text = encoded(&metrics);
        for line in [
            r#"memcached_operator_handovers_total{namespace="cache",memcached="a"} 2"#,
            r#"memcached_operator_handover_items_total{namespace="cache",memcached="a",outcome="copied"} 15"#,
            r#"memcached_operator_handover_items_total{namespace="cache",memcached="a",outcome="existing"} 2"#,
            r#"memcached_operator_handover_bytes_total{namespace="cache",memcached="a"} 1500"#,
            r#"memcached_operator_handover_seconds_total{namespace="cache",memcached="a"} 1.5"#,
            r#"memcached_operator_handover_failures_total{namespace="cache",memcached="a",reason="timeout"} 1"#,
        ] {
            assert!(text.contains(line), "{line} not in\n{text}");
        }
        for name in SERIES {
            assert!(text.contains(&format!("\n{name}{{")), "{name}");
        }
        metrics.forget_instance("cache", "a");
        assert!(!encoded(&metrics).contains("memcached=\"a\""));
    }
}
