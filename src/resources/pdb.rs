//! The PodDisruptionBudget that keeps node drains from taking down more than one pod at a time.

use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::instance::Instance;
use super::labels;

/// The budget for `instance`, or `None` when it should not have one: explicitly disabled, or (by default)
/// while it runs at most one pod, where any budget would block node drains.
pub fn pdb(instance: &Instance<'_>) -> Option<PodDisruptionBudget> {
    let config = instance
        .spec
        .high_availability()
        .pod_disruption_budget
        .unwrap_or_default();
    if !config.enabled.unwrap_or(instance.spec.size > 1) {
        return None;
    }
    let (max_unavailable, min_available) = match (config.max_unavailable, config.min_available) {
        (None, None) => (Some(IntOrString::Int(1)), None),
        bounds => bounds,
    };
    Some(PodDisruptionBudget {
        metadata: instance.child_meta(),
        spec: Some(PodDisruptionBudgetSpec {
            selector: Some(LabelSelector {
                match_labels: Some(labels::selector_labels(instance.name)),
                ..LabelSelector::default()
            }),
            max_unavailable,
            min_available,
            ..PodDisruptionBudgetSpec::default()
        }),
        status: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{HighAvailability, MemcachedSpec, PodDisruptionBudgetConfig};
    use crate::resources::Defaults;
    use crate::resources::testing::memcached;

    fn build(size: i32, config: Option<PodDisruptionBudgetConfig>) -> Option<PodDisruptionBudget> {
        let mc = memcached(
            "cache",
            MemcachedSpec {
                size,
                high_availability: Some(Box::new(HighAvailability {
                    pod_disruption_budget: config,
                    ..HighAvailability::default()
                })),
                ..MemcachedSpec::default()
            },
        );
        let defaults = Defaults::default();
        pdb(&Instance::new(&mc, &defaults).unwrap())
    }

    #[test]
    fn on_by_default_only_above_one_pod() {
        assert!(build(0, None).is_none());
        assert!(build(1, None).is_none());
        let spec = build(2, None).unwrap().spec.unwrap();
        assert_eq!(spec.max_unavailable, Some(IntOrString::Int(1)));
        assert_eq!(spec.min_available, None);
        assert_eq!(
            spec.selector.unwrap().match_labels,
            Some(labels::selector_labels("cache"))
        );
    }

    #[test]
    fn explicit_settings_win() {
        let off = PodDisruptionBudgetConfig {
            enabled: Some(false),
            ..PodDisruptionBudgetConfig::default()
        };
        assert!(build(5, Some(off)).is_none());
        let min = PodDisruptionBudgetConfig {
            enabled: Some(true),
            min_available: Some(IntOrString::String("50%".into())),
            ..PodDisruptionBudgetConfig::default()
        };
        let spec = build(1, Some(min)).unwrap().spec.unwrap();
        assert_eq!(spec.min_available, Some(IntOrString::String("50%".into())));
        assert_eq!(spec.max_unavailable, None);
    }
}
