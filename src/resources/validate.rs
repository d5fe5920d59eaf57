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
    let given = flags::argv::parse(&spec.memcached().extra_args)
        .map_err(|err| InvalidSpec::config(format!("spec.memcached.{err}")))?;
    for option in &given {
        if let Some(why) = refused_value(spec, option) {
            return Err(InvalidSpec::config(format!(
                "spec.memcached.extraArgs[{}] ({}): {why}",
                option.index,
                option.flag.display()
            )));
        }
    }
    Ok(())
}

/// Why memcached would exit at start on `option`'s value, in this spec; each seen with memcached
/// 1.6.18's own binary (its message quoted), and checked against it by `tests/memcached_options.rs`.
fn refused_value(spec: &MemcachedSpec, option: &flags::argv::Given) -> Option<String> {
    let value = option.value.as_deref().unwrap_or_default();
    let threads = spec.memcached().threads();
    match option.flag.short? {
        // "You cannot allow the BINARY protocol while using ascii authentication tokens"
        'B' if spec.auth().is_some() && value != "ascii" => Some(format!(
            "memcached refuses protocol {value:?} with spec.security.auth (its ASCII authentication); \
             use ascii or leave -B out"
        )),
        // "Number of requests per event must be greater than 0" (read with atoi)
        'R' if atoi(value) == 0 => {
            Some("memcached needs a number of requests per event other than 0".into())
        }
        // "No delimiter specified"
        'D' if value.is_empty() => Some("memcached needs a delimiter character".into()),
        // "Maximum number of NAPI IDs must be greater than 0", "... cannot be greater than number of threads"
        'N' if atoi(value) <= 0 || atoi(value) > i64::from(threads) => Some(format!(
            "memcached needs between 1 and the thread count ({threads}, spec.memcached.threads) NAPI IDs"
        )),
        'o' => value
            .split(',')
            .find_map(|item| match item.split_once('=') {
                Some(("hashpower", power)) => hashpower(atoi(power), threads),
                _ => None,
            }),
        _ => None,
    }
}

/// memcached's rule for `-o hashpower=N`: at least 12, at most 32 ("Initial hashtable multiplier of N is
/// too low/high"), and above the item lock table's power, which grows with the threads ("Hash table
/// power size (N) cannot be equal to or less than item lock table (M)"). The table takes `8 << N` bytes at
/// start (32 GiB at 32), which a machine may not have: that failure depends on the node, and is not checked.
fn hashpower(power: i64, threads: i32) -> Option<String> {
    let lock_power = match threads {
        ..3 => 10,
        3 => 11,
        4 => 12,
        5..=10 => 13,
        11..=20 => 14,
        _ => 15,
    };
    let least = (lock_power + 1).max(12);
    (!(least..=32).contains(&power)).then(|| {
        format!(
            "memcached needs hashpower between {least} and 32 with {threads} threads, not {power}"
        )
    })
}

/// C's `atoi`: leading blanks, a sign, the digits up to the first other character; 0 for none.
fn atoi(text: &str) -> i64 {
    let text = text.trim_start();
    let (sign, digits) = match text.as_bytes().first() {
        Some(b'-') => (-1, &text[1..]),
        Some(b'+') => (1, &text[1..]),
        _ => (1, text),
    };
    let end = digits
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(digits.len());
    sign * digits[..end]
        .parse::<i64>()
        .unwrap_or(0)
        .min(i64::from(i32::MAX))
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

    /// Each configuration memcached 1.6.18 exits on (seen with its binary; `tests/memcached_options.rs`
    /// runs them against the installed one) is refused naming the element; its neighbours that start are not.
    #[test]
    fn values_memcached_exits_on_are_refused_naming_the_element() {
        let spec = |args: &[&str], auth: bool, threads: Option<i32>| {
            let mut spec = with_memcached(MemcachedConfig {
                extra_args: args.iter().map(|a| (*a).to_owned()).collect(),
                threads,
                ..MemcachedConfig::default()
            });
            if auth {
                spec.security = Some(Box::new(crate::api::Security {
                    auth: Some(crate::api::AuthConfig {
                        secret_name: "auth".into(),
                        ..Default::default()
                    }),
                    ..Default::default()
                }));
            }
            spec
        };
        for (args, auth, threads, element) in [
            (&["-B", "binary"][..], true, None, "extraArgs[1]"),
            (&["--protocol=auto"], true, None, "extraArgs[0]"),
            (&["-R", "0"], false, None, "extraArgs[1]"),
            (&["-Rabc"], false, None, "extraArgs[0]"),
            (&["-D", ""], false, None, "extraArgs[1]"),
            (&["-N", "5"], false, None, "extraArgs[1]"),
            (&["-N", "0"], false, Some(8), "extraArgs[1]"),
            (&["-o", "modern,hashpower=33"], false, None, "extraArgs[1]"),
            (&["-o", "hashpower=11"], false, Some(1), "extraArgs[1]"),
            (&["-o", "hashpower=12"], false, None, "extraArgs[1]"),
            (&["-o", "hashpower=14"], false, Some(12), "extraArgs[1]"),
        ] {
            let message = message(&spec(args, auth, threads));
            assert!(message.contains(element), "{args:?}: {message}");
        }
        for (args, auth, threads) in [
            (&["-B", "ascii"][..], true, None),
            (&["-B", "binary"], false, None),
            (&["-R", "-1"], false, None),
            (&["-D", ":"], false, None),
            (&["-N", "4"], false, None),
            (&["-o", "hashpower=13"], false, None),
            (&["-o", "hashpower=15"], false, Some(12)),
            (&["-o", "hashpower=32"], false, None),
        ] {
            assert!(validate(&spec(args, auth, threads)).is_ok(), "{args:?}");
        }
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
