//! The operator's RBAC: the manager role (exactly what the controller calls), its namespaced form, the
//! role that authorizes scrapers of `/metrics`, and the leader-election role.

use k8s_openapi::api::rbac::v1::{ClusterRole, PolicyRule, Role};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::names::{
    INSTALL_NAMESPACE, LEADER_ELECTION_ROLE, MANAGER_ROLE, METRICS_AUTH_ROLE, NAME_PREFIX,
};
use super::yaml::to_yaml;
use crate::api::GROUP;
use crate::store::{ChildKind, EachKind, each_kind};

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
///   may bind that too): the opt-in ValidatingAdmissionPolicy ([`admission`](super::admission)) does.
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
///   target: the HPA controller scales the Memcached with its own (`*/scale`) permissions. The
///   ServiceMonitors' rule is granted whether or not the cluster serves their API (a CRD's); the
///   operator uses it only where it does.
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
