//! Operand metrics: what each memcached server reported in the latest collection, on the operator's
//! `/metrics`.
//!
//! Names are the Prometheus memcached exporter's (`memcached_up`, `memcached_commands_total`, …), so
//! dashboards and alerts written for the exporter sidecar work with a change of labels only: each series
//! carries `namespace`, `memcached` (the instance) and `pod`. Values are memcached's own: its counters
//! (hits, misses, evictions, rejected connections, bytes read and written) count since the server
//! started and are exposed as Prometheus counters, which is what they are: a restarted server starts
//! again from zero, which `rate()` and `increase()` read as a counter reset. prometheus-client's
//! `Counter` can only be incremented, so these are not kept in metric objects at all: the latest
//! snapshot per pod is kept, and a [`Collector`] encodes it at scrape time as constant counters and
//! gauges. That also makes removal exact: the series of a pod not read in its instance's latest
//! collection, or of an instance no longer there, are simply not in the snapshot.

use std::collections::BTreeMap;
use std::sync::Mutex;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;

use super::proxy::{AccessCounters, ProxySample};
use super::stats::Stats;

/// (namespace, instance name).
pub type InstanceKey = (String, String);

/// What one pod gave in the latest collection: its stats, or `None` when it could not be read.
pub type PodSamples = BTreeMap<String, Option<Stats>>;

/// What one proxy pod gave in the latest collection, or `None` when it could not be read.
pub type ProxySamples = BTreeMap<String, Option<ProxySample>>;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReadLabels {
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RefreshLabels {
    answer: &'static str,
}

/// The latest samples of every instance's pods, encoded on each scrape; and the operator's own counts
/// (registered by [`crate::metrics`]): reads by result (`memcached_operator_stats_reads_total`),
/// `refresh_certs` sent by answer (`memcached_operator_certificate_refreshes_total`) and servers seen
/// presenting a rotated certificate after one (`memcached_operator_certificate_reloads_total`).
#[derive(Debug, Default)]
pub struct OperandMetrics {
    samples: Mutex<BTreeMap<InstanceKey, PodSamples>>,
    /// The proxy pods' samples, by instance (only those with the proxy on).
    proxies: Mutex<BTreeMap<InstanceKey, ProxySamples>>,
    reads: Family<ReadLabels, Counter>,
    refreshes: Family<RefreshLabels, Counter>,
    reloads: Counter,
}

impl OperandMetrics {
    /// The read counter, for registration.
    pub fn reads(&self) -> Family<ReadLabels, Counter> {
        self.reads.clone()
    }

    /// The `refresh_certs` counter, for registration.
    pub fn refreshes(&self) -> Family<RefreshLabels, Counter> {
        self.refreshes.clone()
    }

    /// The reloaded-servers counter, for registration.
    pub fn reloads(&self) -> Counter {
        self.reloads.clone()
    }

    /// Counts one `refresh_certs` sent, by the server's answer: `ok` or `refused`.
    pub fn count_refresh(&self, answer: &'static str) {
        self.refreshes
            .get_or_create(&RefreshLabels { answer })
            .inc();
    }

    /// Counts servers seen presenting the rotated certificate after `refresh_certs`.
    pub fn count_reloads(&self, servers: u64) {
        self.reloads.inc_by(servers);
    }

    /// Counts one server read: `ok`, a [`super::client::ReadError::reason`], or `unreadable` (not
    /// attempted: the instance's Secrets do not give what is needed).
    pub fn count_read(&self, result: &'static str) {
        self.reads.get_or_create(&ReadLabels { result }).inc();
    }

    /// Replaces the samples of one instance: pods not in `pods` lose their series. An empty `pods`
    /// removes the instance.
    pub fn set_instance(&self, key: InstanceKey, pods: PodSamples) {
        let mut samples = self.samples.lock().unwrap_or_else(|e| e.into_inner());
        if pods.is_empty() {
            samples.remove(&key);
        } else {
            samples.insert(key, pods);
        }
    }

    /// Replaces the proxy samples of one instance: proxy pods not in `pods` lose their series. An empty
    /// `pods` (the proxy off, or none of its pods ready) removes the instance's proxy series.
    pub fn set_proxies(&self, key: InstanceKey, pods: ProxySamples) {
        let mut proxies = self.proxies.lock().unwrap_or_else(|e| e.into_inner());
        if pods.is_empty() {
            proxies.remove(&key);
        } else {
            proxies.insert(key, pods);
        }
    }

    /// Removes the samples (servers' and proxies') of every instance for which `keep` says no.
    pub fn retain_instances(&self, keep: impl Fn(&InstanceKey) -> bool) {
        let mut samples = self.samples.lock().unwrap_or_else(|e| e.into_inner());
        samples.retain(|key, _| keep(key));
        drop(samples);
        let mut proxies = self.proxies.lock().unwrap_or_else(|e| e.into_inner());
        proxies.retain(|key, _| keep(key));
    }

    /// Removes everything (collection stopped: the values would only grow stale).
    pub fn clear(&self) {
        self.retain_instances(|_| false);
    }
}

/// One counter or gauge read from a pod's sample: a server's [`Stats`] or a proxy's [`ProxySample`].
struct Series<T> {
    /// The exporter's name (without `_total`, which the encoder adds to counters).
    name: &'static str,
    help: &'static str,
    counter: bool,
    /// Extra labels beyond namespace, memcached and pod.
    labels: &'static [(&'static str, &'static str)],
    value: fn(&T) -> u64,
}

/// Every series but `memcached_up`, in exposition order. `memcached_commands_total` has one family with
/// a series per (command, status), as the exporter's, of which memcached's `stats` gives these two.
const SERIES: &[Series<Stats>] = &[
    Series {
        name: "memcached_uptime_seconds",
        help: "Seconds since the server started",
        counter: false,
        labels: &[],
        value: |s| s.uptime_seconds,
    },
    Series {
        name: "memcached_commands",
        help: "Requests by command and status, since the server started (get hits and misses)",
        counter: true,
        labels: &[("command", "get"), ("status", "hit")],
        value: |s| s.get_hits,
    },
    Series {
        name: "memcached_commands",
        help: "",
        counter: true,
        labels: &[("command", "get"), ("status", "miss")],
        value: |s| s.get_misses,
    },
    Series {
        name: "memcached_items_evicted",
        help: "Valid items removed to free memory for new ones, since the server started",
        counter: true,
        labels: &[],
        value: |s| s.evictions,
    },
    Series {
        name: "memcached_current_items",
        help: "Items stored on the server",
        counter: false,
        labels: &[],
        value: |s| s.curr_items,
    },
    Series {
        name: "memcached_current_bytes",
        help: "Bytes used to store items",
        counter: false,
        labels: &[],
        value: |s| s.bytes,
    },
    Series {
        name: "memcached_limit_bytes",
        help: "Bytes the server may use to store items (its memory limit)",
        counter: false,
        labels: &[],
        value: |s| s.limit_maxbytes,
    },
    Series {
        name: "memcached_current_connections",
        help: "Open connections, the operator's own reading connection included",
        counter: false,
        labels: &[],
        value: |s| s.curr_connections,
    },
    Series {
        name: "memcached_connections_rejected",
        help: "Connections rejected because the server was at its connection limit, since it started",
        counter: true,
        labels: &[],
        value: |s| s.rejected_connections,
    },
    Series {
        name: "memcached_read_bytes",
        help: "Bytes the server read from the network, since it started",
        counter: true,
        labels: &[],
        value: |s| s.bytes_read,
    },
    Series {
        name: "memcached_written_bytes",
        help: "Bytes the server wrote to the network, since it started",
        counter: true,
        labels: &[],
        value: |s| s.bytes_written,
    },
];

/// The proxy pods' series but `memcached_proxy_up` and `memcached_proxy_backend_down`, in exposition
/// order: memcached's own proxy counters (see [`super::proxy`]), since the proxy pod started.
const PROXY_SERIES: &[Series<ProxySample>] = &[
    Series {
        name: "memcached_proxy_requests",
        help: "Requests the proxy received, since it started",
        counter: true,
        labels: &[],
        value: |s| s.counters.requests,
    },
    Series {
        name: "memcached_proxy_request_errors",
        help: "Requests the proxy could not parse, since it started",
        counter: true,
        labels: &[],
        value: |s| s.counters.request_errors,
    },
    Series {
        name: "memcached_proxy_backend_failures",
        help: "Errors that reset a connection from the proxy to a server (timeout, refused, broken), since it started",
        counter: true,
        labels: &[],
        value: |s| s.counters.backend_failures,
    },
    Series {
        name: "memcached_proxy_backends_marked_down",
        help: "Times the proxy marked a server down after repeated failures, since it started",
        counter: true,
        labels: &[],
        value: |s| s.counters.backends_marked_bad,
    },
    Series {
        name: "memcached_proxy_config_reloads",
        help: "Route configuration loads, the one at start included, since the proxy started",
        counter: true,
        labels: &[],
        value: |s| s.counters.config_reloads,
    },
    Series {
        name: "memcached_proxy_config_reload_failures",
        help: "Route configuration reloads that failed (the previous configuration kept serving), since the proxy started",
        counter: true,
        labels: &[],
        value: |s| s.counters.config_reload_failures,
    },
];

/// The per-backend gauge of a proxy pod.
const BACKEND_DOWN: &str = "memcached_proxy_backend_down";
/// The per identity counters of a proxy pod with access control (without `_total`, which the encoder
/// adds): requests, and those refused.
const ACCESS_REQUESTS: &str = "memcached_proxy_access_requests";
const ACCESS_REFUSALS: &str = "memcached_proxy_access_refusals";

/// The name of every operand sample the operator can expose, as a query names it (`_total` on counters):
/// `memcached_up` and the names of [`SERIES`], so dashboards and alerts can be checked against what this
/// module encodes. `crate::metrics` ties the complete list to an actual encoding.
pub fn series_names() -> Vec<String> {
    let mut names = vec![
        "memcached_up".to_owned(),
        "memcached_proxy_up".to_owned(),
        BACKEND_DOWN.to_owned(),
        format!("{ACCESS_REQUESTS}_total"),
        format!("{ACCESS_REFUSALS}_total"),
    ];
    let counted = |name: &str, counter: bool| {
        if counter {
            format!("{name}_total")
        } else {
            name.to_owned()
        }
    };
    let all = SERIES
        .iter()
        .map(|s| counted(s.name, s.counter))
        .chain(PROXY_SERIES.iter().map(|s| counted(s.name, s.counter)));
    for name in all {
        if !names.contains(&name) {
            names.push(name);
        }
    }
    names
}

fn labels<'a>(
    (namespace, memcached): &'a InstanceKey,
    pod: &'a str,
    extra: &'a [(&'static str, &'static str)],
) -> Vec<(&'a str, &'a str)> {
    let mut labels = vec![
        ("namespace", namespace.as_str()),
        ("memcached", memcached.as_str()),
        ("pod", pod),
    ];
    labels.extend(extra.iter().copied());
    labels
}

/// Encodes `series` (grouped by name: series sharing one share its descriptor) for every read sample.
fn encode_series<T>(
    encoder: &mut DescriptorEncoder,
    series: &[Series<T>],
    samples: &BTreeMap<InstanceKey, BTreeMap<String, Option<T>>>,
) -> Result<(), std::fmt::Error> {
    let mut index = 0;
    while index < series.len() {
        let first = &series[index];
        let group = series[index..]
            .iter()
            .take_while(|s| s.name == first.name)
            .count();
        let metric_type = if first.counter {
            MetricType::Counter
        } else {
            MetricType::Gauge
        };
        let mut family = encoder.encode_descriptor(first.name, first.help, None, metric_type)?;
        for one in &series[index..index + group] {
            for (key, pods) in samples {
                for (pod, sample) in pods {
                    let Some(sample) = sample else { continue };
                    let labels = labels(key, pod, one.labels);
                    let value = (one.value)(sample);
                    let metric = family.encode_family(&labels)?;
                    if one.counter {
                        ConstCounter::new(value).encode(metric)?;
                    } else {
                        ConstGauge::new(value).encode(metric)?;
                    }
                }
            }
        }
        index += group;
    }
    Ok(())
}

/// Encodes the `up` gauge `name`: 1 for each pod read, 0 for each that was not.
fn encode_up<T>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    samples: &BTreeMap<InstanceKey, BTreeMap<String, Option<T>>>,
) -> Result<(), std::fmt::Error> {
    let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (key, pods) in samples {
        for (pod, sample) in pods {
            let labels = labels(key, pod, &[]);
            ConstGauge::new(i64::from(sample.is_some())).encode(family.encode_family(&labels)?)?;
        }
    }
    Ok(())
}

/// Encodes [`BACKEND_DOWN`]: per proxy pod read, one series per published backend (`slot`, `backend`).
fn encode_backends(
    encoder: &mut DescriptorEncoder,
    proxies: &BTreeMap<InstanceKey, ProxySamples>,
) -> Result<(), std::fmt::Error> {
    let mut family = encoder.encode_descriptor(
        BACKEND_DOWN,
        "1 when the proxy pod marks the server of the slot down (it fails its keys until the server answers again), else 0",
        None,
        MetricType::Gauge,
    )?;
    for (key, pods) in proxies {
        for (pod, sample) in pods {
            let Some(sample) = sample else { continue };
            for backend in &sample.backends {
                let slot = backend.slot.to_string();
                let mut labels = labels(key, pod, &[]);
                labels.push(("slot", &slot));
                labels.push(("backend", &backend.address));
                ConstGauge::new(i64::from(backend.down)).encode(family.encode_family(&labels)?)?;
            }
        }
    }
    Ok(())
}

/// One access family: its name, its help, and the counter it reads.
type AccessFamily = (&'static str, &'static str, fn(&AccessCounters) -> u64);

/// Encodes [`ACCESS_REQUESTS`] and [`ACCESS_REFUSALS`]: per proxy pod read, one series per identity it
/// reported (`identity`: a name of the spec or `unknown`, see [`super::proxy::parse_access`]), with the
/// pod's counters since it started, as the other proxy counters: a restarted pod starts again from 0 (a
/// counter reset to `rate()`), a pod gone takes its series with it, and a query sums over `pod`.
fn encode_access(
    encoder: &mut DescriptorEncoder,
    proxies: &BTreeMap<InstanceKey, ProxySamples>,
) -> Result<(), std::fmt::Error> {
    let any = proxies
        .values()
        .flat_map(BTreeMap::values)
        .flatten()
        .any(|sample| !sample.access.is_empty());
    if !any {
        return Ok(());
    }
    let families: [AccessFamily; 2] = [
        (
            ACCESS_REQUESTS,
            "Requests of the identity through the proxy (spec.proxy.access), allowed or refused, since the proxy pod started",
            |c| c.requests,
        ),
        (
            ACCESS_REFUSALS,
            "Requests of the identity the proxy refused (a key outside its prefixes, a write of a read-only identity; every request of identity unknown), since the proxy pod started",
            |c| c.refused,
        ),
    ];
    for (name, help, value) in families {
        let mut family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
        for (key, pods) in proxies {
            for (pod, sample) in pods {
                let Some(sample) = sample else { continue };
                for (identity, counters) in &sample.access {
                    let mut labels = labels(key, pod, &[]);
                    labels.push(("identity", identity));
                    ConstCounter::new(value(counters)).encode(family.encode_family(&labels)?)?;
                }
            }
        }
    }
    Ok(())
}

impl Collector for OperandMetrics {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let samples = self.samples.lock().unwrap_or_else(|e| e.into_inner());
        if !samples.is_empty() {
            encode_up(
                &mut encoder,
                "memcached_up",
                "1 when the operator read the server's stats in the latest collection, else 0",
                &samples,
            )?;
            encode_series(&mut encoder, SERIES, &samples)?;
        }
        drop(samples);
        let proxies = self.proxies.lock().unwrap_or_else(|e| e.into_inner());
        if !proxies.is_empty() {
            encode_up(
                &mut encoder,
                "memcached_proxy_up",
                "1 when the operator read the proxy pod's stats in the latest collection, else 0",
                &proxies,
            )?;
            encode_series(&mut encoder, PROXY_SERIES, &proxies)?;
            encode_backends(&mut encoder, &proxies)?;
            encode_access(&mut encoder, &proxies)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::registry::Registry;
    use std::sync::Arc;

    fn encode(metrics: &Arc<OperandMetrics>) -> String {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(metrics.clone()));
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &registry).unwrap();
        out
    }

    fn key(ns: &str, name: &str) -> InstanceKey {
        (ns.to_owned(), name.to_owned())
    }

    #[test]
    fn encodes_the_exporter_names_and_removes_what_is_gone() {
        let metrics = Arc::new(OperandMetrics::default());
        assert_eq!(
            encode(&metrics),
            "# EOF\n",
            "nothing before the first collection"
        );
        let stats = Stats {
            uptime_seconds: 7,
            get_hits: 3,
            get_misses: 1,
            evictions: 2,
            curr_items: 5,
            bytes: 100,
            limit_maxbytes: 1000,
            curr_connections: 4,
            rejected_connections: 6,
            bytes_read: 8,
            bytes_written: 9,
        };
        metrics.set_instance(
            key("ns", "cache"),
            [
                ("cache-a".to_owned(), Some(stats)),
                ("cache-b".to_owned(), None),
            ]
            .into(),
        );
        metrics.set_instance(key("ns", "other"), [("other-a".to_owned(), None)].into());
        let text = encode(&metrics);
        let a = "namespace=\"ns\",memcached=\"cache\",pod=\"cache-a\"";
        for line in [
            "# TYPE memcached_up gauge".to_owned(),
            format!("memcached_up{{{a}}} 1"),
            "memcached_up{namespace=\"ns\",memcached=\"cache\",pod=\"cache-b\"} 0".to_owned(),
            format!("memcached_uptime_seconds{{{a}}} 7"),
            "# TYPE memcached_commands counter".to_owned(),
            format!("memcached_commands_total{{{a},command=\"get\",status=\"hit\"}} 3"),
            format!("memcached_commands_total{{{a},command=\"get\",status=\"miss\"}} 1"),
            format!("memcached_items_evicted_total{{{a}}} 2"),
            format!("memcached_current_items{{{a}}} 5"),
            format!("memcached_current_bytes{{{a}}} 100"),
            format!("memcached_limit_bytes{{{a}}} 1000"),
            format!("memcached_current_connections{{{a}}} 4"),
            format!("memcached_connections_rejected_total{{{a}}} 6"),
            format!("memcached_read_bytes_total{{{a}}} 8"),
            format!("memcached_written_bytes_total{{{a}}} 9"),
        ] {
            assert!(text.contains(&line), "missing {line:?} in\n{text}");
        }
        assert!(
            !text.contains(
                "memcached_current_items{namespace=\"ns\",memcached=\"cache\",pod=\"cache-b\"}"
            ),
            "an unread pod has only memcached_up"
        );
        assert_eq!(text.matches("# TYPE memcached_commands counter").count(), 1);

        // A pod deleted: its series go.
        metrics.set_instance(key("ns", "cache"), [("cache-b".to_owned(), None)].into());
        // An instance deleted: all its series go.
        metrics.retain_instances(|k| k != &key("ns", "other"));
        let text = encode(&metrics);
        assert!(
            !text.contains("cache-a") && !text.contains("other-a"),
            "{text}"
        );
        assert!(text.contains("pod=\"cache-b\"} 0"), "{text}");
        metrics.set_instance(key("ns", "cache"), PodSamples::new());
        assert_eq!(encode(&metrics), "# EOF\n");
    }

    #[test]
    fn encodes_the_proxy_series_per_pod_and_backend_and_removes_what_is_gone() {
        use crate::telemetry::proxy::{Backend, ProxyCounters};
        let metrics = Arc::new(OperandMetrics::default());
        let sample = ProxySample {
            counters: ProxyCounters {
                requests: 400,
                request_errors: 1,
                backend_failures: 6,
                backends_marked_bad: 2,
                config_reloads: 3,
                config_reload_failures: 4,
            },
            backends: vec![
                Backend {
                    slot: 0,
                    address: "10.0.0.1:11211".to_owned(),
                    down: false,
                },
                Backend {
                    slot: 1,
                    address: "10.0.0.2:11211".to_owned(),
                    down: true,
                },
            ],
            access: BTreeMap::new(),
        };
        metrics.set_proxies(
            key("ns", "cache"),
            [
                ("cache-proxy-a".to_owned(), Some(sample)),
                ("cache-proxy-b".to_owned(), None),
            ]
            .into(),
        );
        let text = encode(&metrics);
        let a = "namespace=\"ns\",memcached=\"cache\",pod=\"cache-proxy-a\"";
        for line in [
            "# TYPE memcached_proxy_up gauge".to_owned(),
            format!("memcached_proxy_up{{{a}}} 1"),
            "memcached_proxy_up{namespace=\"ns\",memcached=\"cache\",pod=\"cache-proxy-b\"} 0"
                .to_owned(),
            format!("memcached_proxy_requests_total{{{a}}} 400"),
            format!("memcached_proxy_request_errors_total{{{a}}} 1"),
            format!("memcached_proxy_backend_failures_total{{{a}}} 6"),
            format!("memcached_proxy_backends_marked_down_total{{{a}}} 2"),
            format!("memcached_proxy_config_reloads_total{{{a}}} 3"),
            format!("memcached_proxy_config_reload_failures_total{{{a}}} 4"),
            format!("memcached_proxy_backend_down{{{a},slot=\"0\",backend=\"10.0.0.1:11211\"}} 0"),
            format!("memcached_proxy_backend_down{{{a},slot=\"1\",backend=\"10.0.0.2:11211\"}} 1"),
        ] {
            assert!(text.contains(&line), "missing {line:?} in\n{text}");
        }
        assert!(!text.contains("memcached_up"), "no server series: {text}");
        assert_eq!(
            text.matches("cache-proxy-b").count(),
            1,
            "an unread proxy pod has only memcached_proxy_up: {text}"
        );
        // The proxy turned off: its series go; the instance deleted: all go.
        metrics.set_proxies(key("ns", "cache"), ProxySamples::new());
        assert_eq!(encode(&metrics), "# EOF\n");
        metrics.set_proxies(key("ns", "cache"), [("p".to_owned(), None)].into());
        metrics.retain_instances(|k| k != &key("ns", "cache"));
        assert_eq!(encode(&metrics), "# EOF\n");
    }

    fn access_sample(counts: &[(&str, u64, u64)]) -> ProxySample {
        use crate::telemetry::proxy::ProxyCounters;
        ProxySample {
            counters: ProxyCounters::default(),
            backends: Vec::new(),
            access: counts
                .iter()
                .map(|&(name, requests, refused)| {
                    (name.to_owned(), AccessCounters { requests, refused })
                })
                .collect(),
        }
    }

    /// The value of the sample `series` in `text`, if there.
    fn value(text: &str, series: &str) -> Option<u64> {
        text.lines()
            .find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
    }

    #[test]
    fn access_series_are_per_pod_and_identity_and_follow_restarts_and_pods_gone() {
        let metrics = Arc::new(OperandMetrics::default());
        let pods = |a: ProxySample, b: Option<ProxySample>| -> ProxySamples {
            let mut pods = ProxySamples::from([("cache-proxy-a".to_owned(), Some(a))]);
            if let Some(b) = b {
                pods.insert("cache-proxy-b".to_owned(), Some(b));
            }
            pods
        };
        let series = |name: &str, pod: &str, identity: &str| {
            format!(
                "{name}_total{{namespace=\"ns\",memcached=\"cache\",pod=\"{pod}\",identity=\"{identity}\"}}"
            )
        };
        let (requests, refusals) = (ACCESS_REQUESTS, ACCESS_REFUSALS);

        // Without access control: no family at all.
        metrics.set_proxies(key("ns", "cache"), pods(access_sample(&[]), None));
        assert!(!encode(&metrics).contains("access"), "{}", encode(&metrics));

        metrics.set_proxies(
            key("ns", "cache"),
            pods(
                access_sample(&[("orders", 9, 5), ("unknown", 1, 1)]),
                Some(access_sample(&[("orders", 4, 0)])),
            ),
        );
        let text = encode(&metrics);
        assert!(
            text.contains("# TYPE memcached_proxy_access_requests counter"),
            "{text}"
        );
        assert!(
            text.contains("# TYPE memcached_proxy_access_refusals counter"),
            "{text}"
        );
        assert_eq!(
            value(&text, &series(requests, "cache-proxy-a", "orders")),
            Some(9)
        );
        assert_eq!(
            value(&text, &series(refusals, "cache-proxy-a", "orders")),
            Some(5)
        );
        assert_eq!(
            value(&text, &series(requests, "cache-proxy-b", "orders")),
            Some(4)
        );
        assert_eq!(
            value(&text, &series(refusals, "cache-proxy-a", "unknown")),
            Some(1)
        );
        assert_eq!(
            value(&text, &series(requests, "cache-proxy-b", "unknown")),
            None
        );

        // Pod b restarted: its counters start again from 0, in its own series, which `rate()` reads as
        // a reset; pod a's series are untouched (a sum over pods in the operator would fall instead,
        // and read as a reset of every pod's counts). Pod a's `unknown` not reported: its series go.
        metrics.set_proxies(
            key("ns", "cache"),
            pods(
                access_sample(&[("orders", 12, 6)]),
                Some(access_sample(&[("orders", 1, 0)])),
            ),
        );
        let text = encode(&metrics);
        assert_eq!(
            value(&text, &series(requests, "cache-proxy-a", "orders")),
            Some(12)
        );
        assert_eq!(
            value(&text, &series(requests, "cache-proxy-b", "orders")),
            Some(1)
        );
        assert!(!text.contains("identity=\"unknown\""), "{text}");

        // Pod b gone, or unread: only its series go.
        let mut unread = pods(access_sample(&[("orders", 13, 6)]), None);
        unread.insert("cache-proxy-b".to_owned(), None);
        metrics.set_proxies(key("ns", "cache"), unread);
        let text = encode(&metrics);
        assert_eq!(
            value(&text, &series(requests, "cache-proxy-a", "orders")),
            Some(13)
        );
        assert!(!text.contains("pod=\"cache-proxy-b\",identity"), "{text}");

        // The instance gone: every series goes.
        metrics.retain_instances(|_| false);
        assert_eq!(encode(&metrics), "# EOF\n");
    }
}
