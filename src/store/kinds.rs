//! The table of the kinds of children the operator creates for an instance, from which everything that
//! is the same for each kind is derived: its cache ([`ChildCaches`]), its watch and the reconciles a change
//! triggers, the watch of same-named objects it does not manage, the wait for its first list before
//! reconciling, and its RBAC rule (`src/manifests.rs`). A new kind is one entry here plus its builder in
//! `resources` and its apply in `reconcile`.
//!
//! Not in the table: pods (created by the workloads, indexed per instance and never applied), Secrets (the
//! users'), and ServiceMonitors (an API the cluster may not serve, watched as dynamic objects only when it
//! does).

use std::fmt::Debug;

use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;

use super::cache::Cache;
use super::compact::Compactable;

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

    /// This kind's cache.
    fn cache(caches: &ChildCaches) -> &Cache<Self>;
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
}

/// The table. Each entry: the field of [`ChildCaches`], the kind, and whether the spec can ask for none.
macro_rules! child_kinds {
    ($($(#[$doc:meta])* $field:ident: $kind:ty, optional: $optional:literal;)*) => {
        /// The caches of the children, one per kind.
        #[derive(Clone, Debug)]
        pub struct ChildCaches {
            $($(#[$doc])* pub $field: Cache<$kind>,)*
        }

        impl ChildCaches {
            /// The cache of each kind, made by `make` in the table's order.
            pub fn build(make: &mut impl MakeCache) -> Self {
                Self {
                    $($field: make.make::<$kind>(),)*
                }
            }
        }

        $(
            impl Compactable for $kind {}

            impl ChildKind for $kind {
                const OPTIONAL: bool = $optional;

                fn cache(caches: &ChildCaches) -> &Cache<Self> {
                    &caches.$field
                }
            }
        )*

        /// Calls `each` once per kind, in the table's order.
        pub fn each_kind(each: &mut impl EachKind) {
            $(each.kind::<$kind>();)*
        }
    };
}

child_kinds! {
    deployments: Deployment, optional: false;
    statefulsets: StatefulSet, optional: false;
    services: Service, optional: false;
    /// The published server lists (`<name>-servers`).
    config_maps: ConfigMap, optional: false;
    pdbs: PodDisruptionBudget, optional: true;
    network_policies: NetworkPolicy, optional: true;
    autoscalers: HorizontalPodAutoscaler, optional: true;
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
                kind: "Deployment"
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
            ]
        );
    }
}
