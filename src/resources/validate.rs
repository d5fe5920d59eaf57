//! Checks of the spec that the schema cannot express (or that servers older than CEL cannot run).
//! A failure is reported as `Degraded` with reason `InvalidConfig` and nothing is applied, so a running
//! instance keeps its last good pods until the spec is fixed.

use super::{InvalidSpec, args, quantity};
use crate::api::{MemcachedSpec, flags};

/// All checks, first failure wins.
pub fn validate(spec: &MemcachedSpec) -> Result<(), InvalidSpec> {
    extra_args(spec)?;
    item_size(spec)?;
    memory_limit(spec)?;
    termination(spec)?;
    disruption_budget(spec)?;
    monitoring(spec)?;
    super::network_policy::validate(spec)?;
    super::autoscaler::validate(spec)
}

/// extraArgs, walked as memcached's getopt would (see `api::flags`), so that no spelling of a managed
/// option slips through on servers that do not run the CRD's CEL rule.
fn extra_args(spec: &MemcachedSpec) -> Result<(), InvalidSpec> {
    flags::argv::check(&spec.memcached().extra_args)
        .map_err(|err| InvalidSpec::config(format!("spec.memcached.{err}")))
}

fn item_size(spec: &MemcachedSpec) -> Result<(), InvalidSpec> {
    let config = spec.memcached();
    let Some(size) = config.max_item_size.as_deref() else {
        return Ok(());
    };
    let bytes = quantity::memcached_size(size).ok_or_else(|| {
        InvalidSpec::config(format!(
            "spec.memcached.maxItemSize {size:?} is not a size such as 1m or 512k"
        ))
    })?;
    let half_memory = u64::try_from(config.max_memory_mb()).unwrap_or(0) * 1024 * 1024 / 2;
    if !(1024..=1024 * 1024 * 1024).contains(&bytes) {
        return Err(InvalidSpec::config(format!(
            "spec.memcached.maxItemSize {size:?} must be between 1k and 1024m"
        )));
    }
    if bytes > half_memory {
        return Err(InvalidSpec::config(format!(
            "spec.memcached.maxItemSize {size:?} must be at most half of maxMemoryMB ({} MiB)",
            config.max_memory_mb()
        )));
    }
    Ok(())
}

fn memory_limit(spec: &MemcachedSpec) -> Result<(), InvalidSpec> {
    let resources = super::deployment::memcached_resources(spec);
    let Some(limit) = resources.limits.as_ref().and_then(|l| l.get("memory")) else {
        return Ok(());
    };
    let needed_mb = spec.memcached().max_memory_mb() + args::MEMORY_OVERHEAD_MB;
    let bytes = quantity::parse(&limit.0).ok_or_else(|| {
        InvalidSpec::config(format!(
            "spec.resources.limits.memory {:?} is not a quantity",
            limit.0
        ))
    })?;
    if bytes < f64::from(needed_mb) * 1024.0 * 1024.0 {
        return Err(InvalidSpec::config(format!(
            "spec.resources.limits.memory {} leaves no room: memcached uses up to maxMemoryMB ({} MiB) plus \
             about {} MiB of overhead, so the limit must be at least {needed_mb}Mi",
            limit.0,
            spec.memcached().max_memory_mb(),
            args::MEMORY_OVERHEAD_MB
        )));
    }
    Ok(())
}

fn termination(spec: &MemcachedSpec) -> Result<(), InvalidSpec> {
    let ha = spec.high_availability();
    let (delay, grace) = (
        ha.pre_stop_delay_seconds(),
        ha.termination_grace_period_seconds(),
    );
    if i64::from(delay) >= grace {
        return Err(InvalidSpec::config(format!(
            "spec.highAvailability.terminationGracePeriodSeconds ({grace}) must be longer than \
             preStopDelaySeconds ({delay}), or pods are killed before they finish stopping"
        )));
    }
    Ok(())
}

fn disruption_budget(spec: &MemcachedSpec) -> Result<(), InvalidSpec> {
    let pdb = spec
        .high_availability()
        .pod_disruption_budget
        .unwrap_or_default();
    if pdb.max_unavailable.is_some() && pdb.min_available.is_some() {
        return Err(InvalidSpec::config(
            "spec.highAvailability.podDisruptionBudget sets both maxUnavailable and minAvailable; set one".into(),
        ));
    }
    Ok(())
}

fn monitoring(spec: &MemcachedSpec) -> Result<(), InvalidSpec> {
    if spec.service_monitor().is_some() && spec.exporter().is_none() {
        return Err(InvalidSpec::config(
            "spec.monitoring.serviceMonitor.enabled needs spec.monitoring.exporter.enabled: the ServiceMonitor \
             scrapes the exporter"
                .into(),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{
        ExporterConfig, HighAvailability, MemcachedConfig, Monitoring, PodDisruptionBudgetConfig,
        ServiceMonitorConfig,
    };
    use crate::resources::INVALID_CONFIG;
    use k8s_openapi::api::core::v1::ResourceRequirements;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

    fn with_memcached(config: MemcachedConfig) -> MemcachedSpec {
        MemcachedSpec {
            memcached: Some(Box::new(config)),
            ..MemcachedSpec::default()
        }
    }

    fn with_memory_limit(limit: &str, max_memory_mb: i32) -> MemcachedSpec {
        MemcachedSpec {
            memcached: Some(Box::new(MemcachedConfig {
                max_memory_mb: Some(max_memory_mb),
                ..MemcachedConfig::default()
            })),
            resources: Some(Box::new(ResourceRequirements {
                limits: Some([("memory".to_owned(), Quantity(limit.to_owned()))].into()),
                ..ResourceRequirements::default()
            })),
            ..MemcachedSpec::default()
        }
    }

    fn message(spec: &MemcachedSpec) -> String {
        let err = validate(spec).unwrap_err();
        assert_eq!(err.reason, INVALID_CONFIG);
        err.message
    }

    #[test]
    fn defaults_are_valid() {
        validate(&MemcachedSpec::default()).unwrap();
    }

    #[test]
    fn extra_args_may_not_repeat_managed_flags() {
        let spec = with_memcached(MemcachedConfig {
            extra_args: vec![
                "-o".into(),
                "lru_crawler".into(),
                "-m".into(),
                "2048".into(),
            ],
            ..MemcachedConfig::default()
        });
        assert!(
            message(&spec).starts_with("spec.memcached.extraArgs[2] \"-m\" sets -m/--memory-limit"),
            "{}",
            message(&spec)
        );
        let smuggled = with_memcached(MemcachedConfig {
            extra_args: vec!["-Cp".into(), "1".into()],
            ..MemcachedConfig::default()
        });
        assert!(message(&smuggled).contains("extraArgs[0] \"-Cp\" sets -p/--port"));
        let ok = with_memcached(MemcachedConfig {
            extra_args: vec!["-o".into(), "lru_crawler".into(), "-R".into(), "40".into()],
            ..MemcachedConfig::default()
        });
        validate(&ok).unwrap();
    }

    #[test]
    fn item_size_is_bounded_by_memory() {
        let size = |s: &str, m| {
            with_memcached(MemcachedConfig {
                max_item_size: Some(s.into()),
                max_memory_mb: Some(m),
                ..MemcachedConfig::default()
            })
        };
        validate(&size("1m", 64)).unwrap();
        validate(&size("32m", 64)).unwrap();
        assert!(message(&size("33m", 64)).contains("half of maxMemoryMB"));
        assert!(message(&size("512", 64)).contains("between 1k and 1024m"));
    }

    #[test]
    fn memory_limit_must_leave_room() {
        validate(&with_memory_limit("96Mi", 64)).unwrap();
        validate(&with_memory_limit("1Gi", 512)).unwrap();
        assert!(message(&with_memory_limit("64Mi", 64)).contains("at least 96Mi"));
        assert!(message(&with_memory_limit("512Mi", 512)).contains("at least 544Mi"));
        // Raising maxMemoryMB alone raises the derived default limit with it.
        validate(&with_memcached(MemcachedConfig {
            max_memory_mb: Some(4096),
            ..MemcachedConfig::default()
        }))
        .unwrap();
    }

    #[test]
    fn grace_period_must_outlast_the_pre_stop_delay() {
        let spec = MemcachedSpec {
            high_availability: Some(Box::new(HighAvailability {
                pre_stop_delay_seconds: Some(30),
                termination_grace_period_seconds: Some(30),
                ..HighAvailability::default()
            })),
            ..MemcachedSpec::default()
        };
        assert!(message(&spec).contains("terminationGracePeriodSeconds (30)"));
    }

    #[test]
    fn budget_takes_one_bound() {
        let spec = MemcachedSpec {
            high_availability: Some(Box::new(HighAvailability {
                pod_disruption_budget: Some(PodDisruptionBudgetConfig {
                    enabled: Some(true),
                    max_unavailable: Some(IntOrString::Int(1)),
                    min_available: Some(IntOrString::Int(1)),
                }),
                ..HighAvailability::default()
            })),
            ..MemcachedSpec::default()
        };
        assert!(message(&spec).contains("both maxUnavailable and minAvailable"));
    }

    #[test]
    fn service_monitor_needs_the_exporter() {
        let mut spec = MemcachedSpec {
            monitoring: Some(Box::new(Monitoring {
                exporter: None,
                service_monitor: Some(ServiceMonitorConfig {
                    enabled: true,
                    ..ServiceMonitorConfig::default()
                }),
            })),
            ..MemcachedSpec::default()
        };
        assert!(message(&spec).contains("needs spec.monitoring.exporter.enabled"));
        spec.monitoring.as_mut().unwrap().exporter = Some(ExporterConfig {
            enabled: true,
            ..ExporterConfig::default()
        });
        validate(&spec).unwrap();
    }
}
