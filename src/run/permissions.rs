//! The optional child kinds the operator may not list in its scope: an install whose RBAC predates a
//! feature (the proxy's ServiceAccount, Role and RoleBinding came with `spec.proxy`) runs a newer operator
//! until its RBAC is updated too. Such a kind is not watched: its cache is empty and complete from the
//! start, so the operator is ready and every instance that does not need the kind is served; an instance
//! that needs it gets the API server's refusal when its child is applied (`Degraded`, with the kind and
//! verb in the message), retried with backoff. The kinds are asked once, at start-up; a role changed
//! later takes effect at the operator's next start.
//!
//! A refusal says something about the role only if the API server grants the operator anything at all: a
//! restarted API server refuses every request (403) until its RBAC authorizer has synced, and an operator
//! that started with it would have left every optional kind unwatched until its own next start. So a kind
//! every install may list (the first required kind of the table) is asked too; when that is refused as
//! well, no kind is taken for forbidden, and their watches retry until the server grants them.

use std::collections::BTreeSet;

use futures::FutureExt;
use futures::future::BoxFuture;
use kube::api::{ListParams, PartialObjectMeta};
use kube::{Api, Client};
use tracing::warn;

use crate::store::kinds::{ChildKind, EachKind, Unserved, each_kind};

/// What a probe's list got.
#[derive(Debug, PartialEq)]
enum Answer {
    Refused(String),
    Other,
}

/// The optional kinds (by URL path segment, `serviceaccounts`) whose list the API server refuses (403)
/// to the operator in `namespace` (or cluster-wide), of those the cluster serves (not `unserved`: no
/// request for an API that is not there). A kind the probe cannot decide (an outage, another
/// error, a server that refuses every kind) counts as allowed: its watch retries as every watch does.
pub async fn forbidden_kinds(
    client: &Client,
    namespace: Option<&str>,
    unserved: &Unserved,
) -> BTreeSet<&'static str> {
    let mut probes = Probes {
        client,
        namespace,
        unserved,
        control: None,
        probes: Vec::new(),
    };
    each_kind(&mut probes);
    // One after another: requests sent at once before the client has a connection each open their own,
    // where the operator keeps one HTTP/2 connection per client.
    if let Some((kind, control)) = probes.control
        && let Answer::Refused(error) = control.await
    {
        warn!(
            resource = kind, %error,
            "the API server refuses even a kind every install may list (an API server whose authorizer is \
             not ready yet, or an operator whose role is not bound): watching every kind, retrying until \
             it grants them"
        );
        return BTreeSet::new();
    }
    let mut forbidden = BTreeSet::new();
    for (kind, probe) in probes.probes {
        if let Answer::Refused(error) = probe.await {
            warn!(
                resource = kind, %error,
                "the operator may not list this kind: not watching it; instances that need \
                 it are Degraded until the operator's role allows it and the operator restarts"
            );
            forbidden.insert(kind);
        }
    }
    forbidden
}

type Probe = (&'static str, BoxFuture<'static, Answer>);

struct Probes<'a> {
    client: &'a Client,
    namespace: Option<&'a str>,
    unserved: &'a Unserved,
    /// The list of the first required kind.
    control: Option<Probe>,
    /// The lists of the optional kinds.
    probes: Vec<Probe>,
}

impl EachKind for Probes<'_> {
    fn kind<K: ChildKind>(&mut self) {
        let skipped = self.unserved.contains(K::URL_PATH_SEGMENT);
        if skipped || (!K::OPTIONAL && self.control.is_some()) {
            return;
        }
        let api: Api<PartialObjectMeta<K>> = match self.namespace {
            Some(ns) => Api::namespaced(self.client.clone(), ns),
            None => Api::all(self.client.clone()),
        };
        let probe = async move {
            match api.list_metadata(&ListParams::default().limit(1)).await {
                Err(kube::Error::Api(status)) if status.code == 403 => {
                    Answer::Refused(status.message)
                }
                _ => Answer::Other,
            }
        }
        .boxed();
        if K::OPTIONAL {
            self.probes.push((K::URL_PATH_SEGMENT, probe));
        } else {
            self.control = Some((K::URL_PATH_SEGMENT, probe));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{Request, Response};
    use kube::client::Body;
    use serde_json::json;
    use tower_test::mock::{self, Handle};

    type Server = Handle<Request<Body>, Response<Body>>;

    /// Answers every list: 403 where `refuses` says so, else an empty list.
    async fn serve(mut server: Server, refuses: impl Fn(&str) -> bool) -> Vec<String> {
        let mut asked = Vec::new();
        while let Some((request, send)) = server.next_request().await {
            let path = request.uri().path().to_owned();
            let (code, body) = if refuses(&path) {
                let status = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                    "reason": "Forbidden", "code": 403, "message": format!("{path} is forbidden")});
                (403, status)
            } else {
                (
                    200,
                    json!({"kind": "List", "apiVersion": "v1", "metadata": {"resourceVersion": "1"}, "items": []}),
                )
            };
            let response = Response::builder().status(code);
            send.send_response(
                response
                    .body(Body::from(body.to_string().into_bytes()))
                    .unwrap(),
            );
            asked.push(path);
        }
        asked
    }

    async fn forbidden_where(
        refuses: impl Fn(&str) -> bool + Send + 'static,
        unserved: Unserved,
    ) -> (BTreeSet<&'static str>, Vec<String>) {
        let (service, server) = mock::pair::<Request<Body>, Response<Body>>();
        let client = Client::new(service, "ns");
        let served = tokio::spawn(serve(server, refuses));
        let forbidden = forbidden_kinds(&client, Some("ns"), &unserved).await;
        drop(client);
        (forbidden, served.await.unwrap())
    }

    #[tokio::test]
    async fn an_optional_kind_the_role_leaves_out_is_forbidden() {
        let (forbidden, asked) =
            forbidden_where(|path| path.ends_with("/roles"), Unserved::new()).await;
        assert_eq!(forbidden, BTreeSet::from(["roles"]));
        assert_eq!(
            asked[0], "/apis/apps/v1/namespaces/ns/deployments",
            "the control first"
        );
    }

    /// A restarted API server whose authorizer has not synced refuses everything: no kind is left
    /// unwatched for that, and the control probe is the only request made.
    #[tokio::test]
    async fn nothing_is_forbidden_while_the_server_refuses_everything() {
        let (forbidden, asked) = forbidden_where(|_| true, Unserved::new()).await;
        assert!(forbidden.is_empty(), "{forbidden:?}");
        assert_eq!(asked, ["/apis/apps/v1/namespaces/ns/deployments"]);
    }

    /// A kind whose API the cluster does not serve is not asked for: its list would only be a 404.
    #[tokio::test]
    async fn a_kind_the_cluster_does_not_serve_is_not_probed() {
        let unserved = Unserved::from(["servicemonitors"]);
        let (forbidden, asked) = forbidden_where(|_| false, unserved).await;
        assert!(forbidden.is_empty(), "{forbidden:?}");
        assert!(
            asked.iter().all(|path| !path.ends_with("/servicemonitors")),
            "{asked:?}"
        );
        assert!(
            asked.iter().any(|path| path.ends_with("/roles")),
            "{asked:?}"
        );
    }
}
