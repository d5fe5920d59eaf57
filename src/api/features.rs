//! The optional parts of `spec` for running Memcached in production: memcached settings, availability,
//! Service, security and monitoring. Every field is optional and its default keeps the tutorials'
//! behaviour, so existing manifests keep working.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Default for `spec.memcached.maxMemoryMB`: the tutorials' `-m 64`.
pub const DEFAULT_MAX_MEMORY_MB: i32 = 64;
/// Default for `spec.memcached.maxConnections` (memcached's own default).
pub const DEFAULT_MAX_CONNECTIONS: i32 = 1024;
/// Default for `spec.memcached.threads` (memcached's own default).
pub const DEFAULT_THREADS: i32 = 4;
/// Default for `spec.highAvailability.preStopDelaySeconds`.
pub const DEFAULT_PRE_STOP_DELAY_SECONDS: i32 = 10;
/// Default for `spec.highAvailability.terminationGracePeriodSeconds`.
pub const DEFAULT_TERMINATION_GRACE_PERIOD_SECONDS: i64 = 30;
/// Default image of the Prometheus exporter sidecar.
pub const DEFAULT_EXPORTER_IMAGE: &str = "prom/memcached-exporter:v0.15.0";
/// Default key of the auth Secret holding memcached's credentials file.
pub const DEFAULT_AUTH_KEY: &str = "auth-file";

/// CEL rule on `spec.highAvailability`: the grace period outlasts the preStop delay (defaults included).
pub const TERMINATION_RULE: &str = "(has(self.terminationGracePeriodSeconds) ? self.terminationGracePeriodSeconds : 30) > \
     (has(self.preStopDelaySeconds) ? self.preStopDelaySeconds : 10)";
/// CEL rule on `spec.highAvailability.podDisruptionBudget`: one bound at most.
pub const BUDGET_RULE: &str = "!(has(self.maxUnavailable) && has(self.minAvailable))";
/// CEL rule on `spec.monitoring`: a ServiceMonitor needs the exporter it scrapes.
pub const MONITORING_RULE: &str = "!(has(self.serviceMonitor) && has(self.serviceMonitor.enabled) && \
     self.serviceMonitor.enabled) || (has(self.exporter) && has(self.exporter.enabled) && self.exporter.enabled)";

/// Open files memcached holds per worker thread (its event base and notification descriptors),
/// measured on memcached 1.6.18: the least `-c` that starts and answers a client is 14 for 1 thread, 26
/// for 4, 83 for 16 and 1 283 for 256.
pub const FILES_PER_THREAD: i64 = 5;
/// Open files memcached holds whatever its threads (standard streams, listening sockets, the main
/// event base, one client), with room for the second listening socket of a pod (IPv4 and IPv6).
pub const FILES_BASE: i64 = 16;

/// The least `maxConnections` memcached starts with for `threads` worker threads: it sets its open-file
/// limit to `-c`, and exits ("Too many open files") when its threads need more.
pub fn connections_needed(threads: i32) -> i64 {
    FILES_PER_THREAD * i64::from(threads) + FILES_BASE
}

/// CEL rule on `spec.memcached`: enough connections (`-c`, default 1024) for the threads (`-t`, default 4).
pub const CONNECTIONS_RULE: &str = "(has(self.maxConnections) ? self.maxConnections : 1024) >= \
     5 * (has(self.threads) ? self.threads : 4) + 16";
/// Its message.
pub const CONNECTIONS_MESSAGE: &str = "maxConnections (default 1024) must be at least 5 x threads (default 4) \
     + 16: memcached sets its open-file limit to maxConnections and each worker thread holds about 5 files, so \
     with fewer it exits at start (\"Too many open files\")";

/// memcached's own settings (`spec.memcached`). Changing any of them rolls the pods.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
// The rule and its message come from memcached's option table (`flags`), which the operator's own check
// walks too. Servers without CEL (before Kubernetes 1.25) skip it; the operator reports `InvalidConfig`.
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": super::flags::cel::extra_args_rule(),
    "message": super::flags::cel::extra_args_message()
}, {
    "rule": CONNECTIONS_RULE,
    "message": CONNECTIONS_MESSAGE
}]))]
pub struct MemcachedConfig {
    /// Memory for items, in MiB (`-m`). Default 64. memcached uses more than this: every slab class's
    /// first 1 MiB page even beyond it (39 classes by default, up to 63 with a small `-f`), its hash table
    /// and its threads and connections. The derived memory limit counts them (147Mi for 64); a limit set
    /// in spec.resources must be at least this + 32Mi, and one below the derived size can be OOM-killed by
    /// a fill across item sizes.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        rename = "maxMemoryMB"
    )]
    #[schemars(range(min = 1, max = 1048576))]
    pub max_memory_mb: Option<i32>,

    /// Most simultaneous client connections (`-c`). Default 1024. memcached also counts its own open
    /// files against it, about 5 per thread: it must be at least 5 x threads + 16.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1048576))]
    pub max_connections: Option<i32>,

    /// Worker threads (`-t`). Default 4.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 256))]
    pub threads: Option<i32>,

    /// Largest item memcached stores (`-I`), as a size with an optional k or m suffix such as `1m` or
    /// `512k`; between 1k and 1024m, at most half of maxMemoryMB, and a multiple of the slab chunk size
    /// (512k unless extraArgs set -o slab_chunk_max): 512k, 1m, 1536k, 2m, ... Default: memcached's (1m,
    /// so maxMemoryMB must then be at least 2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 16), regex(pattern = r"^[0-9]+[kKmM]?$"))]
    pub max_item_size: Option<String>,

    /// Log verbosity: 0 (default), 1 (`-v`, errors and warnings) or 2 (`-vv`, also client commands).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 2))]
    pub verbosity: Option<i32>,

    /// Further memcached arguments, appended as given (e.g. `["-o", "lru_crawler", "-R", "40"]`). Read as
    /// memcached reads them (bundled letters, attached values, abbreviated long names, `-o` lists), they
    /// may not set an option the operator manages or that stops memcached serving (-p -U -l -s -a -A -Z
    /// -S -Y -m -c -t -I -v -d -u -P -e -h -i -V, and -r and -L, which exit on some nodes; the ssl_*,
    /// ext_path and worker_logbuf_size -o sub-options), nor an option memcached does not know, nor a
    /// positional argument, nor a -o sub-option without the value it needs (-o hashpower), nor a value
    /// memcached 1.6.18 to 1.6.45 exits on or never serves with (-B binary or auto with security.auth, -B
    /// other than ascii/binary/auto, -R 0 or negative, -D "" or starting with a blank, -N 0 or above
    /// threads, -n 0 or negative, -f 1 or less, each -o sub-option outside its range as
    /// docs/operations.md lists them, e.g. hot_lru_pct 1..79 with warm_lru_pct adding up to at most 80,
    /// slab_chunk_max a power of two up to 1024 dividing maxItemSize, -o hashpower not above the item
    /// lock table of the threads or a table larger than the memory limit); the CRD's rule refuses such a
    /// spec at admission where it can see it, and the operator reports it as Degraded with reason
    /// InvalidConfig and rolls nothing out.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), inner(length(max = 256)))]
    pub extra_args: Vec<String>,
}

impl MemcachedConfig {
    pub fn max_memory_mb(&self) -> i32 {
        self.max_memory_mb.unwrap_or(DEFAULT_MAX_MEMORY_MB)
    }
    pub fn max_connections(&self) -> i32 {
        self.max_connections.unwrap_or(DEFAULT_MAX_CONNECTIONS)
    }
    pub fn threads(&self) -> i32 {
        self.threads.unwrap_or(DEFAULT_THREADS)
    }
}

/// How strictly pods are spread across nodes.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum AntiAffinity {
    /// No spreading rule.
    None,
    /// Prefer different nodes, but schedule on a shared node rather than not at all.
    #[default]
    Soft,
    /// Never two pods of the instance on one node (pods stay Pending when nodes run out).
    Hard,
}

/// Availability settings (`spec.highAvailability`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": TERMINATION_RULE,
    "message": "terminationGracePeriodSeconds (default 30) must be longer than preStopDelaySeconds (default 10)"
}]))]
pub struct HighAvailability {
    /// Spread pods across nodes by hostname: `none`, `soft` (default) or `hard`. Ignored when
    /// spec.affinity sets its own podAntiAffinity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub anti_affinity: Option<AntiAffinity>,

    /// The PodDisruptionBudget that keeps voluntary disruptions (node drains) from taking down more than
    /// one pod at a time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_disruption_budget: Option<PodDisruptionBudgetConfig>,

    /// Seconds a stopping pod keeps serving after it has left the Service endpoints, so that clients
    /// see it go before memcached exits (a preStop `sleep`; the image must provide `sleep`, as the
    /// official memcached images do). 0 disables it. Default 10.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 600))]
    pub pre_stop_delay_seconds: Option<i32>,

    /// Seconds Kubernetes waits for a stopping pod before killing it; must be longer than
    /// preStopDelaySeconds. Default 30.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 3600))]
    pub termination_grace_period_seconds: Option<i64>,
}

impl HighAvailability {
    pub fn anti_affinity(&self) -> AntiAffinity {
        self.anti_affinity.unwrap_or_default()
    }
    pub fn pre_stop_delay_seconds(&self) -> i32 {
        self.pre_stop_delay_seconds
            .unwrap_or(DEFAULT_PRE_STOP_DELAY_SECONDS)
    }
    pub fn termination_grace_period_seconds(&self) -> i64 {
        self.termination_grace_period_seconds
            .unwrap_or(DEFAULT_TERMINATION_GRACE_PERIOD_SECONDS)
    }
}

/// PodDisruptionBudget settings. At most one of maxUnavailable and minAvailable may be set.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": BUDGET_RULE,
    "message": "set maxUnavailable or minAvailable, not both"
}]))]
pub struct PodDisruptionBudgetConfig {
    /// Whether to keep a PodDisruptionBudget. Left out: only while spec.size is above 1 (a budget for a
    /// single pod would block node drains), removed when size drops to 1. `true` keeps it at every
    /// size (at size 1, `maxUnavailable: 1` still lets a drain evict the pod; `minAvailable: 1` blocks
    /// drains). `false` removes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,

    /// Pods that may be down at once, as a number or a percentage. Default 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_unavailable: Option<IntOrString>,

    /// Pods that must stay up, as a number or a percentage (instead of maxUnavailable).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_available: Option<IntOrString>,
}

/// Kind of the client Service.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum ServiceType {
    #[default]
    ClusterIP,
    NodePort,
    LoadBalancer,
}

impl ServiceType {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ClusterIP => "ClusterIP",
            Self::NodePort => "NodePort",
            Self::LoadBalancer => "LoadBalancer",
        }
    }
}

/// The client Service (`spec.service`). A headless Service `<name>-headless` is always kept too, for
/// per-pod discovery.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServiceConfig {
    /// Service type: ClusterIP (default), NodePort or LoadBalancer.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub type_: Option<ServiceType>,

    /// Annotations for the Service (e.g. for a cloud load balancer).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,

    /// Port the Service exposes. Default: spec.containerPort.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65535))]
    pub port: Option<i32>,
}

/// Security settings (`spec.security`): TLS, authentication, network isolation.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Security {
    /// Serve memcached over TLS.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<TlsConfig>,

    /// Require ASCII authentication.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth: Option<AuthConfig>,

    /// A NetworkPolicy that admits only the listed clients to memcached.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_policy: Option<super::isolation::NetworkPolicyConfig>,
}

/// TLS for client connections (memcached `-Z`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TlsConfig {
    /// A `kubernetes.io/tls` Secret in the instance's namespace with tls.crt and tls.key, and ca.crt when
    /// clientAuth is on. A rotated certificate is loaded by the running servers (the operator sends
    /// memcached's refresh_certs once the kubelet has updated the mounted files; event
    /// CertificatesReloaded); the pods roll instead when the operator does not read stats
    /// (--stats-interval=0), when auth is on and there is no ca.crt, or with the exporter sidecar and
    /// clientAuth.
    #[schemars(length(min = 1, max = 253))]
    pub secret_name: String,

    /// Require clients to present a certificate signed by the Secret's ca.crt (mutual TLS).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub client_auth: bool,

    /// With clientAuth: a `kubernetes.io/tls` Secret in the instance's namespace whose tls.crt and tls.key
    /// the operator presents as its own client certificate when it reads the servers' stats; it must be
    /// issued by the CA in secretName's ca.crt. Unset: the operator presents the server certificate
    /// (secretName's tls.crt and tls.key), as before this field existed; set it so that the operator has an
    /// identity of its own. Only the operator's stats reads use it: a missing or unusable Secret makes those
    /// reads fail (the log names the Secret), never the instance. Ignored without clientAuth.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub client_secret_name: Option<String>,
}

/// ASCII authentication (memcached `-Y`): a client's first command must be a `set` (of any key) whose
/// data is `<user> <password>`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AuthConfig {
    /// Secret in the instance's namespace holding the credentials file: up to 7 lines of
    /// `user:password`, each ending with a newline, the last one too (e.g. `kubectl create secret generic
    /// NAME --from-literal=auth-file=$'app:s3cret\n'`). A file memcached would misread (no final
    /// newline, CRLF, blank lines) sets `Degraded` (`SecretInvalid`) and is not rolled out. A change of
    /// its content rolls the pods. The pods load the operator's copy, `<name>-auth-file`, with one more
    /// line: the operator's own credential (memcached reads 8 lines); this Secret is never changed.
    #[schemars(length(min = 1, max = 253))]
    pub secret_name: String,

    /// Key of the credentials file in the Secret. Default `auth-file`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub key: Option<String>,

    /// Without spec.security.tls: let the operator read the servers' stats over plain TCP, sending its
    /// own credential (a line it adds to the file the pods load, never one of this Secret's) in the
    /// clear on the pod network at every stats interval. Off by default: the operator then reads no stats
    /// of the instance (status.stats.serversRead stays 0, the log and the
    /// memcached_operator_stats_reads_total{result="not_in_clear"} metric say why). Ignored with TLS,
    /// which the operator always reads over.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_plaintext_stats: bool,
}

impl AuthConfig {
    pub fn key(&self) -> &str {
        self.key.as_deref().unwrap_or(DEFAULT_AUTH_KEY)
    }
}

/// Monitoring settings (`spec.monitoring`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": MONITORING_RULE,
    "message": "serviceMonitor.enabled needs exporter.enabled: the ServiceMonitor scrapes the exporter"
}]))]
pub struct Monitoring {
    /// A Prometheus memcached exporter sidecar in every pod, on port 9150 (named `metrics`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exporter: Option<ExporterConfig>,

    /// A Prometheus Operator ServiceMonitor for the exporter (needs the monitoring.coreos.com API).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_monitor: Option<ServiceMonitorConfig>,
}

/// The exporter sidecar.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExporterConfig {
    /// Run the exporter.
    #[serde(default)]
    pub enabled: bool,

    /// Exporter image. Default prom/memcached-exporter:v0.15.0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 512))]
    pub image: Option<String>,

    /// Exporter resources. Default: requests 10m CPU and 32Mi memory, limit 64Mi memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<k8s_openapi::api::core::v1::ResourceRequirements>,
}

/// The ServiceMonitor.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServiceMonitorConfig {
    /// Create a ServiceMonitor (requires monitoring.exporter.enabled).
    #[serde(default)]
    pub enabled: bool,

    /// Scrape interval, such as 30s or 1m. Default: Prometheus' own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[0-9]+(ms|s|m|h)$"))]
    pub interval: Option<String>,

    /// Labels for the ServiceMonitor, so that a Prometheus' serviceMonitorSelector picks it up.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
}
