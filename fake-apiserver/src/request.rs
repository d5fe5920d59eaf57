//! One request as the fake recorded it, what it asked for (verb and resource, as the bench's report
//! counts them), and the query-string decoding that fills it.

use std::time::Instant;

use axum::http::{Method, Version};
use serde_json::Value;

use crate::path;

/// The content type of a server-side apply.
pub const APPLY: &str = "application/apply-patch+yaml";
/// The content type of a JSON patch.
pub const JSON_PATCH: &str = "application/json-patch+json";
/// The content type of a strategic merge patch.
pub const STRATEGIC: &str = "application/strategic-merge-patch+json";

/// One request, and the status it was answered with (200 for a watch, whatever it then sent).
#[derive(Clone, Debug)]
pub struct Req {
    pub seq: usize,
    /// When it arrived.
    pub at: Instant,
    /// The HTTP version it came in with: HTTP/2 only over TLS, on a connection that negotiated `h2`.
    pub version: Version,
    /// Which TLS connection it came on, numbered from 0 in the order they were accepted; `None` over
    /// plain HTTP. A failure's request log shows by it which requests shared a connection.
    pub connection: Option<usize>,
    pub method: Method,
    pub path: String,
    pub raw_query: String,
    /// Decoded query parameters, in order.
    pub query: Vec<(String, String)>,
    pub content_type: Option<String>,
    pub authorization: Option<String>,
    /// What the client asked the answer to be (metadata-only lists and watches ask for
    /// `PartialObjectMetadata`).
    pub accept: Option<String>,
    /// JSON body; `Null` when empty, a string when not JSON.
    pub body: Value,
    pub status: u16,
}

impl Req {
    pub fn param(&self, key: &str) -> Option<&str> {
        self.query
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    pub fn is_watch(&self) -> bool {
        matches!(self.param("watch"), Some("true" | "1"))
    }

    /// What it asked for: `list`, `watch`, `get`, `create`, `update`, `delete`, `apply`, `patch-json`,
    /// `patch-strategic`, `patch-merge`; `discovery` for a read of anything but a collection, `other` for
    /// the rest.
    pub fn verb(&self) -> &'static str {
        let Some(target) = path::parse(&self.path) else {
            return if self.method == Method::GET {
                "discovery"
            } else {
                "other"
            };
        };
        let content_type = self.content_type.as_deref().unwrap_or_default();
        match (self.method.as_str(), target.name) {
            ("GET", None) if self.is_watch() => "watch",
            ("GET", None) => "list",
            ("GET", Some(_)) => "get",
            ("POST", None) => "create",
            ("PUT", Some(_)) => "update",
            ("DELETE", Some(_)) => "delete",
            ("PATCH", Some(_)) if content_type.starts_with(APPLY) => "apply",
            ("PATCH", Some(_)) if content_type == JSON_PATCH => "patch-json",
            ("PATCH", Some(_)) if content_type == STRATEGIC => "patch-strategic",
            ("PATCH", Some(_)) => "patch-merge",
            _ => "other",
        }
    }

    /// The collection's plural, with `/status` for the subresource; the path for anything else.
    pub fn resource(&self) -> String {
        match path::parse(&self.path) {
            Some(target) => match target.subresource {
                Some(sub) => format!("{}/{sub}", target.plural),
                None => target.plural.to_owned(),
            },
            None => self.path.clone(),
        }
    }

    /// A write: anything but a read (list, watch, get, discovery).
    pub fn is_write(&self) -> bool {
        !matches!(self.verb(), "list" | "watch" | "get" | "discovery")
    }

    pub fn is(&self, method: &Method, path: &str) -> bool {
        self.method == *method && self.path == path
    }

    pub fn line(&self) -> String {
        let query = if self.raw_query.is_empty() {
            String::new()
        } else {
            format!("?{}", self.raw_query)
        };
        let connection = self
            .connection
            .map(|n| format!(" [conn {n}]"))
            .unwrap_or_default();
        format!(
            "#{} {} {}{} -> {}{connection}",
            self.seq, self.method, self.path, query, self.status
        )
    }
}

pub fn parse_query(query: &str) -> Vec<(String, String)> {
    query
        .split('&')
        .filter(|kv| !kv.is_empty())
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (percent_decode(k), percent_decode(v))
        })
        .collect()
}

pub fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b'%' if let (Some(high), Some(low)) = (
                bytes.get(i + 1).and_then(|b| hex_value(*b)),
                bytes.get(i + 2).and_then(|b| hex_value(*b)),
            ) =>
            {
                out.push(high * 16 + low);
                i += 3;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The value of one hexadecimal digit.
fn hex_value(digit: u8) -> Option<u8> {
    char::from(digit)
        .to_digit(16)
        .and_then(|v| u8::try_from(v).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_are_percent_decoded_in_order() {
        assert_eq!(
            parse_query("labelSelector=app.kubernetes.io%2Fmanaged-by%21%3Dx&watch=1&a+b=%zz"),
            [
                (
                    "labelSelector".to_owned(),
                    "app.kubernetes.io/managed-by!=x".to_owned()
                ),
                ("watch".to_owned(), "1".to_owned()),
                ("a b".to_owned(), "%zz".to_owned()),
            ]
        );
    }
}
