//! The names a memcached server's certificate may be valid for, as the operator sees it.
//!
//! The operator dials a pod by its IP, but certificates are issued for the names the cache's clients use:
//! the instance's Services. So a server is accepted when its certificate (besides a chain to the instance's
//! CA) is valid for **any** of:
//!
//! - the client Service `<name>` and the headless Service `<name>-headless`, each as `<svc>.<ns>.svc` and
//!   `<svc>.<ns>.svc.<clusterDomain>`: the forms that name the namespace. The short forms a pod's search
//!   path also resolves (`<svc>`, `<svc>.<ns>`) are not accepted: `<svc>` is the same for a same-named
//!   instance in every namespace, so with a CA shared between tenants (a cluster-wide cert-manager issuer)
//!   another namespace's certificate would pass; `<svc>.<ns>` is also a name outside the cluster (`ns` can
//!   be any top-level domain);
//! - the pod's own name behind the headless Service, `<pod>.<name>-headless.<ns>.svc[.<clusterDomain>]`:
//!   the stable address of a StatefulSet pod, and what a wildcard `*.<name>-headless.<ns>.svc` certificate
//!   covers;
//! - the pod's IP (checked by the verifier from the address dialled, as an IP SAN).
//!
//! This is the rule Kubernetes components and the memcached exporter's users rely on: the certificate says
//! it belongs to this instance in this namespace. A certificate from the same CA for anything else (another
//! instance, `evil.example.com`) is refused.

use std::sync::Arc;

use tokio_rustls::rustls::pki_types::ServerName;

use crate::api::names::headless_name;

/// The cluster's DNS domain when the operator is not told another (`--cluster-domain`).
pub const DEFAULT_CLUSTER_DOMAIN: &str = "cluster.local";

/// The DNS names a server's certificate may be valid for (its pod IP is always accepted too). Cheap to
/// clone.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServerNames {
    dns: Arc<[ServerName<'static>]>,
}

impl ServerNames {
    /// The names of pod `pod` of instance `instance` in `namespace` (module documentation). Names that are
    /// not valid DNS names (which the API server's validation of object names rules out) are left out.
    pub fn for_pod(instance: &str, namespace: &str, pod: &str, cluster_domain: &str) -> Self {
        let headless = headless_name(instance);
        let mut names = Vec::with_capacity(6);
        for service in [instance, headless.as_str()] {
            names.push(format!("{service}.{namespace}.svc"));
            names.push(format!("{service}.{namespace}.svc.{cluster_domain}"));
        }
        names.push(format!("{pod}.{headless}.{namespace}.svc"));
        names.push(format!("{pod}.{headless}.{namespace}.svc.{cluster_domain}"));
        Self::new(names)
    }

    /// Exactly these DNS names; those that are not valid DNS names are left out.
    pub fn new(names: impl IntoIterator<Item = String>) -> Self {
        let dns: Vec<ServerName<'static>> = names
            .into_iter()
            .filter_map(|name| ServerName::try_from(name).ok())
            .filter(|name| matches!(name, ServerName::DnsName(_)))
            .collect();
        Self { dns: dns.into() }
    }

    /// The DNS names.
    pub fn dns(&self) -> &[ServerName<'static>] {
        &self.dns
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shown(names: &ServerNames) -> Vec<String> {
        names
            .dns()
            .iter()
            .map(|n| n.to_str().into_owned())
            .collect()
    }

    #[test]
    fn a_pod_is_known_by_its_services_and_its_headless_name() {
        let names = ServerNames::for_pod("cache", "shop", "cache-0", "cluster.local");
        assert_eq!(
            shown(&names),
            [
                "cache.shop.svc",
                "cache.shop.svc.cluster.local",
                "cache-headless.shop.svc",
                "cache-headless.shop.svc.cluster.local",
                "cache-0.cache-headless.shop.svc",
                "cache-0.cache-headless.shop.svc.cluster.local",
            ]
        );
    }

    #[test]
    fn the_cluster_domain_is_the_one_given() {
        let names = ServerNames::for_pod("cache", "shop", "cache-0", "corp.example");
        assert!(shown(&names).contains(&"cache.shop.svc.corp.example".to_owned()));
        assert!(!shown(&names).iter().any(|n| n.ends_with("cluster.local")));
    }

    #[test]
    fn invalid_names_and_ip_addresses_are_left_out() {
        let names = ServerNames::new(["ok.example".into(), "not a name".into(), "10.0.0.1".into()]);
        assert_eq!(shown(&names), ["ok.example"]);
    }
}
