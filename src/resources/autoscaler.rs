//! The HorizontalPodAutoscaler that sets an instance's size.
//!
//! Its target is the `Memcached` itself, through the scale subresource (`.spec.size`, `.status.replicas`,
//! `.status.selector`), not the Deployment or StatefulSet: every change of size then goes through the
//! operator like a change made by hand, with the same events, budget and drain on shrink. The
//! operator never writes `spec.size`, so it never fights the autoscaler.
//!
//! Utilization is measured against the pods' requests, summed over every container. memcached always
//! has CPU and memory requests (derived defaults that `spec.resources` can only override); the exporter
//! has them by default, and a custom `exporter.resources` must keep a request (or a limit, which the API
//! server copies into the request) for each resource the autoscaler targets, or the autoscaler cannot
//! compute a utilization at all. [`validate`] checks that.

use k8s_openapi::api::autoscaling::v2::{
    CrossVersionObjectReference, HorizontalPodAutoscaler, HorizontalPodAutoscalerSpec, MetricSpec,
    MetricTarget, ResourceMetricSource,
};
use kube::Resource;

use super::instance::Instance;
use super::invalid_spec::InvalidSpec;
use crate::api::{Memcached, MemcachedSpec};

/// The autoscaler for `instance`, or `None` when none is wanted.
pub fn autoscaler(instance: &Instance<'_>) -> Option<HorizontalPodAutoscaler> {
    let config = instance.spec.autoscaling()?;
    let metrics = [
        ("cpu", config.target_cpu_utilization_percentage),
        ("memory", config.target_memory_utilization_percentage),
    ]
    .into_iter()
    .filter_map(|(resource, target)| Some(utilization(resource, target?)))
    .collect();
    Some(HorizontalPodAutoscaler {
        metadata: instance.child_meta(),
        spec: Some(HorizontalPodAutoscalerSpec {
            scale_target_ref: CrossVersionObjectReference {
                api_version: Some(Memcached::api_version(&()).into_owned()),
                kind: Memcached::kind(&()).into_owned(),
                name: instance.name.to_owned(),
            },
            min_replicas: Some(config.min_size()),
            max_replicas: config.max_size,
            metrics: Some(metrics),
            behavior: config.behavior.clone(),
        }),
        status: None,
    })
}

fn utilization(resource: &str, percent: i32) -> MetricSpec {
    MetricSpec {
        type_: "Resource".to_owned(),
        resource: Some(ResourceMetricSource {
            name: resource.to_owned(),
            target: MetricTarget {
                type_: "Utilization".to_owned(),
                average_utilization: Some(percent),
                ..MetricTarget::default()
            },
        }),
        ..MetricSpec::default()
    }
}

/// What the CEL rules on `spec.autoscaling` check, for servers without CEL, and what no schema can
/// check: that the exporter sidecar keeps a request for each targeted resource.
pub fn validate(spec: &MemcachedSpec) -> Result<(), InvalidSpec> {
    let Some(config) = &spec.autoscaling else {
        return Ok(());
    };
    if config.min_size() > config.max_size {
        return Err(InvalidSpec::config(format!(
            "spec.autoscaling.minSize ({}) must not exceed maxSize ({})",
            config.min_size(),
            config.max_size
        )));
    }
    if !config.enabled {
        return Ok(());
    }
    let targets = [
        ("cpu", config.target_cpu_utilization_percentage),
        ("memory", config.target_memory_utilization_percentage),
    ];
    if targets.iter().all(|(_, target)| target.is_none()) {
        return Err(InvalidSpec::config(
            "spec.autoscaling is enabled without a target: set targetCPUUtilizationPercentage or \
             targetMemoryUtilizationPercentage"
                .into(),
        ));
    }
    let exporter_resources = spec.exporter().and_then(|e| e.resources.as_ref());
    if let Some(resources) = exporter_resources {
        let has = |map: &Option<std::collections::BTreeMap<_, _>>, key: &str| {
            map.as_ref().is_some_and(|m| m.contains_key(key))
        };
        for (resource, target) in targets {
            if target.is_some()
                && !has(&resources.requests, resource)
                && !has(&resources.limits, resource)
            {
                return Err(InvalidSpec::config(format!(
                    "spec.monitoring.exporter.resources sets no {resource} request, so the autoscaler \
                     cannot compute the pods' {resource} utilization; add requests.{resource}"
                )));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{AutoscalingConfig, ExporterConfig, Monitoring};
    use crate::resources::Defaults;
    use crate::resources::testing::{child_meta_json, memcached};
    use k8s_openapi::api::autoscaling::v2::{HPAScalingRules, HorizontalPodAutoscalerBehavior};
    use k8s_openapi::api::core::v1::ResourceRequirements;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use serde_json::json;

    fn spec(config: AutoscalingConfig) -> MemcachedSpec {
        MemcachedSpec {
            autoscaling: Some(Box::new(config)),
            ..MemcachedSpec::default()
        }
    }

    fn cpu(percent: i32) -> AutoscalingConfig {
        AutoscalingConfig {
            enabled: true,
            max_size: 10,
            target_cpu_utilization_percentage: Some(percent),
            ..AutoscalingConfig::default()
        }
    }

    fn build(spec: MemcachedSpec) -> Option<serde_json::Value> {
        let mc = memcached("cache", spec);
        let defaults = Defaults::default();
        let hpa = autoscaler(&Instance::new(&mc, &defaults).unwrap())?;
        Some(serde_json::to_value(hpa).unwrap())
    }

    #[test]
    fn scales_the_memcached_itself_on_cpu() {
        assert_eq!(
            build(spec(cpu(70))).unwrap(),
            json!({
                "apiVersion": "autoscaling/v2",
                "kind": "HorizontalPodAutoscaler",
                "metadata": child_meta_json(),
                "spec": {
                    "scaleTargetRef": {
                        "apiVersion": "cache.example.com/v1alpha1", "kind": "Memcached", "name": "cache"
                    },
                    "minReplicas": 1,
                    "maxReplicas": 10,
                    "metrics": [{
                        "type": "Resource",
                        "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 70}}
                    }]
                }
            })
        );
    }

    #[test]
    fn both_targets_bounds_and_behavior_pass_through() {
        let behavior = HorizontalPodAutoscalerBehavior {
            scale_down: Some(HPAScalingRules {
                stabilization_window_seconds: Some(600),
                ..HPAScalingRules::default()
            }),
            ..HorizontalPodAutoscalerBehavior::default()
        };
        let config = AutoscalingConfig {
            min_size: Some(3),
            max_size: 64,
            target_memory_utilization_percentage: Some(80),
            behavior: Some(behavior),
            ..cpu(60)
        };
        let hpa = build(spec(config)).unwrap();
        assert_eq!(
            hpa["spec"],
            json!({
                "scaleTargetRef": {"apiVersion": "cache.example.com/v1alpha1", "kind": "Memcached", "name": "cache"},
                "minReplicas": 3,
                "maxReplicas": 64,
                "metrics": [
                    {"type": "Resource",
                     "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 60}}},
                    {"type": "Resource",
                     "resource": {"name": "memory", "target": {"type": "Utilization", "averageUtilization": 80}}}
                ],
                "behavior": {"scaleDown": {"stabilizationWindowSeconds": 600}}
            })
        );
    }

    #[test]
    fn none_unless_enabled() {
        assert!(build(MemcachedSpec::default()).is_none());
        let off = AutoscalingConfig {
            enabled: false,
            ..cpu(70)
        };
        assert!(build(spec(off)).is_none());
    }

    #[test]
    fn bounds_and_a_target_are_required() {
        let inverted = AutoscalingConfig {
            min_size: Some(11),
            ..cpu(70)
        };
        assert!(
            validate(&spec(inverted.clone()))
                .unwrap_err()
                .message
                .contains("minSize (11) must not exceed maxSize (10)")
        );
        // Like the CEL rule, the bounds hold while disabled too.
        let disabled = AutoscalingConfig {
            enabled: false,
            ..inverted
        };
        assert!(validate(&spec(disabled)).is_err());
        let no_target = AutoscalingConfig {
            target_cpu_utilization_percentage: None,
            ..cpu(70)
        };
        assert!(
            validate(&spec(no_target.clone()))
                .unwrap_err()
                .message
                .contains("without a target")
        );
        validate(&spec(AutoscalingConfig {
            enabled: false,
            ..no_target
        }))
        .unwrap();
        validate(&spec(cpu(70))).unwrap();
    }

    #[test]
    fn a_custom_exporter_must_request_what_is_targeted() {
        let with_exporter = |resources: ResourceRequirements| MemcachedSpec {
            monitoring: Some(Box::new(Monitoring {
                exporter: Some(ExporterConfig {
                    enabled: true,
                    resources: Some(resources),
                    ..ExporterConfig::default()
                }),
                service_monitor: None,
            })),
            ..spec(cpu(70))
        };
        let quantities = |key: &str| Some([(key.to_owned(), Quantity("64Mi".into()))].into());
        let memory_only = ResourceRequirements {
            requests: quantities("memory"),
            ..ResourceRequirements::default()
        };
        let message = validate(&with_exporter(memory_only)).unwrap_err().message;
        assert!(message.contains("sets no cpu request"), "{message}");
        // A limit alone is fine: the API server copies it into the request.
        let cpu_limit = ResourceRequirements {
            limits: quantities("cpu"),
            ..ResourceRequirements::default()
        };
        validate(&with_exporter(cpu_limit)).unwrap();
        // The default exporter resources request both.
        let mut default_exporter = with_exporter(ResourceRequirements::default());
        default_exporter
            .monitoring
            .as_mut()
            .unwrap()
            .exporter
            .as_mut()
            .unwrap()
            .resources = None;
        validate(&default_exporter).unwrap();
    }
}
