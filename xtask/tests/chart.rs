//! The Helm chart `charts/memcached-operator`: its generated files are current, its version is the
//! operator's, Helm's engine lints it, and its default rendering installs what `kubectl kustomize
//! config/default` does (the same objects, rules and operator container), the Namespace aside.

mod common;

use std::collections::BTreeSet;

use common::helm::{self, NAMESPACE, find, installed};
use common::{STALE, id, normalize, read, repo, yaml_docs};
use memcached_operator::VERSION;
use serde_json::{Value, json};
use xtask::chart::{self, CHART_DIR};
use xtask::install::{self, default_operator_image};

#[test]
fn committed_chart_files_match_xtask() {
    for (path, content) in chart::files().unwrap() {
        assert!(read(&path) == content, "{path} {STALE}");
    }
}

#[test]
fn chart_version_and_app_version_are_the_crate_version() {
    let chart = yaml_docs(&read(&format!("{CHART_DIR}/Chart.yaml"))).remove(0);
    assert_eq!(chart["apiVersion"], "v2", "Helm 3 and 4 read v2 charts");
    assert_eq!(chart["version"], VERSION, "Chart.yaml version");
    assert_eq!(chart["appVersion"], VERSION, "Chart.yaml appVersion");
}

#[test]
fn chart_lints_without_warnings_with_defaults_and_every_switch_on() {
    let everything = json!({
        "watch": {"scope": "namespace"},
        "metrics": {"serviceMonitor": {"enabled": true, "tlsConfig": {"insecureSkipVerify": true}}},
        "grafana": {"dashboards": {"enabled": true}},
        "prometheusRule": {"enabled": true},
    });
    for values in [json!({}), everything] {
        let findings = match xtask::helm::lint(&repo(CHART_DIR), &values) {
            Err(xtask::helm::Error::Unavailable(reason)) => return helm::skip(&reason),
            other => other.unwrap(),
        };
        // Severity 1 is information ("icon is recommended"); 2 a warning, 3 an error.
        let serious: Vec<_> = findings.iter().filter(|(s, _, _)| *s >= 2).collect();
        assert!(
            serious.is_empty(),
            "helm lint --strict with {values}: {serious:#?}"
        );
    }
}

/// `kind name` of each object the install creates; kustomize's Namespace is left out (`helm install
/// --create-namespace` creates it).
fn kinds_and_names(objects: &[Value]) -> BTreeSet<String> {
    objects
        .iter()
        .filter(|o| o["kind"] != "Namespace")
        .map(id)
        .collect()
}

#[test]
fn default_rendering_installs_the_objects_of_config_default() {
    let Some(rendering) = helm::render(json!({})) else {
        return;
    };
    let chart = installed(&rendering);
    let kustomize = install::install(&default_operator_image()).unwrap();
    assert_eq!(
        kinds_and_names(&chart),
        kinds_and_names(&kustomize),
        "release {} in {NAMESPACE} must create config/default's objects under the same names",
        helm::RELEASE
    );
    for theirs in &kustomize {
        let kind = theirs["kind"].as_str().unwrap();
        let name = theirs["metadata"]["name"].as_str().unwrap();
        let Some(ours) = find(&chart, kind, name) else {
            continue; // the Namespace
        };
        match kind {
            "CustomResourceDefinition" => {
                assert_eq!(
                    normalize(&ours["spec"]),
                    normalize(&theirs["spec"]),
                    "the CRD"
                )
            }
            "ClusterRole" | "Role" => assert_eq!(ours["rules"], theirs["rules"], "{}", id(ours)),
            "ClusterRoleBinding" | "RoleBinding" => {
                assert_eq!(ours["roleRef"], theirs["roleRef"], "{}", id(ours));
                assert_eq!(ours["subjects"], theirs["subjects"], "{}", id(ours));
            }
            "Service" => assert_eq!(ours["spec"]["ports"], theirs["spec"]["ports"]),
            _ => {}
        }
    }
    let aggregation = |objects: &[Value], name: &str| {
        find(objects, "ClusterRole", name).unwrap()["metadata"]["labels"]
            .as_object()
            .unwrap()
            .iter()
            .filter(|(k, _)| k.starts_with("rbac.authorization.k8s.io/"))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect::<Vec<_>>()
    };
    for role in [
        "memcached-operator-memcached-editor-role",
        "memcached-operator-memcached-viewer-role",
    ] {
        assert_eq!(
            aggregation(&chart, role),
            aggregation(&kustomize, role),
            "{role}"
        );
    }
}

#[test]
fn default_rendering_runs_the_operator_as_config_default_does() {
    let Some(rendering) = helm::render(json!({})) else {
        return;
    };
    let objects = rendering.objects().unwrap();
    let kustomize = install::install(&default_operator_image()).unwrap();
    let ours = install::operator_deployment(&objects).unwrap();
    let theirs = install::operator_deployment(&kustomize).unwrap();
    let (ours_pod, theirs_pod) = (
        &ours["spec"]["template"]["spec"],
        &theirs["spec"]["template"]["spec"],
    );
    for field in ["securityContext", "terminationGracePeriodSeconds"] {
        assert_eq!(ours_pod[field], theirs_pod[field], "pod {field}");
    }
    assert_eq!(ours["spec"]["replicas"], theirs["spec"]["replicas"]);
    let (ours, theirs) = (
        install::manager_container(ours).unwrap(),
        install::manager_container(theirs).unwrap(),
    );
    for field in [
        "image",
        "imagePullPolicy",
        "command",
        "args",
        "env",
        "ports",
        "livenessProbe",
        "readinessProbe",
        "securityContext",
        "resources",
    ] {
        assert_eq!(ours[field], theirs[field], "container {field}");
    }
    // The Service reaches the pods.
    let service = find(
        &objects,
        "Service",
        "memcached-operator-controller-manager-metrics-service",
    )
    .unwrap();
    let pod_labels =
        &install::operator_deployment(&objects).unwrap()["spec"]["template"]["metadata"]["labels"];
    for (key, value) in service["spec"]["selector"].as_object().unwrap() {
        assert_eq!(
            &pod_labels[key], value,
            "the Service selects the pods by {key}"
        );
    }
    // The CRD is a template (so `helm upgrade` updates it), kept on uninstall; nothing is left in crds/.
    let crd = find(
        &objects,
        "CustomResourceDefinition",
        "memcacheds.cache.example.com",
    )
    .expect("the CRD among the templates");
    assert_eq!(
        crd["metadata"]["annotations"]["helm.sh/resource-policy"],
        "keep"
    );
    assert!(crd["metadata"]["annotations"].get("helm.sh/hook").is_none());
    assert!(rendering.crd_objects().unwrap().is_empty());
}

#[test]
fn notes_say_how_to_create_a_first_cache() {
    let Some(rendering) = helm::render(json!({})) else {
        return;
    };
    let notes = &rendering.notes;
    for needle in [
        "kubectl apply -n default -f -",
        "memcached-operator-metrics-reader",
    ] {
        assert!(notes.contains(needle), "NOTES lack {needle:?}:\n{notes}");
    }
    // The object the NOTES pipe into kubectl is a valid Memcached.
    let object = notes
        .split_once("echo '")
        .and_then(|(_, rest)| rest.split_once("' |"))
        .map(|(object, _)| object)
        .unwrap_or_else(|| panic!("NOTES show no object to apply:\n{notes}"));
    let memcached: memcached_operator::api::Memcached =
        serde_json::from_str(object).unwrap_or_else(|e| panic!("{object}: {e}"));
    assert_eq!(memcached.spec.size, 3);
}
