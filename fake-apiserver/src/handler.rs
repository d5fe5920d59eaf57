//! The HTTP handler of every request: the configured latency, the answer from the store, the record of
//! the request, and the response (JSON, a watch stream, or plain text).

use std::sync::Arc;
use std::time::Instant;

use axum::Extension;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, Method, Uri, Version, header};
use axum::response::Response;
use serde_json::Value;

use crate::Api;
use crate::request::{Req, parse_query};
use crate::response::response;
use crate::routes::{Answer, answer};
use crate::tls;
use crate::watch;

pub(crate) async fn handle(
    State(api): State<Arc<Api>>,
    method: Method,
    uri: Uri,
    version: Version,
    connection: Option<Extension<tls::ConnectionId>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if !api.latency.is_zero() {
        tokio::time::sleep(api.latency).await;
    }
    let header = |name: header::HeaderName| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let raw_query = uri.query().unwrap_or_default().to_owned();
    let body = if body.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&body)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&body).into_owned()))
    };
    let (answer, delay) = {
        let mut store = api.store();
        let mut req = Req {
            seq: store.requests.len(),
            at: Instant::now(),
            version,
            connection: connection.map(|Extension(tls::ConnectionId(n))| n),
            method,
            path: uri.path().to_owned(),
            query: parse_query(&raw_query),
            raw_query,
            content_type: header(header::CONTENT_TYPE),
            authorization: header(header::AUTHORIZATION),
            accept: header(header::ACCEPT),
            body,
            status: 0,
        };
        let answer = answer(&mut store, &req);
        req.status = answer.code();
        let delay = store
            .settings
            .slow_lists
            .iter()
            .find(|(path, _)| req.method == Method::GET && !req.is_watch() && *path == req.path)
            .map(|(_, delay)| *delay);
        store.requests.push(req);
        (answer, delay)
    };
    if let Some(delay) = delay {
        tokio::time::sleep(delay).await;
    }
    match answer {
        Answer::Json(code, value) => {
            let body = serde_json::to_vec(&value).unwrap_or_default();
            response(code, "application/json", Body::from(body))
        }
        Answer::Text(code, text) => response(code, "text/plain; charset=utf-8", Body::from(text)),
        Answer::Watch {
            plural,
            from,
            filter,
        } => watch::respond(api, plural, from, filter),
        Answer::Expired(message) => watch::expired(message),
    }
}
