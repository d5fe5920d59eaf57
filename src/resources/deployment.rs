//! The Deployment that runs an instance's memcached pods.

use k8s_openapi::api::apps::v1::{
    Deployment, DeploymentSpec, DeploymentStrategy, RollingUpdateDeployment,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::instance::Instance;
use super::{labels, pod};
use crate::api::MemcachedSpec;

pub use super::pod::{
    CONTAINER_NAME, EXPORTER_NAME, METRICS_PORT, METRICS_PORT_NAME, PORT_NAME, RUN_AS_USER,
    SECRET_HASH_ANNOTATION, memcached_resources,
};

/// The Deployment for `instance`: `replicas` memcached pods (`spec.size`, or more while a scale-down
/// drains) that meet the `restricted` Pod Security Standard, rolled out one server at a time without ever
/// lowering capacity, each new server warmed up for `spec.rollout.warmupSeconds` before the next
/// (`minReadySeconds`). `secret_hash` is the hash of the referenced Secrets' content (when any are
/// referenced).
pub fn deployment(instance: &Instance<'_>, replicas: i32, secret_hash: Option<&str>) -> Deployment {
    Deployment {
        metadata: instance.child_meta(),
        spec: Some(DeploymentSpec {
            replicas: Some(replicas),
            // Left out when 0, as the API server leaves it out of what it returns.
            min_ready_seconds: Some(instance.spec.warmup_seconds()).filter(|s| *s > 0),
            selector: LabelSelector {
                match_labels: Some(labels::selector_labels(instance.name)),
                ..LabelSelector::default()
            },
            strategy: Some(strategy(instance.spec)),
            template: pod::template(instance, secret_hash),
            ..DeploymentSpec::default()
        }),
        status: None,
    }
}

/// A new pod is ready (and warm) before an old one goes, so capacity never drops during a rollout and at
/// most one server is cold. With hard anti-affinity the extra pod may have no node to go to (as many pods
/// as nodes), so there an old pod goes first, one at a time; the next one still waits for the warmup.
fn strategy(spec: &MemcachedSpec) -> DeploymentStrategy {
    let (max_unavailable, max_surge) = if pod::hard_anti_affinity(spec) {
        (1, 0)
    } else {
        (0, 1)
    };
    DeploymentStrategy {
        type_: Some("RollingUpdate".to_owned()),
        rolling_update: Some(RollingUpdateDeployment {
            max_unavailable: Some(IntOrString::Int(max_unavailable)),
            max_surge: Some(IntOrString::Int(max_surge)),
        }),
    }
}

#[cfg(test)]
mod tests;
