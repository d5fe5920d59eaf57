//! Sample instances for the builder and status tests.

use crate::api::{Memcached, MemcachedSpec};

/// The metadata every child of `memcached("cache", ..)` carries, as JSON.
pub fn child_meta_json() -> serde_json::Value {
    serde_json::json!({
        "name": "cache",
        "namespace": "default",
        "labels": {
            "app.kubernetes.io/instance": "cache",
            "app.kubernetes.io/managed-by": "memcached-operator",
            "app.kubernetes.io/name": "memcached"
        },
        "ownerReferences": [{
            "apiVersion": "cache.example.com/v1alpha1", "kind": "Memcached", "name": "cache",
            "uid": "uid-1", "controller": true
        }]
    })
}

pub fn memcached(name: &str, spec: MemcachedSpec) -> Memcached {
    let mut mc = Memcached::new(name, spec);
    mc.metadata.namespace = Some("default".into());
    mc.metadata.uid = Some("uid-1".into());
    mc.metadata.generation = Some(1);
    mc
}
