//! The install tree: generated files match the code, the CRD schema is structural and rejects what it
//! must, the samples are valid Memcached objects, and `kubectl kustomize` renders the install.

mod common;

use common::{read, repo, yaml_docs};

use std::process::Command;

use memcached_operator::api::Memcached;
use memcached_operator::manifests;
use serde_json::{Value, json};

#[test]
fn committed_crd_matches_the_binary() {
    assert!(
        read(manifests::CRD_PATH) == manifests::crd_yaml().unwrap(),
        "{} is stale: run `make manifests` and commit the result",
        manifests::CRD_PATH
    );
}

#[test]
fn committed_rbac_matches_the_binary() {
    assert!(
        read(manifests::RBAC_PATH) == manifests::rbac_yaml().unwrap(),
        "{} is stale: run `make manifests` and commit the result",
        manifests::RBAC_PATH
    );
}

fn schema() -> Value {
    let crd = yaml_docs(&read(manifests::CRD_PATH)).remove(0);
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"].clone()
}

/// The rules of a structural schema (Kubernetes docs, "Specifying a structural schema"), which a v1 CRD
/// must follow to be accepted.
fn assert_structural(node: &Value, path: &str, in_junctor: bool) {
    let Some(obj) = node.as_object() else {
        panic!("{path}: schema node is not an object")
    };
    for forbidden in [
        "$ref",
        "definitions",
        "$schema",
        "id",
        "patternProperties",
        "dependencies",
    ] {
        assert!(
            !obj.contains_key(forbidden),
            "{path}: {forbidden} is not allowed"
        );
    }
    let exempt = obj.get("x-kubernetes-int-or-string") == Some(&json!(true))
        || obj.get("x-kubernetes-preserve-unknown-fields") == Some(&json!(true));
    if in_junctor {
        for key in [
            "description",
            "type",
            "default",
            "additionalProperties",
            "nullable",
        ] {
            assert!(
                !obj.contains_key(key),
                "{path}: {key} inside allOf/anyOf/oneOf/not"
            );
        }
    } else if !exempt {
        let ty = obj.get("type").and_then(Value::as_str).unwrap_or_default();
        assert!(!ty.is_empty(), "{path}: every node needs a type");
        if obj.contains_key("properties") || obj.contains_key("additionalProperties") {
            assert_eq!(ty, "object", "{path}");
        }
        if obj.contains_key("items") {
            assert_eq!(ty, "array", "{path}");
        }
    }
    assert!(
        !(obj.contains_key("properties")
            && obj
                .get("additionalProperties")
                .is_some_and(|a| a != &json!(false))),
        "{path}: properties and additionalProperties are mutually exclusive"
    );
    if let Some(props) = obj.get("properties").and_then(Value::as_object) {
        for (name, child) in props {
            assert_structural(child, &format!("{path}.{name}"), in_junctor);
        }
    }
    if let Some(items) = obj.get("items") {
        assert_structural(items, &format!("{path}[]"), in_junctor);
    }
    if let Some(additional) = obj.get("additionalProperties").filter(|a| a.is_object()) {
        assert_structural(additional, &format!("{path}{{}}"), in_junctor);
    }
    for junctor in ["allOf", "anyOf", "oneOf"] {
        for (i, child) in obj
            .get(junctor)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .enumerate()
        {
            assert_structural(child, &format!("{path}.{junctor}[{i}]"), true);
        }
    }
    if let Some(not) = obj.get("not") {
        assert_structural(not, &format!("{path}.not"), true);
    }
    if obj.get("x-kubernetes-list-type") == Some(&json!("map")) {
        let keys = obj["x-kubernetes-list-map-keys"]
            .as_array()
            .expect("map lists need keys");
        let required = obj["items"]["required"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        for key in keys {
            assert!(
                required.contains(key),
                "{path}: list map key {key} must be required"
            );
        }
    }
}

#[test]
fn crd_schema_is_structural_and_documented() {
    let schema = schema();
    assert_structural(&schema, "openAPIV3Schema", false);
    // `kubectl explain memcached.spec` is useful: every spec and status field says what it is.
    for part in ["spec", "status"] {
        let props = schema["properties"][part]["properties"]
            .as_object()
            .unwrap();
        for (name, field) in props {
            let description = field["description"].as_str().unwrap_or_default();
            assert!(description.len() > 10, "{part}.{name} needs a description");
        }
    }
}

#[test]
fn crd_has_the_tutorial_names_subresources_and_columns() {
    let crd = yaml_docs(&read(manifests::CRD_PATH)).remove(0);
    assert_eq!(crd["metadata"]["name"], "memcacheds.cache.example.com");
    assert_eq!(crd["spec"]["scope"], "Namespaced");
    assert_eq!(crd["spec"]["names"]["shortNames"], json!(["mc"]));
    let version = &crd["spec"]["versions"][0];
    assert_eq!(version["name"], "v1alpha1");
    assert_eq!(version["subresources"]["status"], json!({}));
    assert_eq!(
        version["subresources"]["scale"],
        json!({"specReplicasPath": ".spec.size", "statusReplicasPath": ".status.replicas",
               "labelSelectorPath": ".status.selector"})
    );
    let columns: Vec<&str> = version["additionalPrinterColumns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        columns,
        ["Size", "Ready", "Available", "Hit%", "Mem%", "Age"]
    );
    // The cache-health columns are in the default view (priority 0, left out of the CRD).
    assert!(
        version["additionalPrinterColumns"]
            .as_array()
            .unwrap()
            .iter()
            .all(|c| c.get("priority").is_none_or(|p| p == 0)),
        "{}",
        version["additionalPrinterColumns"]
    );
    // Nothing only newer servers understand, except CEL rules (skipped before 1.25, and each backed by an
    // operator-side check): no selectable fields, no messageExpression/reason/fieldPath on rules.
    let text = read(manifests::CRD_PATH);
    for newer in [
        "selectableFields",
        "messageExpression",
        "fieldPath:",
        "reason: Field",
    ] {
        assert!(
            !text.contains(newer),
            "{newer} needs a newer Kubernetes than 1.24"
        );
    }
}

/// A small validator for the subset of OpenAPI this CRD uses, standing in for the API server's admission
/// checks: unknown fields, types, and numeric and length bounds. Returns the path of the first violation.
fn validate(value: &Value, schema: &Value, path: &str) -> Result<(), String> {
    let ty = schema["type"].as_str().unwrap_or_default();
    if value.is_null() && schema["nullable"] == json!(true) {
        return Ok(());
    }
    if let Some(allowed) = schema["enum"].as_array()
        && !allowed.contains(value)
    {
        return Err(format!("{path}: must be one of {allowed:?}"));
    }
    if schema["x-kubernetes-int-or-string"] == json!(true) {
        return match value {
            Value::Number(_) | Value::String(_) => Ok(()),
            _ => Err(format!("{path}: must be a number or a string")),
        };
    }
    if schema["x-kubernetes-preserve-unknown-fields"] == json!(true) {
        return Ok(());
    }
    match ty {
        "boolean" => {
            value
                .as_bool()
                .ok_or(format!("{path}: must be true or false"))?;
        }
        "number" => {
            value.as_f64().ok_or(format!("{path}: must be a number"))?;
        }
        "object" => {
            let obj = value
                .as_object()
                .ok_or(format!("{path}: must be an object"))?;
            let props = schema["properties"]
                .as_object()
                .cloned()
                .unwrap_or_default();
            for (k, v) in obj {
                let child = match props.get(k) {
                    Some(child) => child,
                    None if schema["additionalProperties"].is_object() => {
                        &schema["additionalProperties"]
                    }
                    None => return Err(format!("{path}.{k}: unknown field")),
                };
                validate(v, child, &format!("{path}.{k}"))?;
            }
            for req in schema["required"].as_array().into_iter().flatten() {
                let req = req.as_str().unwrap_or_default();
                if !obj.contains_key(req) {
                    return Err(format!("{path}.{req}: required"));
                }
            }
        }
        "integer" => {
            let n = value
                .as_i64()
                .ok_or(format!("{path}: must be an integer"))? as f64;
            if let Some(min) = schema["minimum"].as_f64().filter(|m| n < *m) {
                return Err(format!("{path}: must be >= {min}"));
            }
            if let Some(max) = schema["maximum"].as_f64().filter(|m| n > *m) {
                return Err(format!("{path}: must be <= {max}"));
            }
        }
        "string" => {
            let s = value.as_str().ok_or(format!("{path}: must be a string"))?;
            if let Some(min) = schema["minLength"]
                .as_u64()
                .filter(|m| (s.len() as u64) < *m)
            {
                return Err(format!("{path}: shorter than {min}"));
            }
            if let Some(max) = schema["maxLength"]
                .as_u64()
                .filter(|m| (s.len() as u64) > *m)
            {
                return Err(format!("{path}: longer than {max}"));
            }
        }
        "array" => {
            for (i, item) in value
                .as_array()
                .ok_or(format!("{path}: must be a list"))?
                .iter()
                .enumerate()
            {
                validate(item, &schema["items"], &format!("{path}[{i}]"))?;
            }
        }
        other => return Err(format!("{path}: validator does not know type {other:?}")),
    }
    Ok(())
}

fn validate_spec(spec: Value) -> Result<(), String> {
    validate(&spec, &schema()["properties"]["spec"], "spec")
}

#[test]
fn schema_rejects_invalid_input_naming_the_field() {
    let cases = [
        (json!({"size": -1}), "spec.size"),
        (json!({"size": 1000}), "spec.size"),
        (json!({"size": 65}), "spec.size"),
        (json!({"containerPort": 0}), "spec.containerPort"),
        (json!({"containerPort": 65536}), "spec.containerPort"),
        (json!({"size": "three"}), "spec.size"),
        (json!({"image": ""}), "spec.image"),
        (json!({"sise": 3}), "spec.sise"),
    ];
    for (spec, field) in cases {
        let err = validate_spec(spec.clone()).expect_err(&format!("{spec} must be rejected"));
        assert!(err.starts_with(field), "{spec}: {err}");
    }
    for spec in [
        json!({}),
        json!({"size": 0}),
        json!({"size": 64, "containerPort": 65535, "image": "m:1"}),
    ] {
        validate_spec(spec.clone()).unwrap_or_else(|e| panic!("{spec}: {e}"));
    }
    // Defaults are in the schema, so the API server fills them in.
    let spec = &schema()["properties"]["spec"]["properties"];
    assert_eq!(spec["size"]["default"], 1);
    assert_eq!(spec["containerPort"]["default"], 11211);
}

#[test]
fn every_sample_is_a_valid_memcached() {
    let dir = repo("config/samples");
    let mut samples = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        if !name.ends_with(".yaml") || name == "kustomization.yaml" {
            continue;
        }
        for doc in yaml_docs(&std::fs::read_to_string(&path).unwrap()) {
            assert_eq!(doc["apiVersion"], "cache.example.com/v1alpha1", "{name}");
            assert_eq!(doc["kind"], "Memcached", "{name}");
            validate_spec(doc["spec"].clone()).unwrap_or_else(|e| panic!("{name}: {e}"));
            let mc: Memcached =
                serde_json::from_value(doc).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert!(mc.metadata.name.is_some(), "{name}");
            // What only the operator checks passes too: no sample is InvalidConfig.
            memcached_operator::resources::validate::validate(&mc.spec)
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            samples += 1;
        }
    }
    assert!(
        samples >= 2,
        "expected the tutorial samples and a richer one"
    );
    let tutorial = yaml_docs(&read("config/samples/cache_v1alpha1_memcached.yaml")).remove(0);
    assert_eq!(tutorial["metadata"]["name"], "memcached-sample");
    assert_eq!(tutorial["spec"], json!({"size": 1, "containerPort": 11211}));
}

fn kustomize(dir: &str) -> Vec<Value> {
    let out = Command::new("kubectl")
        .args(["kustomize", dir])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("kubectl must be installed to check the install tree (kubectl kustomize)");
    assert!(
        out.status.success(),
        "kubectl kustomize {dir} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    yaml_docs(&String::from_utf8(out.stdout).unwrap())
}

fn find<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name} in the rendered install"))
}

#[test]
fn default_install_renders_with_kustomize() {
    let docs = kustomize("config/default");
    const NS: &str = "memcached-operator-system";
    for doc in &docs {
        let kind = doc["kind"].as_str().unwrap();
        let cluster_scoped = [
            "Namespace",
            "CustomResourceDefinition",
            "ClusterRole",
            "ClusterRoleBinding",
        ];
        if !cluster_scoped.contains(&kind) {
            assert_eq!(
                doc["metadata"]["namespace"], NS,
                "{kind} {}",
                doc["metadata"]["name"]
            );
        }
    }
    find(&docs, "Namespace", NS);
    // Compared as typed values: kustomize writes `65535.0` as `65535`.
    let crd = find(
        &docs,
        "CustomResourceDefinition",
        "memcacheds.cache.example.com",
    );
    let crd: k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition =
        serde_json::from_value(crd.clone()).unwrap();
    assert_eq!(crd, manifests::crd());

    let role = find(&docs, "ClusterRole", "memcached-operator-manager-role");
    assert_eq!(
        role["rules"],
        serde_json::to_value(manifests::manager_role()).unwrap()["rules"]
    );
    let lease_role = find(&docs, "Role", "memcached-operator-leader-election-role");
    assert_eq!(
        lease_role["rules"],
        serde_json::to_value(manifests::leader_election_role()).unwrap()["rules"]
    );

    let metrics_auth = find(&docs, "ClusterRole", "memcached-operator-metrics-auth-role");
    assert_eq!(
        metrics_auth["rules"],
        serde_json::to_value(manifests::metrics_auth_role()).unwrap()["rules"]
    );
    let reader = find(&docs, "ClusterRole", "memcached-operator-metrics-reader");
    assert_eq!(
        reader["rules"],
        json!([{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]),
        "what the operator's SubjectAccessReview asks about"
    );

    let sa = "memcached-operator-controller-manager";
    find(&docs, "ServiceAccount", sa);
    for (kind, name) in [
        (
            "ClusterRoleBinding",
            "memcached-operator-manager-rolebinding",
        ),
        (
            "ClusterRoleBinding",
            "memcached-operator-metrics-auth-rolebinding",
        ),
        (
            "RoleBinding",
            "memcached-operator-leader-election-rolebinding",
        ),
    ] {
        let binding = find(&docs, kind, name);
        assert_eq!(binding["subjects"][0]["name"], sa, "{name}");
        assert_eq!(binding["subjects"][0]["namespace"], NS, "{name}");
    }

    let deployment = find(&docs, "Deployment", "memcached-operator-controller-manager");
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(pod["serviceAccountName"], sa);
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(
        pod["securityContext"]["seccompProfile"]["type"],
        "RuntimeDefault"
    );
    let manager = &pod["containers"][0];
    let args: Vec<&str> = manager["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert!(args.contains(&"--leader-elect"), "{args:?}");
    // /metrics over HTTPS on 8443, behind the Service's `https` port.
    assert!(args.contains(&"--metrics-bind-address=:8443"), "{args:?}");
    assert_eq!(
        manager["ports"][0],
        json!({"name": "metrics", "containerPort": 8443, "protocol": "TCP"})
    );
    let service = find(
        &docs,
        "Service",
        "memcached-operator-controller-manager-metrics-service",
    );
    assert_eq!(
        service["spec"]["ports"],
        json!([{"name": "https", "port": 8443, "protocol": "TCP", "targetPort": "metrics"}])
    );
    let sc = &manager["securityContext"];
    assert_eq!(sc["allowPrivilegeEscalation"], false);
    assert_eq!(sc["readOnlyRootFilesystem"], true);
    assert_eq!(sc["capabilities"]["drop"], json!(["ALL"]));
    assert_eq!(manager["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(manager["readinessProbe"]["httpGet"]["path"], "/readyz");
    let env: Vec<&str> = manager["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    for var in ["POD_NAMESPACE", "POD_NAME", "MEMCACHED_IMAGE"] {
        assert!(env.contains(&var), "manager env lacks {var}");
    }
    assert!(manager["resources"]["limits"]["memory"].is_string());

    // Every flag the manifest passes is one the binary accepts.
    let out = Command::new(env!("CARGO_BIN_EXE_memcached-operator"))
        .args(["run", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8(out.stdout).unwrap();
    for arg in args.iter().filter(|a| a.starts_with("--")) {
        let flag = arg.split('=').next().unwrap();
        assert!(
            help.contains(flag),
            "the manager Deployment passes {flag}, which `run` does not know"
        );
    }
}

/// `config/namespaced`: everything of `config/default`, but the operator's rights are a Role in its own
/// namespace (the rules of manager-role, Secrets included) bound by a RoleBinding; its only ClusterRole is
/// metrics-auth-role (TokenReviews and SubjectAccessReviews are cluster-scoped), and it watches its own
/// namespace.
#[test]
fn namespaced_install_gives_the_operator_its_namespace_only() {
    const NS: &str = "memcached-operator-system";
    let docs = kustomize("config/namespaced");
    let default = kustomize("config/default");
    let kinds = |docs: &[Value]| -> Vec<(String, String)> {
        docs.iter()
            .map(|d| {
                (
                    d["kind"].as_str().unwrap_or_default().to_owned(),
                    d["metadata"]["name"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned(),
                )
            })
            .collect()
    };
    let mut expected = kinds(&default);
    expected.retain(|(kind, name)| {
        !(kind == "ClusterRole" && name == "memcached-operator-manager-role"
            || kind == "ClusterRoleBinding" && name == "memcached-operator-manager-rolebinding")
    });
    expected.push(("Role".into(), "memcached-operator-manager-role".into()));
    expected.push((
        "RoleBinding".into(),
        "memcached-operator-manager-rolebinding".into(),
    ));
    let mut rendered = kinds(&docs);
    expected.sort();
    rendered.sort();
    assert_eq!(rendered, expected);
    // The one ClusterRoleBinding: metrics-auth-role, whose reviews are cluster-scoped and read nothing.
    let cluster_bindings: Vec<&Value> = docs
        .iter()
        .filter(|d| d["kind"] == "ClusterRoleBinding")
        .collect();
    assert_eq!(cluster_bindings.len(), 1, "{cluster_bindings:?}");
    assert_eq!(
        cluster_bindings[0]["roleRef"]["name"],
        "memcached-operator-metrics-auth-role"
    );
    for doc in docs.iter().filter(|d| d["kind"] == "ClusterRole") {
        let name = doc["metadata"]["name"].as_str().unwrap_or_default();
        assert!(
            name.ends_with("-editor-role")
                || name.ends_with("-viewer-role")
                || name == "memcached-operator-metrics-reader"
                || name == "memcached-operator-metrics-auth-role",
            "only the user-facing roles and metrics-auth-role are cluster-wide: {name}"
        );
    }
    let metrics_auth = find(&docs, "ClusterRole", "memcached-operator-metrics-auth-role");
    assert_eq!(
        metrics_auth["rules"],
        json!([
            {"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]},
            {"apiGroups": ["authorization.k8s.io"], "resources": ["subjectaccessreviews"], "verbs": ["create"]},
        ]),
        "reviews only: no Secret or any other read cluster-wide"
    );

    let role = find(&docs, "Role", "memcached-operator-manager-role");
    assert_eq!(role["metadata"]["namespace"], NS);
    let cluster_role = find(&default, "ClusterRole", "memcached-operator-manager-role");
    assert_eq!(role["rules"], cluster_role["rules"], "the same rules");
    let binding = find(
        &docs,
        "RoleBinding",
        "memcached-operator-manager-rolebinding",
    );
    assert_eq!(binding["metadata"]["namespace"], NS);
    assert_eq!(
        binding["roleRef"],
        json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "memcached-operator-manager-role"})
    );
    let account = find(
        &docs,
        "ServiceAccount",
        "memcached-operator-controller-manager",
    );
    assert_eq!(
        binding["subjects"],
        json!([{"kind": "ServiceAccount", "name": account["metadata"]["name"], "namespace": NS}])
    );

    let deployment = find(&docs, "Deployment", "memcached-operator-controller-manager");
    let env = &deployment["spec"]["template"]["spec"]["containers"][0]["env"];
    let watch: Vec<&Value> = env
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["name"] == "WATCH_NAMESPACE")
        .collect();
    assert_eq!(
        watch,
        [
            &json!({"name": "WATCH_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}})
        ]
    );
}

#[test]
fn other_kustomizations_render() {
    for dir in [
        "config/crd",
        "config/rbac",
        "config/manager",
        "config/samples",
    ] {
        assert!(!kustomize(dir).is_empty(), "{dir} renders nothing");
    }
}

/// Every node of `schema` that carries CEL rules, with its path.
fn rule_nodes<'a>(schema: &'a Value, path: String, out: &mut Vec<(String, &'a Value)>) {
    if schema.get("x-kubernetes-validations").is_some() {
        out.push((path.clone(), schema));
    }
    if let Some(props) = schema["properties"].as_object() {
        for (name, child) in props {
            rule_nodes(child, format!("{path}.{name}"), out);
        }
    }
    if schema.get("items").is_some() {
        rule_nodes(&schema["items"], format!("{path}[]"), out);
    }
}

#[test]
fn cel_rules_compile_and_are_bounded() {
    use kube::core::cel::{compile_schema, estimate_rule_cost};
    let schema = schema();
    let mut nodes = Vec::new();
    rule_nodes(&schema, "openAPIV3Schema".into(), &mut nodes);
    assert_eq!(
        nodes.len(),
        9,
        "root (metadata.name), spec (workload), memcached, highAvailability, podDisruptionBudget, \
         monitoring, allowedClients[], autoscaling, proxy.access.identities"
    );
    for (path, node) in nodes {
        let compiled = compile_schema(node);
        assert!(
            !compiled.has_errors(),
            "{path}: {:?}",
            compiled.compilation_errors()
        );
        for rule in node["x-kubernetes-validations"].as_array().unwrap() {
            let rule = rule["rule"].as_str().unwrap();
            // kube-cel's cost heuristic (the scope analysis does not know comprehension variables).
            // By Kubernetes' cost model the extraArgs rule costs about 64 items x 3 string operations
            // of ~1k each, far below the 10M per-rule limit, thanks to maxItems 64 / maxLength 256.
            let warnings = estimate_rule_cost(rule, &compiled);
            assert!(warnings.is_empty(), "{path}: {rule}: {warnings:?}");
        }
    }
}

/// The root's CEL rule refuses the names the operator would report as `InvalidName` (too long for
/// `<name>-headless`, or not an RFC 1035 label), at the same limit.
#[test]
fn cel_refuses_names_that_cannot_name_the_services() {
    use kube::core::cel::Validator;
    use memcached_operator::resources::MAX_NAME_LEN;
    let schema = schema();
    let longest = "a".repeat(MAX_NAME_LEN);
    let too_long = "a".repeat(MAX_NAME_LEN + 1);
    let sixty = "a".repeat(60);
    for (name, valid) in [
        ("cache", true),
        (longest.as_str(), true),
        (too_long.as_str(), false),
        (sixty.as_str(), false),
        ("1cache", false),
        ("cache.example", false),
    ] {
        let object = json!({"apiVersion": "cache.example.com/v1alpha1", "kind": "Memcached",
                            "metadata": {"name": name, "namespace": "ns"}, "spec": {}});
        let cel = Validator::new().validate(&schema, &object, None);
        assert_eq!(cel.is_ok(), valid, "CEL on name {name:?}: {cel:?}");
    }
}

/// The root's StatefulSet rule refuses, for `workload: StatefulSet` only, the names longer than the
/// operator's limit for it (room for `-<revision hash>` in a 63-character label value), with a message
/// naming the limit.
#[test]
fn cel_refuses_statefulset_names_too_long_for_the_revision_label() {
    use kube::core::cel::Validator;
    use memcached_operator::resources::{MAX_NAME_LEN, MAX_STATEFULSET_NAME_LEN};
    let schema = schema();
    let longest = "a".repeat(MAX_STATEFULSET_NAME_LEN);
    let too_long = "a".repeat(MAX_STATEFULSET_NAME_LEN + 1);
    let deployment_longest = "a".repeat(MAX_NAME_LEN);
    for (name, workload, valid) in [
        (longest.as_str(), Some("StatefulSet"), true),
        (too_long.as_str(), Some("StatefulSet"), false),
        (deployment_longest.as_str(), Some("StatefulSet"), false),
        (too_long.as_str(), Some("Deployment"), true),
        (deployment_longest.as_str(), Some("Deployment"), true),
        (deployment_longest.as_str(), None, true),
    ] {
        let spec = workload.map_or(json!({}), |w| json!({"workload": w}));
        let object = json!({"apiVersion": "cache.example.com/v1alpha1", "kind": "Memcached",
                            "metadata": {"name": name, "namespace": "ns"}, "spec": spec});
        let cel = Validator::new().validate(&schema, &object, None);
        assert_eq!(
            cel.is_ok(),
            valid,
            "CEL on a {}-character {workload:?} name: {cel:?}",
            name.len()
        );
        if let Err(e) = cel {
            assert!(
                format!("{e:?}").contains("must be at most 52 characters"),
                "{e:?}"
            );
        }
    }
}

/// The CEL rules (what a 1.25+ API server rejects at admission) and the operator's own checks (what it
/// reports as InvalidConfig, on every server) agree case by case.
#[test]
fn cel_rules_agree_with_the_operator_checks() {
    // `spec.proxy.access` with identities of these names (and common names).
    fn access(identities: &[(&str, Option<&str>)]) -> Value {
        let identities: Vec<Value> = identities
            .iter()
            .map(|(name, cn)| match cn {
                Some(cn) => json!({"name": name, "commonName": cn, "prefixes": ["p:"]}),
                None => json!({"name": name, "prefixes": ["p:"]}),
            })
            .collect();
        json!({"clientCA": {"secretName": "ca"}, "identities": identities})
    }
    use kube::core::cel::Validator;
    use memcached_operator::resources::validate::validate as operator_check;
    let schema = schema();
    let cases = [
        (json!({}), true),
        (
            json!({"memcached": {"extraArgs": ["-o", "lru_crawler", "-R", "40", "-B", "binary"]}}),
            true,
        ),
        (json!({"memcached": {"extraArgs": ["-m", "2048"]}}), false),
        (json!({"memcached": {"extraArgs": ["-p11311"]}}), false),
        (
            json!({"memcached": {"extraArgs": ["--memory-limit=2048"]}}),
            false,
        ),
        (json!({"memcached": {"extraArgs": ["--threads"]}}), false),
        (json!({"memcached": {"extraArgs": ["-vv"]}}), false),
        (
            json!({"memcached": {"extraArgs": ["-o", "ssl_key=/x"]}}),
            false,
        ),
        // Not a memcached option (memcached would exit), although it reads like `-o lru_crawler`.
        (
            json!({"memcached": {"extraArgs": ["--lru-crawler"]}}),
            false,
        ),
        (
            json!({"memcached": {"extraArgs": ["-o", "modern,ssl_verify_mode=0"]}}),
            false,
        ),
        (
            json!({"memcached": {"extraArgs": ["-o", "ext_path=/data/cache:1G"]}}),
            false,
        ),
        (json!({"memcached": {"extraArgs": ["-Cp", "1"]}}), false),
        (json!({"memcached": {"extraArgs": ["-CU", "11211"]}}), false),
        (
            json!({"memcached": {"extraArgs": ["-Cl", "0.0.0.0"]}}),
            false,
        ),
        (
            json!({"memcached": {"extraArgs": ["-ossl_verify_mode=0"]}}),
            false,
        ),
        (
            json!({"memcached": {"extraArgs": ["-Cossl_verify_mode=0"]}}),
            false,
        ),
        (json!({"memcached": {"extraArgs": ["--por=1"]}}), false),
        (json!({"memcached": {"extraArgs": ["--udp=11211"]}}), false),
        (json!({"memcached": {"extraArgs": ["--enable-ss"]}}), false),
        (json!({"memcached": {"extraArgs": ["-S"]}}), false),
        (json!({"memcached": {"extraArgs": ["-s/tmp/x"]}}), false),
        (json!({"memcached": {"extraArgs": ["-A"]}}), false),
        (
            json!({"memcached": {"extraArgs": ["--ext=modern,ssl_key=/x"]}}),
            false,
        ),
        (
            json!({"memcached": {"extraArgs": ["--extended", "ssl_key=/x"]}}),
            false,
        ),
        (json!({"memcached": {"extraArgs": ["-q"]}}), false),
        (json!({"memcached": {"extraArgs": ["--frobnicate"]}}), false),
        (
            json!({"memcached": {"extraArgs": ["--disable-cas=1"]}}),
            false,
        ),
        (json!({"memcached": {"extraArgs": ["--"]}}), false),
        (json!({"memcached": {"extraArgs": ["-V"]}}), false),
        (json!({"memcached": {"extraArgs": ["--verb=2"]}}), false),
        (json!({"memcached": {"extraArgs": ["-MLA"]}}), false),
        (
            json!({"memcached": {"extraArgs": ["-o", "lru_crawler"]}}),
            true,
        ),
        (json!({"memcached": {"extraArgs": ["-o", "modern"]}}), true),
        (json!({"memcached": {"extraArgs": ["-R", "40"]}}), true),
        (
            json!({"memcached": {"extraArgs": ["--max-reqs-per-event=40"]}}),
            true,
        ),
        (
            json!({"memcached": {"extraArgs": ["--max-reqs", "40"]}}),
            true,
        ),
        (json!({"memcached": {"extraArgs": ["-B", "ascii"]}}), true),
        (json!({"memcached": {"extraArgs": ["-CFXWM"]}}), true),
        (
            json!({"memcached": {"extraArgs": ["-CFo", "lru_crawler,idle_timeout=600"]}}),
            true,
        ),
        (
            json!({"memcached": {"extraArgs": ["--listen-backlog=2048"]}}),
            true,
        ),
        (json!({"memcached": {"extraArgs": ["-D", ":"]}}), true),
        // Exit on some nodes (hard core-file limit 0, transparent huge pages off).
        (json!({"memcached": {"extraArgs": ["-r"]}}), false),
        (json!({"memcached": {"extraArgs": ["-CL"]}}), false),
        (
            json!({"memcached": {"extraArgs": ["--enable-coredumps"]}}),
            false,
        ),
        // Read as slab_sizes too before memcached 1.6.40.
        (
            json!({"memcached": {"extraArgs": ["-o", "modern,worker_logbuf_size=64"]}}),
            false,
        ),
        // Each worker thread holds open files within -c.
        (json!({"memcached": {"threads": 256}}), false),
        (
            json!({"memcached": {"threads": 256, "maxConnections": 1296}}),
            true,
        ),
        (json!({"memcached": {"maxConnections": 35}}), false),
        (json!({"memcached": {"maxConnections": 36}}), true),
        (
            json!({"highAvailability": {"preStopDelaySeconds": 20}}),
            true,
        ),
        (
            json!({"highAvailability": {"preStopDelaySeconds": 30}}),
            false,
        ),
        (
            json!({"highAvailability": {"terminationGracePeriodSeconds": 10}}),
            false,
        ),
        (
            json!({"highAvailability": {"preStopDelaySeconds": 0, "terminationGracePeriodSeconds": 1}}),
            true,
        ),
        (
            json!({"highAvailability": {"podDisruptionBudget": {"maxUnavailable": 1}}}),
            true,
        ),
        (
            json!({"highAvailability": {"podDisruptionBudget": {"maxUnavailable": 1, "minAvailable": "50%"}}}),
            false,
        ),
        (
            json!({"monitoring": {"serviceMonitor": {"enabled": true}}}),
            false,
        ),
        (
            json!({"monitoring": {"serviceMonitor": {"enabled": false}}}),
            true,
        ),
        (
            json!({"monitoring": {"exporter": {"enabled": true}, "serviceMonitor": {"enabled": true}}}),
            true,
        ),
        (json!({"proxy": {"enabled": true, "replicas": 3}}), true),
        (
            json!({"proxy": {"enabled": true}, "clients": {"hashing": "unknown"}}),
            true,
        ),
        (
            json!({"proxy": {"enabled": true}, "clients": {"hashing": "jump"}}),
            false,
        ),
        (
            json!({"proxy": {"enabled": false}, "clients": {"hashing": "jump"}}),
            true,
        ),
        (
            json!({"proxy": {"enabled": true}, "security": {"auth": {"secretName": "a"}}}),
            false,
        ),
        (
            json!({"proxy": {"enabled": true, "image": "i"}, "security": {"tls": {"secretName": "t"}}}),
            true,
        ),
        (
            json!({"proxy": {"enabled": true}, "security": {"tls": {"secretName": "t"}}}),
            false,
        ),
        (
            json!({"proxy": {"enabled": false}, "security": {"tls": {"secretName": "t"}}}),
            true,
        ),
        (
            json!({"proxy": {"enabled": true, "image": "i"}, "security": {"tls": {"secretName": "t", "clientAuth": false}}}),
            true,
        ),
        (
            json!({"proxy": {"enabled": true}, "security": {"tls": {"secretName": "t", "clientAuth": false}}}),
            false,
        ),
        (
            json!({"proxy": {"enabled": true}, "security": {"tls": {"secretName": "t", "clientAuth": true}}}),
            false,
        ),
        (
            json!({"proxy": {"enabled": false}, "security": {"tls": {"secretName": "t", "clientAuth": true}}}),
            true,
        ),
        (
            json!({"proxy": {"enabled": true}, "security": {"tls": {"secretName": "t"}, "auth": {"secretName": "a"}}}),
            false,
        ),
        (
            json!({"security": {"tls": {"secretName": "t"}}, "proxy": {"replicas": 2}}),
            true,
        ),
        (
            json!({"proxy": {"enabled": true, "access": access(&[("a", None), ("b", None)])}}),
            false,
        ),
        (
            json!({"proxy": {"enabled": false, "access": access(&[("a", None)])}}),
            true,
        ),
        (
            json!({"proxy": {"enabled": true, "image": "i", "access": access(&[("a", None), ("b", None)])},
                   "security": {"tls": {"secretName": "t"}}}),
            true,
        ),
        (
            json!({"proxy": {"enabled": true, "image": "i", "access": access(&[("a", None), ("a", Some("x"))])},
                   "security": {"tls": {"secretName": "t"}}}),
            false,
        ),
        (
            json!({"proxy": {"enabled": true, "image": "i", "access": access(&[("a", Some("b")), ("b", None)])},
                   "security": {"tls": {"secretName": "t"}}}),
            false,
        ),
    ];
    for (spec, valid) in cases {
        let object = json!({"apiVersion": "cache.example.com/v1alpha1", "kind": "Memcached",
                            "metadata": {"name": "x", "namespace": "ns"}, "spec": spec});
        let cel = Validator::new().validate(&schema, &object, None);
        assert_eq!(cel.is_ok(), valid, "CEL on {spec}: {cel:?}");
        let mc: Memcached = serde_json::from_value(object).unwrap();
        let operator = operator_check(&mc.spec);
        assert_eq!(operator.is_ok(), valid, "operator on {spec}: {operator:?}");
    }
}

/// The workload kind is fixed once an instance exists (a transition rule: it sees the old object too).
#[test]
fn the_workload_cannot_change_on_a_live_instance() {
    use kube::core::cel::Validator;
    let schema = schema();
    let object = |spec: Value| {
        json!({"apiVersion": "cache.example.com/v1alpha1", "kind": "Memcached",
               "metadata": {"name": "x", "namespace": "ns"}, "spec": spec})
    };
    let sts = object(json!({"workload": "StatefulSet", "size": 3}));
    let deploy = object(json!({"workload": "Deployment"}));
    let unset = object(json!({}));
    let cases = [
        (&sts, None, true),
        (
            &sts,
            Some(&object(json!({"workload": "StatefulSet", "size": 1}))),
            true,
        ),
        (&sts, Some(&deploy), false),
        (&deploy, Some(&sts), false),
        (&sts, Some(&unset), false),
        (&unset, Some(&deploy), true),
    ];
    for (new, old, valid) in cases {
        let result = Validator::new().validate(&schema, new, old);
        assert_eq!(result.is_ok(), valid, "{new} after {old:?}: {result:?}");
        if let Err(errors) = result {
            assert!(
                format!("{errors:?}").contains("spec.workload cannot change"),
                "{errors:?}"
            );
        }
    }
}

/// The image's dependency layer, replayed: the manifests its `COPY` lines bring and the placeholder
/// sources its first `RUN` writes must make a workspace cargo can load. A workspace member the Dockerfile
/// does not copy fails the image build before anything compiles.
#[test]
fn image_dependency_layer_reads_the_workspace() {
    let dockerfile = read("Dockerfile");
    let lines: Vec<&str> = dockerfile.lines().collect();
    let start = lines
        .iter()
        .position(|l| l.starts_with("COPY Cargo.toml Cargo.lock"))
        .expect("the Dockerfile copies the workspace manifests first");
    let dir = std::env::temp_dir().join(format!("image-layer-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let mut index = start;
    while let Some(copy) = lines[index].strip_prefix("COPY ") {
        let mut parts: Vec<&str> = copy.split_whitespace().collect();
        let target = parts.pop().unwrap();
        for source in parts {
            let to = if target.ends_with('/') {
                dir.join(target)
                    .join(std::path::Path::new(source).file_name().unwrap())
            } else {
                dir.join(target)
            };
            std::fs::create_dir_all(to.parent().unwrap()).unwrap();
            std::fs::copy(repo(source), &to).unwrap();
        }
        index += 1;
    }
    // The first RUN after the COPY lines, joined, up to its first cargo command.
    let mut run = String::new();
    for line in &lines[index..] {
        let line = line.trim_start_matches("RUN ");
        run.push_str(line.trim_end_matches('\\'));
        if !line.ends_with('\\') {
            break;
        }
    }
    let placeholders = run
        .split("&& cargo ")
        .next()
        .unwrap()
        .trim()
        .trim_end_matches("&&");
    let status = Command::new("sh")
        .args(["-c", placeholders])
        .current_dir(&dir)
        .status()
        .unwrap();
    assert!(
        status.success(),
        "the placeholder step failed: {placeholders}"
    );
    let out = Command::new(env!("CARGO"))
        .args([
            "metadata",
            "--no-deps",
            "--offline",
            "--format-version",
            "1",
        ])
        .arg("--manifest-path")
        .arg(dir.join("Cargo.toml"))
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        out.status.success(),
        "cargo cannot read the workspace the Dockerfile's dependency layer copies:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
