//! One request the operator made, as the fake recorded it, and the query-string decoding that fills it.

use std::time::Instant;

use axum::http::{Method, Version};
use serde_json::Value;

/// One request the operator made, and the status it was answered with.
#[derive(Clone, Debug)]
pub struct Req {
    pub seq: usize,
    /// When it arrived.
    pub at: Instant,
    /// The HTTP version it came in with: HTTP/2 only over TLS, on a connection that negotiated `h2`.
    pub version: Version,
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

    pub fn is(&self, method: &Method, path: &str) -> bool {
        self.method == *method && self.path == path
    }

    pub fn line(&self) -> String {
        let query = if self.raw_query.is_empty() {
            String::new()
        } else {
            format!("?{}", self.raw_query)
        };
        format!(
            "#{} {} {}{} -> {}",
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
            b'%' if bytes.len() >= i + 3
                && bytes[i + 1].is_ascii_hexdigit()
                && bytes[i + 2].is_ascii_hexdigit() =>
            {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap();
                out.push(u8::from_str_radix(hex, 16).unwrap());
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
