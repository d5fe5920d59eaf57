use super::*;
use crate::api::{ExporterConfig, Monitoring, NetworkPolicyConfig, Security};
use crate::resources::Defaults;
use crate::resources::testing::{child_meta_json, memcached};
use k8s_openapi::api::networking::v1::IPBlock;
use serde_json::json;

fn spec(config: NetworkPolicyConfig, exporter: bool) -> MemcachedSpec {
    MemcachedSpec {
        container_port: 11311,
        security: Some(Box::new(Security {
            network_policy: Some(config),
            ..Security::default()
        })),
        monitoring: exporter.then(|| {
            Box::new(Monitoring {
                exporter: Some(ExporterConfig {
                    enabled: true,
                    ..ExporterConfig::default()
                }),
                service_monitor: None,
            })
        }),
        ..MemcachedSpec::default()
    }
}

fn build(spec: MemcachedSpec) -> Option<serde_json::Value> {
    let mc = memcached("cache", spec);
    let defaults = Defaults::default();
    let policy = network_policy(&Instance::new(&mc, &defaults).unwrap())?;
    Some(serde_json::to_value(policy).unwrap())
}

fn enabled() -> NetworkPolicyConfig {
    NetworkPolicyConfig {
        enabled: true,
        ..NetworkPolicyConfig::default()
    }
}

fn selector(key: &str, value: &str) -> LabelSelector {
    LabelSelector {
        match_labels: Some([(key.to_owned(), value.to_owned())].into()),
        ..LabelSelector::default()
    }
}

/// The first rule's peers of the policy `build` makes for `spec` (the servers' or the proxy's),
/// with the operator running in a pod of `memcached-operator-system`, and collecting stats or not.
fn peers(
    build: fn(&Instance<'_>) -> Option<NetworkPolicy>,
    spec: MemcachedSpec,
    stats_collected: bool,
) -> serde_json::Value {
    let mc = memcached("cache", spec);
    let defaults = Defaults {
        operator_pods: Some(crate::resources::OperatorPods {
            namespace: "memcached-operator-system".into(),
        }),
        stats_collected,
        ..Defaults::default()
    };
    let policy = build(&Instance::new(&mc, &defaults).unwrap()).unwrap();
    serde_json::to_value(policy).unwrap()["spec"]["ingress"][0]["from"].clone()
}

fn operator_peer() -> serde_json::Value {
    json!({
        "podSelector": {"matchLabels": {"app.kubernetes.io/name": "memcached-operator"}},
        "namespaceSelector": {"matchLabels": {
            "kubernetes.io/metadata.name": "memcached-operator-system"}}
    })
}

#[test]
fn the_operator_is_admitted_to_memcached_when_it_reads_stats() {
    let mc = memcached("cache", spec(enabled(), true));
    let defaults = Defaults {
        operator_pods: Some(crate::resources::OperatorPods {
            namespace: "memcached-operator-system".into(),
        }),
        ..Defaults::default()
    };
    let policy = network_policy(&Instance::new(&mc, &defaults).unwrap()).unwrap();
    let policy = serde_json::to_value(policy).unwrap();
    assert_eq!(
        policy["spec"]["ingress"][0]["from"],
        json!([{"podSelector": {}}, operator_peer()])
    );
    assert_eq!(
        policy["spec"]["ingress"][1]["from"],
        json!([{"podSelector": {}}]),
        "the exporter's port is not the operator's business"
    );
}

#[test]
fn the_operator_is_admitted_to_memcached_for_its_handover_copies_without_stats() {
    // `--stats-interval=0`: the operator still copies items between servers in warm handovers
    // (on by default), and a policy without it would time every copy out.
    assert_eq!(
        peers(network_policy, spec(enabled(), false), false),
        json!([{"podSelector": {}}, operator_peer()])
    );
    let mut without_handover = spec(enabled(), false);
    without_handover.handover = Some(crate::api::WarmHandover {
        enabled: Some(false),
        ..Default::default()
    });
    assert_eq!(
        peers(network_policy, without_handover, false),
        json!([{"podSelector": {}}]),
        "no stats read, no handover: the operator never connects"
    );
}

#[test]
fn the_policy_selects_the_servers_and_the_spare_server_but_not_the_operator() {
    let mc = memcached("cache", spec(enabled(), false));
    let defaults = Defaults::default();
    let policy = network_policy(&Instance::new(&mc, &defaults).unwrap()).unwrap();
    let selector = policy.spec.and_then(|s| s.pod_selector).unwrap();
    let selects = |name: &str, instance: &str| {
        let pod = [
            (labels::NAME_KEY.to_owned(), name.to_owned()),
            (labels::INSTANCE_KEY.to_owned(), instance.to_owned()),
        ];
        let labelled = |key: &str| pod.iter().find(|(k, _)| k == key).map(|(_, v)| v);
        let labels_match = selector
            .match_labels
            .iter()
            .flatten()
            .all(|(k, v)| labelled(k) == Some(v));
        let expressions_match = selector.match_expressions.iter().flatten().all(|e| {
            e.operator == "In"
                && labelled(&e.key).is_some_and(|v| e.values.iter().flatten().any(|x| x == v))
        });
        labels_match && expressions_match
    };
    assert!(selects("memcached", "cache"), "a server");
    assert!(selects(spare::SPARE_APP_NAME, "cache"), "the spare server");
    assert!(!selects("memcached", "other"), "another instance's server");
    assert!(!selects("memcached-operator", "cache"), "the operator");
}

#[test]
fn default_policy_admits_memcached_from_the_namespace_only() {
    assert_eq!(
        build(spec(enabled(), false)).unwrap(),
        json!({
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": child_meta_json(),
            "spec": {
                "podSelector": {
                    "matchLabels": {"app.kubernetes.io/instance": "cache"},
                    "matchExpressions": [{
                        "key": "app.kubernetes.io/name", "operator": "In",
                        "values": ["memcached", "memcached-handover"]
                    }]
                },
                "policyTypes": ["Ingress"],
                "ingress": [{
                    "from": [{"podSelector": {}}],
                    "ports": [{"port": 11311, "protocol": "TCP"}]
                }]
            }
        })
    );
}

#[test]
fn listed_clients_and_monitoring_namespaces_are_admitted_on_their_ports() {
    let config = NetworkPolicyConfig {
        allowed_clients: vec![
            AllowedClient {
                pod_selector: Some(selector("app", "web")),
                ..AllowedClient::default()
            },
            AllowedClient {
                namespace_selector: Some(selector("team", "shop")),
                pod_selector: Some(selector("app", "api")),
                ..AllowedClient::default()
            },
            AllowedClient {
                ip_block: Some(IPBlock {
                    cidr: "10.0.0.0/8".into(),
                    except: Some(vec!["10.9.0.0/16".into()]),
                }),
                ..AllowedClient::default()
            },
        ],
        monitoring_namespace_selector: Some(selector("kubernetes.io/metadata.name", "monitoring")),
        ..enabled()
    };
    let policy = build(spec(config, true)).unwrap();
    assert_eq!(
        policy["spec"]["ingress"],
        json!([
            {
                "from": [
                    {"podSelector": {"matchLabels": {"app": "web"}}},
                    {"namespaceSelector": {"matchLabels": {"team": "shop"}},
                     "podSelector": {"matchLabels": {"app": "api"}}},
                    {"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.9.0.0/16"]}}
                ],
                "ports": [{"port": 11311, "protocol": "TCP"}]
            },
            {
                "from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}],
                "ports": [{"port": 9150, "protocol": "TCP"}]
            }
        ])
    );
}

#[test]
fn metrics_port_defaults_to_the_namespace_and_needs_the_exporter() {
    let with_exporter = build(spec(enabled(), true)).unwrap();
    assert_eq!(
        with_exporter["spec"]["ingress"][1],
        json!({"from": [{"podSelector": {}}], "ports": [{"port": 9150, "protocol": "TCP"}]})
    );
    // A monitoring selector without the exporter opens nothing.
    let config = NetworkPolicyConfig {
        monitoring_namespace_selector: Some(LabelSelector::default()),
        ..enabled()
    };
    let policy = build(spec(config, false)).unwrap();
    assert_eq!(policy["spec"]["ingress"].as_array().unwrap().len(), 1);
}

/// `spec(config, exporter)` with the proxy on.
fn with_proxy(config: NetworkPolicyConfig, exporter: bool) -> MemcachedSpec {
    MemcachedSpec {
        proxy: Some(Box::new(crate::api::Proxy {
            enabled: true,
            ..crate::api::Proxy::default()
        })),
        ..spec(config, exporter)
    }
}

fn build_proxy(spec: MemcachedSpec) -> Option<serde_json::Value> {
    let mc = memcached("cache", spec);
    let defaults = Defaults::default();
    let policy = proxy_network_policy(&Instance::new(&mc, &defaults).unwrap())?;
    Some(serde_json::to_value(policy).unwrap())
}

fn web_clients() -> NetworkPolicyConfig {
    NetworkPolicyConfig {
        allowed_clients: vec![AllowedClient {
            pod_selector: Some(selector("app", "web")),
            ..AllowedClient::default()
        }],
        ..enabled()
    }
}

fn proxy_peer() -> serde_json::Value {
    json!({"podSelector": {"matchLabels": {
        "app.kubernetes.io/instance": "cache",
        "app.kubernetes.io/name": "memcached-proxy"}}})
}

#[test]
fn with_the_proxy_the_listed_clients_reach_the_proxy_pods_only() {
    let policy = build_proxy(with_proxy(web_clients(), true)).unwrap();
    assert_eq!(policy["metadata"]["name"], "cache-proxy");
    assert_eq!(
        policy["spec"],
        json!({
            "podSelector": {"matchLabels": {
                "app.kubernetes.io/instance": "cache",
                "app.kubernetes.io/name": "memcached-proxy"}},
            "policyTypes": ["Ingress"],
            "ingress": [{
                "from": [{"podSelector": {"matchLabels": {"app": "web"}}}],
                "ports": [{"port": 11311, "protocol": "TCP"}]
            }]
        })
    );
    let namespace = build_proxy(with_proxy(enabled(), false)).unwrap();
    assert_eq!(
        namespace["spec"]["ingress"][0]["from"],
        json!([{"podSelector": {}}]),
        "no list: the namespace, as for the servers without the proxy"
    );
}

#[test]
fn the_operator_is_admitted_to_the_proxy_when_it_reads_stats() {
    // The collector reads every proxy pod's `stats` on the memcached port (over TLS with TLS on):
    // without this peer, a namespace's default-deny would time every read out.
    assert_eq!(
        peers(proxy_network_policy, with_proxy(web_clients(), false), true),
        json!([{"podSelector": {"matchLabels": {"app": "web"}}}, operator_peer()])
    );
    assert_eq!(
        peers(proxy_network_policy, with_proxy(enabled(), false), true),
        json!([{"podSelector": {}}, operator_peer()])
    );
    // `--stats-interval=0`: the operator never connects to a proxy (handover copies go server to
    // server), so the proxy admits the listed clients only.
    assert_eq!(
        peers(
            proxy_network_policy,
            with_proxy(web_clients(), false),
            false
        ),
        json!([{"podSelector": {"matchLabels": {"app": "web"}}}])
    );
}

#[test]
fn with_the_proxy_the_servers_admit_the_proxy_the_operator_and_the_scrapers() {
    assert_eq!(
        peers(network_policy, with_proxy(web_clients(), true), true),
        json!([proxy_peer(), operator_peer()]),
        "the proxy's pods instead of the listed clients; the operator for stats and copies"
    );
    let mut without_handover = with_proxy(web_clients(), false);
    without_handover.handover = Some(crate::api::WarmHandover {
        enabled: Some(false),
        ..Default::default()
    });
    assert_eq!(
        peers(network_policy, without_handover, false),
        json!([proxy_peer()])
    );
    let policy = build(with_proxy(web_clients(), true)).unwrap();
    assert_eq!(policy["metadata"]["name"], "cache");
    assert_eq!(
        policy["spec"]["ingress"][1],
        json!({"from": [{"podSelector": {}}], "ports": [{"port": 9150, "protocol": "TCP"}]}),
        "the exporter's port as without the proxy"
    );
}

#[test]
fn no_proxy_policy_unless_both_are_on() {
    assert!(
        build_proxy(spec(web_clients(), false)).is_none(),
        "no proxy"
    );
    let mut off = with_proxy(web_clients(), false);
    off.security = None;
    assert!(build_proxy(off).is_none(), "no policy");
}

#[test]
fn none_unless_enabled() {
    assert!(build(MemcachedSpec::default()).is_none());
    assert!(build(spec(NetworkPolicyConfig::default(), true)).is_none());
}

#[test]
fn peers_take_selectors_or_an_ip_block_alone() {
    let with = |client: AllowedClient| {
        spec(
            NetworkPolicyConfig {
                allowed_clients: vec![
                    AllowedClient {
                        pod_selector: Some(LabelSelector::default()),
                        ..AllowedClient::default()
                    },
                    client,
                ],
                ..enabled()
            },
            false,
        )
    };
    let block = || {
        Some(IPBlock {
            cidr: "192.168.0.0/16".into(),
            except: None,
        })
    };
    let message = validate(&with(AllowedClient::default()))
        .unwrap_err()
        .message;
    assert!(message.contains("allowedClients[1]"), "{message}");
    let mixed = AllowedClient {
        namespace_selector: Some(LabelSelector::default()),
        ip_block: block(),
        ..AllowedClient::default()
    };
    assert!(validate(&with(mixed)).is_err());
    let ip_only = AllowedClient {
        ip_block: block(),
        ..AllowedClient::default()
    };
    validate(&with(ip_only)).unwrap();
    // Checked while disabled too, as the CEL rule is: enabling it later cannot fail at apply time.
    let mut off = with(AllowedClient::default());
    off.security
        .as_mut()
        .unwrap()
        .network_policy
        .as_mut()
        .unwrap()
        .enabled = false;
    assert!(validate(&off).is_err());
}
