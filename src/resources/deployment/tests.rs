use super::*;
use crate::api::{
    AntiAffinity, AuthConfig, DEFAULT_EXPORTER_IMAGE, ExporterConfig, HighAvailability,
    MemcachedConfig, Monitoring, Security, TlsConfig,
};
use crate::resources::Defaults;
use crate::resources::testing::memcached;
use k8s_openapi::api::core::v1::{
    Affinity, Container, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm,
    PodSpec, ResourceRequirements, Toleration,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

fn build_with(spec: MemcachedSpec, hash: Option<&str>) -> Deployment {
    let mc = memcached("cache", spec);
    let defaults = Defaults::default();
    let instance = Instance::new(&mc, &defaults).unwrap();
    deployment(&instance, instance.spec.size, hash)
}

fn build(spec: MemcachedSpec) -> Deployment {
    build_with(spec, None)
}

fn pod(d: &Deployment) -> &PodSpec {
    d.spec.as_ref().unwrap().template.spec.as_ref().unwrap()
}

fn container<'a>(d: &'a Deployment, name: &str) -> &'a Container {
    pod(d).containers.iter().find(|c| c.name == name).unwrap()
}

fn everything() -> MemcachedSpec {
    MemcachedSpec {
        size: 3,
        memcached: Some(Box::new(MemcachedConfig {
            max_memory_mb: Some(256),
            ..MemcachedConfig::default()
        })),
        security: Some(Box::new(Security {
            tls: Some(TlsConfig {
                secret_name: "cache-tls".into(),
                client_auth: true,
                client_secret_name: None,
            }),
            auth: Some(AuthConfig {
                secret_name: "cache-auth".into(),
                key: Some("users".into()),
                allow_plaintext_stats: false,
            }),
            network_policy: None,
        })),
        monitoring: Some(Box::new(Monitoring {
            exporter: Some(ExporterConfig {
                enabled: true,
                ..ExporterConfig::default()
            }),
            service_monitor: None,
        })),
        ..MemcachedSpec::default()
    }
}

#[test]
fn replicas_follow_size_including_zero() {
    for size in [0, 1, 3, 64] {
        let d = build(MemcachedSpec {
            size,
            ..MemcachedSpec::default()
        });
        assert_eq!(d.spec.unwrap().replicas, Some(size));
    }
}

#[test]
fn selector_is_only_the_stable_labels_and_matches_the_template() {
    let d = build(MemcachedSpec::default());
    let spec = d.spec.unwrap();
    let selector = spec.selector.match_labels.unwrap();
    assert_eq!(selector, labels::selector_labels("cache"));
    let template_labels = spec.template.metadata.unwrap().labels.unwrap();
    for (k, v) in &selector {
        assert_eq!(template_labels.get(k), Some(v));
    }
    assert_eq!(
        template_labels
            .get(labels::MANAGED_BY_KEY)
            .map(String::as_str),
        Some(labels::MANAGER_NAME)
    );
}

#[test]
fn container_runs_memcached_with_the_spec_port_and_image() {
    let d = build(MemcachedSpec {
        container_port: 11311,
        image: Some("memcached:1.6.38-alpine".into()),
        ..MemcachedSpec::default()
    });
    let c = container(&d, "memcached");
    assert_eq!(c.image.as_deref(), Some("memcached:1.6.38-alpine"));
    assert_eq!(c.command.as_ref().unwrap(), &["memcached"]);
    assert_eq!(
        c.args.as_ref().unwrap().join(" "),
        "-p 11311 -m 64 -o modern"
    );
    let port = &c.ports.as_ref().unwrap()[0];
    assert_eq!(
        (port.name.as_deref(), port.container_port),
        (Some("memcached"), 11311)
    );
    for probe in [&c.readiness_probe, &c.liveness_probe] {
        let tcp = probe.as_ref().unwrap().tcp_socket.as_ref().unwrap();
        assert_eq!(tcp.port, IntOrString::String("memcached".into()));
    }
    assert_eq!(pod(&d).containers.len(), 1, "no exporter unless asked for");
}

/// The `restricted` Pod Security Standard, checked field by field, with every feature on.
#[test]
fn pod_meets_the_restricted_pod_security_standard() {
    for spec in [MemcachedSpec::default(), everything()] {
        let d = build(spec);
        let pod = pod(&d);
        let psc = pod.security_context.as_ref().unwrap();
        assert_eq!(psc.run_as_non_root, Some(true));
        assert_ne!(psc.run_as_user, Some(0));
        assert_eq!(
            psc.seccomp_profile.as_ref().unwrap().type_,
            "RuntimeDefault"
        );
        assert!(pod.host_network.is_none() && pod.host_pid.is_none() && pod.host_ipc.is_none());
        for v in pod.volumes.iter().flatten() {
            assert!(v.secret.is_some(), "only Secret volumes: {}", v.name);
        }
        for c in &pod.containers {
            let sc = c.security_context.as_ref().unwrap();
            assert_eq!(sc.allow_privilege_escalation, Some(false), "{}", c.name);
            assert_eq!(sc.read_only_root_filesystem, Some(true), "{}", c.name);
            assert_eq!(sc.privileged, None);
            let caps = sc.capabilities.as_ref().unwrap();
            assert_eq!(caps.drop.as_deref(), Some(&["ALL".to_owned()][..]));
            assert_eq!(caps.add, None);
            assert!(c.ports.iter().flatten().all(|p| p.host_port.is_none()));
        }
    }
}

#[test]
fn rollout_never_lowers_capacity() {
    let strategy = build(MemcachedSpec::default())
        .spec
        .unwrap()
        .strategy
        .unwrap();
    let rolling = strategy.rolling_update.unwrap();
    assert_eq!(rolling.max_unavailable, Some(IntOrString::Int(0)));
    assert_eq!(rolling.max_surge, Some(IntOrString::Int(1)));
}

#[test]
fn warmup_is_min_ready_seconds_and_replicas_come_from_the_drain() {
    let spec = MemcachedSpec {
        size: 2,
        rollout: Some(crate::api::Rollout {
            warmup_seconds: Some(90),
        }),
        ..MemcachedSpec::default()
    };
    let d = build(spec.clone()).spec.unwrap();
    assert_eq!(d.min_ready_seconds, Some(90));
    assert_eq!(
        build(MemcachedSpec::default())
            .spec
            .unwrap()
            .min_ready_seconds,
        None,
        "no warmup: left out, as the API server leaves a zero minReadySeconds out"
    );
    // While a scale-down drains, the reconciler asks for more replicas than spec.size.
    let mc = memcached("cache", spec);
    let defaults = Defaults::default();
    let draining = deployment(&Instance::new(&mc, &defaults).unwrap(), 3, None);
    assert_eq!(draining.spec.unwrap().replicas, Some(3));
}

#[test]
fn termination_is_graceful() {
    let d = build(MemcachedSpec::default());
    assert_eq!(pod(&d).termination_grace_period_seconds, Some(30));
    let pre_stop = container(&d, "memcached")
        .lifecycle
        .as_ref()
        .unwrap()
        .pre_stop
        .as_ref()
        .unwrap();
    assert_eq!(
        pre_stop.exec.as_ref().unwrap().command.as_ref().unwrap(),
        &["sleep", "10"]
    );

    let d = build(MemcachedSpec {
        high_availability: Some(Box::new(HighAvailability {
            pre_stop_delay_seconds: Some(0),
            termination_grace_period_seconds: Some(5),
            ..HighAvailability::default()
        })),
        ..MemcachedSpec::default()
    });
    assert_eq!(pod(&d).termination_grace_period_seconds, Some(5));
    assert!(container(&d, "memcached").lifecycle.is_none());
}

#[test]
fn anti_affinity_modes() {
    let with = |mode| {
        build(MemcachedSpec {
            high_availability: Some(Box::new(HighAvailability {
                anti_affinity: Some(mode),
                ..HighAvailability::default()
            })),
            ..MemcachedSpec::default()
        })
    };
    let soft = pod(&build(MemcachedSpec::default()))
        .affinity
        .clone()
        .unwrap()
        .pod_anti_affinity
        .unwrap();
    let preferred = &soft
        .preferred_during_scheduling_ignored_during_execution
        .unwrap()[0];
    assert_eq!(
        preferred.pod_affinity_term.topology_key,
        "kubernetes.io/hostname"
    );
    assert_eq!(
        preferred
            .pod_affinity_term
            .label_selector
            .as_ref()
            .unwrap()
            .match_labels,
        Some(labels::selector_labels("cache"))
    );

    let hard = pod(&with(AntiAffinity::Hard))
        .affinity
        .clone()
        .unwrap()
        .pod_anti_affinity
        .unwrap();
    assert_eq!(
        hard.required_during_scheduling_ignored_during_execution
            .unwrap()
            .len(),
        1
    );
    assert!(pod(&with(AntiAffinity::None)).affinity.is_none());
}

#[test]
fn scheduling_fields_pass_through_and_user_affinity_is_kept() {
    let node_affinity = NodeAffinity {
        required_during_scheduling_ignored_during_execution: Some(NodeSelector {
            node_selector_terms: vec![NodeSelectorTerm {
                match_expressions: Some(vec![NodeSelectorRequirement {
                    key: "pool".into(),
                    operator: "In".into(),
                    values: Some(vec!["cache".into()]),
                }]),
                ..NodeSelectorTerm::default()
            }],
        }),
        ..NodeAffinity::default()
    };
    let d = build(MemcachedSpec {
        node_selector: Some([("disk".to_owned(), "ssd".to_owned())].into()),
        tolerations: Some(vec![Toleration {
            key: Some("dedicated".into()),
            operator: Some("Exists".into()),
            ..Toleration::default()
        }]),
        affinity: Some(Box::new(Affinity {
            node_affinity: Some(node_affinity.clone()),
            ..Affinity::default()
        })),
        priority_class_name: Some("high".into()),
        ..MemcachedSpec::default()
    });
    let pod = pod(&d);
    assert_eq!(pod.node_selector.as_ref().unwrap()["disk"], "ssd");
    assert_eq!(
        pod.tolerations.as_ref().unwrap()[0].key.as_deref(),
        Some("dedicated")
    );
    assert_eq!(pod.priority_class_name.as_deref(), Some("high"));
    let affinity = pod.affinity.as_ref().unwrap();
    assert_eq!(affinity.node_affinity.as_ref(), Some(&node_affinity));
    assert!(
        affinity.pod_anti_affinity.is_some(),
        "default soft anti-affinity is added"
    );
}

#[test]
fn secrets_are_mounted_read_only_for_the_memcached_group() {
    let d = build_with(everything(), Some("abc"));
    let pod = pod(&d);
    assert_eq!(
        pod.security_context.as_ref().unwrap().fs_group,
        Some(RUN_AS_USER)
    );
    let volumes = pod.volumes.as_ref().unwrap();
    let secret_of = |name: &str| {
        let v = volumes.iter().find(|v| v.name == name).unwrap();
        let s = v.secret.as_ref().unwrap();
        assert_eq!(s.default_mode, Some(0o440));
        s.secret_name.clone().unwrap()
    };
    assert_eq!(secret_of("tls"), "cache-tls");
    assert_eq!(
        secret_of("auth"),
        "cache-auth-file",
        "the operator's copy with its own entry, not the user's Secret"
    );
    let mounts = container(&d, "memcached").volume_mounts.clone().unwrap();
    assert!(mounts.iter().all(|m| m.read_only == Some(true)));
    let args = container(&d, "memcached").args.clone().unwrap().join(" ");
    assert!(
        args.contains("-Z") && args.contains("-Y /etc/memcached/auth/users"),
        "{args}"
    );

    // The auth file is bound as it was when the container started (subPath): a changed Secret reaches the
    // servers only through a rollout, which the operator starts after checking the new file.
    let auth = mounts.iter().find(|m| m.name == "auth").unwrap();
    assert_eq!(auth.mount_path, "/etc/memcached/auth/users");
    assert_eq!(auth.sub_path.as_deref(), Some("users"));
    let tls = mounts.iter().find(|m| m.name == "tls").unwrap();
    assert_eq!(
        tls.sub_path, None,
        "TLS files follow the Secret: servers reload them in place"
    );

    let template = d.spec.unwrap().template.metadata.unwrap();
    assert_eq!(template.annotations.unwrap()[SECRET_HASH_ANNOTATION], "abc");
    let plain = build(MemcachedSpec::default());
    assert!(
        plain
            .spec
            .unwrap()
            .template
            .metadata
            .unwrap()
            .annotations
            .is_none()
    );
}

#[test]
fn exporter_sidecar_scrapes_memcached_over_loopback() {
    let d = build(everything());
    let exporter = container(&d, "exporter");
    assert_eq!(exporter.image.as_deref(), Some(DEFAULT_EXPORTER_IMAGE));
    let args = exporter.args.clone().unwrap();
    assert!(args.contains(&"--memcached.address=localhost:11211".to_owned()));
    assert!(
        args.contains(&"--memcached.tls.enable".to_owned()),
        "TLS is on: {args:?}"
    );
    // Verified over loopback by the Service's namespaced name, against the CA (client auth is on).
    assert!(
        !args.iter().any(|a| a.contains("insecure-skip-verify")),
        "{args:?}"
    );
    assert!(args.contains(&"--memcached.tls.server-name=cache.default.svc".to_owned()));
    assert!(
        args.contains(&"--memcached.tls.ca-file=/etc/memcached-exporter/tls/ca.crt".to_owned())
    );
    assert!(
        args.contains(&"--memcached.tls.key-file=/etc/memcached-exporter/tls/tls.key".to_owned())
    );
    let port = &exporter.ports.as_ref().unwrap()[0];
    assert_eq!(
        (port.name.as_deref(), port.container_port),
        (Some("metrics"), 9150)
    );
    assert!(
        exporter.readiness_probe.is_none(),
        "must not gate memcached's readiness"
    );
    assert!(
        exporter
            .resources
            .as_ref()
            .unwrap()
            .limits
            .as_ref()
            .unwrap()
            .contains_key("memory")
    );
}

/// Without client certificates the exporter has no private key to read: its volume holds the server's
/// certificate only, which it verifies the server against.
#[test]
fn the_exporter_gets_no_private_key_without_client_auth() {
    let mut spec = everything();
    spec.security
        .as_mut()
        .unwrap()
        .tls
        .as_mut()
        .unwrap()
        .client_auth = false;
    let d = build(spec);
    let args = container(&d, "exporter").args.clone().unwrap();
    assert!(
        args.contains(&"--memcached.tls.ca-file=/etc/memcached-exporter/tls/tls.crt".to_owned()),
        "{args:?}"
    );
    assert!(
        !args
            .iter()
            .any(|a| a.contains("key-file") || a.contains("insecure")),
        "{args:?}"
    );
    let mounts = container(&d, "exporter").volume_mounts.clone().unwrap();
    assert_eq!(mounts.len(), 1);
    let volume = pod(&d)
        .volumes
        .as_ref()
        .unwrap()
        .iter()
        .find(|v| v.name == mounts[0].name)
        .unwrap();
    let items = volume.secret.as_ref().unwrap().items.as_ref().unwrap();
    let keys: Vec<_> = items.iter().map(|i| i.key.as_str()).collect();
    assert_eq!(keys, ["tls.crt"]);
}

#[test]
fn resources_are_derived_from_item_memory_and_overridable() {
    let d = build(everything());
    let r = container(&d, "memcached").resources.clone().unwrap();
    // maxMemoryMB 256 + 32 + 39 slab classes + a hash table of 2^22 buckets and its old half (48 MiB).
    assert_eq!(r.limits.unwrap()["memory"], Quantity("375Mi".into()));
    assert_eq!(r.requests.unwrap()["memory"], Quantity("375Mi".into()));

    let d = build(MemcachedSpec {
        resources: Some(Box::new(ResourceRequirements {
            requests: Some([("cpu".to_owned(), Quantity("2".into()))].into()),
            limits: Some([("memory".to_owned(), Quantity("1Gi".into()))].into()),
            ..ResourceRequirements::default()
        })),
        ..MemcachedSpec::default()
    });
    let r = container(&d, "memcached").resources.clone().unwrap();
    let requests = r.requests.unwrap();
    assert_eq!(requests["cpu"], Quantity("2".into()));
    assert_eq!(
        requests["memory"],
        Quantity("147Mi".into()),
        "derived key kept"
    );
    assert_eq!(r.limits.unwrap()["memory"], Quantity("1Gi".into()));
}

#[test]
fn status_is_never_applied() {
    assert!(build(MemcachedSpec::default()).status.is_none());
}
