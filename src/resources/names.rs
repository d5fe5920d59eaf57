//! How long an instance's name may be: its children are named after it, and the longest of their names
//! must still fit where Kubernetes puts it. The limits per workload and the check of a name.

use super::invalid_spec::InvalidSpec;
use super::service;
use crate::api::Workload;

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
pub(super) fn validate_child_name(name: &str, workload: Workload) -> Result<(), InvalidSpec> {
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
mod tests {
    use crate::api::{MemcachedSpec, Workload};
    use crate::resources::defaults::Defaults;
    use crate::resources::instance::Instance;
    use crate::resources::testing::memcached;

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
}
