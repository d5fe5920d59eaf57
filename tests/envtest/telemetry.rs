//! Operand telemetry against real memcached servers: the stand-in kubelet runs Debian's memcached for
//! each pod on its loopback address, the operator's collector reads them, and `status.stats` shows what
//! was stored. Skipped (and said so) where memcached is not installed.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use serde_json::json;

use crate::instances::{apply, memcacheds, ready_pods, wait_settled};
use crate::{Scenario, wait_for};

#[tokio::test]
async fn status_stats_show_what_the_servers_hold() {
    let Some(s) = Scenario::start_with(
        "telemetry",
        &["--stats-interval", "1s", "--stats-status-interval", "2s"],
    )
    .await
    else {
        return;
    };
    if !s.real_memcached() {
        eprintln!(
            "envtest: skipped telemetry: the stand-in kubelet runs no memcached (install Debian's memcached)"
        );
        return;
    }
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
