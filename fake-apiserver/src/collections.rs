//! The collections the fake serves: every kind the operator lists, watches or writes, with the API
//! group and version a request must name. A path that names another group, version or plural is not
//! served (404), as on an API server that does not know the resource.

/// One collection: its group/version (`v1` for the core group), plural and kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Collection {
    pub api_version: &'static str,
    pub plural: &'static str,
    pub kind: &'static str,
}

const fn collection(
    api_version: &'static str,
    plural: &'static str,
    kind: &'static str,
) -> Collection {
    Collection {
        api_version,
        plural,
        kind,
    }
}

/// Every collection, ServiceMonitors included: those are served only when the fake is told that the
/// cluster has their API ([`crate::Options::service_monitors`]).
pub const COLLECTIONS: &[Collection] = &[
    collection("cache.example.com/v1alpha1", "memcacheds", "Memcached"),
    collection("apps/v1", "deployments", "Deployment"),
    collection("apps/v1", "statefulsets", "StatefulSet"),
    collection("v1", "services", "Service"),
    collection("v1", "configmaps", "ConfigMap"),
    collection("v1", "pods", "Pod"),
    collection("v1", "secrets", "Secret"),
    collection("policy/v1", "poddisruptionbudgets", "PodDisruptionBudget"),
    collection("networking.k8s.io/v1", "networkpolicies", "NetworkPolicy"),
    collection(
        "autoscaling/v2",
        "horizontalpodautoscalers",
        "HorizontalPodAutoscaler",
    ),
    collection("events.k8s.io/v1", "events", "Event"),
    collection("coordination.k8s.io/v1", "leases", "Lease"),
    collection(
        "monitoring.coreos.com/v1",
        "servicemonitors",
        "ServiceMonitor",
    ),
];

/// The API group of the operator's own resource: [`crate::Fake::set_crd_missing`] takes it away.
pub const OPERATOR_GROUP: &str = "cache.example.com";

/// The group/version whose discovery document says whether ServiceMonitors are served.
pub const MONITORING: &str = "monitoring.coreos.com/v1";

/// The collection named `plural` in `api_version`.
pub fn find(api_version: &str, plural: &str) -> Option<&'static Collection> {
    COLLECTIONS
        .iter()
        .find(|c| c.plural == plural && c.api_version == api_version)
}
