//! Checks of the spec that the schema cannot express (or that servers older than CEL cannot run).
//! A failure is reported as `Degraded` with reason `InvalidConfig` and nothing is applied, so a running
//! instance keeps its last good pods until the spec is fixed. [`Instance::new`] runs them all, with the
//! check of the instance's name, before any builder sees the instance.

use kube::Resource;

use super::defaults::Defaults;
use super::instance::Instance;
use super::invalid_spec::InvalidSpec;
use super::names::validate_child_name;
use super::{memory, quantity};
use crate::api::{Memcached, MemcachedSpec, flags};

/// All checks, first failure wins.
pub fn validate(spec: &MemcachedSpec) -> Result<(), InvalidSpec> {
    item_size(spec)?;
    connections(spec)?;
    extra_args(spec)?;
    memory_limit(spec)?;
    termination(spec)?;
    disruption_budget(spec)?;
    monitoring(spec)?;
    proxy(spec)?;
    super::network_policy::validate(spec)?;
    super::autoscaler::validate(spec)
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
        validate(&mc.spec)?;
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
            proxy_fleet: None,
            proxy_access: None,
            owner,
        })
    }
}

/// extraArgs, walked as memcached's getopt would (see `api::flags`), so that no spelling of a managed
/// option slips through on servers that do not run the CRD's CEL rule, and no value memcached exits on
/// (`api::flags::values`: `-B binary` with auth, `-R 0`, `-D ""`, `-N` above the threads, `-o hashpower`
/// out of range) reaches the pods: they would crash-loop, where a refused spec leaves them serving.
fn extra_args(spec: &MemcachedSpec) -> Result<(), InvalidSpec> {
    let config = spec.memcached();
    // The user's limit, or the derived one without the room it makes for a `-o hashpower` table.
    let given_limit = spec
        .resources
        .as_ref()
        .and_then(|r| r.limits.as_ref())
        .and_then(|l| l.get("memory"));
    let memory_limit = match given_limit {
        Some(q) => quantity::parse(&q.0)
            .filter(|bytes| bytes.is_finite() && *bytes >= 0.0)
            .map(|bytes| bytes as u64),
        None => u64::try_from(config.max_memory_mb() + memory::grown_overhead_mb(&config))
            .ok()
            .map(|mb| mb << 20),
    };
    let item_size = config
        .max_item_size
        .as_deref()
        .and_then(quantity::memcached_size);
    let managed = flags::values::Managed {
        threads: config.threads(),
        auth: spec.auth().is_some(),
        memory_limit,
        item_size,
        item_size_text: config.max_item_size.clone(),
    };
    flags::values::check(&config.extra_args, &managed)
        .map_err(|err| InvalidSpec::config(format!("spec.memcached.{err}")))
}

/// `-I` against `-m`: memcached exits when the item size (1 MiB unless set) is more than half the item
/// memory ("Cannot set item size limit higher than 1/2 of memory max.", so `maxMemoryMB: 1` alone exits).
fn item_size(spec: &MemcachedSpec) -> Result<(), InvalidSpec> {
    let config = spec.memcached();
    let half_memory = u64::try_from(config.max_memory_mb()).unwrap_or(0) * 1024 * 1024 / 2;
    let Some(size) = config.max_item_size.as_deref() else {
        if flags::startup::DEFAULT_ITEM_SIZE > half_memory {
            return Err(InvalidSpec::config(format!(
                "spec.memcached.maxMemoryMB {} is less than twice memcached's default item size (1 MiB): \
                 memcached exits (\"Cannot set item size limit higher than 1/2 of memory max.\"); use at least 2, \
                 or set maxItemSize to at most half of it",
                config.max_memory_mb()
            )));
        }
        return Ok(());
    };
    let bytes = quantity::memcached_size(size).ok_or_else(|| {
        InvalidSpec::config(format!(
            "spec.memcached.maxItemSize {size:?} is not a size such as 1m or 512k"
        ))
    })?;
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

/// `-c` against `-t`, as the CRD's rule states it ([`crate::api::CONNECTIONS_RULE`]).
fn connections(spec: &MemcachedSpec) -> Result<(), InvalidSpec> {
    let config = spec.memcached();
    let needed = crate::api::connections_needed(config.threads());
    if i64::from(config.max_connections()) < needed {
        return Err(InvalidSpec::config(format!(
            "spec.memcached.maxConnections {} is too few for {} threads: {}",
            config.max_connections(),
            config.threads(),
            crate::api::CONNECTIONS_MESSAGE
        )));
    }
    Ok(())
}

fn memory_limit(spec: &MemcachedSpec) -> Result<(), InvalidSpec> {
    let resources = super::deployment::memcached_resources(spec);
    let Some(limit) = resources.limits.as_ref().and_then(|l| l.get("memory")) else {
        return Ok(());
    };
    let config = spec.memcached();
    let needed_mb = config.max_memory_mb() + memory::BASELINE_MB;
    let bytes = quantity::parse(&limit.0).ok_or_else(|| {
        InvalidSpec::config(format!(
            "spec.resources.limits.memory {:?} is not a quantity",
            limit.0
        ))
    })?;
    if bytes < f64::from(needed_mb) * 1024.0 * 1024.0 {
        return Err(InvalidSpec::config(format!(
            "spec.resources.limits.memory {} leaves no room: memcached uses maxMemoryMB ({} MiB) plus at \
             least {} MiB for threads and connections, so the limit must be at least {needed_mb}Mi (and a \
             limit below the derived {}Mi can be OOM-killed by a fill across item sizes)",
            limit.0,
            config.max_memory_mb(),
            memory::BASELINE_MB,
            config.max_memory_mb() + memory::overhead_mb(&config),
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

/// Whether `identities` have distinct names and distinct common names (`IDENTITIES_UNIQUE_RULE`).
fn distinct(identities: &[crate::api::ProxyIdentity]) -> bool {
    let names: std::collections::BTreeSet<&str> =
        identities.iter().map(|i| i.name.as_str()).collect();
    let common: std::collections::BTreeSet<&str> =
        identities.iter().map(|i| i.common_name()).collect();
    names.len() == identities.len()
        && common.len() == identities.len()
        && !names.contains(crate::api::UNKNOWN_IDENTITY)
}

/// The proxy's limits, as the CEL rules on `spec` state them (`api::proxy`).
fn proxy(spec: &MemcachedSpec) -> Result<(), InvalidSpec> {
    let Some(proxy) = spec.proxy() else {
        return Ok(());
    };
    let refused = if spec.auth().is_some() {
        crate::api::PROXY_AUTH_MESSAGE
    } else if spec.tls().is_some_and(|tls| tls.client_auth) {
        crate::api::PROXY_TLS_MESSAGE
    } else if spec.tls().is_some() && proxy.image.is_none() {
        crate::api::PROXY_TLS_IMAGE_MESSAGE
    } else if spec.client_hashing() != crate::api::ClientHashing::Unknown {
        crate::api::PROXY_HASHING_MESSAGE
    } else if proxy.access.is_some() && spec.tls().is_none() {
        crate::api::PROXY_ACCESS_TLS_MESSAGE
    } else if proxy
        .access
        .as_ref()
        .is_some_and(|access| !distinct(&access.identities))
    {
        crate::api::IDENTITIES_UNIQUE_MESSAGE
    } else {
        return Ok(());
    };
    Err(InvalidSpec::config(refused.into()))
}

#[cfg(test)]
mod option_tests;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{
        AuthConfig, ExporterConfig, HighAvailability, MemcachedConfig, Monitoring,
        PodDisruptionBudgetConfig, Security, ServiceMonitorConfig,
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

    fn with_args(extra: &[&str], threads: Option<i32>, auth: bool) -> MemcachedSpec {
        MemcachedSpec {
            memcached: Some(Box::new(MemcachedConfig {
                threads,
                extra_args: extra.iter().map(|a| (*a).to_owned()).collect(),
                ..MemcachedConfig::default()
            })),
            security: auth.then(|| {
                Box::new(Security {
                    auth: Some(AuthConfig {
                        secret_name: "auth".into(),
                        key: None,
                        allow_plaintext_stats: false,
                    }),
                    ..Security::default()
                })
            }),
            ..MemcachedSpec::default()
        }
    }

    /// The configurations memcached 1.6.18 exits on (see `api::flags::values`), each named by the
    /// element that sets it; their neighbours that start are valid.
    #[test]
    fn extra_args_memcached_would_exit_on_are_invalid() {
        for (extra, threads, auth, expected) in [
            (&["-B", "binary"][..], None, true, "extraArgs[1] \"binary\""),
            (
                &["-o", "modern", "-Bauto"],
                None,
                true,
                "extraArgs[2] \"-Bauto\"",
            ),
            (
                &["--protocol=binary"],
                None,
                true,
                "extraArgs[0] \"--protocol=binary\"",
            ),
            (&["-B", "ascii", "-B", "binary"], None, true, "extraArgs[3]"),
            (&["-B", "udp"], None, false, "extraArgs[1] \"udp\""),
            (&["-R", "0"], None, false, "extraArgs[1] \"0\""),
            (&["-R", "-p1"], None, false, "extraArgs[1] \"-p1\""),
            (&["-R", "-1"], None, false, "extraArgs[1] \"-1\""),
            (&["-R4294967296"], None, false, "extraArgs[0]"),
            (&["-D", ""], None, false, "extraArgs[1] \"\""),
            (&["-N", "5"], None, false, "extraArgs[1] \"5\""),
            (&["-N", "3"], Some(2), false, "extraArgs[1] \"3\""),
            (&["-N", "0"], None, false, "extraArgs[1] \"0\""),
            (
                &["-o", "hashpower=11"],
                None,
                false,
                "extraArgs[1] \"hashpower=11\"",
            ),
            (&["-o", "hashpower=33"], None, false, "extraArgs[1]"),
            (&["-o", "modern,hashpower=abc"], None, false, "extraArgs[1]"),
            (&["-o", "hashpower=12"], None, false, "extraArgs[1]"),
            (&["-o", "hashpower=13"], Some(5), false, "extraArgs[1]"),
            (&["-o", "hashpower=15"], Some(21), false, "extraArgs[1]"),
            // 256 MiB, more than the 147Mi the instance gets without it.
            (&["-o", "hashpower=25"], None, false, "extraArgs[1]"),
            (&["-n", "0"], None, false, "extraArgs[1]"),
            (&["-n", "-5"], None, false, "extraArgs[1]"),
            (&["-f", "1"], None, false, "extraArgs[1]"),
        ] {
            let message = message(&with_args(extra, threads, auth));
            assert!(
                message.starts_with(&format!("spec.memcached.{expected}")),
                "{extra:?}: {message}"
            );
        }
        for (extra, threads, auth) in [
            (&["-B", "binary"][..], None, false),
            (&["-B", "auto"], None, false),
            (&["-B", "ascii"], None, true),
            (&["-B", "binary", "-B", "ascii"], None, true),
            (&["-R", "40x"], None, false),
            (&["-D", ":"], None, false),
            (&["-N", "4"], None, false),
            (&["-N", "8"], Some(8), false),
            (&["-o", "hashpower=13"], None, false),
            (&["-o", "hashpower=12"], Some(3), false),
            (&["-o", "hashpower=16"], Some(21), false),
            (&["-o", "hashpower=23"], None, false),
            // 128 MiB fits the derived 147Mi (which then grows by the table: 263Mi).
            (&["-o", "hashpower=24"], None, false),
            (&["-n", "5"], None, false),
            (&["-f", "1.25"], None, false),
        ] {
            validate(&with_args(extra, threads, auth))
                .unwrap_or_else(|e| panic!("{extra:?} threads {threads:?} auth {auth}: {e}"));
        }
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

    #[test]
    fn the_proxy_with_tls_needs_an_image_of_its_own() {
        let spec = |proxy: serde_json::Value| -> MemcachedSpec {
            serde_json::from_value(serde_json::json!({
                "proxy": proxy, "security": {"tls": {"secretName": "tls"}}
            }))
            .unwrap()
        };
        let refused = message(&spec(serde_json::json!({"enabled": true})));
        assert!(refused.contains("spec.proxy.image is required with spec.security.tls"));
        assert!(refused.contains("--enable-proxy-tls"));
        validate(&spec(
            serde_json::json!({"enabled": true, "image": "proxy-tls"}),
        ))
        .unwrap();
        validate(&spec(serde_json::json!({"enabled": false}))).unwrap();
    }
}
