//! Network isolation (`spec.security.networkPolicy`) and autoscaling (`spec.autoscaling`): the parts of
//! the spec that ask for a NetworkPolicy and a HorizontalPodAutoscaler per instance. Both are off unless
//! enabled, so existing manifests keep their behaviour.

use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscalerBehavior;
use k8s_openapi::api::networking::v1::IPBlock;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Default for `spec.autoscaling.minSize` (the HorizontalPodAutoscaler's own default).
pub const DEFAULT_MIN_SIZE: i32 = 1;
/// Most entries of `spec.security.networkPolicy.allowedClients`: bounds the object and its CEL cost.
pub const MAX_ALLOWED_CLIENTS: usize = 32;

/// CEL rule on each allowed client: selectors, or an ipBlock alone (what a NetworkPolicyPeer accepts).
pub const PEER_RULE: &str = "has(self.ipBlock) ? !has(self.podSelector) && !has(self.namespaceSelector) : \
     (has(self.podSelector) || has(self.namespaceSelector))";
/// CEL rule on `spec.autoscaling`: the lower bound does not exceed the upper one.
pub const AUTOSCALING_BOUNDS_RULE: &str = "!has(self.minSize) || self.minSize <= self.maxSize";
/// CEL rule on `spec.autoscaling`: an enabled autoscaler has something to scale on.
pub const AUTOSCALING_TARGET_RULE: &str = "!(has(self.enabled) && self.enabled) || \
     has(self.targetCPUUtilizationPercentage) || has(self.targetMemoryUtilizationPercentage)";

/// A NetworkPolicy for the instance (`spec.security.networkPolicy`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NetworkPolicyConfig {
    /// Keep a NetworkPolicy `<name>` that admits connections to the instance's pods only on the memcached
    /// port from allowedClients, and on the exporter's metrics port from monitoringNamespaceSelector.
    /// Other ingress to the pods is dropped; egress is left alone. Enforcement needs a network plugin that
    /// implements NetworkPolicy (Calico, Cilium, ...). When false the policy is removed.
    #[serde(default)]
    pub enabled: bool,

    /// Who may connect to the memcached port, as NetworkPolicy peers: a podSelector (pods in the
    /// instance's namespace), a namespaceSelector (every pod in those namespaces), both (those pods in
    /// those namespaces), or an ipBlock alone (clients outside the cluster, e.g. through a LoadBalancer
    /// Service). Empty (the default): every pod in the instance's namespace.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub allowed_clients: Vec<AllowedClient>,

    /// Namespaces whose pods (Prometheus) may scrape the exporter's metrics port, when the exporter is on.
    /// Default: the instance's namespace only. `{}` selects every namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub monitoring_namespace_selector: Option<LabelSelector>,
}

/// One peer allowed to reach memcached: podSelector and/or namespaceSelector, or an ipBlock alone.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": PEER_RULE,
    "message": "an allowed client sets podSelector and/or namespaceSelector, or ipBlock alone"
}]))]
pub struct AllowedClient {
    /// Pods allowed to connect; alone, in the instance's namespace, with namespaceSelector, in those
    /// namespaces. `{}` selects every pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_selector: Option<LabelSelector>,

    /// Namespaces whose pods may connect. `{}` selects every namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_selector: Option<LabelSelector>,

    /// An IP range allowed to connect (CIDR, with optional exceptions), for clients that are not pods.
    /// Cannot be combined with the selectors.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip_block: Option<IPBlock>,
}

/// A HorizontalPodAutoscaler for the instance (`spec.autoscaling`). The autoscaler scales the Memcached
/// itself through its scale subresource, so while it is enabled it owns `spec.size`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": AUTOSCALING_BOUNDS_RULE,
        "message": "minSize (default 1) must not exceed maxSize"
    },
    {
        "rule": AUTOSCALING_TARGET_RULE,
        "message": "an enabled autoscaler needs targetCPUUtilizationPercentage or targetMemoryUtilizationPercentage"
    }
]))]
pub struct AutoscalingConfig {
    /// Keep an autoscaling/v2 HorizontalPodAutoscaler `<name>` that sets spec.size between minSize and
    /// maxSize. While enabled, spec.size is the autoscaler's: edits and `kubectl scale` are overridden
    /// (leave size out of applied manifests), and size 0 pauses autoscaling. Needs a metrics server.
    /// When false the autoscaler is removed and spec.size stays where it was.
    #[serde(default)]
    pub enabled: bool,

    /// Fewest pods the autoscaler keeps. Default 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 64))]
    pub min_size: Option<i32>,

    /// Most pods the autoscaler sets (at most 64, the limit of spec.size).
    #[schemars(range(min = 1, max = 64))]
    pub max_size: i32,

    /// Average CPU use of the pods to aim for, in percent of their CPU requests (every container of the
    /// pod counts, the exporter included).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        rename = "targetCPUUtilizationPercentage"
    )]
    #[schemars(range(min = 1, max = 1000))]
    pub target_cpu_utilization_percentage: Option<i32>,

    /// Average memory use of the pods to aim for, in percent of their memory requests. memcached keeps
    /// memory it has filled with items, so this mostly scales up; CPU is the usual target.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        rename = "targetMemoryUtilizationPercentage"
    )]
    #[schemars(range(min = 1, max = 1000))]
    pub target_memory_utilization_percentage: Option<i32>,

    /// Scaling behaviour (stabilization windows and rate policies), passed to the autoscaler as given.
    /// Default: the autoscaler's (scale up at once, scale down after 5 minutes of lower use).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub behavior: Option<HorizontalPodAutoscalerBehavior>,
}

impl AutoscalingConfig {
    pub fn min_size(&self) -> i32 {
        self.min_size.unwrap_or(DEFAULT_MIN_SIZE)
    }
}
