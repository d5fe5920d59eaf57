//! Auth without TLS: the collector reads only when the spec allows it (`allowPlaintextStats`), and then
//! with the operator's own entry, never the user's.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use memcached_operator::telemetry::metrics::OperandMetrics;

use serde_json::json;

use super::{LONG, one_pod, secret};
use crate::fakes::*;

fn up(metrics: &Arc<OperandMetrics>) -> Option<f64> {
    sample(
        &exposition(metrics),
        "memcached_up{namespace=\"default\",memcached=\"cache\",pod=\"cache-a\"}",
    )
}

fn reads(metrics: &Arc<OperandMetrics>) -> String {
    let mut registry = prometheus_client::registry::Registry::default();
    registry.register("memcached_operator_stats_reads", "", metrics.reads());
    let mut reads = String::new();
    prometheus_client::encoding::text::encode(&mut reads, &registry).unwrap();
    reads
}

#[tokio::test]
async fn auth_without_tls_is_not_read_unless_the_spec_allows_it() {
    let security = |auth: String| Security {
        tls: None,
        auth: Some(auth),
    };
    let spec = json!({"security": {"auth": {"secretName": "cache-auth"}}});
    let one = one_pod("127.0.21.1", spec, security(operator_auth("cache")), LONG).await;
    one.collector.collect().await;
    assert_eq!(
        one.server.connections.load(Ordering::SeqCst),
        0,
        "nothing goes to the server, not even a connection"
    );
    assert_eq!(up(&one.metrics), Some(0.0));
    let reads = reads(&one.metrics);
    assert!(
        reads.contains("memcached_operator_stats_reads_total{result=\"not_in_clear\"} 1"),
        "{reads}"
    );
    let writes = one.api.status_writes("cache");
    assert_eq!(
        writes[0].body["status"],
        json!({"stats": {"serversRead": 0, "serversReady": 1}})
    );

    let opted =
        json!({"security": {"auth": {"secretName": "cache-auth", "allowPlaintextStats": true}}});
    let one = one_pod("127.0.21.2", opted, security(operator_auth("cache")), LONG).await;
    one.collector.collect().await;
    assert_eq!(up(&one.metrics), Some(1.0), "read in the clear, as allowed");
}

#[tokio::test]
async fn the_operator_never_sends_the_users_first_entry() {
    // A server that takes only the user's first entry: the operator does not have it.
    let security = Security {
        tls: None,
        auth: Some("alice s3cret".into()),
    };
    let opted =
        json!({"security": {"auth": {"secretName": "cache-auth", "allowPlaintextStats": true}}});
    let mut one = one_pod("127.0.22.1", opted, security, LONG).await;
    one.caches.secret("cache-auth", "1");
    one.secrets.insert(
        "cache-auth",
        secret("cache-auth", "1", &[("auth-file", "alice:s3cret\n")]),
    );
    one.collector.collect().await;
    assert_eq!(one.server.connections.load(Ordering::SeqCst), 1);
    assert_eq!(up(&one.metrics), Some(0.0), "refused: not the user's entry");
    assert_eq!(
        one.api.secret_reads("cache-auth"),
        0,
        "the user's auth file is never read"
    );
    let reads = reads(&one.metrics);
    assert!(
        reads.contains("memcached_operator_stats_reads_total{result=\"auth\"} 1"),
        "{reads}"
    );
}
