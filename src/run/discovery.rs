//! Which APIs the cluster serves, of those it may not (CRDs'): asked once at start, before the watches
//! are made, for each kind of the table of [`Served::IfInstalled`] (the ServiceMonitor).

use futures::future::{BoxFuture, Shared};
use kube::Client;
use tracing::{debug, info, warn};

use super::watch_retry::{FIRST_RETRY, LONGEST_RETRY};
use crate::store::kinds::{ChildKind, EachKind, Served, Unserved, each_kind};

/// The kinds of the table the cluster does not serve (see [`served`]).
pub(super) async fn unserved_kinds(
    client: &Client,
    shutdown: Shared<BoxFuture<'static, ()>>,
) -> Unserved {
    struct Asked(Vec<(&'static str, &'static str, &'static str)>);
    impl EachKind for Asked {
        fn kind<K: ChildKind>(&mut self) {
            if K::SERVED == Served::IfInstalled {
                self.0.push((K::API_VERSION, K::URL_PATH_SEGMENT, K::KIND));
            }
        }
    }
    let mut asked = Asked(Vec::new());
    each_kind(&mut asked);
    let mut unserved = Unserved::new();
    for (api_version, plural, kind) in asked.0 {
        if !served(client, api_version, plural, kind, shutdown.clone()).await {
            info!(
                kind,
                api_version, "the cluster does not serve this API; not watching it"
            );
            unserved.insert(plural);
        }
    }
    unserved
}

/// Whether the cluster serves `plural` in `api_version` (a group's). Asked until it answers (an operator
/// started during an API-server outage must not decide "not served" from a refused connection), or until
/// shutdown; an error that a retry cannot fix (403, other 4xx) counts as not served.
async fn served(
    client: &Client,
    api_version: &str,
    plural: &str,
    kind: &str,
    shutdown: Shared<BoxFuture<'static, ()>>,
) -> bool {
    let mut delay = FIRST_RETRY;
    loop {
        match client.list_api_group_resources(api_version).await {
            Ok(list) => return list.resources.iter().any(|r| r.name == plural),
            Err(kube::Error::Api(status)) if status.code == 404 => return false,
            Err(kube::Error::Api(status)) if status.code < 500 => {
                warn!(error = %status.message, kind, "cannot discover the API; its objects are not managed");
                return false;
            }
            Err(error) => {
                debug!(%error, kind, "cannot discover the API yet; retrying");
            }
        }
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            () = shutdown.clone() => return false,
        }
        delay = (delay * 2).min(LONGEST_RETRY);
    }
}
