//! The API paths the tests name, as the operator under test addresses them (namespace `default`,
//! instance `cache`, Lease in `op-system`), and the patch content types it accepts.

pub const MEMCACHEDS: &str = "/apis/cache.example.com/v1alpha1/namespaces/default/memcacheds";
pub const DEPLOYMENTS: &str = "/apis/apps/v1/namespaces/default/deployments";
pub const STATEFULSETS: &str = "/apis/apps/v1/namespaces/default/statefulsets";
pub const CONFIGMAPS: &str = "/api/v1/namespaces/default/configmaps";
pub const NETWORK_POLICIES: &str = "/apis/networking.k8s.io/v1/namespaces/default/networkpolicies";
pub const AUTOSCALERS: &str = "/apis/autoscaling/v2/namespaces/default/horizontalpodautoscalers";
pub const SERVICES: &str = "/api/v1/namespaces/default/services";
pub const PODS: &str = "/api/v1/namespaces/default/pods";
pub const PDBS: &str = "/apis/policy/v1/namespaces/default/poddisruptionbudgets";
pub const SECRETS: &str = "/api/v1/namespaces/default/secrets";
pub const MONITORING: &str = "/apis/monitoring.coreos.com/v1";
pub const SERVICE_MONITORS: &str =
    "/apis/monitoring.coreos.com/v1/namespaces/default/servicemonitors";

pub const HEADLESS: &str = "/api/v1/namespaces/default/services/cache-headless";
pub const PDB: &str = "/apis/policy/v1/namespaces/default/poddisruptionbudgets/cache";
pub const DEPLOYMENT: &str = "/apis/apps/v1/namespaces/default/deployments/cache";
pub const SERVICE: &str = "/api/v1/namespaces/default/services/cache";
pub const SERVER_LIST: &str = "/api/v1/namespaces/default/configmaps/cache-servers";
pub const INSTANCE: &str = "/apis/cache.example.com/v1alpha1/namespaces/default/memcacheds/cache";
pub const STATUS: &str =
    "/apis/cache.example.com/v1alpha1/namespaces/default/memcacheds/cache/status";

pub const EVENTS: &str = "/apis/events.k8s.io/v1/namespaces/default/events";
pub const LEASES: &str = "/apis/coordination.k8s.io/v1/namespaces/op-system/leases";
pub const LEASE: &str =
    "/apis/coordination.k8s.io/v1/namespaces/op-system/leases/memcached-operator.cache.example.com";

pub use fake_apiserver::request::{APPLY, JSON_PATCH, STRATEGIC};
