//! The API paths the tests name, as the operator under test addresses them (namespace `default`,
//! instance `cache`, Lease in `op-system`), and the patch content types it accepts. The children's paths
//! come from the operator's table of kinds ([`crate::common::kinds`]).

use std::sync::LazyLock;

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;

use crate::common::kinds::{collection_path, collection_paths, object_path};

pub const MEMCACHEDS: &str = "/apis/cache.example.com/v1alpha1/namespaces/default/memcacheds";
pub static DEPLOYMENTS: LazyLock<&str> = LazyLock::new(collection_path::<Deployment>);
pub static STATEFULSETS: LazyLock<&str> = LazyLock::new(collection_path::<StatefulSet>);
pub static CONFIGMAPS: LazyLock<&str> = LazyLock::new(collection_path::<ConfigMap>);
pub static SERVICES: LazyLock<&str> = LazyLock::new(collection_path::<Service>);
pub static PDBS: LazyLock<&str> = LazyLock::new(collection_path::<PodDisruptionBudget>);
/// The collection of every kind of child every cluster serves (no CRD's), in the table's order.
pub static CHILDREN: LazyLock<Vec<&str>> = LazyLock::new(collection_paths);
pub const PODS: &str = "/api/v1/namespaces/default/pods";
pub const SECRETS: &str = "/api/v1/namespaces/default/secrets";
pub const MONITORING: &str = "/apis/monitoring.coreos.com/v1";
pub const SERVICE_MONITORS: &str =
    "/apis/monitoring.coreos.com/v1/namespaces/default/servicemonitors";

pub static HEADLESS: LazyLock<&str> = LazyLock::new(|| object_path::<Service>("cache-headless"));
pub static PDB: LazyLock<&str> = LazyLock::new(|| object_path::<PodDisruptionBudget>("cache"));
pub static DEPLOYMENT: LazyLock<&str> = LazyLock::new(|| object_path::<Deployment>("cache"));
pub static SERVICE: LazyLock<&str> = LazyLock::new(|| object_path::<Service>("cache"));
pub static SERVER_LIST: LazyLock<&str> =
    LazyLock::new(|| object_path::<ConfigMap>("cache-servers"));
pub const INSTANCE: &str = "/apis/cache.example.com/v1alpha1/namespaces/default/memcacheds/cache";
pub const STATUS: &str =
    "/apis/cache.example.com/v1alpha1/namespaces/default/memcacheds/cache/status";

pub const EVENTS: &str = "/apis/events.k8s.io/v1/namespaces/default/events";
/// The operator's digest key, in its own namespace (`POD_NAMESPACE`).
pub const DIGEST_KEY: &str = "/api/v1/namespaces/op-system/secrets/memcached-operator-digest-key";
pub const LEASES: &str = "/apis/coordination.k8s.io/v1/namespaces/op-system/leases";
pub const LEASE: &str =
    "/apis/coordination.k8s.io/v1/namespaces/op-system/leases/memcached-operator.cache.example.com";

pub use fake_apiserver::request::{APPLY, JSON_PATCH, STRATEGIC};
