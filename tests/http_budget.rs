//! The probes and `/metrics` stay answered while other clients hold many idle connections to them: a
//! new connection evicts an idle one rather than wait behind it, and one client address cannot hold more
//! than its share (issue 45, item 2). The flooding clients connect from other loopback addresses than
//! the probing one (127.0.0.2 and up), as pods other than the kubelet would: Linux routes all of
//! 127.0.0.0/8 to the loopback interface.
#![cfg(target_os = "linux")]

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use memcached_operator::manager::http::{self, Health};
use memcached_operator::manager::metrics_auth::Gate;
use memcached_operator::manager::server::MAX_CONNECTIONS_PER_CLIENT;
use memcached_operator::metrics::Metrics;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

/// How long a probe may take here: the kubelet's default probe timeout is 1 s; before the budget, a
/// probe behind 256 idle connections waited for their 10 s header timeout.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// A connection to `to` from `source`, if one is made within a second.
async fn connect(to: SocketAddr, source: Ipv4Addr) -> Option<TcpStream> {
    let socket = TcpSocket::new_v4().expect("a socket");
    socket
        .bind(SocketAddr::from((source, 0)))
        .expect("a loopback source address");
    tokio::time::timeout(Duration::from_secs(1), socket.connect(to))
        .await
        .ok()?
        .ok()
}

/// `count` connections to `to` that send nothing, from 127.0.0.2 .. 127.0.0.(1 + sources) in turn, each
/// opened again as soon as the server closes it, until the flood is dropped.
fn flood(to: SocketAddr, count: usize, sources: u8) -> Flood {
    let tasks = (0..count)
        .map(|i| {
            let source = Ipv4Addr::new(127, 0, 0, 2 + (i % usize::from(sources)) as u8);
            tokio::spawn(async move {
                loop {
                    if let Some(mut stream) = connect(to, source).await {
                        let _ = stream.read(&mut [0u8; 1]).await;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            })
        })
        .collect();
    Flood(tasks)
}

/// The flooding clients, stopped when dropped.
struct Flood(Vec<tokio::task::JoinHandle<()>>);

impl Drop for Flood {
    fn drop(&mut self) {
        self.0.iter().for_each(tokio::task::JoinHandle::abort);
    }
}

/// `count` connections to `to` that send nothing, from 127.0.0.2.
async fn idle(to: SocketAddr, count: usize) -> Vec<TcpStream> {
    let mut held = Vec::with_capacity(count);
    for _ in 0..count {
        held.extend(connect(to, Ipv4Addr::new(127, 0, 0, 2)).await);
    }
    held
}

/// The status line of `GET path` on a new connection from 127.0.0.1, or why there is none in time.
async fn get(to: SocketAddr, path: &str) -> Result<String, String> {
    let exchange = async {
        let mut stream = TcpStream::connect(to).await.map_err(|e| e.to_string())?;
        let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        stream
            .write_all(request.as_bytes())
            .await
            .map_err(|e| e.to_string())?;
        let mut response = String::new();
        stream
            .read_to_string(&mut response)
            .await
            .map_err(|e| e.to_string())?;
        Ok(response.lines().next().unwrap_or_default().to_owned())
    };
    tokio::time::timeout(PROBE_TIMEOUT, exchange)
        .await
        .map_err(|_| format!("no answer to {path} within {PROBE_TIMEOUT:?}"))?
}

async fn servers() -> (SocketAddr, SocketAddr) {
    let loopback: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let probes = http::serve(loopback, http::probes(Arc::new(Health::default())))
        .await
        .unwrap();
    let metrics = http::serve(
        loopback,
        http::metrics(Arc::new(Metrics::default()), Gate::new(None)),
    )
    .await
    .unwrap();
    (probes, metrics)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_and_scrapes_are_answered_while_idle_connections_fill_both_servers() {
    let (probes, metrics) = servers().await;
    // More than either server holds at once, from more addresses than one client's share would allow,
    // each connection opened again when closed.
    let _flood = (flood(probes, 400, 20), flood(metrics, 400, 20));
    // Let the servers accept what they will.
    tokio::time::sleep(Duration::from_secs(1)).await;
    for _ in 0..5 {
        assert_eq!(
            get(probes, "/healthz").await.as_deref(),
            Ok("HTTP/1.1 200 OK")
        );
        assert_eq!(
            get(metrics, "/metrics").await.as_deref(),
            Ok("HTTP/1.1 200 OK")
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_client_address_holds_no_more_than_its_share() {
    let (probes, _) = servers().await;
    let mut held = idle(probes, 100).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut open = 0;
    for stream in &mut held {
        let mut byte = [0u8; 1];
        // A connection the server dropped reads its end at once; one it holds has nothing to read.
        let read = tokio::time::timeout(Duration::from_millis(5), stream.read(&mut byte)).await;
        if read.is_err() {
            open += 1;
        }
    }
    assert!(
        open <= MAX_CONNECTIONS_PER_CLIENT,
        "{open} idle connections of one client still held"
    );
    assert_eq!(
        get(probes, "/healthz").await.as_deref(),
        Ok("HTTP/1.1 200 OK")
    );
}
