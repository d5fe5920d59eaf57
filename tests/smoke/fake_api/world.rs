//! What the fake's lists return: the cluster as the operator finds it when it starts.

use std::time::Duration;

use serde_json::{Value, json};

/// The objects the fake lists, and how slowly.
#[derive(Clone)]
pub struct World {
    pub memcacheds: Vec<Value>,
    pub deployments: Vec<Value>,
    pub statefulsets: Vec<Value>,
    pub services: Vec<Value>,
    pub config_maps: Vec<Value>,
    pub pods: Vec<Value>,
    pub pdbs: Vec<Value>,
    pub network_policies: Vec<Value>,
    pub autoscalers: Vec<Value>,
    /// Full Secrets: listed metadata-only, served whole on a GET by name.
    pub secrets: Vec<Value>,
    /// ServiceMonitors, or `None` when the cluster does not serve their API.
    pub service_monitors: Option<Vec<Value>>,
    /// List paths answered only after this delay, as a large list or a busy API server would be.
    pub slow_lists: Vec<(&'static str, Duration)>,
}

impl Default for World {
    /// One instance and nothing else: the operator has never run.
    fn default() -> Self {
        Self {
            memcacheds: vec![memcached()],
            deployments: vec![],
            statefulsets: vec![],
            services: vec![],
            config_maps: vec![],
            pods: vec![],
            pdbs: vec![],
            network_policies: vec![],
            autoscalers: vec![],
            secrets: vec![],
            service_monitors: None,
            slow_lists: vec![],
        }
    }
}

/// A Secret as a metadata-only list returns it.
pub fn metadata_only(secret: &Value) -> Value {
    json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata", "metadata": secret["metadata"]})
}

/// The instance of most tests.
pub fn memcached() -> Value {
    memcached_named("cache", "uid-1")
}

/// An existing instance: 2 memcached pods on port 11211.
pub fn memcached_named(name: &str, uid: &str) -> Value {
    json!({
        "apiVersion": "cache.example.com/v1alpha1",
        "kind": "Memcached",
        "metadata": {
            "name": name, "namespace": "default", "uid": uid, "generation": 1,
            "resourceVersion": "1", "creationTimestamp": "2024-01-01T00:00:00Z"
        },
        "spec": {"size": 2, "containerPort": 11211}
    })
}

/// The finalizer earlier builds of the operator put on every instance.
pub const LEGACY_FINALIZER: &str = "cache.example.com/finalizer";

/// `mc` as an earlier build of the operator left it: carrying its finalizer.
pub fn with_legacy_finalizer(mut mc: Value) -> Value {
    mc["metadata"]["finalizers"] = json!([LEGACY_FINALIZER]);
    mc
}
