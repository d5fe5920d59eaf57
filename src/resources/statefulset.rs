//! The StatefulSet that runs an instance's memcached pods when `spec.workload` is `StatefulSet`: pods
//! `<name>-0 … <name>-(n-1)` governed by the headless Service, so each server keeps its name and DNS
//! address across restarts and replacements.

use k8s_openapi::api::apps::v1::{
    RollingUpdateStatefulSetStrategy, StatefulSet, StatefulSetSpec, StatefulSetUpdateStrategy,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use super::instance::Instance;
use super::{labels, pod, service};

/// The StatefulSet for `instance`: `replicas` servers (`spec.size`, or more while a scale-down drains).
/// - `podManagementPolicy: Parallel`: pods start and stop together instead of one ordinal at a time
///   (memcached servers do not depend on each other); a scale-down still removes the highest ordinals.
/// - `RollingUpdate` replaces one pod at a time, highest ordinal first, and only those at or above
///   `partition`: the operator steps it down one server at a time once the replaced server has been ready
///   for `spec.rollout.warmupSeconds` (see [`super::rollout`]), because the StatefulSet controller ignores
///   `minReadySeconds` while it rolls out a `Parallel` StatefulSet. `minReadySeconds` is still set: it
///   counts the servers `availableReplicas` reports.
/// - The same pod template and selector labels as the Deployment.
pub fn statefulset(
    instance: &Instance<'_>,
    replicas: i32,
    secret_hash: Option<&str>,
    partition: i32,
) -> StatefulSet {
    StatefulSet {
        metadata: instance.child_meta(),
        spec: Some(StatefulSetSpec {
            replicas: Some(replicas),
            service_name: Some(service::headless_name(instance.name)),
            pod_management_policy: Some("Parallel".to_owned()),
            // Left out when 0, as the API server leaves it out of what it returns.
            min_ready_seconds: Some(instance.spec.warmup_seconds()).filter(|s| *s > 0),
            selector: LabelSelector {
                match_labels: Some(labels::selector_labels(instance.name)),
                ..LabelSelector::default()
            },
            update_strategy: Some(StatefulSetUpdateStrategy {
                type_: Some("RollingUpdate".to_owned()),
                rolling_update: Some(RollingUpdateStatefulSetStrategy {
                    partition: Some(partition),
                    ..RollingUpdateStatefulSetStrategy::default()
                }),
            }),
            template: pod::template(instance, secret_hash),
            ..StatefulSetSpec::default()
        }),
        status: None,
    }
}

/// Sets the partition of a StatefulSet built by [`statefulset`].
pub fn set_partition(sts: &mut StatefulSet, partition: i32) {
    if let Some(rolling) = sts
        .spec
        .as_mut()
        .and_then(|s| s.update_strategy.as_mut())
        .and_then(|u| u.rolling_update.as_mut())
    {
        rolling.partition = Some(partition);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{MemcachedSpec, Rollout, Workload};
    use crate::resources::testing::memcached;
    use crate::resources::{Defaults, deployment};

    fn spec() -> MemcachedSpec {
        MemcachedSpec {
            size: 3,
            workload: Workload::StatefulSet,
            rollout: Some(Rollout {
                warmup_seconds: Some(45),
            }),
            ..MemcachedSpec::default()
        }
    }

    #[test]
    fn statefulset_has_the_pool_shape() {
        let mc = memcached("cache", spec());
        let defaults = Defaults::default();
        let instance = Instance::new(&mc, &defaults).unwrap();
        let sts = statefulset(&instance, 4, Some("h"), 3);
        let spec = sts.spec.unwrap();
        assert_eq!(spec.replicas, Some(4), "replicas as given (drain included)");
        assert_eq!(spec.service_name.as_deref(), Some("cache-headless"));
        assert_eq!(spec.pod_management_policy.as_deref(), Some("Parallel"));
        assert_eq!(spec.min_ready_seconds, Some(45));
        let strategy = spec.update_strategy.unwrap();
        assert_eq!(strategy.type_.as_deref(), Some("RollingUpdate"));
        let rolling = strategy.rolling_update.unwrap();
        assert_eq!(rolling.max_unavailable, None, "one pod at a time");
        assert_eq!(rolling.partition, Some(3), "the paced partition");
        assert_eq!(
            spec.selector.match_labels,
            Some(labels::selector_labels("cache"))
        );
        assert!(spec.volume_claim_templates.is_none());
        assert_eq!(sts.metadata.name.as_deref(), Some("cache"));
    }

    #[test]
    fn statefulset_and_deployment_share_the_pod_template() {
        let mc = memcached("cache", spec());
        let defaults = Defaults::default();
        let instance = Instance::new(&mc, &defaults).unwrap();
        let sts = statefulset(&instance, 3, Some("h"), 0).spec.unwrap();
        let deploy = deployment::deployment(&instance, 3, Some("h"))
            .spec
            .unwrap();
        assert_eq!(sts.template, deploy.template);
        assert_eq!(sts.min_ready_seconds, deploy.min_ready_seconds);
    }
}
