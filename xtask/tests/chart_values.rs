//! The chart's install options, rendered by Helm's engine: each switch changes what it should, and
//! `values.schema.json` refuses wrong values naming their path.

mod common;

use common::helm::{self, NAMESPACE, find, refusal};
use serde_json::{Value, json};
use xtask::install::{self, manager_container, operator_deployment};

const MANAGER_ROLE: &str = "memcached-operator-manager-role";
const LEADER_ROLE: &str = "memcached-operator-leader-election-role";

fn args(objects: &[Value]) -> Vec<String> {
    let deployment = operator_deployment(objects).unwrap();
    manager_container(deployment).unwrap()["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_owned())
        .collect()
}

fn env_names(objects: &[Value]) -> Vec<String> {
    let deployment = operator_deployment(objects).unwrap();
    manager_container(deployment).unwrap()["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn namespace_scope_grants_the_manager_rules_by_a_role_in_the_release_namespace() {
    let (Some(cluster), Some(namespaced)) = (
        helm::render(json!({})),
        helm::render(json!({"watch": {"scope": "namespace"}})),
    ) else {
        return;
    };
    let (cluster, namespaced) = (cluster.objects().unwrap(), namespaced.objects().unwrap());
    assert!(find(&namespaced, "ClusterRole", MANAGER_ROLE).is_none());
    assert!(
        find(
            &namespaced,
            "ClusterRoleBinding",
            "memcached-operator-manager-rolebinding"
        )
        .is_none()
    );
    let role = find(&namespaced, "Role", MANAGER_ROLE).expect("a Role manager-role");
    assert_eq!(role["metadata"]["namespace"], NAMESPACE);
    assert_eq!(
        role["rules"],
        find(&cluster, "ClusterRole", MANAGER_ROLE).unwrap()["rules"],
        "the Role has exactly the ClusterRole's rules"
    );
    let binding = find(
        &namespaced,
        "RoleBinding",
        "memcached-operator-manager-rolebinding",
    )
    .unwrap();
    assert_eq!(binding["roleRef"]["kind"], "Role");
    assert!(env_names(&namespaced).contains(&"WATCH_NAMESPACE".to_owned()));
    assert!(!env_names(&cluster).contains(&"WATCH_NAMESPACE".to_owned()));
    // TokenReviews and SubjectAccessReviews are cluster-scoped: that ClusterRole stays.
    assert!(
        find(
            &namespaced,
            "ClusterRole",
            "memcached-operator-metrics-auth-role"
        )
        .is_some()
    );
}

#[test]
fn leader_election_off_drops_the_flag_but_keeps_the_own_namespace_role() {
    let Some(off) = helm::render(json!({"leaderElection": {"enabled": false}, "replicaCount": 1}))
    else {
        return;
    };
    let objects = off.objects().unwrap();
    assert!(!args(&objects).contains(&"--leader-elect".to_owned()));
    // The Role in the operator's namespace also lets it create its digest key Secret, elected or not.
    let role = find(&objects, "Role", LEADER_ROLE).expect("the operator's own-namespace Role");
    assert!(
        role["rules"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["resources"][0] == "secrets"),
        "{role}"
    );
    let Some(on) = helm::render(json!({"replicaCount": 2})) else {
        return;
    };
    let objects = on.objects().unwrap();
    assert!(args(&objects).contains(&"--leader-elect".to_owned()));
    assert!(find(&objects, "Role", LEADER_ROLE).is_some());
    assert_eq!(
        operator_deployment(&objects).unwrap()["spec"]["replicas"],
        2
    );
    let Some(message) = refusal(json!({"leaderElection": {"enabled": false}, "replicaCount": 2}))
    else {
        return;
    };
    assert!(message.contains("leaderElection.enabled"), "{message}");
}

#[test]
fn service_monitor_scrapes_the_metrics_service_with_a_token() {
    let Some(off) = helm::render(json!({})) else {
        return;
    };
    let kinds = |objects: &[Value]| {
        objects
            .iter()
            .filter(|o| o["kind"] == "ServiceMonitor")
            .count()
    };
    assert_eq!(kinds(&off.objects().unwrap()), 0, "off by default");
    // Without a CA or an explicit insecureSkipVerify, the install says what is missing.
    if let Some(error) = helm::refusal(json!({"metrics": {"serviceMonitor": {"enabled": true}}})) {
        assert!(
            error.contains("metrics.serviceMonitor.tlsConfig"),
            "{error}"
        );
    }
    let ca = json!({"secret": {"name": "metrics-server-cert", "key": "ca.crt"}});
    let Some(on) = helm::render(json!({"metrics": {"serviceMonitor": {
        "enabled": true, "labels": {"release": "prom"}, "interval": "30s",
        "tlsConfig": {"ca": ca, "serverName": "op.ns.svc"}}}}))
    else {
        return;
    };
    let objects = on.objects().unwrap();
    let monitor = find(
        &objects,
        "ServiceMonitor",
        "memcached-operator-controller-manager",
    )
    .unwrap();
    assert_eq!(monitor["metadata"]["labels"]["release"], "prom");
    let endpoint = &monitor["spec"]["endpoints"][0];
    assert_eq!(endpoint["port"], "https");
    assert_eq!(endpoint["scheme"], "https");
    assert_eq!(endpoint["interval"], "30s");
    assert!(
        endpoint.get("bearerTokenFile").is_none(),
        "deprecated by the Prometheus Operator"
    );
    // The token of the release's scraper ServiceAccount, bound to metrics-reader.
    let credentials = &endpoint["authorization"]["credentials"];
    assert_eq!(credentials["key"], "token");
    let secret = find(&objects, "Secret", credentials["name"].as_str().unwrap()).unwrap();
    assert_eq!(secret["type"], "kubernetes.io/service-account-token");
    let scraper = secret["metadata"]["annotations"]["kubernetes.io/service-account.name"]
        .as_str()
        .unwrap();
    assert!(find(&objects, "ServiceAccount", scraper).is_some());
    let binding = find(
        &objects,
        "ClusterRoleBinding",
        "memcached-operator-metrics-scraper",
    )
    .unwrap();
    assert_eq!(
        binding["roleRef"]["name"],
        "memcached-operator-metrics-reader"
    );
    assert_eq!(binding["subjects"][0]["name"], scraper);
    assert_eq!(binding["subjects"][0]["namespace"], NAMESPACE);
    assert_eq!(
        endpoint["tlsConfig"]["ca"], ca,
        "verified against the given CA"
    );
    assert!(endpoint["tlsConfig"].get("insecureSkipVerify").is_none());
    assert_eq!(
        endpoint["honorLabels"], true,
        "the operand series keep their memcached pods' namespace and pod labels"
    );
    let service = find(
        &objects,
        "Service",
        "memcached-operator-controller-manager-metrics-service",
    )
    .unwrap();
    for (key, value) in monitor["spec"]["selector"]["matchLabels"]
        .as_object()
        .unwrap()
    {
        assert_eq!(
            &service["metadata"]["labels"][key], value,
            "the monitor selects the Service by {key}"
        );
    }
}

#[test]
fn install_options_reach_the_operator_pod() {
    let Some(rendering) = helm::render(json!({
        "image": {"repository": "registry.test/op", "tag": "v9", "pullPolicy": "Always"},
        "memcachedImage": "memcached:1.6.38",
        "logFormat": "text",
        "logLevel": "debug",
        "extraArgs": ["--concurrency=8"],
        "resources": {"limits": {"memory": "256Mi"}},
        "nodeSelector": {"kubernetes.io/os": "linux"},
        "tolerations": [{"key": "dedicated", "operator": "Exists"}],
        "affinity": {"nodeAffinity": {}},
        "rbac": {"userRoles": false},
        "metrics": {"service": {"enabled": false}},
    })) else {
        return;
    };
    let objects = rendering.objects().unwrap();
    let deployment = operator_deployment(&objects).unwrap();
    let pod = &deployment["spec"]["template"]["spec"];
    let manager = manager_container(deployment).unwrap();
    assert_eq!(manager["image"], "registry.test/op:v9");
    assert_eq!(manager["imagePullPolicy"], "Always");
    // Helm merges maps with the defaults: the other resources stay.
    assert_eq!(manager["resources"]["limits"]["memory"], "256Mi");
    assert_eq!(manager["resources"]["requests"]["memory"], "64Mi");
    let args = args(&objects);
    for arg in ["--log-format=text", "--log-level=debug", "--concurrency=8"] {
        assert!(args.contains(&arg.to_owned()), "{arg} in {args:?}");
    }
    let memcached_image = manager["env"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "MEMCACHED_IMAGE");
    assert_eq!(memcached_image.unwrap()["value"], "memcached:1.6.38");
    // The proxy pods run the operator's own image: the operator is told which one it is.
    assert_eq!(
        install::manager_env(deployment, "OPERATOR_IMAGE"),
        Some("registry.test/op:v9")
    );
    assert_eq!(pod["nodeSelector"]["kubernetes.io/os"], "linux");
    assert_eq!(pod["tolerations"][0]["key"], "dedicated");
    assert!(pod["affinity"]["nodeAffinity"].is_object());
    assert!(
        find(
            &objects,
            "ClusterRole",
            "memcached-operator-memcached-editor-role"
        )
        .is_none()
    );
    assert!(objects.iter().all(|o| o["kind"] != "Service"));
}

#[test]
fn a_string_for_replica_count_is_refused_with_its_path() {
    let Some(message) = refusal(json!({"replicaCount": "two"})) else {
        return;
    };
    assert!(message.contains("/replicaCount"), "{message}");
    assert!(message.contains("want integer"), "{message}");
}

#[test]
fn a_misspelt_key_is_refused_with_its_name() {
    for (values, named) in [
        (json!({"replicaCont": 1}), "replicaCont"),
        (json!({"image": {"tagg": "v1"}}), "tagg"),
        (
            json!({"metrics": {"serviceMonitor": {"enable": true}}}),
            "enable",
        ),
    ] {
        let Some(message) = refusal(values.clone()) else {
            return;
        };
        assert!(message.contains(named), "{values}: {message}");
    }
    let Some(message) = refusal(json!({"watch": {"scope": "everywhere"}})) else {
        return;
    };
    assert!(message.contains("/watch/scope"), "{message}");
}

#[test]
fn a_release_name_without_the_chart_name_prefixes_the_objects() {
    let rendering = match xtask::helm::render(
        &common::repo(xtask::chart::CHART_DIR),
        &json!({}),
        "cache-team",
        "caches",
    ) {
        Err(xtask::helm::Error::Unavailable(reason)) => return helm::skip(&reason),
        other => other.unwrap(),
    };
    let objects = rendering.objects().unwrap();
    let deployment = operator_deployment(&objects).unwrap();
    assert_eq!(
        deployment["metadata"]["name"],
        "cache-team-memcached-operator-controller-manager"
    );
    assert_eq!(deployment["metadata"]["namespace"], "caches");
    for object in &objects {
        let name = object["metadata"]["name"].as_str().unwrap();
        assert!(name.len() <= 63, "{name} is longer than a DNS label");
    }
}
