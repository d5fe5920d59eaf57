//! The chart's opt-in policies for the operator itself, rendered by Helm's engine: the
//! ValidatingAdmissionPolicy (`admissionPolicy.enabled`) is the one the code generates
//! (`memcached_operator::manifests::admission`) and `config/admission-policy` ships, its match condition
//! naming the release's ServiceAccount; the NetworkPolicy (`networkPolicy.enabled`) admits what
//! `config/network-policy` admits. Both are off by default.

mod common;

use common::helm::{self, NAMESPACE, installed};
use common::{normalize, read, yaml_docs};
use memcached_operator::manifests::admission;
use serde_json::{Value, json};

fn of_kind<'a>(objects: &'a [Value], kind: &str) -> Vec<&'a Value> {
    objects.iter().filter(|o| o["kind"] == kind).collect()
}

#[test]
fn neither_policy_is_rendered_by_default() {
    let Some(rendering) = helm::render(json!({})) else {
        return;
    };
    let objects = installed(&rendering);
    for kind in [
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
        "NetworkPolicy",
    ] {
        assert!(
            of_kind(&objects, kind).is_empty(),
            "{kind} rendered by default"
        );
    }
}

#[test]
fn the_admission_policy_is_the_generated_one_for_the_releases_service_account() {
    let values = json!({"admissionPolicy": {"enabled": true}, "serviceAccount": {"name": "op"}});
    let Some(rendering) = helm::render(values) else {
        return;
    };
    let objects = installed(&rendering);
    let policies = of_kind(&objects, "ValidatingAdmissionPolicy");
    let bindings = of_kind(&objects, "ValidatingAdmissionPolicyBinding");
    assert_eq!((policies.len(), bindings.len()), (1, 1));
    let (policy, binding) = (policies[0], bindings[0]);
    let name = policy["metadata"]["name"].as_str().unwrap();
    let expected = admission::policy(name, NAMESPACE, "op");
    assert_eq!(
        normalize(&policy["spec"]),
        normalize(&json!(expected.spec)),
        "the chart's policy is not the generated one"
    );
    assert_eq!(
        policy["spec"]["matchConditions"][0]["expression"],
        admission::match_condition(NAMESPACE, "op")
    );
    assert_eq!(binding["spec"]["policyName"], name);
    assert_eq!(binding["spec"]["validationActions"], json!(["Deny"]));
    for object in [policy, binding] {
        let version = object["apiVersion"].as_str().unwrap();
        assert!(
            version == "admissionregistration.k8s.io/v1"
                || version == "admissionregistration.k8s.io/v1beta1",
            "{version}"
        );
    }
}

#[test]
fn the_default_release_ships_the_kustomize_admission_policy() {
    let Some(rendering) = helm::render(json!({"admissionPolicy": {"enabled": true}})) else {
        return;
    };
    let objects = installed(&rendering);
    let chart = of_kind(&objects, "ValidatingAdmissionPolicy")[0];
    let kustomize = yaml_docs(&read(admission::ADMISSION_POLICY_PATH));
    let committed = kustomize
        .iter()
        .find(|o| o["kind"] == "ValidatingAdmissionPolicy")
        .expect("the committed policy");
    assert_eq!(normalize(&chart["spec"]), normalize(&committed["spec"]));
    assert_eq!(chart["metadata"]["name"], committed["metadata"]["name"]);
}

#[test]
fn the_network_policy_admits_scrapes_from_the_selected_namespaces_only() {
    let selector = json!({"matchLabels": {"kubernetes.io/metadata.name": "prometheus"}});
    let values = json!({"networkPolicy": {"enabled": true, "metricsNamespaceSelector": selector}});
    let Some(rendering) = helm::render(values) else {
        return;
    };
    let objects = installed(&rendering);
    let policies = of_kind(&objects, "NetworkPolicy");
    assert_eq!(policies.len(), 1);
    let spec = &policies[0]["spec"];
    assert_eq!(spec["policyTypes"], json!(["Ingress"]));
    assert_eq!(
        spec["podSelector"]["matchLabels"]["control-plane"],
        "controller-manager"
    );
    assert_eq!(
        spec["ingress"],
        json!([{"from": [{"namespaceSelector": selector}],
                "ports": [{"protocol": "TCP", "port": 8443}]}])
    );

    // The kustomize component admits the same, from the `monitoring` namespace.
    let component = yaml_docs(&read("config/network-policy/network_policy.yaml")).remove(0);
    let mut ingress = component["spec"]["ingress"].clone();
    ingress[0]["from"][0]["namespaceSelector"] = selector;
    assert_eq!(spec["ingress"], ingress);
    assert_eq!(spec["policyTypes"], component["spec"]["policyTypes"]);
}
