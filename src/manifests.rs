//! Generated install manifests: the CRD and the operator's RBAC rules, printed by the binary and
//! committed under `config/`. Tests fail when the committed copies drift from what the code generates.

use k8s_openapi::api::rbac::v1::{ClusterRole, PolicyRule, Role};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, ValidationRule,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::CustomResourceExt;
use serde::Serialize;

use crate::api::{GROUP, Memcached};
use crate::resources::{MAX_NAME_LEN, MAX_STATEFULSET_NAME_LEN, REVISION_HASH_LEN};
use crate::store::{ChildKind, EachKind, each_kind};

pub mod admission;

/// Path of the committed CRD, relative to the repository root.
pub const CRD_PATH: &str = "config/crd/bases/cache.example.com_memcacheds.yaml";
/// Path of the committed operator roles, relative to the repository root.
pub const RBAC_PATH: &str = "config/rbac/role.yaml";
/// Path of the committed Role of the namespaced install (`config/namespaced`).
pub const NAMESPACED_RBAC_PATH: &str = "config/namespaced/role.yaml";
/// The namespace and name prefix `config/default` gives every object, which the namespaced overlay's own
/// objects carry already (an overlay's prefix would apply to `config/default`'s objects a second time).
pub const INSTALL_NAMESPACE: &str = "memcached-operator-system";
pub const NAME_PREFIX: &str = "memcached-operator-";

/// Name of the ClusterRole holding what the controller calls.
pub const MANAGER_ROLE: &str = "manager-role";
/// Name of the ClusterRole that lets the operator check who scrapes `/metrics`.
pub const METRICS_AUTH_ROLE: &str = "metrics-auth-role";
/// Name of the namespaced Role for the leader-election Lease and the digest key Secret.
pub const LEADER_ELECTION_ROLE: &str = "leader-election-role";

/// The CRD, generated from the Rust types, with [`name_rule`] and [`statefulset_name_rule`] on its root
/// (the rules that read `metadata`, which the derived schema of the spec cannot carry).
pub fn crd() -> CustomResourceDefinition {
    let mut crd = Memcached::crd();
    for version in &mut crd.spec.versions {
        if let Some(root) = version
            .schema
            .as_mut()
            .and_then(|s| s.open_api_v3_schema.as_mut())
        {
            root.x_kubernetes_validations
                .get_or_insert_with(Vec::new)
                .extend([name_rule(), statefulset_name_rule()]);
        }
    }
    crd
}

/// CEL rule on the object's root: a name that can name the instance's Services, as the operator's
/// `InvalidName` check requires (an RFC 1035 label that leaves room for the `-headless` suffix within 63
/// characters). Refused at admission rather than left to become `Degraded` after it is stored, since a
/// name cannot be changed, only recreated.
pub fn name_rule() -> ValidationRule {
    ValidationRule {
        rule: format!(
            "self.metadata.name.size() <= {MAX_NAME_LEN} && self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')"
        ),
        message: Some(format!(
            "metadata.name must be at most {MAX_NAME_LEN} characters of lower-case letters, digits and '-', start \
             with a letter and end with a letter or digit: it names the instance's Services, `<name>-headless` \
             included, which must fit in 63 characters"
        )),
        ..ValidationRule::default()
    }
}

/// CEL rule on the object's root: a StatefulSet instance's name leaves room for the hash the StatefulSet
/// controller appends in its pods' `controller-revision-hash` label (a label value, at most 63
/// characters), as the operator's `InvalidName` check requires. A longer name is admitted by the API and
/// then no pod is ever created (kubernetes/kubernetes#64023).
pub fn statefulset_name_rule() -> ValidationRule {
    ValidationRule {
        rule: format!(
            "!has(self.spec.workload) || self.spec.workload != 'StatefulSet' || \
             self.metadata.name.size() <= {MAX_STATEFULSET_NAME_LEN}"
        ),
        message: Some(format!(
            "metadata.name of a StatefulSet instance (spec.workload: StatefulSet) must be at most \
             {MAX_STATEFULSET_NAME_LEN} characters: its pods carry the label \
             controller-revision-hash=<name>-<a hash of up to {REVISION_HASH_LEN} characters>, which must fit \
             in 63 characters, or the StatefulSet controller creates no pod"
        )),
        ..ValidationRule::default()
    }
}

/// One rule: `verbs` on `resources` of `group`.
fn rule(group: &str, resources: &[&str], verbs: &[&str]) -> PolicyRule {
    PolicyRule {
        api_groups: Some(vec![group.to_owned()]),
        resources: Some(resources.iter().map(|r| (*r).to_owned()).collect()),
        verbs: verbs.iter().map(|v| (*v).to_owned()).collect(),
        ..PolicyRule::default()
    }
}

/// Exactly what the controller calls, cluster-wide (it may watch every namespace), and no more: no `get`
/// where the operator only watches (its reads come from the watches' caches), no `update` (it writes by
/// server-side apply, a `patch`), no `deletecollection`, no `escalate`, `bind` or `impersonate`, no
/// wildcard. `tests/rbac.rs` holds each verb to the call that needs it; docs/operations.md#rbac says why.
/// - Memcached: watched; patched to remove the finalizer earlier builds added (instances no longer get
///   one); status server-side applied. `update` on `memcacheds/finalizers` is not for a finalizer: it is
///   the right the OwnerReferencesPermissionEnforcement admission plugin (OpenShift, hardened clusters)
///   asks of whoever sets `blockOwnerDeletion: true` in an owner reference to a Memcached. The children's
///   controller owner references come from kube's `controller_owner_ref`, which leaves that field unset
///   today; the rule stays so that setting it (as controller-runtime operators do, so that a foreground
///   deletion waits for the children) takes no RBAC change, and because the Kubebuilder scaffold grants it.
/// - Deployments, StatefulSets, Services and ConfigMaps (the published server lists): watched and
///   server-side applied (a PATCH that may create, so `create` too); never deleted by the operator
///   (garbage collection does that), except the proxy's (`<name>-proxy`: a Deployment, a Service, a
///   ConfigMap) when a spec turns the proxy off, hence `delete` on all but StatefulSets.
/// - ServiceAccounts, Roles and RoleBindings: the proxy's configuration writer's (`<name>-proxy`, a Role
///   that lists and watches that one ConfigMap, which the operator may itself do: Kubernetes' escalation
///   check lets it create and bind such a Role without `escalate` or `bind`), like PodDisruptionBudgets
///   below. RBAC cannot confine what the operator binds (it holds every permission of its own role, so it
///   may bind that too): the opt-in ValidatingAdmissionPolicy ([`admission`]) does.
/// - Pods: watched, to report pod names, assign server slots and say why pods cannot start; read by
///   name (`get`) to tell a pod gone from one not marked; patched (server-side apply of one annotation)
///   to mark drained pods, and the server a warm handover copies from, with a low pod-deletion cost. Their
///   status is patched (`pods/status`) to open the warm-handover readiness gate of a rollout's new pod.
///   `create` and `delete` are for one pod only: the spare server a StatefulSet rollout's warm handover
///   runs while it lasts (`<name>-handover`, created by server-side apply and deleted when the rollout
///   ends; see `resources::spare`). RBAC cannot narrow `create` to a name, and a pod the operator creates
///   must be removed by it (garbage collection only removes it with the instance); nothing else is
///   created or deleted, and no other verb is added (`update` and `deletecollection` stay out).
/// - PodDisruptionBudgets, NetworkPolicies, HorizontalPodAutoscalers and ServiceMonitors: like
///   Deployments, and deleted when a spec turns them off. Creating an autoscaler needs no right on its
///   target: the HPA controller scales the Memcached with its own (`*/scale`) permissions. ServiceMonitors
///   are read by name (`get`) before one is created, having no watch of others' (`controller::apply`).
/// - Secrets: watched by metadata (to notice a referenced Secret's change; RBAC cannot grant metadata
///   alone, and a tenant may reference any Secret of its namespace, so no label or name narrows it), and
///   read (`get`) when one an instance references changes (TLS, auth) and for the digest key.
/// - Events: recorded through `events.k8s.io/v1` (created, and patched when they repeat).
pub fn manager_role() -> ClusterRole {
    ClusterRole {
        metadata: ObjectMeta {
            name: Some(MANAGER_ROLE.to_owned()),
            ..ObjectMeta::default()
        },
        rules: Some(
            vec![
                rule(GROUP, &["memcacheds"], &["list", "watch", "patch"]),
                rule(GROUP, &["memcacheds/status"], &["patch"]),
                // Not for a finalizer (the operator sets none): what OwnerReferencesPermissionEnforcement
                // asks of an owner reference with `blockOwnerDeletion: true` (see above).
                rule(GROUP, &["memcacheds/finalizers"], &["update"]),
            ]
            .into_iter()
            .chain(child_rules())
            .chain([
                rule(
                    "",
                    &["pods"],
                    &["get", "list", "watch", "create", "patch", "delete"],
                ),
                rule("", &["pods/status"], &["patch"]),
                // create, patch, delete: the auth file the servers load (`<name>-auth-file`), which
                // holds the operator's own entry beside the user's.
                rule(
                    "",
                    &["secrets"],
                    &["get", "list", "watch", "create", "patch", "delete"],
                ),
                rule(
                    "monitoring.coreos.com",
                    &["servicemonitors"],
                    &["get", "list", "watch", "create", "patch", "delete"],
                ),
                rule("events.k8s.io", &["events"], &["create", "patch"]),
            ])
            .collect(),
        ),
        ..ClusterRole::default()
    }
}

/// One rule per kind of child (see `store::kinds`): watched and applied by name; deleted too when the
/// spec can ask for none of them (an optional kind, or the proxy's children).
fn child_rules() -> Vec<PolicyRule> {
    struct Rules(Vec<PolicyRule>);
    impl EachKind for Rules {
        fn kind<K: ChildKind>(&mut self) {
            let verbs: &[&str] = if K::DELETES {
                &["list", "watch", "create", "patch", "delete"]
            } else {
                &["list", "watch", "create", "patch"]
            };
            self.0.push(rule(K::GROUP, &[K::URL_PATH_SEGMENT], verbs));
        }
    }
    let mut rules = Rules(Vec::new());
    each_kind(&mut rules);
    rules.0
}

/// The rules of [`manager_role`] as a Role in the install's namespace, for `config/namespaced`: the operator
/// watches only that namespace (`WATCH_NAMESPACE`), so it needs them nowhere else, and no ClusterRole
/// gives it Secrets or writes in other namespaces. Every rule is about namespaced resources, so a Role
/// can hold them all.
pub fn manager_namespaced_role() -> Role {
    Role {
        metadata: ObjectMeta {
            name: Some(format!("{NAME_PREFIX}{MANAGER_ROLE}")),
            namespace: Some(INSTALL_NAMESPACE.to_owned()),
            ..ObjectMeta::default()
        },
        rules: manager_role().rules,
    }
}

/// The committed Role of the namespaced install.
pub fn namespaced_rbac_yaml() -> Result<String, serde_saphyr::ser_error::Error> {
    Ok(format!(
        "# Generated by `make manifests`: the rules of `cargo xtask rbac`'s {MANAGER_ROLE}, as a \
         Role. Do not edit.\n{}",
        to_yaml(&[manager_namespaced_role()])?
    ))
}

/// What the operator needs to authorize scrapers of its HTTPS `/metrics` (manager/metrics_auth.rs): create
/// TokenReviews (who is this token?) and SubjectAccessReviews (may they `get /metrics`?). Both kinds are
/// cluster-scoped, so this is a ClusterRole even in the namespaced install; it is kept apart from
/// manager-role so that `config/namespaced` can drop manager-role and still keep it. It gives no read of
/// anything: a review only answers about the token or user it is given.
pub fn metrics_auth_role() -> ClusterRole {
    ClusterRole {
        metadata: ObjectMeta {
            name: Some(METRICS_AUTH_ROLE.to_owned()),
            ..ObjectMeta::default()
        },
        rules: Some(vec![
            rule("authentication.k8s.io", &["tokenreviews"], &["create"]),
            rule(
                "authorization.k8s.io",
                &["subjectaccessreviews"],
                &["create"],
            ),
        ]),
        ..ClusterRole::default()
    }
}

/// What the operator keeps in its own namespace only: the leader-election Lease (read, created once,
/// renewed by patch) and the digest key Secret (created once; reading it is the manager role's `get` on
/// Secrets). The name stays the one the Lease gave it, which installs bind.
pub fn leader_election_role() -> Role {
    Role {
        metadata: ObjectMeta {
            name: Some(LEADER_ELECTION_ROLE.to_owned()),
            // Rewritten by kustomize's namespace transformer, as in the Kubebuilder scaffold.
            namespace: Some("system".to_owned()),
            ..ObjectMeta::default()
        },
        rules: Some(vec![
            rule(
                "coordination.k8s.io",
                &["leases"],
                &["get", "create", "patch"],
            ),
            rule("", &["secrets"], &["create"]),
        ]),
    }
}

/// YAML documents separated by `---`, each with its apiVersion and kind.
pub fn to_yaml<T: Serialize>(docs: &[T]) -> Result<String, serde_saphyr::ser_error::Error> {
    let mut out = String::new();
    for doc in docs {
        out.push_str("---\n");
        out.push_str(&serde_saphyr::to_string(doc)?);
        if !out.ends_with('\n') {
            out.push('\n');
        }
    }
    Ok(out)
}

/// The committed CRD file's content.
pub fn crd_yaml() -> Result<String, serde_saphyr::ser_error::Error> {
    Ok(format!("{}{}", header("crd"), to_yaml(&[crd()])?))
}

/// The committed RBAC file's content.
pub fn rbac_yaml() -> Result<String, serde_saphyr::ser_error::Error> {
    let docs = [
        serde_json::to_value(manager_role()).unwrap_or_default(),
        serde_json::to_value(metrics_auth_role()).unwrap_or_default(),
        serde_json::to_value(leader_election_role()).unwrap_or_default(),
    ];
    Ok(format!("{}{}", header("rbac"), to_yaml(&docs)?))
}

fn header(command: &str) -> String {
    format!("# Generated by `cargo xtask {command}` (make manifests). Do not edit.\n")
}
