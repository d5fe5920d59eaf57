//! Pure builders: a `Memcached` in, the exact child objects the operator server-side applies out.
//!
//! Nothing here talks to the API server, so every shape decision is unit-tested with plain values.

pub mod args;
pub mod auth_file;
pub mod autoscaler;
pub mod deployment;
pub mod drift;
pub mod labels;
pub mod memory;
pub mod network_policy;
pub mod pdb;
pub mod pod;
pub mod proxy;
pub mod quantity;
pub mod rollout;
pub mod scaling;
pub mod secrets;
pub mod servers;
pub mod service;
pub mod service_monitor;
pub mod spare;
pub mod statefulset;
pub mod validate;
#[cfg(test)]
pub mod vertical_pod_autoscaler;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::Resource;

use crate::api::{Memcached, MemcachedSpec, Workload};

/// Image used when neither `spec.image` nor `MEMCACHED_IMAGE` says otherwise.
pub const DEFAULT_IMAGE: &str = "memcached:1.6-alpine";

/// The operator's own image, as the release tooling tags it: what runs the proxy's configuration writer
/// unless `--operator-image` says otherwise.
pub const DEFAULT_OPERATOR_IMAGE: &str = concat!(
    "registry.example.com/memcached-operator:v",
    env!("CARGO_PKG_VERSION")
);

/// Operator-wide settings that shape the children of every instance.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Defaults {
    /// Image for instances whose spec has none (`MEMCACHED_IMAGE`).
    pub image: String,
    /// Where the operator's own pods run: an instance's NetworkPolicy admits them to the memcached port
    /// while the operator connects to its servers (stats reads, handover copies). `None` when the
    /// operator does not run in a pod.
    pub operator_pods: Option<OperatorPods>,
    /// Whether the operator reads its instances' stats (`--stats-interval` not 0), wherever it runs: the
    /// collector is what asks servers to reload a rotated certificate ([`secrets::tls_reload`]).
    pub stats_collected: bool,
    /// The operator's own image: the proxy's configuration writer runs it (see [`proxy`]).
    pub operator_image: String,
}

/// The operator's pods, as a NetworkPolicy peer: those labelled [`labels::OPERATOR_POD_LABEL`] in
/// `namespace` (the install's manager Deployment carries the label).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OperatorPods {
    pub namespace: String,
}

impl Default for Defaults {
    fn default() -> Self {
        Self {
            image: DEFAULT_IMAGE.to_owned(),
            operator_pods: None,
            stats_collected: true,
            operator_image: DEFAULT_OPERATOR_IMAGE.to_owned(),
        }
    }
}

/// A spec the operator cannot realise, found before anything is applied. Reported as `Degraded`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{reason}: {message}")]
pub struct InvalidSpec {
    /// CamelCase condition reason.
    pub reason: &'static str,
    /// Human-readable explanation naming the offending field.
    pub message: String,
}

/// Reason of every spec check that the schema cannot express (see [`validate`]).
pub const INVALID_CONFIG: &str = "InvalidConfig";

impl InvalidSpec {
    /// A spec check failed: reason [`INVALID_CONFIG`], `message` naming the field.
    pub(crate) fn config(message: String) -> Self {
        Self {
            reason: INVALID_CONFIG,
            message,
        }
    }
}

/// A validated instance: everything the builders need, with the checks the schema cannot express done.
#[derive(Clone, Debug)]
pub struct Instance<'a> {
    pub name: &'a str,
    pub namespace: &'a str,
    pub spec: &'a MemcachedSpec,
    pub image: &'a str,
    /// The operator's default memcached image ([`Defaults::image`]), which the proxy runs unless
    /// `spec.proxy.image` says otherwise.
    pub default_image: &'a str,
    /// The operator's pods, when it runs in a pod (see [`Defaults::operator_pods`]).
    pub operator_pods: Option<&'a OperatorPods>,
    /// See [`Defaults::stats_collected`].
    pub stats_collected: bool,
    /// See [`Defaults::operator_image`].
    pub operator_image: &'a str,
    /// The hash the proxy's pod template carries of the Secret keys the proxy reads (see
    /// [`proxy`]): set by the reconcile once it has read the Secrets ([`Self::with_proxy_secret_hash`]);
    /// `None` when the proxy reads none.
    pub proxy_secret_hash: Option<String>,
    owner: OwnerReference,
}

impl<'a> Instance<'a> {
    /// Validates `mc` for what only the operator can check (the schema covers the rest).
    pub fn new(mc: &'a Memcached, defaults: &'a Defaults) -> Result<Self, InvalidSpec> {
        let meta = mc.meta();
        let (Some(name), Some(namespace)) = (meta.name.as_deref(), meta.namespace.as_deref())
        else {
            return Err(InvalidSpec {
                reason: "InvalidObject",
                message: "the Memcached object has no name or namespace".into(),
            });
        };
        let owner = mc.controller_owner_ref(&()).ok_or_else(|| InvalidSpec {
            reason: "InvalidObject",
            message: "the Memcached object has no uid yet".into(),
        })?;
        validate_child_name(name, mc.spec.workload)?;
        validate::validate(&mc.spec)?;
        Ok(Self {
            name,
            namespace,
            spec: &mc.spec,
            image: mc.image_or(&defaults.image),
            default_image: &defaults.image,
            operator_pods: defaults.operator_pods.as_ref(),
            stats_collected: defaults.stats_collected,
            operator_image: &defaults.operator_image,
            proxy_secret_hash: None,
            owner,
        })
    }

    /// This instance, with `hash` as [`Self::proxy_secret_hash`].
    pub fn with_proxy_secret_hash(&self, hash: Option<String>) -> Self {
        Self {
            proxy_secret_hash: hash,
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

/// Longest instance name: the headless Service `<name>-headless` must fit in 63 characters. The limit of a
/// Deployment instance: its ReplicaSets (`<name>-<hash>`) and pods (`<name>-<hash>-<5 characters>`) are
/// DNS subdomains of up to 253 characters, and the API server shortens a generated name's base.
pub const MAX_NAME_LEN: usize = 63 - service::HEADLESS_SUFFIX.len();

/// Longest hash the StatefulSet controller puts after a revision's name: `controller-revision-hash` is
/// `<name>-<hash>`, the hash a 32-bit FNV in decimal, safe-encoded (up to 10 characters).
pub const REVISION_HASH_LEN: usize = 10;

/// Longest name of a StatefulSet instance: its pods carry the label `controller-revision-hash=<name>-<hash>`,
/// a label value of at most 63 characters; for a longer one the StatefulSet controller creates no pod
/// (kubernetes/kubernetes#64023). Its other names fit: pods `<name>-<ordinal>` (at most `-63`), the spare
/// `<name>-handover`, the headless Service.
pub const MAX_STATEFULSET_NAME_LEN: usize = 63 - 1 - REVISION_HASH_LEN;

/// Longest name of an instance whose servers `workload` runs.
pub const fn max_name_len(workload: Workload) -> usize {
    match workload {
        Workload::Deployment => MAX_NAME_LEN,
        Workload::StatefulSet => MAX_STATEFULSET_NAME_LEN,
    }
}

/// Children are named after the instance. A Service name must be an RFC 1035 label of at most 63
/// characters, including the headless Service's suffix; a Memcached name may be a longer DNS subdomain.
/// A StatefulSet instance's name is shorter still (see [`MAX_STATEFULSET_NAME_LEN`]): the CRD's rule
/// refuses a longer one at admission, and this catches one that slips through (a server without CEL, a
/// workload changed where the transition rule does not run).
fn validate_child_name(name: &str, workload: Workload) -> Result<(), InvalidSpec> {
    let bytes = name.as_bytes();
    let valid = !bytes.is_empty()
        && bytes.len() <= MAX_NAME_LEN
        && bytes[0].is_ascii_lowercase()
        && bytes[bytes.len() - 1].is_ascii_alphanumeric()
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-');
    if !valid {
        return Err(InvalidSpec {
            reason: "InvalidName",
            message: format!(
                "metadata.name {name:?} cannot name the instance's Services: it must be at most \
                 {MAX_NAME_LEN} characters of lower-case letters, digits and '-', start with a letter and end \
                 with a letter or digit; recreate the Memcached under such a name"
            ),
        });
    }
    if bytes.len() > max_name_len(workload) {
        return Err(InvalidSpec {
            reason: "InvalidName",
            message: format!(
                "metadata.name {name:?} ({} characters) is too long for spec.workload {}: a StatefulSet \
                 instance's name must be at most {MAX_STATEFULSET_NAME_LEN} characters, because its pods carry \
                 the label controller-revision-hash=<name>-<a hash of up to {REVISION_HASH_LEN} characters>, \
                 which must fit in 63, or the StatefulSet controller creates no pod; recreate the Memcached \
                 under a shorter name",
                bytes.len(),
                workload.as_str()
            ),
        });
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod testing {
    //! Sample instances for the builder and status tests.
    use super::*;

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
}

#[cfg(test)]
mod tests {
    use super::testing::memcached;
    use super::*;

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

    /// A StatefulSet's pods carry `controller-revision-hash=<name>-<hash of up to 10 characters>`, a label
    /// value of at most 63 characters: the StatefulSet controller creates no pod for a longer one
    /// (kubernetes/kubernetes#64023), so a StatefulSet instance's name is at most 52 characters.
    #[test]
    fn statefulset_names_leave_room_for_the_revision_label() {
        let defaults = Defaults::default();
        let spec = |workload| MemcachedSpec {
            workload,
            ..MemcachedSpec::default()
        };
        let longest = "a".repeat(52);
        let mc = memcached(&longest, spec(Workload::StatefulSet));
        assert!(Instance::new(&mc, &defaults).is_ok());
        for too_long in ["a".repeat(53), "a".repeat(54)] {
            let mc = memcached(&too_long, spec(Workload::StatefulSet));
            let err = Instance::new(&mc, &defaults).unwrap_err();
            assert_eq!(err.reason, "InvalidName");
            assert!(
                err.message.contains("at most 52 characters")
                    && err.message.contains("controller-revision-hash"),
                "{}",
                err.message
            );
            let mc = memcached(&too_long, spec(Workload::Deployment));
            assert!(Instance::new(&mc, &defaults).is_ok(), "{too_long}");
        }
    }

    #[test]
    fn names_that_cannot_name_a_service_are_invalid() {
        let defaults = Defaults::default();
        for bad in ["1cache", "my.cache", &"a".repeat(55), "cache-"] {
            let mc = memcached(bad, MemcachedSpec::default());
            let err = Instance::new(&mc, &defaults).unwrap_err();
            assert_eq!(err.reason, "InvalidName", "{bad}");
            assert!(err.message.contains("metadata.name"), "{}", err.message);
        }
        for good in ["cache", "memcached-sample", "a1", &"a".repeat(54)] {
            let mc = memcached(good, MemcachedSpec::default());
            assert!(Instance::new(&mc, &defaults).is_ok(), "{good}");
        }
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
