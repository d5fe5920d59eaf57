//! The chart's `helm test` (templates/tests/), rendered by Helm's engine: a pod of the operator's image
//! runs `memcached-operator check` for this release's objects, meets the `restricted` Pod Security
//! Standard, and runs under a ServiceAccount and Role of its own that allow what the check does and no
//! more, in the namespace the operator watches too; every object is a hook of `helm test` only.
//! tests/envtest/chart_actions.rs runs it with Helm's own action against a real API server.

mod common;

use std::collections::BTreeSet;

use common::helm::{self, find, refusal};
use serde_json::{Value, json};
use xtask::install::{manager_container, operator_deployment};

/// The test hooks of a rendering of `values`, and the operator's Deployment; `None` when skipped.
fn render(values: Value) -> Option<(Vec<Value>, Value)> {
    let rendering = helm::render(values)?;
    let objects = rendering.objects().unwrap();
    let deployment = operator_deployment(&objects).unwrap().clone();
    Some((rendering.test_hooks().unwrap(), deployment))
}

const NAME: &str = "memcached-operator-helm-test";

fn strings(value: &Value) -> Vec<String> {
    value
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_owned())
        .collect()
}

/// `verb resource name` for every permission of `role` (`*` for a rule without resourceNames).
fn permissions(role: &Value) -> BTreeSet<String> {
    let mut granted = BTreeSet::new();
    for rule in role["rules"].as_array().unwrap() {
        let names = rule
            .get("resourceNames")
            .map(strings)
            .unwrap_or_else(|| vec!["*".to_owned()]);
        for verb in strings(&rule["verbs"]) {
            for resource in strings(&rule["resources"]) {
                for name in &names {
                    granted.insert(format!("{verb} {resource} {name}"));
                }
            }
        }
    }
    granted
}

#[test]
fn helm_test_checks_this_release_from_the_operators_image_restricted() {
    let Some((hooks, deployment)) = render(json!({})) else {
        return;
    };
    let ids: BTreeSet<String> = hooks.iter().map(common::id).collect();
    let expected: BTreeSet<String> = ["ServiceAccount", "Role", "RoleBinding", "Pod"]
        .iter()
        .map(|kind| format!("{kind} {}/{NAME}", helm::NAMESPACE))
        .collect();
    assert_eq!(ids, expected);
    for hook in &hooks {
        let annotations = &hook["metadata"]["annotations"];
        assert_eq!(annotations["helm.sh/hook"], "test", "{}", common::id(hook));
        assert_eq!(
            annotations["helm.sh/hook-delete-policy"],
            "before-hook-creation,hook-succeeded",
            "{}",
            common::id(hook)
        );
        assert_eq!(hook["metadata"]["namespace"], helm::NAMESPACE);
    }
    let pod = find(&hooks, "Pod", NAME).unwrap();
    let spec = &pod["spec"];
    assert_eq!(spec["restartPolicy"], "Never");
    assert_eq!(spec["serviceAccountName"], NAME);
    assert_eq!(spec["automountServiceAccountToken"], true);
    let manager = manager_container(&deployment).unwrap();
    let container = &spec["containers"][0];
    assert_eq!(container["image"], manager["image"], "the operator's image");
    assert_eq!(container["command"], manager["command"]);
    assert_eq!(
        strings(&container["args"]),
        [
            "check",
            "--namespace=memcached-operator-system",
            "--deployment=memcached-operator-controller-manager",
            "--lease=memcached-operator.cache.example.com",
            "--instance=memcached-operator-helm-test",
            "--timeout=2m",
        ]
    );
    // restricted: non-root, RuntimeDefault seccomp, no privilege escalation, no capabilities, read-only root.
    assert_eq!(spec["securityContext"]["runAsNonRoot"], true);
    assert_eq!(
        spec["securityContext"]["seccompProfile"]["type"],
        "RuntimeDefault"
    );
    let security = &container["securityContext"];
    assert_eq!(security["allowPrivilegeEscalation"], false);
    assert_eq!(security["readOnlyRootFilesystem"], true);
    assert_eq!(security["capabilities"]["drop"], json!(["ALL"]));
    assert!(container["resources"]["limits"]["memory"].is_string());

    // What the check reads and writes, by name wherever Kubernetes allows it.
    let role = find(&hooks, "Role", NAME).unwrap();
    assert_eq!(
        permissions(role),
        [
            "get deployments memcached-operator-controller-manager",
            "get leases memcached-operator.cache.example.com",
            "get pods *",
            "create memcacheds *",
            "get memcacheds memcached-operator-helm-test",
            "delete memcacheds memcached-operator-helm-test",
        ]
        .iter()
        .map(|p| (*p).to_owned())
        .collect::<BTreeSet<_>>()
    );
    let binding = find(&hooks, "RoleBinding", NAME).unwrap();
    assert_eq!(binding["roleRef"]["name"], NAME);
    assert_eq!(binding["subjects"][0]["name"], NAME);
}

#[test]
fn helm_test_follows_the_watched_namespace_and_leader_election() {
    let Some((hooks, _)) = render(json!({
        "watch": {"scope": "namespace", "namespace": "apps"},
        "leaderElection": {"enabled": false},
        "tests": {"timeout": "90s"},
    })) else {
        return;
    };
    let pod = find(&hooks, "Pod", NAME).unwrap();
    let args = strings(&pod["spec"]["containers"][0]["args"]);
    assert!(
        args.contains(&"--instance-namespace=apps".to_owned()),
        "{args:?}"
    );
    assert!(args.contains(&"--timeout=90s".to_owned()), "{args:?}");
    assert!(!args.iter().any(|a| a.starts_with("--lease")), "{args:?}");
    let roles: Vec<&Value> = hooks.iter().filter(|o| o["kind"] == "Role").collect();
    assert_eq!(roles.len(), 2, "one Role in each namespace");
    for role in roles {
        let granted = permissions(role);
        let bindings: Vec<&Value> = hooks
            .iter()
            .filter(|o| {
                o["kind"] == "RoleBinding"
                    && o["metadata"]["namespace"] == role["metadata"]["namespace"]
            })
            .collect();
        assert_eq!(bindings.len(), 1);
        assert_eq!(bindings[0]["subjects"][0]["namespace"], helm::NAMESPACE);
        if role["metadata"]["namespace"] == "apps" {
            assert!(
                granted.iter().all(|p| p.contains(" memcacheds ")),
                "{granted:?}"
            );
        } else {
            assert!(
                !granted.iter().any(|p| p.contains(" memcacheds ")),
                "{granted:?}"
            );
            assert!(
                !granted.iter().any(|p| p.contains(" leases ")),
                "{granted:?}"
            );
        }
    }

    let Some((none, _)) = render(json!({"tests": {"enabled": false}})) else {
        return;
    };
    assert!(none.is_empty(), "tests.enabled=false renders no hook");
    let Some(message) = refusal(json!({"tests": {"timeout": "soon"}})) else {
        return;
    };
    assert!(message.contains("/tests/timeout"), "{message}");
}
