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
use crate::handler::response;
use crate::store::WatchFilter;

/// The response to a watch of `plural` from `from`.
pub(crate) fn respond(
    api: Arc<Api>,
    plural: &'static str,
    from: u64,
    filter: WatchFilter,
) -> Response {
    let Some(latest) = api.store().subscribe(plural) else {
        return response(StatusCode::OK, "application/json", Body::empty());
    };
    let stream =
        futures::stream::unfold((api, from, latest), move |(api, mut after, mut latest)| {
            let filter = filter.clone();
            async move {
                loop {
                    latest.borrow_and_update();
                    let changes = api.store().changes_after(plural, after, &filter);
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
