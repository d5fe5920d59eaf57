//! Watches: every change after the watched version that the watch selects, as JSON lines, the
//! connection held open for more (no bookmarks, no timeout); or, from an expired version, the 410 error
//! event after which an API server ends the watch.

use std::convert::Infallible;
use std::sync::Arc;

use axum::body::Body;
use axum::http::StatusCode;
use axum::response::Response;
use bytes::Bytes;
use serde_json::json;

use crate::Api;
use crate::response::response;
use crate::store::WatchFilter;

/// The response to a watch of `plural` from `from`.
pub(crate) fn respond(
    api: Arc<Api>,
    plural: &'static str,
    from: u64,
    filter: WatchFilter,
) -> Response {
    let (latest, epoch) = {
        let store = api.store();
        (store.subscribe(plural), store.watch_epoch())
    };
    let Some(latest) = latest else {
        return response(StatusCode::OK, "application/json", Body::empty());
    };
    let stream =
        futures::stream::unfold((api, from, latest), move |(api, mut after, mut latest)| {
            let filter = filter.clone();
            async move {
                loop {
                    latest.borrow_and_update();
                    let changes = {
                        let store = api.store();
                        (store.watch_epoch() == epoch)
                            .then(|| store.changes_after(plural, after, &filter))
                    };
                    let Some(changes) = changes else {
                        // Its server is gone: nothing more, and no end either (that is for the
                        // connection's cut or freeze to show).
                        return std::future::pending().await;
                    };
                    if let Some((chunk, last)) = changes {
                        after = last;
                        if !chunk.is_empty() {
                            return Some((Ok::<_, Infallible>(chunk), (api, after, latest)));
                        }
                    }
                    latest.changed().await.ok()?;
                }
            }
        });
    response(
        StatusCode::OK,
        "application/json",
        Body::from_stream(stream),
    )
}

/// The answer to a watch from an expired version: the `ERROR` event, then the end of the watch.
pub(crate) fn expired(message: String) -> Response {
    let event = json!({"type": "ERROR", "object": {
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": "Expired", "code": 410}});
    let mut line = serde_json::to_vec(&event).unwrap_or_default();
    line.push(b'\n');
    response(
        StatusCode::OK,
        "application/json",
        Body::from(Bytes::from(line)),
    )
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::time::Duration;

    use futures::StreamExt;
    use serde_json::json;

    use super::*;
    use crate::collections::Collection;
    use crate::store::Store;

    fn deployment(name: &str) -> serde_json::Value {
        json!({"metadata": {"name": name, "namespace": "ns"}, "spec": {"replicas": 1}})
    }

    /// The watch of deployments from version 0, as the bytes it sends.
    fn watch(api: &Arc<Api>, filter: &WatchFilter) -> axum::body::BodyDataStream {
        respond(api.clone(), "deployments", 0, filter.clone())
            .into_body()
            .into_data_stream()
    }

    /// What `stream` sends next, within 5 s.
    async fn next_text(stream: &mut axum::body::BodyDataStream) -> String {
        let chunk = tokio::time::timeout(Duration::from_secs(5), stream.next())
            .await
            .expect("a chunk within 5 s")
            .expect("the watch goes on")
            .unwrap();
        String::from_utf8_lossy(&chunk).into_owned()
    }

    /// The race this closes: an instance created right after a restart reached the operator over the old
    /// server's watch, whose connection was cut a moment later, so that the operator never re-listed.
    #[tokio::test]
    async fn a_watch_whose_server_went_away_sends_nothing_made_after() {
        let api = Arc::new(Api {
            store: Mutex::new(Store::serving(&[Collection::new(
                "apps/v1",
                "deployments",
                "Deployment",
            )])),
            latency: Duration::ZERO,
        });
        let filter = WatchFilter {
            namespace: None,
            selector: Default::default(),
            metadata_only: false,
        };
        let mut before = watch(&api, &filter);
        api.store().create("deployments", deployment("a")).unwrap();
        assert!(next_text(&mut before).await.contains("\"a\""));

        api.store().end_watches();
        api.store().create("deployments", deployment("b")).unwrap();
        let after = tokio::time::timeout(Duration::from_millis(300), before.next()).await;
        assert!(after.is_err(), "nothing more, not even an end: {after:?}");

        // A watch started now, from the same version, is the new server's: it sends the change.
        let mut now = watch(&api, &filter);
        assert!(next_text(&mut now).await.contains("\"b\""));
    }
}
