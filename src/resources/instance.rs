//! The validated instance every builder takes ([`Instance`]): the spec, the operator's defaults for it,
//! and the owner reference its children carry. [`Instance::new`], which runs the checks that make it
//! valid, is with those checks in `validate.rs`.

use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

use super::defaults::OperatorPods;
use super::fleet::Held;
use super::labels;
use super::proxy::identities::Material;
use crate::api::MemcachedSpec;

/// A validated instance: everything the builders need, with the checks the schema cannot express done.
#[derive(Clone, Debug)]
pub struct Instance<'a> {
    pub name: &'a str,
    pub namespace: &'a str,
    pub spec: &'a MemcachedSpec,
    pub image: &'a str,
    /// The operator's default memcached image ([`Defaults::image`](super::defaults::Defaults::image)),
    /// which the proxy runs unless `spec.proxy.image` says otherwise.
    pub default_image: &'a str,
    /// The operator's pods, when it runs in a pod (see
    /// [`Defaults::operator_pods`](super::defaults::Defaults::operator_pods)).
    pub operator_pods: Option<&'a OperatorPods>,
    /// See [`Defaults::stats_collected`](super::defaults::Defaults::stats_collected).
    pub stats_collected: bool,
    /// See [`Defaults::operator_image`](super::defaults::Defaults::operator_image).
    pub operator_image: &'a str,
    /// The hash the proxy's pod template carries of the Secret keys the proxy reads (see
    /// [`proxy`](super::proxy)): set by the reconcile once it has read the Secrets
    /// ([`Self::with_proxy_secret_hash`]); `None` when the proxy reads none.
    pub proxy_secret_hash: Option<String>,
    /// With `spec.proxy.access`: the client CA read from its Secret and the trust the proxy Deployment
    /// records (see [`identities`](super::proxy::identities)); set by the reconcile
    /// ([`Self::with_proxy_access`]).
    pub proxy_access: Option<Arc<Material>>,
    /// While the proxy is on: what the fleet rollout leaves of the proxy Deployment's template (the
    /// cause it records, the live template while the instance waits for its turn; see
    /// [`fleet`](super::fleet)); set by the reconcile ([`Self::with_proxy_fleet`]). `None`: as built,
    /// no cause recorded.
    pub proxy_fleet: Option<Arc<Held>>,
    /// The controller owner reference every child carries (set by [`Instance::new`]).
    pub(super) owner: OwnerReference,
}

impl<'a> Instance<'a> {
    /// This instance, with `hash` as [`Self::proxy_secret_hash`].
    pub fn with_proxy_secret_hash(&self, hash: Option<String>) -> Self {
        Self {
            proxy_secret_hash: hash,
            ..self.clone()
        }
    }

    /// This instance, with `access` as [`Self::proxy_access`].
    pub fn with_proxy_access(&self, access: Option<Arc<Material>>) -> Self {
        Self {
            proxy_access: access,
            ..self.clone()
        }
    }

    /// This instance, with `held` as [`Self::proxy_fleet`].
    pub fn with_proxy_fleet(&self, held: Option<Arc<Held>>) -> Self {
        Self {
            proxy_fleet: held,
            ..self.clone()
        }
    }

    /// Metadata shared by every child: same name and namespace as the instance, common labels, and a
    /// controller owner reference so that garbage collection removes the child with the instance.
    pub fn child_meta(&self) -> ObjectMeta {
        ObjectMeta {
            name: Some(self.name.to_owned()),
            namespace: Some(self.namespace.to_owned()),
            labels: Some(labels::common_labels(self.name)),
            owner_references: Some(vec![self.owner.clone()]),
            ..ObjectMeta::default()
        }
    }

    /// UID of the instance, as found in its children's controller owner reference.
    pub fn uid(&self) -> &str {
        &self.owner.uid
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::defaults::{DEFAULT_IMAGE, Defaults};
    use crate::resources::testing::memcached;

    #[test]
    fn instance_uses_default_image_unless_spec_sets_one() {
        let defaults = Defaults::default();
        let mc = memcached("cache", MemcachedSpec::default());
        assert_eq!(Instance::new(&mc, &defaults).unwrap().image, DEFAULT_IMAGE);

        let mc = memcached(
            "cache",
            MemcachedSpec {
                image: Some("memcached:1.6.38".into()),
                ..MemcachedSpec::default()
            },
        );
        assert_eq!(
            Instance::new(&mc, &defaults).unwrap().image,
            "memcached:1.6.38"
        );
    }

    #[test]
    fn child_meta_carries_labels_and_controller_owner() {
        let defaults = Defaults::default();
        let mc = memcached("cache", MemcachedSpec::default());
        let meta = Instance::new(&mc, &defaults).unwrap().child_meta();
        assert_eq!(meta.name.as_deref(), Some("cache"));
        assert_eq!(meta.namespace.as_deref(), Some("default"));
        let owners = meta.owner_references.unwrap();
        assert_eq!(owners.len(), 1);
        assert_eq!(owners[0].kind, "Memcached");
        assert_eq!(owners[0].uid, "uid-1");
        assert_eq!(owners[0].controller, Some(true));
        assert_eq!(meta.labels.unwrap(), labels::common_labels("cache"));
    }

    #[test]
    fn objects_without_uid_are_rejected_not_panicked_on() {
        let defaults = Defaults::default();
        let mut mc = memcached("cache", MemcachedSpec::default());
        mc.metadata.uid = None;
        assert_eq!(
            Instance::new(&mc, &defaults).unwrap_err().reason,
            "InvalidObject"
        );
    }
}
