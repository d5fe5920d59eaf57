use std::sync::Arc;

use super::*;
use crate::api::{MemcachedSpec, Server};
use crate::resources::Defaults;
use crate::resources::testing::memcached;

fn spec(size: i32, proxy: serde_json::Value) -> MemcachedSpec {
    serde_json::from_value(serde_json::json!({"size": size, "proxy": proxy})).unwrap()
}

fn with<T>(spec: MemcachedSpec, build: impl FnOnce(&Instance<'_>) -> T) -> T {
    let mc = memcached("cache", spec);
    let defaults = Defaults {
        operator_image: "operator:v1".into(),
        ..Defaults::default()
    };
    build(&Instance::new(&mc, &defaults).unwrap())
}

fn on() -> serde_json::Value {
    serde_json::json!({"enabled": true})
}

fn pod_spec_of(deployment: &Deployment) -> &PodSpec {
    let template = &deployment.spec.as_ref().unwrap().template;
    template.spec.as_ref().unwrap()
}

#[test]
fn nothing_is_built_while_the_proxy_is_off() {
    for proxy in [serde_json::json!(null), serde_json::json!({"replicas": 3})] {
        with(spec(3, proxy), |instance| {
            assert!(deployment(instance).is_none());
            assert!(service(instance).is_none());
            assert!(pdb(instance).is_none());
            assert!(routes::config_map(instance, &[]).is_none());
            assert!(access::service_account(instance).is_none());
            assert!(access::role(instance).is_none());
            assert!(access::role_binding(instance).is_none());
        });
    }
}

#[test]
fn the_proxy_pods_are_not_the_servers_pods() {
    let deployment = with(spec(3, on()), |i| deployment(i).unwrap());
    assert_eq!(deployment.metadata.name.as_deref(), Some("cache-proxy"));
    let selector = deployment
        .spec
        .as_ref()
        .unwrap()
        .selector
        .match_labels
        .clone();
    assert_eq!(selector, Some(labels::proxy_selector_labels("cache")));
    assert_ne!(selector, Some(labels::selector_labels("cache")));
    assert_eq!(
        selector.unwrap()[labels::NAME_KEY],
        labels::PROXY_APP_NAME,
        "the pod index and the servers' Services select app.kubernetes.io/name=memcached"
    );
    assert_eq!(deployment.spec.as_ref().unwrap().replicas, Some(2));
}

#[test]
fn the_template_depends_on_the_spec_not_on_the_size() {
    let template = |size| {
        with(spec(size, on()), |i| {
            deployment(i).unwrap().spec.unwrap().template
        })
    };
    assert_eq!(template(3), template(5));
}

#[test]
fn the_pod_is_restricted_and_only_the_writer_gets_a_token() {
    let deployment = with(spec(3, on()), |i| deployment(i).unwrap());
    let pod = pod_spec_of(&deployment);
    assert_eq!(pod.share_process_namespace, Some(true));
    assert_eq!(pod.automount_service_account_token, Some(false));
    assert_eq!(pod.service_account_name.as_deref(), Some("cache-proxy"));
    let security = pod.security_context.as_ref().unwrap();
    assert_eq!(security.run_as_non_root, Some(true));
    assert_eq!(security.run_as_user, Some(RUN_AS_USER));
    let all = pod.init_containers.iter().flatten().chain(&pod.containers);
    let mut names = Vec::new();
    for container in all {
        names.push(container.name.as_str());
        assert_eq!(container.security_context, Some(restricted()));
        let mounts = container.volume_mounts.as_deref().unwrap();
        let token = mounts.iter().any(|m| m.mount_path == access::TOKEN_DIR);
        assert_eq!(
            token,
            container.name != PROXY_CONTAINER,
            "{}",
            container.name
        );
        assert!(mounts.iter().any(|m| m.mount_path == CONFIG_DIR));
    }
    assert_eq!(names, ["proxy-config-init", "proxy", "proxy-config"]);
    let spread = &pod.topology_spread_constraints.as_ref().unwrap()[0];
    assert_eq!(spread.topology_key, "kubernetes.io/hostname");
}

#[test]
fn memcached_runs_routelib_over_the_shared_configuration() {
    let deployment = with(spec(3, on()), |i| deployment(i).unwrap());
    let pod = pod_spec_of(&deployment);
    let proxy = &pod.containers[0];
    assert_eq!(proxy.image.as_deref(), Some("memcached:1.6-alpine"));
    assert_eq!(
        proxy.args.as_deref().unwrap(),
        [
            "-p",
            "11211",
            "-o",
            "proxy_config=routelib,proxy_arg=/etc/memcached-proxy/proxy.lua",
            "-P",
            "/etc/memcached-proxy/memcached.pid"
        ]
    );
    let writer = &pod.containers[1];
    assert_eq!(writer.image.as_deref(), Some("operator:v1"));
    assert_eq!(
        writer.args.as_deref().unwrap(),
        [
            "proxy-config",
            "--config-map=cache-proxy",
            "--dir=/etc/memcached-proxy",
            "--pid-file=/etc/memcached-proxy/memcached.pid"
        ]
    );
    let init = &pod.init_containers.as_ref().unwrap()[0];
    assert_eq!(
        init.args.as_deref().unwrap().last().map(String::as_str),
        Some("--once")
    );
}

#[test]
fn resources_replace_the_defaults_key_by_key() {
    let proxy = serde_json::json!({"enabled": true, "image": "mc:1.6.45",
        "resources": {"limits": {"memory": "1Gi"}}});
    let deployment = with(spec(3, proxy), |i| deployment(i).unwrap());
    let container = &pod_spec_of(&deployment).containers[0];
    assert_eq!(container.image.as_deref(), Some("mc:1.6.45"));
    let resources = container.resources.as_ref().unwrap();
    assert_eq!(resources.limits.as_ref().unwrap()["memory"].0, "1Gi");
    assert_eq!(resources.requests.as_ref().unwrap()["memory"].0, "64Mi");
}

#[test]
fn the_service_selects_the_proxy_on_the_memcached_port() {
    let service = with(spec(3, on()), |i| service(i).unwrap());
    assert_eq!(service.metadata.name.as_deref(), Some("cache-proxy"));
    let spec = service.spec.unwrap();
    assert_eq!(spec.selector, Some(labels::proxy_selector_labels("cache")));
    assert_eq!(spec.ports.unwrap()[0].port, 11211);
}

#[test]
fn a_budget_only_above_one_proxy_pod() {
    let one = serde_json::json!({"enabled": true, "replicas": 1});
    assert!(with(spec(3, one), pdb).is_none());
    let budget = with(spec(3, on()), |i| pdb(i).unwrap());
    let budget_spec = budget.spec.unwrap();
    assert_eq!(budget_spec.max_unavailable, Some(IntOrString::Int(1)));
    assert_eq!(
        budget_spec.selector.unwrap().match_labels,
        Some(labels::proxy_selector_labels("cache"))
    );
}

#[test]
fn the_routes_list_the_published_servers_in_slot_order() {
    let server = |slot, address: Option<&str>| Server {
        slot,
        pod: Some(format!("pod-{slot}")),
        address: address.map(str::to_owned),
        ready: address.is_some(),
    };
    let servers = [
        server(0, Some("10.0.0.9:11211")),
        server(1, None),
        server(2, Some("10.0.0.3:11211")),
    ];
    let config_map = with(spec(3, on()), |i| routes::config_map(i, &servers).unwrap());
    assert_eq!(config_map.metadata.name.as_deref(), Some("cache-proxy"));
    let data = config_map.data.unwrap();
    assert_eq!(
        data.keys().collect::<Vec<_>>(),
        [routes::DATA_KEY],
        "data only: no code"
    );
    let route = routes::Route::parse(&data[routes::DATA_KEY]).unwrap();
    assert_eq!(route.servers, ["10.0.0.9:11211", "10.0.0.3:11211"]);
    assert!(!route.backend_tls);
    assert_eq!(
        routes::render("cache", &route),
        routes::config("cache", &["10.0.0.9:11211", "10.0.0.3:11211"])
    );
}

#[test]
fn the_writer_may_read_its_configuration_and_nothing_else() {
    let role = with(spec(3, on()), |i| access::role(i).unwrap());
    let rules = role.rules.unwrap();
    assert_eq!(rules.len(), 1);
    assert_eq!(rules[0].resources.as_deref().unwrap(), ["configmaps"]);
    assert_eq!(rules[0].resource_names.as_deref().unwrap(), ["cache-proxy"]);
    assert_eq!(rules[0].verbs, ["list", "watch"]);
    let binding = with(spec(3, on()), |i| access::role_binding(i).unwrap());
    assert_eq!(binding.role_ref.name, "cache-proxy");
    let subject = &binding.subjects.unwrap()[0];
    assert_eq!(
        (
            subject.kind.as_str(),
            subject.name.as_str(),
            subject.namespace.as_deref()
        ),
        ("ServiceAccount", "cache-proxy", Some("default"))
    );
}

fn tls_spec() -> MemcachedSpec {
    serde_json::from_value(serde_json::json!({
        "size": 3,
        "proxy": {"enabled": true, "image": "registry.example.com/memcached-proxy-tls:1.6.45"},
        "security": {"tls": {"secretName": "cache-tls"}}
    }))
    .unwrap()
}

#[test]
fn with_tls_clients_must_speak_tls_with_the_servers_certificate() {
    let deployment = with(tls_spec(), |i| deployment(i).unwrap());
    let pod = pod_spec_of(&deployment);
    let proxy = &pod.containers[0];
    assert_eq!(
        proxy.args.as_deref().unwrap(),
        [
            "-p",
            "11211",
            "-o",
            "proxy_config=routelib,proxy_arg=/etc/memcached-proxy/proxy.lua,\
             ssl_chain_cert=/etc/memcached/tls/tls.crt,ssl_key=/etc/memcached/tls/tls.key",
            "-P",
            "/etc/memcached-proxy/memcached.pid",
            "-Z",
            "-l",
            "*,notls:127.0.0.1:11299"
        ]
    );
    let writer_env = pod.containers[1].env.as_ref().unwrap();
    let stats = writer_env
        .iter()
        .find(|e| e.name == "PROXY_STATS_ADDRESS")
        .unwrap();
    assert_eq!(
        stats.value.as_deref(),
        Some("127.0.0.1:11299"),
        "the writer reads stats in the clear on the loopback listener"
    );
    let mount = proxy
        .volume_mounts
        .as_ref()
        .unwrap()
        .iter()
        .find(|m| m.name == "tls")
        .unwrap();
    assert_eq!(mount.mount_path, "/etc/memcached/tls");
    assert_eq!(mount.read_only, Some(true));
    let writer_mounts = pod.containers[1].volume_mounts.as_ref().unwrap();
    assert!(
        writer_mounts.iter().all(|m| m.name != "tls"),
        "the writer reads no certificate"
    );
    let volume = pod
        .volumes
        .as_ref()
        .unwrap()
        .iter()
        .find(|v| v.name == "tls")
        .unwrap();
    let secret = volume.secret.as_ref().unwrap();
    assert_eq!(secret.secret_name.as_deref(), Some("cache-tls"));
    assert_eq!(secret.default_mode, Some(0o440));
    let keys: Vec<&str> = secret
        .items
        .as_ref()
        .unwrap()
        .iter()
        .map(|item| item.key.as_str())
        .collect();
    assert_eq!(keys, ["tls.crt", "tls.key"], "never the CA");
    let security = pod.security_context.as_ref().unwrap();
    assert_eq!(security.fs_group, Some(RUN_AS_USER));
}

#[test]
fn without_tls_nothing_of_it_is_there() {
    let deployment = with(spec(3, on()), |i| deployment(i).unwrap());
    let pod = pod_spec_of(&deployment);
    assert!(
        !pod.containers[0]
            .args
            .as_ref()
            .unwrap()
            .contains(&"-Z".to_owned())
    );
    assert!(
        pod.volumes
            .as_ref()
            .unwrap()
            .iter()
            .all(|v| v.name != "tls")
    );
    assert_eq!(pod.security_context.as_ref().unwrap().fs_group, None);
    let writer_env = pod.containers[1].env.as_ref().unwrap();
    let stats = writer_env
        .iter()
        .find(|e| e.name == "PROXY_STATS_ADDRESS")
        .unwrap();
    assert_eq!(stats.value.as_deref(), Some("127.0.0.1:11211"));
}

#[test]
fn the_loopback_stats_port_never_is_the_instances_port() {
    assert_eq!(loopback_stats_port(11211), LOOPBACK_STATS_PORT);
    assert_eq!(
        loopback_stats_port(LOOPBACK_STATS_PORT),
        LOOPBACK_STATS_PORT + 1
    );
}

#[test]
fn with_tls_the_routes_reach_the_servers_over_tls() {
    let servers = [Server {
        slot: 0,
        pod: Some("pod-0".into()),
        address: Some("10.0.0.9:11211".into()),
        ready: true,
    }];
    let lua = |spec| {
        with(spec, |i| {
            let data = routes::config_map(i, &servers).unwrap().data.unwrap();
            routes::render(
                "cache",
                &routes::Route::parse(&data[routes::DATA_KEY]).unwrap(),
            )
        })
    };
    assert!(lua(tls_spec()).contains("backend_use_tls = true"));
    assert!(!lua(spec(3, on())).contains("backend_use_tls"));
}

#[test]
fn a_rotated_certificate_rolls_the_proxy_pods() {
    let annotations = |hash: Option<&str>| {
        with(tls_spec(), |i| {
            let instance = i.with_proxy_secret_hash(hash.map(str::to_owned));
            deployment(&instance)
                .unwrap()
                .spec
                .unwrap()
                .template
                .metadata
                .unwrap()
                .annotations
        })
    };
    assert_eq!(annotations(None), None);
    assert_eq!(
        annotations(Some("h1")).unwrap()[SECRET_HASH_ANNOTATION],
        "h1"
    );
}

fn access_spec() -> MemcachedSpec {
    serde_json::from_value(serde_json::json!({
        "size": 3,
        "proxy": {
            "enabled": true,
            "image": "registry.example.com/memcached-proxy-tls:1.6.45",
            "access": {
                "clientCA": {"secretName": "clients-ca"},
                "identities": [
                    {"name": "orders", "prefixes": ["orders:"]},
                    {"name": "reports", "commonName": "reports.example", "prefixes": ["orders:"],
                     "readOnly": true}
                ]
            }
        },
        "security": {"tls": {"secretName": "cache-tls"}, "networkPolicy": {"enabled": true}}
    }))
    .unwrap()
}

fn material(trusted: &str, epoch: &str) -> identities::Material {
    identities::Material {
        ca: identities::ClientCa {
            pem: "-----BEGIN CERTIFICATE-----\nMA==\n-----END CERTIFICATE-----\n".to_owned(),
            fingerprints: vec![trusted.to_owned()],
        },
        trust: identities::Trust {
            trusted: trusted.to_owned(),
            epoch: epoch.to_owned(),
        },
    }
}

fn with_access<T>(build: impl FnOnce(&Instance<'_>) -> T) -> T {
    with(access_spec(), |instance| {
        build(&instance.with_proxy_access(Some(Arc::new(material("00aa", "e1")))))
    })
}

#[test]
fn with_access_clients_need_a_certificate_and_the_operator_has_its_own_listener() {
    let deployment = with_access(|i| deployment(i).unwrap());
    let pod = pod_spec_of(&deployment);
    let proxy = &pod.containers[0];
    assert_eq!(
        proxy.args.as_deref().unwrap(),
        [
            "-p",
            "11211",
            "-o",
            "proxy_config=routelib:/etc/memcached-proxy/access.lua,\
             proxy_arg=/etc/memcached-proxy/proxy.lua,\
             ssl_chain_cert=/etc/memcached/tls/tls.crt,ssl_key=/etc/memcached/tls/tls.key,\
             ssl_ca_cert=/etc/memcached-proxy/client-ca.crt,ssl_session_cache",
            "-P",
            "/etc/memcached-proxy/memcached.pid",
            "-Z",
            "-l",
            "mtls:tag[client]:*:11211,btls:*:11298,notls:127.0.0.1:11299"
        ]
    );
    let ports: Vec<(Option<&str>, i32)> = proxy
        .ports
        .as_ref()
        .unwrap()
        .iter()
        .map(|p| (p.name.as_deref(), p.container_port))
        .collect();
    assert_eq!(ports, [(Some("memcached"), 11211), (Some("ops"), 11298)]);
    // The Deployment records the CAs its pods may trust, the template the epoch they start under.
    let annotations = deployment.metadata.annotations.as_ref().unwrap();
    assert_eq!(annotations[identities::TRUSTED_ANNOTATION], "00aa");
    let template = deployment.spec.as_ref().unwrap().template.metadata.as_ref();
    let template = template.unwrap().annotations.as_ref().unwrap();
    assert_eq!(template[identities::EPOCH_ANNOTATION], "e1");
    // The init container waits for the route of that epoch; the sidecar takes any.
    let init = &pod.init_containers.as_ref().unwrap()[0];
    assert!(
        init.args
            .as_ref()
            .unwrap()
            .contains(&"--trust-epoch=e1".to_owned())
    );
    let sidecar = &pod.containers[1];
    assert!(
        !sidecar
            .args
            .as_ref()
            .unwrap()
            .iter()
            .any(|a| a.starts_with("--trust-epoch"))
    );
}

#[test]
fn a_new_trust_epoch_rolls_the_pods_and_added_cas_do_not() {
    let template = |trusted: &str, epoch: &str| {
        with(access_spec(), |instance| {
            let instance = instance.with_proxy_access(Some(Arc::new(material(trusted, epoch))));
            deployment(&instance).unwrap().spec.unwrap().template
        })
    };
    assert_eq!(template("00aa", "e1"), template("00aa,11bb", "e1"));
    assert_ne!(template("00aa", "e1"), template("11bb", "e2"));
}

#[test]
fn the_route_carries_the_identities_and_the_ca_it_was_given() {
    let config_map = with_access(|i| routes::config_map(i, &[]).unwrap());
    let data = &config_map.data.as_ref().unwrap()[routes::DATA_KEY];
    let route: routes::Route = serde_json::from_str(data).unwrap();
    let access = route.access.unwrap();
    assert_eq!(access.epoch, "e1");
    assert!(access.client_ca.contains("BEGIN CERTIFICATE"));
    let identities: Vec<(&str, &str, bool)> = access
        .identities
        .iter()
        .map(|i| (i.name.as_str(), i.common_name.as_str(), i.read_only))
        .collect();
    assert_eq!(
        identities,
        [
            ("orders", "orders", false),
            ("reports", "reports.example", true)
        ]
    );
    // Without the CA read (the reconcile holds the instance then), no access part, nothing to load.
    let config_map = with(access_spec(), |i| routes::config_map(i, &[]).unwrap());
    assert!(!config_map.data.unwrap()[routes::DATA_KEY].contains("access"));
}

#[test]
fn with_access_the_operator_alone_reaches_the_stats_listener() {
    let spec = access_spec();
    assert_eq!(stats_port(&spec), 11298);
    let mut other = spec.clone();
    other.container_port = 11298;
    assert_eq!(stats_port(&other), 11299, "never the clients' port");
    assert_eq!(stats_port(&tls_spec()), 11211);
    let mc = memcached("cache", access_spec());
    let defaults = Defaults {
        operator_pods: Some(crate::resources::defaults::OperatorPods {
            namespace: "operators".into(),
        }),
        ..Defaults::default()
    };
    let instance = Instance::new(&mc, &defaults).unwrap();
    let policy = crate::resources::network_policy::proxy_network_policy(&instance).unwrap();
    let rules = policy.spec.unwrap().ingress.unwrap();
    assert_eq!(rules.len(), 2);
    let port = |rule: &k8s_openapi::api::networking::v1::NetworkPolicyIngressRule| {
        rule.ports.as_ref().unwrap()[0].port.clone()
    };
    assert_eq!(port(&rules[0]), Some(IntOrString::Int(11211)));
    assert_eq!(port(&rules[1]), Some(IntOrString::Int(11298)));
    let operator = rules[1].from.as_ref().unwrap();
    assert_eq!(operator.len(), 1);
    assert!(
        operator[0].namespace_selector.is_some(),
        "the operator's pods only"
    );
    let clients = rules[0].from.as_ref().unwrap();
    assert_eq!(
        clients.len(),
        1,
        "the namespace's pods, without the operator's"
    );
}

/// While its instance waits for its fleet turn, the proxy Deployment keeps the live template and the
/// cause it records; given its turn, it is built and records the new cause.
#[test]
fn the_fleet_turn_decides_the_proxy_template_and_its_recorded_cause() {
    use crate::resources::fleet::{CAUSE_ANNOTATION, Cause, Held};
    let cause = |template: &str| Cause {
        spec: "s1".into(),
        template: template.into(),
        key: None,
    };
    let annotation = |d: &Deployment| {
        let annotations = d.metadata.annotations.as_ref();
        annotations.and_then(|a| a.get(CAUSE_ANNOTATION)).cloned()
    };
    with(spec(1, on()), |instance| {
        let built = deployment(instance).unwrap();
        assert_eq!(annotation(&built), None, "no turn taken: no cause");
        let live = PodTemplateSpec {
            metadata: Some(ObjectMeta {
                labels: Some(labels::proxy_labels("cache")),
                ..ObjectMeta::default()
            }),
            spec: Some(PodSpec::default()),
        };
        let waits = Held {
            cause: Some(cause("t1")),
            template: Some(live.clone()),
        };
        let held = deployment(&instance.with_proxy_fleet(Some(Arc::new(waits)))).unwrap();
        assert_eq!(held.spec.as_ref().unwrap().template, live);
        assert_eq!(annotation(&held), Some(cause("t1").to_annotation()));
        let unrecorded = Held {
            cause: None,
            template: Some(live.clone()),
        };
        let held = deployment(&instance.with_proxy_fleet(Some(Arc::new(unrecorded)))).unwrap();
        assert_eq!(annotation(&held), None, "an earlier build's, kept so");
        let goes = Held {
            cause: Some(cause("t2")),
            template: None,
        };
        let rolled = deployment(&instance.with_proxy_fleet(Some(Arc::new(goes)))).unwrap();
        assert_eq!(rolled.spec, built.spec, "as built");
        assert_eq!(annotation(&rolled), Some(cause("t2").to_annotation()));
    });
}
