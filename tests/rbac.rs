//! The operator's RBAC is no wider than what its code calls (each verb below with the call that needs
//! it), and the ValidatingAdmissionPolicy shipped with it (`manifests::admission`) refuses what a stolen
//! operator token would write, evaluated with kube's CEL as the API server evaluates it. No envtest
//! control plane is needed: the policy's CEL is checked here, its rendering in the chart by xtask's tests.

use std::collections::BTreeSet;

use k8s_openapi::api::rbac::v1::PolicyRule;
use kube::core::cel::{AdmissionRequest, GroupVersionResource, VapEvaluator, VapExpression};
use memcached_operator::api::Memcached;
use memcached_operator::manifests::{self, admission};
use memcached_operator::resources::proxy::access;
use memcached_operator::resources::{Defaults, Instance};
use memcached_operator::store::{ChildKind, EachKind, each_kind};
use serde_json::{Value, json};

/// Every (API group, resource, verbs) the operator's code needs beside its children's, and why.
const NEEDED: &[(&str, &str, &[&str], &str)] = &[
    (
        "cache.example.com",
        "memcacheds",
        &["list", "watch", "patch"],
        "the controller's watch (run/controller_loop.rs); a JSON patch removes a legacy finalizer (controller/legacy_finalizer.rs)",
    ),
    (
        "cache.example.com",
        "memcacheds/status",
        &["patch"],
        "status by server-side apply (controller/report.rs, telemetry/collector.rs)",
    ),
    (
        "cache.example.com",
        "memcacheds/finalizers",
        &["update"],
        "what OwnerReferencesPermissionEnforcement asks of blockOwnerDeletion owner references",
    ),
    (
        "",
        "pods",
        &["get", "list", "watch", "create", "patch", "delete"],
        "watched; get_opt (controller/pool.rs); drain marks (patch); the handover spare (create, delete)",
    ),
    (
        "",
        "pods/status",
        &["patch"],
        "the warm-handover readiness gate (handover/engine.rs)",
    ),
    (
        "",
        "secrets",
        &["get", "list", "watch", "create", "patch", "delete"],
        "metadata watch of referenced Secrets; their values read by name (get_opt); the auth file the \
         servers load, `<name>-auth-file` (applied, deleted when auth is turned off)",
    ),
    (
        "events.k8s.io",
        "events",
        &["create", "patch"],
        "Events, patched when they repeat",
    ),
];

/// What the code does with each kind of child (the table of `store::kinds`): watches it (its own by
/// label, others' by metadata), applies it by server-side apply (a patch that may create), and deletes it
/// when the spec can ask for none (`DELETES`). Never reads one by name: no `get`.
struct ChildGrants(BTreeSet<Grant>);

impl EachKind for ChildGrants {
    fn kind<K: ChildKind>(&mut self) {
        let mut verbs = vec!["list", "watch", "create", "patch"];
        if K::DELETES {
            verbs.push("delete");
        }
        for verb in verbs {
            let grant = (
                K::GROUP.to_owned(),
                K::URL_PATH_SEGMENT.to_owned(),
                verb.to_owned(),
            );
            self.0.insert(grant);
        }
    }
}

type Grant = (String, String, String);

fn grants(rules: &[PolicyRule]) -> BTreeSet<Grant> {
    let mut out = BTreeSet::new();
    for rule in rules {
        for group in rule.api_groups.as_deref().unwrap_or_default() {
            for resource in rule.resources.as_deref().unwrap_or_default() {
                for verb in &rule.verbs {
                    out.insert((group.clone(), resource.clone(), verb.clone()));
                }
            }
        }
    }
    out
}

#[test]
fn the_manager_role_grants_exactly_what_the_code_calls() {
    let granted = grants(&manifests::manager_role().rules.unwrap_or_default());
    let mut children = ChildGrants(BTreeSet::new());
    each_kind(&mut children);
    let mut needed = children.0;
    needed.extend(NEEDED.iter().flat_map(|(group, resource, verbs, _)| {
        verbs
            .iter()
            .map(|verb| (group.to_string(), resource.to_string(), verb.to_string()))
    }));
    let wider: Vec<_> = granted.difference(&needed).collect();
    assert!(
        wider.is_empty(),
        "granted beyond what the code calls: {wider:?}"
    );
    let missing: Vec<_> = needed.difference(&granted).collect();
    assert!(missing.is_empty(), "needed but not granted: {missing:?}");
}

#[test]
fn no_role_holds_a_wildcard_or_a_verb_that_escalates() {
    let roles = [
        manifests::manager_role().rules,
        manifests::manager_namespaced_role().rules,
        manifests::metrics_auth_role().rules,
        manifests::leader_election_role().rules,
    ];
    for rule in roles.iter().flatten().flatten() {
        let fields = [
            rule.verbs.clone(),
            rule.resources.clone().unwrap_or_default(),
            rule.api_groups.clone().unwrap_or_default(),
        ];
        assert!(
            !fields.iter().flatten().any(|f| f.contains('*')),
            "{rule:?}"
        );
        for verb in ["escalate", "bind", "impersonate", "deletecollection"] {
            assert!(!rule.verbs.iter().any(|v| v == verb), "{verb}: {rule:?}");
        }
        assert!(rule.non_resource_urls.is_none(), "{rule:?}");
    }
}

/// The all-features sample, with the proxy on.
fn sample() -> Memcached {
    let path = format!(
        "{}/config/samples/cache_v1alpha1_memcached_all_features.yaml",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = std::fs::read_to_string(path).expect("the all-features sample");
    let mut mc: Value = serde_saphyr::from_str(&text).expect("YAML");
    mc["spec"]["proxy"] = json!({"enabled": true});
    // The proxy takes neither client authentication nor client certificates.
    if let Some(spec) = mc["spec"].as_object_mut() {
        spec.remove("security");
    }
    let mut mc: Memcached = serde_json::from_value(mc).expect("a Memcached");
    mc.metadata.namespace = Some("tenant".to_owned());
    mc.metadata.uid = Some("0b5a1d6e-7c1f-4c55-9d7e-3a2f1b0c9d8e".to_owned());
    mc
}

#[test]
fn the_operator_holds_every_permission_of_the_role_it_creates() {
    // Kubernetes' escalation check: a Role may be created, and bound, by whoever holds all it grants.
    let mc = sample();
    let defaults = Defaults::default();
    let instance = Instance::new(&mc, &defaults).expect("valid");
    let role = access::role(&instance).expect("the sample runs the proxy");
    let held = grants(&manifests::manager_role().rules.unwrap_or_default());
    for grant in grants(&role.rules.unwrap_or_default()) {
        assert!(
            held.contains(&grant),
            "the proxy's Role grants {grant:?}, which the operator lacks"
        );
    }
}

const OPERATOR: &str =
    "system:serviceaccount:memcached-operator-system:memcached-operator-controller-manager";

fn request(operation: &str, group: &str, resource: &str, username: &str) -> AdmissionRequest {
    AdmissionRequest {
        operation: operation.to_owned(),
        username: username.to_owned(),
        namespace: "tenant".to_owned(),
        resource: GroupVersionResource {
            group: group.to_owned(),
            version: "v1".to_owned(),
            resource: resource.to_owned(),
        },
        ..AdmissionRequest::default()
    }
}

/// `expression` as kube's CEL must be given it: without a schema it escapes every object key as the API
/// server escapes property names (`app.kubernetes.io/managed-by` becomes
/// `app__dot__kubernetes__dot__io__slash__managed__dash__by`), where the API server leaves the keys of a
/// map (labels) as they are; and it escapes the property `namespace` (a word CEL reserves) as
/// `__namespace__`, which a v1.28.7 API server does not for a built-in type's field: there
/// `has(object.subjects[0].__namespace__)` was false and `object.subjects[0].namespace` the subject's
/// namespace (measured with the policy on a real server).
fn for_kube_cel(expression: String) -> String {
    expression
        .replace(
            "'app.kubernetes.io/managed-by'",
            "'app__dot__kubernetes__dot__io__slash__managed__dash__by'",
        )
        .replace("subjects[0].namespace", "subjects[0].__namespace__")
}

/// The policy's messages for a request: empty when it is admitted, or when it is not the operator's.
fn refusals(req: AdmissionRequest, object: Value, old: Option<Value>) -> Vec<String> {
    let policy = admission::policy(
        "p",
        "memcached-operator-system",
        "memcached-operator-controller-manager",
    );
    let spec = policy.spec.expect("a spec");
    let mut builder = VapEvaluator::builder().object(object).request(req);
    if let Some(old) = old {
        builder = builder.old_object(old);
    }
    let evaluator = builder.build();
    let conditions: Vec<VapExpression> = spec
        .match_conditions
        .unwrap_or_default()
        .into_iter()
        .map(|c| VapExpression {
            expression: c.expression,
            message: None,
            message_expression: None,
        })
        .collect();
    if evaluator.evaluate(&conditions).iter().any(|r| !r.passed) {
        return Vec::new();
    }
    let validations: Vec<VapExpression> = spec
        .validations
        .unwrap_or_default()
        .into_iter()
        .map(|v| VapExpression {
            expression: for_kube_cel(v.expression),
            message: v.message,
            message_expression: None,
        })
        .collect();
    evaluator
        .evaluate(&validations)
        .into_iter()
        .filter(|r| !r.passed)
        .map(|r| r.message.unwrap_or_default())
        .collect()
}

fn labelled(kind: &str, name: &str) -> Value {
    json!({"kind": kind, "metadata": {"name": name, "namespace": "tenant",
        "labels": {"app.kubernetes.io/managed-by": "memcached-operator"}}})
}

fn foreign(kind: &str, name: &str) -> Value {
    json!({"kind": kind, "metadata": {"name": name, "namespace": "tenant", "labels": {"app": "theirs"}}})
}

#[test]
fn the_policy_admits_the_operators_own_writes_and_refuses_others() {
    let create = |object: Value| refusals(request("CREATE", "", "pods", OPERATOR), object, None);
    let admitted = create(labelled("Pod", "cache-handover"));
    assert!(admitted.is_empty(), "{admitted:?}");
    assert_eq!(create(foreign("Pod", "x")).len(), 1, "unlabelled create");

    let update = |old: Value| {
        refusals(
            request("UPDATE", "", "pods", OPERATOR),
            labelled("Pod", "x"),
            Some(old),
        )
    };
    assert!(update(labelled("Pod", "x")).is_empty());
    assert_eq!(
        update(foreign("Pod", "x")).len(),
        1,
        "taking over a foreign object"
    );
    let mut unlabelled_child = foreign("Pod", "x");
    unlabelled_child["metadata"]["ownerReferences"] = json!([{"apiVersion": "cache.example.com/v1alpha1",
        "kind": "Memcached", "name": "x", "uid": "u", "controller": true}]);
    assert!(
        update(unlabelled_child).is_empty(),
        "its own child, label taken off: put back"
    );

    let delete = |old: Value| {
        refusals(
            request("DELETE", "", "pods", OPERATOR),
            Value::Null,
            Some(old),
        )
    };
    assert!(delete(labelled("Pod", "cache-handover")).is_empty());
    assert_eq!(
        delete(foreign("Pod", "theirs")).len(),
        1,
        "deleting a foreign pod"
    );

    let status = refusals(
        request("UPDATE", "", "pods", "system:serviceaccount:tenant:someone"),
        foreign("Pod", "x"),
        Some(foreign("Pod", "x")),
    );
    assert!(status.is_empty(), "other users are not matched");
}

#[test]
fn the_policy_refuses_a_binding_of_anything_but_the_proxys_role() {
    let binding = |role_kind: &str, role: &str, subject: &str| {
        let mut object = labelled("RoleBinding", "cache-proxy");
        object["roleRef"] =
            json!({"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": role});
        object["subjects"] =
            json!([{"kind": "ServiceAccount", "name": subject, "namespace": "tenant"}]);
        refusals(
            request(
                "CREATE",
                "rbac.authorization.k8s.io",
                "rolebindings",
                OPERATOR,
            ),
            object,
            None,
        )
    };
    let proxys = binding("Role", "cache-proxy", "cache-proxy");
    assert!(proxys.is_empty(), "{proxys:?}");
    assert_eq!(
        binding(
            "ClusterRole",
            "memcached-operator-manager-role",
            "cache-proxy"
        )
        .len(),
        1
    );
    assert_eq!(binding("ClusterRole", "cluster-admin", "default").len(), 1);
    assert_eq!(
        binding("Role", "cache-proxy", "default").len(),
        1,
        "another subject"
    );

    let role = |rules: Value| {
        let mut object = labelled("Role", "cache-proxy");
        object["rules"] = rules;
        refusals(
            request("CREATE", "rbac.authorization.k8s.io", "roles", OPERATOR),
            object,
            None,
        )
    };
    let reads = json!([{"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["cache-proxy"],
        "verbs": ["list", "watch"]}]);
    assert!(role(reads).is_empty());
    let secrets = json!([{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "list"]}]);
    assert_eq!(role(secrets).len(), 1, "a Role that reads Secrets");
    let every =
        json!([{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list", "watch"]}]);
    assert_eq!(role(every).len(), 1, "a Role without resourceNames");
}

/// Every child the operator applies for the all-features sample, as the reconcile builds it.
struct Children<'a> {
    instance: &'a Instance<'a>,
    objects: Vec<(&'static str, Value)>,
}

impl EachKind for Children<'_> {
    fn kind<K: ChildKind>(&mut self) {
        for (_, object) in K::desired(self.instance) {
            let object = serde_json::to_value(&object).expect("JSON");
            if !object.is_null() {
                self.objects.push((K::URL_PATH_SEGMENT, object));
            }
        }
    }
}

#[test]
fn the_policy_admits_every_child_the_operator_applies() {
    let mc = sample();
    let defaults = Defaults::default();
    let instance = Instance::new(&mc, &defaults).expect("valid");
    let mut children = Children {
        instance: &instance,
        objects: Vec::new(),
    };
    each_kind(&mut children);
    let kinds: BTreeSet<_> = children.objects.iter().map(|(k, _)| *k).collect();
    for kind in ["roles", "rolebindings"] {
        assert!(kinds.contains(kind), "the sample builds {kind}: {kinds:?}");
    }
    // The auth file the servers load (security.auth, which the proxy sample leaves out).
    let served =
        memcached_operator::resources::auth_file::served_secret(&instance, "auth-file", b"u:p\n");
    children
        .objects
        .push(("secrets", serde_json::to_value(served).unwrap()));
    for (resource, object) in children.objects {
        let refused = refusals(
            request("CREATE", "", resource, OPERATOR),
            object.clone(),
            None,
        );
        assert!(
            refused.is_empty(),
            "{resource} {}: {refused:?}",
            object["metadata"]["name"]
        );
    }
}
