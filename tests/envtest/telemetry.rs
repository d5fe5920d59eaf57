//! Operand telemetry against real memcached servers: the stand-in kubelet runs Debian's memcached for
//! each pod on its loopback address, the operator's collector reads them, and `status.stats` shows what
//! was stored. Skipped (and said so) where memcached is not installed.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use serde_json::json;

use crate::instances::{apply, memcacheds, ready_pods, wait_settled};
use crate::secrets::{auth_secret, tls_secrets};
use crate::{Scenario, wait_for};

#[tokio::test]
async fn status_stats_show_what_the_servers_hold() {
    let Some(s) = Scenario::start_with_memcached(
        "telemetry",
        &["--stats-interval", "1s", "--stats-status-interval", "2s"],
    )
    .await
    else {
        return;
    };
    apply(&s, "cache", json!({"size": 2})).await;
    wait_settled(&s, "cache", Duration::from_secs(60)).await;
    let pods = ready_pods(&s, "cache").await;
    assert_eq!(pods.len(), 2);
    for (i, pod) in pods.iter().enumerate() {
        let ip = pod
            .status
            .as_ref()
            .and_then(|st| st.pod_ip.clone())
            .expect("a pod IP");
        let mut conn = TcpStream::connect((ip.as_str(), 11211))
            .await
            .expect("memcached answers");
        for k in 0..10 {
            let value = format!("value-{i}-{k}");
            let cmd = format!("set key-{i}-{k} 0 0 {}\r\n{value}\r\n", value.len());
            conn.write_all(cmd.as_bytes()).await.expect("set");
            let mut buf = [0u8; 16];
            let n = conn.read(&mut buf).await.expect("answer");
            assert_eq!(&buf[..n], b"STORED\r\n");
        }
    }
    s.step("stored 10 items on each server");
    let api = memcacheds(&s);
    let stats = wait_for(
        "status.stats to show 20 items on 2 servers",
        Duration::from_secs(30),
        || async {
            let mc = api.get("cache").await.map_err(|e| e.to_string())?;
            let stats = mc.status.and_then(|st| st.stats).ok_or("no stats yet")?;
            if stats.servers_read == 2 && stats.items == Some(20) {
                Ok(stats)
            } else {
                Err(format!("{stats:?}"))
            }
        },
    )
    .await;
    s.step(&format!("status.stats: {stats:?}"));
}

/// Over TLS with auth and client certificates, against real servers: an instance whose certificate names
/// its Service is read with the operator's own client certificate (`clientSecretName`); one whose
/// certificate, from its own CA, names `evil.example.com` is not read (and gets no credentials).
#[tokio::test]
async fn tls_reads_check_the_server_name_and_present_the_client_secret() {
    let Some(s) = Scenario::start_with_memcached(
        "telemetry-tls",
        &["--stats-interval", "1s", "--stats-status-interval", "1s"],
    )
    .await
    else {
        return;
    };
    let ns = s.namespace.clone();
    tls_secrets(
        &s,
        "good-tls",
        vec![format!("good.{ns}.svc")],
        Some("good-client"),
    )
    .await;
    tls_secrets(&s, "evil-tls", vec!["evil.example.com".to_owned()], None).await;
    auth_secret(&s, "auth", "auth-file", "app:s3cret\n").await;
    let security = |tls: &str, client: Option<&str>| {
        let mut tls = json!({"secretName": tls, "clientAuth": true});
        if let Some(client) = client {
            tls["clientSecretName"] = json!(client);
        }
        json!({"tls": tls, "auth": {"secretName": "auth"}})
    };
    apply(
        &s,
        "good",
        json!({"size": 2, "security": security("good-tls", Some("good-client"))}),
    )
    .await;
    apply(
        &s,
        "evil",
        json!({"size": 1, "security": security("evil-tls", None)}),
    )
    .await;
    wait_settled(&s, "good", Duration::from_secs(60)).await;
    wait_settled(&s, "evil", Duration::from_secs(60)).await;
    let api = memcacheds(&s);
    let read = |name: &'static str, want_read: i32, want_ready: i32| {
        let api = api.clone();
        async move {
            let mc = api.get(name).await.map_err(|e| e.to_string())?;
            let stats = mc.status.and_then(|st| st.stats).ok_or("no stats yet")?;
            if (stats.servers_read, stats.servers_ready) == (want_read, want_ready) {
                Ok(stats)
            } else {
                Err(format!("{name}: {stats:?}"))
            }
        }
    };
    let good = wait_for(
        "both servers of `good` read over mutual TLS with auth",
        Duration::from_secs(30),
        || read("good", 2, 2),
    )
    .await;
    s.step(&format!("good: {good:?}"));
    let evil = wait_for(
        "the server of `evil` ready but not read",
        Duration::from_secs(30),
        || read("evil", 0, 1),
    )
    .await;
    s.step(&format!("evil: {evil:?}"));
}
