//! A ValidatingAdmissionPolicy that confines what the operator's ServiceAccount may write to the objects
//! that are its own, whatever its RBAC allows: RBAC cannot narrow `create`, `patch` or `delete` by label,
//! and cannot keep a holder of roles from binding them (the operator holds every permission of its own
//! ClusterRole, so Kubernetes' escalation check lets it bind that ClusterRole to any ServiceAccount). With
//! the policy, a stolen operator token can still read what the operator reads, but writes only:
//! - objects labelled `app.kubernetes.io/managed-by=memcached-operator` (created so, and labelled so
//!   before the change, or controlled by a Memcached: the operator puts back the label of a child whose
//!   label was taken off); deleted only when labelled;
//! - Roles that only list and watch ConfigMaps by name (the proxy writer's `<name>-proxy`);
//! - RoleBindings `<name>-proxy` that bind the Role of their own name to the ServiceAccount of their own
//!   name in their namespace, and nothing else: never a ClusterRole, never another subject.
//!
//! The policy matches the resources the operator writes (from [`super::rbac::manager_role`] and the
//! digest key Secret), but not `Memcached` objects (a tenant's, which the operator patches only to
//! remove a legacy finalizer and to report status) nor Events. `admissionregistration.k8s.io/v1` since
//! Kubernetes 1.30; 1.28 and 1.29 serve the same fields as `v1beta1` with the
//! `ValidatingAdmissionPolicy` feature gate and the `admissionregistration.k8s.io/v1beta1` API enabled.
//! Opt-in (the chart's `admissionPolicy.enabled`, `kubectl apply -k config/admission-policy`), since
//! older servers lack it.

use k8s_openapi::api::admissionregistration::v1::{
    MatchCondition, MatchResources, NamedRuleWithOperations, ValidatingAdmissionPolicy,
    ValidatingAdmissionPolicyBinding, ValidatingAdmissionPolicyBindingSpec,
    ValidatingAdmissionPolicySpec, Validation,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::names::{INSTALL_NAMESPACE, NAME_PREFIX};
use super::rbac::manager_role;
use super::yaml::to_yaml;
use crate::api::GROUP;
use crate::resources::labels::{MANAGED_BY_KEY, MANAGER_NAME};

/// Path of the committed policy and its binding (the kustomization `config/admission-policy`).
pub const ADMISSION_POLICY_PATH: &str = "config/admission-policy/policy.yaml";
/// The policy's name (its binding's too), after config/default's name prefix.
pub const POLICY_NAME: &str = "writes";
/// The ServiceAccount the operator runs as in `config/default`, before the name prefix.
pub const SERVICE_ACCOUNT: &str = "controller-manager";

/// Whether `name` (a CEL expression of an object) carries the operator's `managed-by` label.
fn labelled(object: &str) -> String {
    format!(
        "has({object}.metadata.labels) && '{MANAGED_BY_KEY}' in {object}.metadata.labels && \
         {object}.metadata.labels['{MANAGED_BY_KEY}'] == '{MANAGER_NAME}'"
    )
}

/// Whether `object`'s controller is a Memcached.
fn controlled(object: &str) -> String {
    format!(
        "has({object}.metadata.ownerReferences) && {object}.metadata.ownerReferences.exists(r, \
         r.apiVersion.startsWith('{GROUP}/') && r.kind == 'Memcached' && has(r.controller) && r.controller)"
    )
}

/// The policy's validations, as (CEL expression, message), in order. A RoleBinding subject's `namespace`
/// is read as `namespace`: a v1.28.7 API server does not escape that field of a built-in type (there
/// `has(object.subjects[0].__namespace__)` was false, measured with this policy), though it escapes a
/// CRD schema's property of that name; the object's own namespace is the request's.
pub fn validations() -> Vec<(String, String)> {
    let labelled_new = labelled("object");
    let labelled_old = labelled("oldObject");
    let controlled_old = controlled("oldObject");
    vec![
        (
            format!("object == null || ({labelled_new})"),
            format!("the operator writes only objects labelled {MANAGED_BY_KEY}={MANAGER_NAME}"),
        ),
        (
            format!("oldObject == null || ({labelled_old}) || ({controlled_old})"),
            "the operator changes or deletes only objects that are its own already (labelled, or \
             controlled by a Memcached)"
                .to_owned(),
        ),
        (
            "request.resource.resource != 'roles' || object == null || \
             (has(object.rules) && object.rules.all(r, r.apiGroups == [''] && \
             r.resources == ['configmaps'] && has(r.resourceNames) && size(r.resourceNames) > 0 && \
             r.verbs.all(v, v == 'list' || v == 'watch')))"
                .to_owned(),
            "the operator's Roles only list and watch ConfigMaps by name".to_owned(),
        ),
        (
            "request.resource.resource != 'rolebindings' || object == null || \
             (object.metadata.name.endsWith('-proxy') && object.roleRef.kind == 'Role' && \
             object.roleRef.name == object.metadata.name && has(object.subjects) && \
             size(object.subjects) == 1 && object.subjects[0].kind == 'ServiceAccount' && \
             object.subjects[0].name == object.metadata.name && \
             has(object.subjects[0].namespace) && object.subjects[0].namespace == request.namespace)"
                .to_owned(),
            "the operator's RoleBindings bind the Role <name>-proxy to the ServiceAccount <name>-proxy of \
             their namespace only"
                .to_owned(),
        ),
    ]
}

/// The match condition: requests of the operator's ServiceAccount `namespace/name` only.
pub fn match_condition(namespace: &str, service_account: &str) -> String {
    format!("request.userInfo.username == 'system:serviceaccount:{namespace}:{service_account}'")
}

/// The resources the operator writes, with the operations that write them: every resource of
/// [`manager_role`] with a write verb but the Memcached API's and Events (Secrets among them: the auth
/// files the servers load), and Secrets in any case (the digest key, created by the operator in its own
/// namespace).
pub fn resource_rules() -> Vec<NamedRuleWithOperations> {
    let written = ["create", "patch", "update", "delete"];
    let mut rules: Vec<NamedRuleWithOperations> = manager_role()
        .rules
        .unwrap_or_default()
        .into_iter()
        .filter(|rule| rule.verbs.iter().any(|v| written.contains(&v.as_str())))
        .filter(|rule| {
            let group = rule.api_groups.as_deref().unwrap_or_default();
            !group.iter().any(|g| g == GROUP || g == "events.k8s.io")
        })
        .map(|rule| NamedRuleWithOperations {
            api_groups: rule.api_groups,
            api_versions: Some(vec!["*".to_owned()]),
            resources: rule.resources,
            operations: Some(["CREATE", "UPDATE", "DELETE"].map(String::from).to_vec()),
            ..NamedRuleWithOperations::default()
        })
        .collect();
    let secrets_written = rules.iter().any(|rule| {
        rule.api_groups.as_deref() == Some(&[String::new()][..])
            && rule.resources.iter().flatten().any(|r| r == "secrets")
    });
    if !secrets_written {
        rules.push(NamedRuleWithOperations {
            api_groups: Some(vec![String::new()]),
            api_versions: Some(vec!["v1".to_owned()]),
            resources: Some(vec!["secrets".to_owned()]),
            operations: Some(["CREATE", "UPDATE", "DELETE"].map(String::from).to_vec()),
            ..NamedRuleWithOperations::default()
        });
    }
    rules
}

/// The policy, for the operator's ServiceAccount `namespace/service_account`.
pub fn policy(name: &str, namespace: &str, service_account: &str) -> ValidatingAdmissionPolicy {
    ValidatingAdmissionPolicy {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..ObjectMeta::default()
        },
        spec: Some(ValidatingAdmissionPolicySpec {
            failure_policy: Some("Fail".to_owned()),
            match_constraints: Some(MatchResources {
                resource_rules: Some(resource_rules()),
                ..MatchResources::default()
            }),
            match_conditions: Some(vec![MatchCondition {
                name: "operator".to_owned(),
                expression: match_condition(namespace, service_account),
            }]),
            validations: Some(
                validations()
                    .into_iter()
                    .map(|(expression, message)| Validation {
                        expression,
                        message: Some(message),
                        reason: Some("Forbidden".to_owned()),
                        ..Validation::default()
                    })
                    .collect(),
            ),
            ..ValidatingAdmissionPolicySpec::default()
        }),
        ..ValidatingAdmissionPolicy::default()
    }
}

/// The binding that enforces `policy` everywhere (`Deny`: a refused write fails).
pub fn binding(name: &str, policy: &str) -> ValidatingAdmissionPolicyBinding {
    ValidatingAdmissionPolicyBinding {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..ObjectMeta::default()
        },
        spec: Some(ValidatingAdmissionPolicyBindingSpec {
            policy_name: Some(policy.to_owned()),
            validation_actions: Some(vec!["Deny".to_owned()]),
            ..ValidatingAdmissionPolicyBindingSpec::default()
        }),
    }
}

/// The committed file of `config/admission-policy` (a kustomization of its own, applied after
/// `config/default`: kustomize would give these cluster-scoped kinds, which it does not know, a
/// namespace): the policy and binding for `config/default`'s ServiceAccount.
pub fn admission_policy_yaml() -> Result<String, serde_saphyr::ser_error::Error> {
    let name = format!("{NAME_PREFIX}{POLICY_NAME}");
    let service_account = format!("{NAME_PREFIX}{SERVICE_ACCOUNT}");
    let docs = [
        serde_json::to_value(policy(&name, INSTALL_NAMESPACE, &service_account))
            .unwrap_or_default(),
        serde_json::to_value(binding(&name, &name)).unwrap_or_default(),
    ];
    Ok(format!(
        "# Generated by `make manifests` (cargo xtask manifests). Do not edit. For the operator's \
         ServiceAccount\n# {INSTALL_NAMESPACE}/{service_account} of config/default: another namespace or \
         prefix needs the match\n# condition's user name changed (the Helm chart sets it from the release).\n{}",
        to_yaml(&docs)?
    ))
}
