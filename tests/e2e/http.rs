//! Plain HTTP/1.1 GETs to the operator's probe and metrics endpoints.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use crate::env::OpInfo;
use crate::kubectl::truncate;

pub fn port_for(op: &OpInfo, path: &str) -> u16 {
    if path == "/metrics" {
        op.metrics_port
    } else {
        op.probe_port
    }
}

pub fn metrics_with_operator_families(port: u16) -> Result<(), String> {
    match http_get(port, "/metrics")? {
        (200, body) if body.contains("memcached_operator_") => Ok(()),
        (200, body) => Err(format!(
            "no memcached_operator_ metric in: {}",
            truncate(&body, 1500)
        )),
        (code, body) => Err(format!("HTTP {code}: {}", truncate(&body, 500))),
    }
}

/// The operator's answers from the API server by HTTP version, from
/// `memcached_operator_kube_responses_total{protocol}`: e.g. `[("HTTP/2", 412.0)]`.
pub fn api_answers_by_protocol(port: u16) -> Result<Vec<(String, f64)>, String> {
    const FAMILY: &str = "memcached_operator_kube_responses_total{protocol=\"";
    let (code, body) = http_get(port, "/metrics")?;
    if code != 200 {
        return Err(format!("HTTP {code}: {}", truncate(&body, 500)));
    }
    let answers: Vec<(String, f64)> = body
        .lines()
        .filter_map(|line| {
            let rest = line.strip_prefix(FAMILY)?;
            let (protocol, value) = rest.split_once("\"} ")?;
            Some((protocol.to_owned(), value.trim().parse().ok()?))
        })
        .collect();
    if answers.is_empty() {
        return Err(format!(
            "no {FAMILY}...}} sample in: {}",
            truncate(&body, 1500)
        ));
    }
    Ok(answers)
}

/// Two distinct free TCP ports on 127.0.0.1 (bound together, then released).
pub fn two_free_ports() -> (u16, u16) {
    let bind = || {
        TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .unwrap_or_else(|e| panic!("cannot bind 127.0.0.1:0: {e}"))
    };
    let (a, b) = (bind(), bind());
    let port = |l: &TcpListener| {
        l.local_addr()
            .map(|a| a.port())
            .unwrap_or_else(|e| panic!("local_addr: {e}"))
    };
    (port(&a), port(&b))
}

/// A minimal HTTP/1.1 GET against 127.0.0.1; returns the status code and the (de-chunked) body.
pub fn http_get(port: u16, path: &str) -> Result<(u16, String), String> {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let fail = |what: &str, e: std::io::Error| format!("GET http://{addr}{path}: {what}: {e}");
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2))
        .map_err(|e| fail("connect", e))?;
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(|e| fail("set timeout", e))?;
    stream
        .set_write_timeout(Some(Duration::from_secs(5)))
        .map_err(|e| fail("set timeout", e))?;
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUser-Agent: memcached-operator-e2e\r\nAccept: */*\r\nConnection: close\r\n\r\n"
    );
    stream
        .write_all(request.as_bytes())
        .map_err(|e| fail("send", e))?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).map_err(|e| fail("read", e))?;

    let head_end = find(&raw, b"\r\n\r\n").ok_or_else(|| {
        format!(
            "GET http://{addr}{path}: incomplete response: {}",
            String::from_utf8_lossy(&raw)
        )
    })?;
    let head = String::from_utf8_lossy(&raw[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let mut parts = status_line.split_whitespace();
    let code = match (parts.next(), parts.next().map(str::parse::<u16>)) {
        (Some(version), Some(Ok(code))) if version.starts_with("HTTP/") => code,
        _ => {
            return Err(format!(
                "GET http://{addr}{path}: bad status line {status_line:?}"
            ));
        }
    };
    let chunked = lines.any(|l| {
        l.split_once(':').is_some_and(|(k, v)| {
            k.trim().eq_ignore_ascii_case("transfer-encoding")
                && v.to_ascii_lowercase().contains("chunked")
        })
    });
    let body = &raw[head_end + 4..];
    let body = if chunked {
        dechunk(body).map_err(|e| format!("GET http://{addr}{path}: {e}"))?
    } else {
        body.to_vec()
    };
    Ok((code, String::from_utf8_lossy(&body).into_owned()))
}

pub fn dechunk(mut data: &[u8]) -> Result<Vec<u8>, String> {
    let mut body = Vec::new();
    loop {
        let eol = find(data, b"\r\n").ok_or("truncated chunked body")?;
        let size_line = String::from_utf8_lossy(&data[..eol]).into_owned();
        let size_hex = size_line.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(size_hex, 16)
            .map_err(|e| format!("bad chunk size {size_line:?}: {e}"))?;
        data = &data[eol + 2..];
        if size == 0 {
            return Ok(body);
        }
        if data.len() < size {
            return Err("truncated chunk".into());
        }
        body.extend_from_slice(&data[..size]);
        data = data.get(size + 2..).unwrap_or_default();
    }
}

pub fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}
