//! The `Memcached` resource itself: its group and version, the spec (`MemcachedSpec`, with the
//! accessors that fill in each section's defaults) and the status the operator writes. The sections of
//! the spec are in the sibling files, one per part of it.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Affinity, ResourceRequirements, Toleration, TopologySpreadConstraint,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::clients::{ClientHashing, Clients};
use super::features::{
    AuthConfig, ExporterConfig, HighAvailability, MemcachedConfig, Monitoring, Security,
    ServiceConfig, ServiceMonitorConfig, TlsConfig,
};
use super::handover::WarmHandover;
use super::isolation::{AutoscalingConfig, MAX_ALLOWED_CLIENTS, NetworkPolicyConfig};
use super::pools::{
    Drain, Rollout, Scaling, Server, WORKLOAD_RULE, WORKLOAD_RULE_MESSAGE, Workload,
};
use super::proxy::{
    PROXY_ACCESS_TLS_MESSAGE, PROXY_ACCESS_TLS_RULE, PROXY_AUTH_MESSAGE, PROXY_AUTH_RULE,
    PROXY_HASHING_MESSAGE, PROXY_HASHING_RULE, PROXY_TLS_IMAGE_MESSAGE, PROXY_TLS_IMAGE_RULE,
    PROXY_TLS_MESSAGE, PROXY_TLS_RULE, Proxy, ProxyStatus,
};
use super::stats::CacheStats;

/// API group of the custom resource.
pub const GROUP: &str = "cache.example.com";
/// API version of the custom resource.
pub const VERSION: &str = "v1alpha1";
/// Finalizer that earlier builds of the operator put on every instance (the name the tutorial's
/// deploy-image variant uses). The operator no longer adds it, and removes it from instances that still
/// carry it.
pub const FINALIZER: &str = "cache.example.com/finalizer";

/// Default for `spec.size`.
pub const DEFAULT_SIZE: i32 = 1;
/// Upper bound for `spec.size`.
pub const MAX_SIZE: i32 = 64;
/// Default for `spec.containerPort`: memcached's well-known port.
pub const DEFAULT_CONTAINER_PORT: i32 = 11211;

/// Desired state of a Memcached instance.
// Several printer columns share a `type_`, which clippy would take for a repeated attribute.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "cache.example.com",
    version = "v1alpha1",
    kind = "Memcached",
    plural = "memcacheds",
    shortname = "mc",
    namespaced,
    status = "MemcachedStatus",
    derive = "PartialEq",
    doc = "Memcached runs a set of memcached servers (a Deployment or StatefulSet, its Services, a published server list and optional extras) managed by memcached-operator.",
    scale(
        spec_replicas_path = ".spec.size",
        status_replicas_path = ".status.replicas",
        label_selector_path = ".status.selector"
    ),
    printcolumn(
        name = "Size",
        type_ = "integer",
        json_path = ".spec.size",
        description = "Desired number of memcached pods"
    ),
    printcolumn(
        name = "Ready",
        type_ = "integer",
        json_path = ".status.readyReplicas",
        description = "Number of ready memcached pods"
    ),
    printcolumn(
        name = "Available",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Available\")].status",
        description = "Whether every desired memcached pod is ready"
    ),
    printcolumn(
        name = "Hit%",
        type_ = "integer",
        json_path = ".status.stats.hitRatioPercent",
        description = "Share of gets that hit, in whole percent, as the operator last read it from the servers"
    ),
    printcolumn(
        name = "Mem%",
        type_ = "integer",
        json_path = ".status.stats.memoryUsedPercent",
        description = "Memory used by items, in whole percent of the memory limit, as the operator last read it from the servers"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": WORKLOAD_RULE, "message": WORKLOAD_RULE_MESSAGE},
    {"rule": PROXY_AUTH_RULE, "message": PROXY_AUTH_MESSAGE},
    {"rule": PROXY_TLS_RULE, "message": PROXY_TLS_MESSAGE},
    {"rule": PROXY_ACCESS_TLS_RULE, "message": PROXY_ACCESS_TLS_MESSAGE},
    {"rule": PROXY_TLS_IMAGE_RULE, "message": PROXY_TLS_IMAGE_MESSAGE},
    {"rule": PROXY_HASHING_RULE, "message": PROXY_HASHING_MESSAGE}
]))]
// The sections most instances leave out are boxed: the operator's cache holds every instance's spec, and an
// unboxed `None` takes its section's full size (880 bytes per instance in all). Boxes change neither the
// JSON nor the schema.
pub struct MemcachedSpec {
    /// Number of memcached pods. 0 scales the instance to zero (the Deployment and Service are kept).
    /// Also settable through the scale subresource (`kubectl scale memcached/NAME --replicas=N`).
    #[serde(default = "default_size")]
    #[schemars(range(min = 0, max = 64))]
    pub size: i32,

    /// TCP port memcached listens on inside the pod; the Service exposes the same port.
    #[serde(default = "default_container_port")]
    #[schemars(range(min = 1, max = 65535))]
    pub container_port: i32,

    /// Container image to run. Defaults to the operator's MEMCACHED_IMAGE environment variable, or to the
    /// operator's built-in memcached image when that is unset. Changing it rolls the pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 512))]
    pub image: Option<String>,

    /// memcached's own settings: memory, connections, threads, item size, verbosity, extra arguments.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memcached: Option<Box<MemcachedConfig>>,

    /// CPU and memory for the memcached container. Default: requests of 100m CPU and a memory of
    /// maxMemoryMB + what memcached uses beyond it (32Mi for threads and connections, 1Mi per slab class,
    /// the hash table grown for the most items: 147Mi in all for the default 64), and a memory limit of the
    /// same; keys given here replace those defaults one by one. A memory limit must be at least
    /// maxMemoryMB + 32Mi; one below the derived size can be OOM-killed by a fill across item sizes (Degraded,
    /// OOMKilled).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<Box<ResourceRequirements>>,

    /// Node labels the pods must run on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<BTreeMap<String, String>>,

    /// Taints the pods tolerate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tolerations: Option<Vec<Toleration>>,

    /// Scheduling constraints. A podAntiAffinity here replaces highAvailability.antiAffinity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity: Option<Box<Affinity>>,

    /// How pods spread across topology domains such as zones.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology_spread_constraints: Option<Vec<TopologySpreadConstraint>>,

    /// PriorityClass of the pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub priority_class_name: Option<String>,

    /// Spreading across nodes, the PodDisruptionBudget, and graceful termination.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub high_availability: Option<Box<HighAvailability>>,

    /// The client Service: type, annotations, port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<ServiceConfig>,

    /// TLS and authentication.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub security: Option<Box<Security>>,

    /// Prometheus exporter sidecar and ServiceMonitor.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub monitoring: Option<Box<Monitoring>>,

    /// What runs the servers: `Deployment` (default) or `StatefulSet` (stable pod names and DNS
    /// addresses). Cannot change on a live instance. A StatefulSet instance's name is at most 52
    /// characters (54 for a Deployment): its pods' controller-revision-hash label is `<name>-<hash>`.
    #[serde(default)]
    pub workload: Workload,

    /// How a scale-down drains servers before removing them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scaling: Option<Scaling>,

    /// How a changed pod template rolls out: one server at a time, each warmed up before the next.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<Rollout>,
    /// A HorizontalPodAutoscaler that sets spec.size from the pods' CPU or memory use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autoscaling: Option<Box<AutoscalingConfig>>,

    /// What the operator may assume about the clients: how they place keys over the server list.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clients: Option<Clients>,

    /// Copying items to servers that take keys over (see docs/clients.md, "Warm handover").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handover: Option<WarmHandover>,

    /// A memcached proxy in front of the servers: one address, `<name>-proxy`, for any client (see
    /// docs/clients.md, "Through the proxy"). Off by default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy: Option<Box<Proxy>>,
}

fn default_size() -> i32 {
    DEFAULT_SIZE
}

fn default_container_port() -> i32 {
    DEFAULT_CONTAINER_PORT
}

impl Default for MemcachedSpec {
    fn default() -> Self {
        Self {
            size: DEFAULT_SIZE,
            container_port: DEFAULT_CONTAINER_PORT,
            image: None,
            memcached: None,
            resources: None,
            node_selector: None,
            tolerations: None,
            affinity: None,
            topology_spread_constraints: None,
            priority_class_name: None,
            high_availability: None,
            service: None,
            security: None,
            monitoring: None,
            workload: Workload::default(),
            scaling: None,
            rollout: None,
            autoscaling: None,
            clients: None,
            handover: None,
            proxy: None,
        }
    }
}

/// Observed state of a Memcached instance, written by the operator only.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MemcachedStatus {
    /// Latest observations: `Available` (all desired pods ready), `Progressing` (a rollout or scale is under
    /// way) and `Degraded` (pods cannot start or the spec cannot be realised); with `spec.proxy.enabled`,
    /// `ProxyAvailable` too (at least one proxy pod ready).
    #[serde(default)]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,

    /// The `metadata.generation` this status was computed for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// Number of memcached pods that exist (ready or not), as reported by the Deployment.
    #[serde(default)]
    pub replicas: i32,

    /// Number of memcached pods that are ready to serve.
    #[serde(default)]
    pub ready_replicas: i32,

    /// Label selector of the instance's pods, in string form (used by the scale subresource and HPAs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,

    /// Sorted names of the instance's pods.
    #[serde(default)]
    pub nodes: Vec<String>,

    /// `host:port` of every ready server, in slot order: the server list for clients that hash keys
    /// across servers (kept for compatibility; `servers` and the `<name>-servers` ConfigMap say more).
    #[serde(default)]
    pub server_list: Vec<String>,

    /// One entry per published server slot, in slot order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["slot"]))]
    pub servers: Vec<Server>,

    /// The scale-down being drained, while one is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain: Option<Drain>,

    /// The proxy's pods and the Service its clients use, while `spec.proxy.enabled`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy: Option<ProxyStatus>,

    /// What the servers themselves report (hit ratio, memory, items, evictions, connections), read by
    /// the operator every `--stats-interval` and written at most every `--stats-status-interval`, only
    /// when a value changed. Absent while no server is ready or when the operator's stats collection is
    /// off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stats: Option<CacheStats>,
}

impl Memcached {
    /// The spec'd image, or `default_image` when the spec leaves it out.
    pub fn image_or<'a>(&'a self, default_image: &'a str) -> &'a str {
        self.spec.image.as_deref().unwrap_or(default_image)
    }
}

impl MemcachedSpec {
    /// `spec.memcached`, or all defaults.
    pub fn memcached(&self) -> MemcachedConfig {
        self.memcached.as_deref().cloned().unwrap_or_default()
    }
    /// `spec.highAvailability`, or all defaults.
    pub fn high_availability(&self) -> HighAvailability {
        self.high_availability
            .as_deref()
            .cloned()
            .unwrap_or_default()
    }
    /// `spec.service`, or all defaults.
    pub fn service(&self) -> ServiceConfig {
        self.service.clone().unwrap_or_default()
    }
    /// TLS settings, if TLS is on.
    pub fn tls(&self) -> Option<&TlsConfig> {
        self.security.as_ref()?.tls.as_ref()
    }
    /// Auth settings, if authentication is on.
    pub fn auth(&self) -> Option<&AuthConfig> {
        self.security.as_ref()?.auth.as_ref()
    }
    /// Exporter settings, if the exporter is on.
    pub fn exporter(&self) -> Option<&ExporterConfig> {
        self.monitoring
            .as_ref()?
            .exporter
            .as_ref()
            .filter(|e| e.enabled)
    }
    /// `spec.scaling.drainSeconds`, or its default.
    pub fn drain_seconds(&self) -> i32 {
        self.scaling.clone().unwrap_or_default().drain_seconds()
    }
    /// `spec.rollout.warmupSeconds`, or its default.
    pub fn warmup_seconds(&self) -> i32 {
        self.rollout.clone().unwrap_or_default().warmup_seconds()
    }
    /// `spec.handover`, or its defaults.
    pub fn handover(&self) -> WarmHandover {
        self.handover.clone().unwrap_or_default()
    }
    /// `spec.clients.hashing`, or its default `unknown`.
    pub fn client_hashing(&self) -> ClientHashing {
        self.clients.as_ref().map(|c| c.hashing).unwrap_or_default()
    }
    /// How keys are placed over the published list, as far as the operator knows: the proxy's
    /// distribution when the proxy is on (the operator's choice), else the declared client hashing. What
    /// warm handover follows; `None` when nothing is known.
    pub fn key_scheme(&self) -> Option<crate::hashing::Scheme> {
        if self.proxy().is_some() {
            return Some(crate::hashing::Scheme::ProxyJump);
        }
        self.client_hashing().scheme()
    }
    /// `spec.proxy`, if the proxy is on.
    pub fn proxy(&self) -> Option<&Proxy> {
        self.proxy.as_deref().filter(|p| p.enabled)
    }
    /// ServiceMonitor settings, if a ServiceMonitor is wanted.
    pub fn service_monitor(&self) -> Option<&ServiceMonitorConfig> {
        self.monitoring
            .as_ref()?
            .service_monitor
            .as_ref()
            .filter(|s| s.enabled)
    }
    /// NetworkPolicy settings, if a NetworkPolicy is wanted.
    pub fn network_policy(&self) -> Option<&NetworkPolicyConfig> {
        self.security
            .as_ref()?
            .network_policy
            .as_ref()
            .filter(|n| n.enabled)
    }
    /// Autoscaling settings, if an autoscaler is wanted.
    pub fn autoscaling(&self) -> Option<&AutoscalingConfig> {
        self.autoscaling.as_deref().filter(|a| a.enabled)
    }
}

// Schema bounds repeat these numbers (attributes take literals); keep them in step.
const _: () = assert!(MAX_SIZE == 64 && MAX_ALLOWED_CLIENTS == 32);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tutorial_spec_deserializes_with_defaults() {
        let spec: MemcachedSpec = serde_json::from_str(r#"{"size": 3}"#).unwrap();
        assert_eq!(spec.size, 3);
        assert_eq!(spec.container_port, DEFAULT_CONTAINER_PORT);
        assert_eq!(spec.image, None);

        let empty: MemcachedSpec = serde_json::from_str("{}").unwrap();
        assert_eq!(empty, MemcachedSpec::default());
    }

    #[test]
    fn status_serializes_every_count_so_server_side_apply_can_zero_them() {
        let json = serde_json::to_value(MemcachedStatus::default()).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"conditions": [], "replicas": 0, "readyReplicas": 0, "nodes": [], "serverList": []})
        );
    }
}
