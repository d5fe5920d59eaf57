//! The optional child kinds the operator may not list in its scope: an install whose RBAC predates a
//! feature (the proxy's ServiceAccount, Role and RoleBinding came with `spec.proxy`) runs a newer operator
//! until its RBAC is updated too. Such a kind is not watched: its cache is empty and complete from the
//! start, so the operator is ready and every instance that does not need the kind is served; an instance
//! that needs it gets the API server's refusal when its child is applied (`Degraded`, with the kind and
//! verb in the message), retried with backoff. The kinds are asked once, at start-up; a role changed
//! later takes effect at the operator's next start.

use std::collections::BTreeSet;

use futures::FutureExt;
use futures::future::BoxFuture;
use kube::api::{ListParams, PartialObjectMeta};
use kube::{Api, Client};
use tracing::warn;

use crate::store::kinds::{ChildKind, EachKind, each_kind};

/// The optional kinds (by URL path segment, `serviceaccounts`) whose list the API server refuses (403)
/// to the operator in `namespace` (or cluster-wide). A kind the probe cannot decide (an outage, another
/// error) counts as allowed: its watch retries as every watch does.
pub async fn forbidden_kinds(client: &Client, namespace: Option<&str>) -> BTreeSet<&'static str> {
    let mut probes = Probes {
        client,
        namespace,
        probes: Vec::new(),
    };
    each_kind(&mut probes);
    // One after another: requests sent at once before the client has a connection each open their own,
    // where the operator keeps one HTTP/2 connection per client.
    let mut forbidden = BTreeSet::new();
    for probe in probes.probes {
        forbidden.extend(probe.await);
    }
    forbidden
}

struct Probes<'a> {
    client: &'a Client,
    namespace: Option<&'a str>,
    probes: Vec<BoxFuture<'static, Option<&'static str>>>,
}

impl EachKind for Probes<'_> {
    fn kind<K: ChildKind>(&mut self) {
        if !K::OPTIONAL {
            return;
        }
        let api: Api<PartialObjectMeta<K>> = match self.namespace {
            Some(ns) => Api::namespaced(self.client.clone(), ns),
            None => Api::all(self.client.clone()),
        };
        self.probes.push(
            async move {
                let kind = K::URL_PATH_SEGMENT;
                match api.list_metadata(&ListParams::default().limit(1)).await {
                    Err(kube::Error::Api(status)) if status.code == 403 => {
                        warn!(
                            resource = kind, error = %status.message,
                            "the operator may not list this kind: not watching it; instances that need \
                             it are Degraded until the operator's role allows it and the operator restarts"
                        );
                        Some(kind)
                    }
                    _ => None,
                }
            }
            .boxed(),
        );
    }
}
