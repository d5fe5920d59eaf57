//! Which instances a changed object triggers: the owners of a child, the instance a pod belongs to,
//! the instances that name a Secret.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::ResourceExt;
use kube::api::PartialObjectMeta;
use kube::runtime::reflector::ObjectRef;

use crate::api::Memcached;
use crate::api::names::served_auth_name;
use crate::resources::{labels, secrets};
use crate::store::compact::Compact;

/// The instances that own an object: its owner references to a `Memcached` (as kube's `owns` reads them).
pub(super) fn owners(meta: &kube::api::ObjectMeta) -> Vec<ObjectRef<Memcached>> {
    meta.owner_references
        .iter()
        .flatten()
        .filter_map(|owner| ObjectRef::from_owner_ref(meta.namespace.as_deref(), owner, ()))
        .collect()
}

/// The instances that reference `secret` (same namespace, named in their spec), or whose servers load it
/// (`<name>-auth-file`: changed or deleted by someone, it is written again).
pub fn referencing(
    instances: &[Arc<Memcached>],
    secret: &PartialObjectMeta<Secret>,
) -> Vec<ObjectRef<Memcached>> {
    let (Some(name), namespace) = (
        secret.metadata.name.as_deref(),
        secret.metadata.namespace.as_deref(),
    ) else {
        return Vec::new();
    };
    instances
        .iter()
        .filter(|mc| mc.metadata.namespace.as_deref() == namespace)
        .filter(|mc| {
            secrets::referenced(&mc.spec).iter().any(|r| r.name == name)
                || secrets::access_referenced(&mc.spec).is_some_and(|r| r.name == name)
                || mc.metadata.name.as_deref().map(served_auth_name).as_deref() == Some(name)
        })
        .map(|mc| ObjectRef::from_obj(mc.as_ref()))
        .collect()
}

/// The instance a pod belongs to, from its labels: one of its servers, or its rollout's spare server
/// (see `resources::spare`).
pub fn pod_owner(pod: Compact<Pod>) -> Option<ObjectRef<Memcached>> {
    let labels = pod.labels();
    if labels.get(labels::NAME_KEY).map(String::as_str) != Some(labels::APP_NAME)
        && !crate::resources::spare::is_spare(labels)
    {
        return None;
    }
    let name = labels.get(labels::INSTANCE_KEY)?;
    let namespace = pod.namespace()?;
    Some(ObjectRef::new(name).within(&namespace))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::Memcached;
    use serde_json::json;

    #[test]
    fn pods_map_to_their_instance_by_label() {
        let pod: Compact<Pod> = serde_json::from_value(json!({"metadata": {"name": "cache-x", "namespace": "ns",
            "labels": {"app.kubernetes.io/name": "memcached", "app.kubernetes.io/instance": "cache"}}}))
        .unwrap();
        assert_eq!(pod_owner(pod), Some(ObjectRef::new("cache").within("ns")));
        let foreign: Compact<Pod> =
            serde_json::from_value(json!({"metadata": {"name": "x", "namespace": "ns",
            "labels": {"app.kubernetes.io/name": "redis", "app.kubernetes.io/instance": "cache"}}}))
            .unwrap();
        assert_eq!(pod_owner(foreign), None);
    }

    #[test]
    fn secrets_trigger_the_instances_that_name_them() {
        let mc = |name: &str, ns: &str, secret: Option<&str>| {
            let mut mc: Memcached = serde_json::from_value(json!({
                "apiVersion": "cache.example.com/v1alpha1", "kind": "Memcached",
                "metadata": {"name": name, "namespace": ns}, "spec": {}
            }))
            .unwrap();
            if let Some(secret) = secret {
                mc.spec =
                    serde_json::from_value(json!({"security": {"auth": {"secretName": secret}}}))
                        .unwrap();
            }
            Arc::new(mc)
        };
        let instances = [
            mc("a", "ns", Some("creds")),
            mc("b", "ns", None),
            mc("c", "other", Some("creds")),
            mc("d", "ns", Some("creds")),
        ];
        let mut secret = PartialObjectMeta::<Secret>::default();
        secret.metadata.name = Some("creds".into());
        secret.metadata.namespace = Some("ns".into());
        let refs = referencing(&instances, &secret);
        assert_eq!(
            refs,
            [
                ObjectRef::new("a").within("ns"),
                ObjectRef::new("d").within("ns")
            ]
        );
    }
}
