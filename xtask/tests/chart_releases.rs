//! Releases of the chart side by side, and the values platform teams set, rendered by Helm's engine: every
//! cluster-scoped name and the Lease derive from the release, and each value changes what it should.

mod common;

use std::collections::BTreeSet;

use common::helm::{self, find, refusal};
use serde_json::{Value, json};
use xtask::chart::CHART_DIR;
use xtask::helm::Error;
use xtask::install::{self, manager_container, operator_deployment};

/// The objects of the chart rendered as `release` in `namespace`; `None` when skipped.
fn render_as(values: Value, release: &str, namespace: &str) -> Option<Vec<Value>> {
    match xtask::helm::render(&common::repo(CHART_DIR), &values, release, namespace) {
        Err(Error::Unavailable(reason)) => {
            helm::skip(&reason);
            None
        }
        other => Some(other.unwrap().objects().unwrap()),
    }
}

const CLUSTER_KINDS: &[&str] = &["ClusterRole", "ClusterRoleBinding"];

/// `Kind/name` of every cluster-scoped object but the CRD (which the releases share).
fn cluster_scoped(objects: &[Value]) -> BTreeSet<String> {
    objects
        .iter()
        .filter(|o| CLUSTER_KINDS.contains(&o["kind"].as_str().unwrap()))
        .map(|o| {
            format!(
                "{}/{}",
                o["kind"].as_str().unwrap(),
                o["metadata"]["name"].as_str().unwrap()
            )
        })
        .collect()
}

fn args(objects: &[Value]) -> Vec<String> {
    manager_container(operator_deployment(objects).unwrap()).unwrap()["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn releases_of_one_name_in_two_namespaces_share_no_cluster_scoped_name() {
    let scoped = json!({"watch": {"scope": "namespace"}});
    let (Some(a), Some(b)) = (
        render_as(scoped.clone(), "cache", "team-a"),
        render_as(scoped, "cache", "team-b"),
    ) else {
        return;
    };
    let (a_names, b_names) = (cluster_scoped(&a), cluster_scoped(&b));
    assert!(!a_names.is_empty());
    assert!(
        a_names.is_disjoint(&b_names),
        "{:?}",
        a_names.intersection(&b_names).collect::<Vec<_>>()
    );
    assert!(
        a_names.contains("ClusterRole/cache-memcached-operator-team-a-metrics-reader"),
        "{a_names:?}"
    );
    // Each binding names its own release's ServiceAccount and role.
    for binding in a.iter().filter(|o| o["kind"] == "ClusterRoleBinding") {
        assert!(
            binding["roleRef"]["name"]
                .as_str()
                .unwrap()
                .contains("team-a"),
            "{binding}"
        );
    }
}

#[test]
fn two_releases_in_one_namespace_lead_their_own_lease_and_share_no_name() {
    let (Some(a), Some(b)) = (
        render_as(
            json!({"watch": {"scope": "namespace", "namespace": "apps-a"}}),
            "a",
            "ops",
        ),
        render_as(
            json!({"watch": {"scope": "namespace", "namespace": "apps-b"}}),
            "b",
            "ops",
        ),
    ) else {
        return;
    };
    let lease = |objects: &[Value]| {
        args(objects)
            .into_iter()
            .find_map(|a| a.strip_prefix("--leader-election-id=").map(str::to_owned))
            .expect("a Lease of the release's own")
    };
    assert_eq!(lease(&a), "a-memcached-operator.cache.example.com");
    assert_eq!(lease(&b), "b-memcached-operator.cache.example.com");
    // The CRD aside: one per cluster, rendered by both but owned by the first (templates/crds.yaml).
    let names = |objects: &[Value]| -> BTreeSet<String> {
        objects
            .iter()
            .filter(|o| o["kind"] != "CustomResourceDefinition")
            .map(common::id)
            .collect()
    };
    assert!(names(&a).is_disjoint(&names(&b)));
    // Each watches its own namespace, where its manager Role is; the digest key stays readable at home.
    let role = find(&a, "Role", "a-memcached-operator-manager-role").unwrap();
    assert_eq!(role["metadata"]["namespace"], "apps-a");
    let env = &manager_container(operator_deployment(&a).unwrap()).unwrap()["env"];
    let watch = env
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "WATCH_NAMESPACE")
        .unwrap();
    assert_eq!(watch["value"], "apps-a");
    let home = find(&a, "Role", "a-memcached-operator-leader-election-role").unwrap();
    assert!(
        home["rules"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["resourceNames"][0] == "memcached-operator-digest-key"
                && r["verbs"][0] == "get"),
        "{home}"
    );
    // The default release keeps the operator's default Lease (config/default's).
    let Some(default) = helm::render(json!({})) else {
        return;
    };
    let default = default.objects().unwrap();
    assert!(
        !args(&default)
            .iter()
            .any(|a| a.starts_with("--leader-election-id"))
    );
}

#[test]
fn the_dashboard_uid_is_one_per_release_unless_set() {
    let on = json!({"grafana": {"dashboards": {"enabled": true}}});
    let uid = |objects: &[Value]| -> String {
        let map = objects.iter().find(|o| o["kind"] == "ConfigMap").unwrap();
        let dashboard: Value =
            serde_json::from_str(map["data"]["memcached-operator.json"].as_str().unwrap()).unwrap();
        assert!(
            dashboard["panels"]
                .as_array()
                .is_some_and(|p| !p.is_empty())
        );
        dashboard["uid"].as_str().unwrap().to_owned()
    };
    let (Some(a), Some(b), Some(set)) = (
        render_as(on.clone(), "cache", "team-a"),
        render_as(on, "cache", "team-b"),
        render_as(
            json!({"grafana": {"dashboards": {"enabled": true, "uid": "mine"}}}),
            "cache",
            "team-a",
        ),
    ) else {
        return;
    };
    assert_ne!(uid(&a), uid(&b));
    assert!(uid(&a).len() <= 40);
    assert_eq!(uid(&set), "mine");
}

#[test]
fn crds_enabled_and_keep_decide_the_crd_template() {
    let crd = |objects: &[Value]| {
        find(
            objects,
            "CustomResourceDefinition",
            "memcacheds.cache.example.com",
        )
        .cloned()
    };
    let (Some(off), Some(unkept)) = (
        render_as(json!({"crds": {"enabled": false}}), "cache", "caches"),
        render_as(json!({"crds": {"keep": false}}), "cache", "caches"),
    ) else {
        return;
    };
    assert!(crd(&off).is_none());
    let unkept = crd(&unkept).unwrap();
    assert!(
        unkept["metadata"]["annotations"]
            .get("helm.sh/resource-policy")
            .is_none(),
        "{}",
        unkept["metadata"]
    );
    assert_eq!(
        unkept["metadata"]["labels"]["app.kubernetes.io/instance"],
        "cache"
    );
}

#[test]
fn values_platform_teams_set_reach_the_objects() {
    let Some(objects) = render_as(
        json!({
            "global": {"imageRegistry": "mirror.test:5000"},
            "image": {"digest": format!("sha256:{}", "a".repeat(64))},
            "commonLabels": {"team": "caches"},
            "commonAnnotations": {"owner": "platform"},
            "serviceAccount": {"create": false, "name": "ops-sa"},
            "automountServiceAccountToken": false,
            "extraVolumes": [{"name": "certs", "secret": {"secretName": "metrics-cert"}}],
            "extraVolumeMounts": [{"name": "certs", "mountPath": "/certs"}],
            "replicaCount": 2,
            "metrics": {"readers": [{"name": "prometheus-k8s", "namespace": "monitoring"}]},
        }),
        "cache",
        "caches",
    ) else {
        return;
    };
    let deployment = operator_deployment(&objects).unwrap();
    let pod = &deployment["spec"]["template"]["spec"];
    let manager = manager_container(deployment).unwrap();
    assert_eq!(
        manager["image"],
        format!(
            "mirror.test:5000/memcached-operator@sha256:{}",
            "a".repeat(64)
        )
    );
    let memcached_image = manager["env"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "MEMCACHED_IMAGE")
        .unwrap();
    assert_eq!(
        memcached_image["value"],
        "mirror.test:5000/memcached:1.6-alpine"
    );
    assert_eq!(
        install::manager_env(deployment, "OPERATOR_IMAGE"),
        manager["image"].as_str(),
        "the operator is told its own image, under global.imageRegistry too"
    );
    assert_eq!(pod["serviceAccountName"], "ops-sa");
    assert_eq!(pod["automountServiceAccountToken"], false);
    assert!(objects.iter().all(|o| o["kind"] != "ServiceAccount"));
    assert_eq!(pod["volumes"][0]["name"], "certs");
    assert_eq!(manager["volumeMounts"][0]["mountPath"], "/certs");
    assert_eq!(
        pod["topologySpreadConstraints"][0]["topologyKey"],
        "kubernetes.io/hostname"
    );
    let pdb = find(
        &objects,
        "PodDisruptionBudget",
        "cache-memcached-operator-controller-manager",
    )
    .unwrap();
    assert_eq!(pdb["spec"]["minAvailable"], 1);
    for object in &objects {
        assert_eq!(
            object["metadata"]["labels"]["team"],
            "caches",
            "{}",
            common::id(object)
        );
        assert_eq!(
            object["metadata"]["annotations"]["owner"],
            "platform",
            "{}",
            common::id(object)
        );
    }
    let reader = objects
        .iter()
        .find(|o| o["kind"] == "ClusterRoleBinding" && o["subjects"][0]["name"] == "prometheus-k8s")
        .expect("metrics-reader bound to Prometheus's ServiceAccount");
    assert_eq!(
        reader["roleRef"]["name"],
        "cache-memcached-operator-caches-metrics-reader"
    );
    assert_eq!(reader["subjects"][0]["namespace"], "monitoring");
    // The bindings name the ServiceAccount the pod runs as.
    let binding = objects
        .iter()
        .find(|o| o["kind"] == "ClusterRoleBinding")
        .unwrap();
    assert_eq!(binding["subjects"][0]["name"], "ops-sa");

    // One replica: no budget, no spread; rbac.create false: no role at all.
    let Some(single) = render_as(json!({"rbac": {"create": false}}), "cache", "caches") else {
        return;
    };
    assert!(single.iter().all(|o| o["kind"] != "PodDisruptionBudget"));
    let pod = &operator_deployment(&single).unwrap()["spec"]["template"]["spec"];
    assert!(pod.get("topologySpreadConstraints").is_none());
    assert!(single.iter().all(|o| {
        !["Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"]
            .contains(&o["kind"].as_str().unwrap())
    }));
}

#[test]
fn cert_manager_certificate_is_served_and_verified() {
    let Some(objects) = render_as(
        json!({"metrics": {
            "certManager": {"enabled": true, "issuerRef": {"name": "ca", "kind": "ClusterIssuer"}},
            "serviceMonitor": {"enabled": true}}}),
        "cache",
        "caches",
    ) else {
        return;
    };
    let certificate = find(
        &objects,
        "Certificate",
        "cache-memcached-operator-metrics-cert",
    )
    .unwrap();
    let service = "cache-memcached-operator-controller-manager-metrics-service";
    assert_eq!(
        certificate["spec"]["dnsNames"][0],
        format!("{service}.caches.svc")
    );
    let deployment = operator_deployment(&objects).unwrap();
    assert!(
        args(&objects)
            .contains(&"--metrics-cert-dir=/tmp/k8s-metrics-server/metrics-certs".to_owned())
    );
    assert_eq!(
        deployment["spec"]["template"]["spec"]["volumes"][0]["secret"]["secretName"],
        certificate["spec"]["secretName"]
    );
    let monitor = objects
        .iter()
        .find(|o| o["kind"] == "ServiceMonitor")
        .unwrap();
    let tls = &monitor["spec"]["endpoints"][0]["tlsConfig"];
    assert_eq!(
        tls["ca"]["secret"]["name"],
        certificate["spec"]["secretName"]
    );
    assert_eq!(tls["serverName"], format!("{service}.caches.svc"));
    assert!(tls.get("insecureSkipVerify").is_none());
}

#[test]
fn bad_new_values_are_refused_naming_the_key() {
    for (values, named) in [
        (json!({"crds": {"enabled": "yes"}}), "/crds/enabled"),
        (json!({"image": {"digest": "latest"}}), "/image/digest"),
        (
            json!({"metrics": {"readers": [{"name": "p"}]}}),
            "namespace",
        ),
        (
            json!({"prometheusRule": {"alerts": {"MemcachedEvicting": {"severity": "page"}}}}),
            "/prometheusRule/alerts/MemcachedEvicting/severity",
        ),
        (json!({"serviceAccount": {"craete": true}}), "craete"),
    ] {
        let Some(message) = refusal(values.clone()) else {
            return;
        };
        assert!(message.contains(named), "{values}: {message}");
    }
}
