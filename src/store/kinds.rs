//! The table of the kinds of children the operator creates for an instance, from which everything that
//! enumerates kinds is derived: its cache ([`ChildCaches`]), its watch and the reconciles a change
//! triggers, the watch of same-named objects it does not manage, the wait for its first list before
//! reconciling, its RBAC rule (`src/manifests.rs`), the names checked before anything is written, and
//! how the reconcile applies it ([`Role`]): the kinds applied after the workload are built by the
//! builder the table names and applied (or deleted) in the table's order by one loop. The test fakes
//! (the fake API server's collections, the scripted mock, the smoke world) take their kinds from here too.
//! A new kind is one entry here plus its builder in `resources`, and the regenerated files.
//!
//! A kind whose API the cluster may not serve (a CRD's, such as a VerticalPodAutoscaler's) says so in its
//! entry ([`Served::IfInstalled`]): the operator asks at start whether it is served; where it is not, its
//! cache is empty and complete (no watch, no wait for a first list that never comes), and an instance that
//! asks for such a child is Degraded (`<Kind>Unavailable`) instead of failing. Such kinds' Rust types, which
//! k8s-openapi does not carry, live in `api::external`.
//!
//! The ServiceMonitor (the Prometheus Operator's) is such a kind, and the last entry: applied after the
//! Service it selects.
//!
//! Not in the table: pods (created by the workloads, indexed per instance and never applied) and Secrets
//! (the users').

use std::collections::BTreeSet;
use std::fmt::Debug;

use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::core::v1::{ConfigMap, Service, ServiceAccount};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{Role as RbacRole, RoleBinding};

use super::cache::Cache;
use super::compact::Compactable;
use crate::api::Workload;
use crate::api::external::ServiceMonitor;
#[cfg(test)]
use crate::api::external::VerticalPodAutoscaler;
use crate::api::names::config_map_name;
use crate::api::names::proxy_name;
use crate::resources::proxy::{self, access};
#[cfg(test)]
use crate::resources::vertical_pod_autoscaler;
use crate::resources::{Instance, autoscaler, network_policy, pdb, service, service_monitor};

/// How the reconcile applies a kind of child.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// The published server list, applied with the pool before the workload.
    ServerList,
    /// The workload, of the kind `spec.workload` names.
    Workload(Workload),
    /// Applied after the workload from what the kind's builder makes of the spec (see
    /// [`ChildKind::desired`]), in the table's order; an optional child the spec no longer asks for is
    /// deleted. (The other kinds' builders make the proxy's children: applied after these, see
    /// [`ChildKind::desired`].)
    Built,
}

/// Whether the cluster serves a kind's API wherever the operator runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Served {
    /// A Kubernetes API: always served.
    Always,
    /// A CRD's API (see the module doc): asked once at start, watched only where served.
    IfInstalled,
}

/// The kinds (by plural) whose API the cluster did not serve when the operator started.
pub type Unserved = BTreeSet<&'static str>;

/// What a builder makes of an instance: each child of one kind by name, `None` where the spec asks for
/// none of that name.
pub type Desired<K> = Vec<(String, Option<K>)>;

/// A kind of child in the table.
pub trait ChildKind:
    Compactable<DynamicType = (), Scope = NamespaceResourceScope>
    + k8s_openapi::Resource
    + k8s_openapi::Metadata
    + Debug
    + Send
    + Sync
{
    /// Whether the spec can ask for none of it, so the operator deletes it (and needs to be allowed to).
    const OPTIONAL: bool;
    /// Whether the operator deletes children of this kind: those of an optional kind, and the optional
    /// children (the proxy's) the builder of a required kind makes.
    const DELETES: bool;
    /// How the reconcile applies it.
    const ROLE: Role;
    /// Whether the cluster may not serve its API.
    const SERVED: Served;

    /// This kind's cache.
    fn cache(caches: &ChildCaches) -> &Cache<Self>;

    /// The children of this kind `instance` has, by name, that the reconcile applies after the workload:
    /// every child of a [`Role::Built`] kind, in the table's order, then the optional children of the
    /// other kinds' builders (the proxy's Deployment: its pods need the ServiceAccount before them). The
    /// server list and the workload themselves are built with the pool.
    fn desired(instance: &Instance<'_>) -> Desired<Self>;

    /// The names `instance`'s children of this kind must have (an optional kind's are checked as it is
    /// applied): an object of that name that the operator does not manage stops the reconcile before
    /// anything is written.
    fn required_names(instance: &Instance<'_>) -> Vec<String> {
        if Self::OPTIONAL {
            return Vec::new();
        }
        match Self::ROLE {
            Role::ServerList => vec![config_map_name(instance.name)],
            Role::Workload(workload) if workload == instance.spec.workload => {
                vec![instance.name.to_owned()]
            }
            Role::Workload(_) => Vec::new(),
            Role::Built => Self::desired(instance)
                .into_iter()
                .map(|(name, _)| name)
                .collect(),
        }
    }
}

/// Something done once per kind of the table ([`each_kind`]).
pub trait EachKind {
    fn kind<K: ChildKind>(&mut self);
}

/// How the API names a kind of the table: what serves or checks its collection without its Rust type (a
/// fake API server, a test that looks for kinds listed by hand).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KindName {
    /// `group/version`, or `v1` for the core group.
    pub api_version: &'static str,
    /// The collection's name in paths (`deployments`).
    pub plural: &'static str,
    pub kind: &'static str,
    /// Whether the cluster may not serve it (a fake serves it only when told the CRD is installed).
    pub served: Served,
}

/// The name of each kind, in the table's order.
pub fn kind_names() -> Vec<KindName> {
    struct Names(Vec<KindName>);
    impl EachKind for Names {
        fn kind<K: ChildKind>(&mut self) {
            self.0.push(KindName {
                api_version: K::API_VERSION,
                plural: K::URL_PATH_SEGMENT,
                kind: K::KIND,
                served: K::SERVED,
            });
        }
    }
    let mut names = Names(Vec::new());
    each_kind(&mut names);
    names.0
}

/// What makes the cache of each kind ([`ChildCaches::build`]): the watches, or a test's caches.
pub trait MakeCache {
    fn make<K: ChildKind>(&mut self) -> Cache<K>;

    /// The kinds of [`Served::IfInstalled`] the cluster does not serve (their caches empty and complete).
    fn unserved(&self) -> Unserved {
        Unserved::new()
    }
}

/// The table. Each entry: the field of [`ChildCaches`], the kind, whether the spec can ask for none, how
/// it is applied, whether the cluster may not serve it, and (for [`Role::Built`]) its builder. An entry
/// may be `#[cfg(test)]`, after its doc.
macro_rules! child_kinds {
    ($($(#[doc = $doc:literal])* $(#[cfg($cfg:meta)])? $field:ident: $kind:ty, optional: $optional:literal,
       deletes: $deletes:literal, role: $role:expr, served: $served:ident, built: $built:expr;)*) => {
        /// The caches of the children, one per kind.
        #[derive(Clone, Debug)]
        pub struct ChildCaches {
            $($(#[doc = $doc])* $(#[cfg($cfg)])? pub $field: Cache<$kind>,)*
            /// The kinds the cluster did not serve at start (see [`Served::IfInstalled`]).
            pub unserved: Unserved,
        }

        impl ChildCaches {
            /// The cache of each kind, made by `make` in the table's order.
            pub fn build(make: &mut impl MakeCache) -> Self {
                Self {
                    $($(#[cfg($cfg)])? $field: make.make::<$kind>(),)*
                    unserved: make.unserved(),
                }
            }

            /// Whether the cluster served `K`'s API when the operator started.
            pub fn served<K: ChildKind>(&self) -> bool {
                !self.unserved.contains(K::URL_PATH_SEGMENT)
            }
        }

        $(
            $(#[cfg($cfg)])?
            impl Compactable for $kind {}

            $(#[cfg($cfg)])?
            impl ChildKind for $kind {
                const OPTIONAL: bool = $optional;
                const DELETES: bool = $deletes;
                const ROLE: Role = $role;
                const SERVED: Served = Served::$served;

                fn cache(caches: &ChildCaches) -> &Cache<Self> {
                    &caches.$field
                }

                fn desired(instance: &Instance<'_>) -> Desired<Self> {
                    let built: fn(&Instance<'_>) -> Desired<Self> = $built;
                    built(instance)
                }
            }
        )*

        /// Calls `each` once per kind, in the table's order.
        pub fn each_kind(each: &mut impl EachKind) {
            $($(#[cfg($cfg)])? each.kind::<$kind>();)*
        }
    };
}

child_kinds! {
    /// The servers' Deployments (the workload), and the proxies' (`<name>-proxy`).
    deployments: Deployment, optional: false, deletes: true,
        role: Role::Workload(Workload::Deployment), served: Always,
        built: |instance| vec![(proxy_name(instance.name), proxy::deployment(instance))];
    statefulsets: StatefulSet, optional: false, deletes: false,
        role: Role::Workload(Workload::StatefulSet), served: Always, built: |_| Vec::new();
    services: Service, optional: false, deletes: true, role: Role::Built, served: Always,
        built: |instance| vec![
            (instance.name.to_owned(), Some(service::service(instance))),
            (service::headless_name(instance.name), Some(service::headless(instance))),
            (proxy_name(instance.name), proxy::service(instance)),
        ];
    /// The published server lists (`<name>-servers`) and the proxies' route configurations
    /// (`<name>-proxy`), both built from the published list with the pool.
    config_maps: ConfigMap, optional: false, deletes: true, role: Role::ServerList, served: Always,
        built: |_| Vec::new();
    pdbs: PodDisruptionBudget, optional: true, deletes: true, role: Role::Built, served: Always,
        built: |instance| vec![
            (instance.name.to_owned(), pdb::pdb(instance)),
            (proxy_name(instance.name), proxy::pdb(instance)),
        ];
    /// The servers' NetworkPolicy, and the proxies' (`<name>-proxy`).
    network_policies: NetworkPolicy, optional: true, deletes: true, role: Role::Built, served: Always,
        built: |instance| vec![
            (instance.name.to_owned(), network_policy::network_policy(instance)),
            (proxy_name(instance.name), network_policy::proxy_network_policy(instance)),
        ];
    autoscalers: HorizontalPodAutoscaler, optional: true, deletes: true, role: Role::Built, served: Always,
        built: |instance| named(instance, autoscaler::autoscaler(instance));
    /// The proxy's configuration writer: its ServiceAccount, its Role (read its one ConfigMap) and their
    /// binding (`resources::proxy::access`).
    service_accounts: ServiceAccount, optional: true, deletes: true, role: Role::Built, served: Always,
        built: |instance| proxy_named(instance, access::service_account(instance));
    roles: RbacRole, optional: true, deletes: true, role: Role::Built, served: Always,
        built: |instance| proxy_named(instance, access::role(instance));
    role_bindings: RoleBinding, optional: true, deletes: true, role: Role::Built, served: Always,
        built: |instance| proxy_named(instance, access::role_binding(instance));
    /// A kind of a CRD the cluster may not serve, in the table only for the tests that show such a kind is
    /// one entry plus its builder.
    #[cfg(test)]
    vertical_pod_autoscalers: VerticalPodAutoscaler, optional: true, deletes: true, role: Role::Built,
        served: IfInstalled,
        built: |instance| named(instance, vertical_pod_autoscaler::vertical_pod_autoscaler(instance));
    /// The Prometheus Operator's ServiceMonitor for the exporter, a CRD's kind: last, after the Service it
    /// selects.
    service_monitors: ServiceMonitor, optional: true, deletes: true, role: Role::Built,
        served: IfInstalled, built: |instance| named(instance, service_monitor::service_monitor(instance));
}

/// The proxy's one child of a kind, named `<name>-proxy`, or none.
fn proxy_named<K>(instance: &Instance<'_>, desired: Option<K>) -> Desired<K> {
    vec![(proxy_name(instance.name), desired)]
}

/// One child named after the instance, or none.
fn named<K>(instance: &Instance<'_>, desired: Option<K>) -> Desired<K> {
    vec![(instance.name.to_owned(), desired)]
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Names(Vec<(&'static str, &'static str, bool)>);

    impl EachKind for Names {
        fn kind<K: ChildKind>(&mut self) {
            self.0.push((K::GROUP, K::URL_PATH_SEGMENT, K::OPTIONAL));
        }
    }

    #[test]
    fn kind_names_follow_the_table() {
        let mut names = Names(Vec::new());
        each_kind(&mut names);
        let plurals: Vec<_> = kind_names().iter().map(|k| k.plural).collect();
        let table: Vec<_> = names.0.iter().map(|&(_, plural, _)| plural).collect();
        assert_eq!(plurals, table);
        assert_eq!(
            kind_names()[0],
            KindName {
                api_version: "apps/v1",
                plural: "deployments",
                kind: "Deployment",
                served: Served::Always,
            }
        );
    }

    #[test]
    fn the_table_lists_every_kind_of_child_once() {
        let mut names = Names(Vec::new());
        each_kind(&mut names);
        assert_eq!(
            names.0,
            [
                ("apps", "deployments", false),
                ("apps", "statefulsets", false),
                ("", "services", false),
                ("", "configmaps", false),
                ("policy", "poddisruptionbudgets", true),
                ("networking.k8s.io", "networkpolicies", true),
                ("autoscaling", "horizontalpodautoscalers", true),
                ("", "serviceaccounts", true),
                ("rbac.authorization.k8s.io", "roles", true),
                ("rbac.authorization.k8s.io", "rolebindings", true),
                ("autoscaling.k8s.io", "verticalpodautoscalers", true),
                ("monitoring.coreos.com", "servicemonitors", true),
            ]
        );
    }
}
