//! Labels the operator puts on what it creates.
//!
//! The selector labels (`name` + `instance`) are part of the Deployment's immutable selector, so they must
//! never change between operator versions. `managed-by` scopes the operator's watches to its own children.

use std::collections::BTreeMap;

/// `app.kubernetes.io/name`: what runs (always memcached).
pub const NAME_KEY: &str = "app.kubernetes.io/name";
/// `app.kubernetes.io/instance`: which Memcached object it belongs to.
pub const INSTANCE_KEY: &str = "app.kubernetes.io/instance";
/// `app.kubernetes.io/managed-by`: who manages it.
pub const MANAGED_BY_KEY: &str = "app.kubernetes.io/managed-by";

/// Value of [`NAME_KEY`].
pub const APP_NAME: &str = "memcached";
/// Value of [`NAME_KEY`] on the proxy's pods: not [`APP_NAME`], so that neither the servers' selector
/// nor the operator's pod index takes a proxy pod for a server.
pub const PROXY_APP_NAME: &str = "memcached-proxy";
/// Value of [`MANAGED_BY_KEY`]; also the server-side apply field manager.
pub const MANAGER_NAME: &str = "memcached-operator";
/// The pod condition (and readiness gate) the operator sets once a new server's warm handover is over
/// (see `handover::plan::rollout`).
pub const HANDOVER_GATE: &str = "cache.example.com/handover";
/// The label the Deployment controller gives each pod: the hash of the template it was made from, so
/// pods of the same ReplicaSet share it and a rollout's new pods differ from the old ones.
pub const TEMPLATE_HASH_LABEL: &str = "pod-template-hash";

/// The label (`app.kubernetes.io/name=memcached-operator`) the install puts on the operator's own pods:
/// instance NetworkPolicies admit pods with it to the memcached port when the operator reads stats.
pub const OPERATOR_POD_LABEL: (&str, &str) = (NAME_KEY, MANAGER_NAME);

/// Label selector that every watch of child objects uses.
pub fn managed_selector() -> String {
    format!("{MANAGED_BY_KEY}={MANAGER_NAME}")
}

/// The labels that select an instance's pods. Stable forever: they are part of the Deployment selector.
pub fn selector_labels(instance: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (NAME_KEY.to_owned(), APP_NAME.to_owned()),
        (INSTANCE_KEY.to_owned(), instance.to_owned()),
    ])
}

/// Selector labels plus `managed-by`: what every child object and pod carries.
pub fn common_labels(instance: &str) -> BTreeMap<String, String> {
    let mut labels = selector_labels(instance);
    labels.insert(MANAGED_BY_KEY.to_owned(), MANAGER_NAME.to_owned());
    labels
}

/// The labels that select an instance's proxy pods (the proxy Deployment's selector: stable forever).
pub fn proxy_selector_labels(instance: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (NAME_KEY.to_owned(), PROXY_APP_NAME.to_owned()),
        (INSTANCE_KEY.to_owned(), instance.to_owned()),
    ])
}

/// Proxy selector labels plus `managed-by`: what the proxy's pods carry.
pub fn proxy_labels(instance: &str) -> BTreeMap<String, String> {
    let mut labels = proxy_selector_labels(instance);
    labels.insert(MANAGED_BY_KEY.to_owned(), MANAGER_NAME.to_owned());
    labels
}

/// The selector labels in `kubectl`'s string form, as published in `status.selector`.
pub fn selector_string(instance: &str) -> String {
    selector_labels(instance)
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selector_string_is_sorted_and_stable() {
        assert_eq!(
            selector_string("cache"),
            "app.kubernetes.io/instance=cache,app.kubernetes.io/name=memcached"
        );
    }

    #[test]
    fn common_labels_extend_selector_labels() {
        let common = common_labels("cache");
        for (k, v) in selector_labels("cache") {
            assert_eq!(common.get(&k), Some(&v));
        }
        assert_eq!(
            common.get(MANAGED_BY_KEY).map(String::as_str),
            Some(MANAGER_NAME)
        );
    }
}
