//! The proxy with TLS (`spec.security.tls`), end to end: the servers serve TLS only, the proxy serves
//! clients over TLS with the instance's certificate (which also names `<name>-proxy.<namespace>.svc`) and
//! reaches the servers over TLS. A pymemcache `Client` that trusts the instance's CA and checks the name
//! `cache-proxy.<namespace>.svc` fills keys and reads every one back after a scale; a plain connection to
//! the proxy's port gets no answer; the operator reads the proxy's stats over TLS (`status.stats.proxy`).
//!
//! The proxy's own plain listener is on its loopback only (`-l *,notls:127.0.0.1:11299`, for its
//! configuration writer); the stand-in kubelet moves it to the pod's IP, where this scenario reads the
//! proxy's reload count.

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::{Value, json};

use super::{
    KEYS, VALUE_LEN, proxy_available, proxy_follows, proxy_pod, proxy_tls_secret, same_proxy, stat,
};
use crate::instances::{apply, memcacheds};
use crate::real_clients::{drive, published};
use crate::{Scenario, wait_for};

/// The proxy's plain listener on its loopback (the operator's choice when the memcached port is not it).
const LOOPBACK_PORT: u16 = 11299;
/// Stats every 2 s, each change written: the proxy's read shows in the status soon.
const OPERATOR_ARGS: &[&str] = &["--stats-interval", "2s", "--stats-status-interval", "2s"];

fn spec(size: usize) -> Value {
    json!({
        "size": size,
        "memcached": {"maxMemoryMB": 64},
        "scaling": {"drainSeconds": 2},
        "highAvailability": {"preStopDelaySeconds": 1, "terminationGracePeriodSeconds": 5},
        "security": {"tls": {"secretName": "cache-tls"}},
        "proxy": {"enabled": true, "replicas": 1, "image": "example.com/memcached:1.6-proxy-tls"},
    })
}

/// The pymemcache client's `op` over TLS through the proxy, by its Service name: keys stored or hit.
async fn over_tls(s: &Scenario, op: &str, proxy: &str, ca: &str) -> usize {
    let name = format!("cache-proxy.{}.svc", s.namespace);
    let (ip, port) = proxy.rsplit_once(':').expect("ip:port");
    let answer = drive(json!({
        "op": op, "hashing": "plain", "servers": [format!("{name}:{port}")], "keys": KEYS,
        "value_len": VALUE_LEN, "hosts": {name.clone(): ip}, "tls_ca": ca,
    }))
    .await
    .unwrap_or_else(|e| panic!("the TLS client's {op} through {name}: {e}"));
    answer["hits"]
        .as_u64()
        .unwrap_or_else(|| panic!("{answer}")) as usize
}

/// Waits until the operator has read the proxy's stats (over TLS) and written them to the status.
async fn read_by_the_operator(s: &Scenario) -> String {
    let api = memcacheds(s);
    wait_for(
        "status.stats.proxy with the proxy pod read",
        Duration::from_secs(60),
        || async {
            let mc = api.get("cache").await.map_err(|e| e.to_string())?;
            let stats = mc.status.and_then(|st| st.stats).and_then(|st| st.proxy);
            match stats {
                Some(proxy) if proxy.proxies_read == 1 => Ok(format!("{proxy:?}")),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await
}

#[tokio::test]
async fn a_tls_client_of_the_proxy_keeps_every_key_through_a_scale() {
    let Some(s) = super::start_with("proxy-tls", OPERATOR_ARGS).await else {
        return;
    };
    let ns = s.namespace.clone();
    let ca = proxy_tls_secret(&s).await;
    apply(&s, "cache", spec(2)).await;
    let list = published(&s, 2, &BTreeSet::new(), Duration::from_secs(120)).await;
    let pod = proxy_pod(&s).await;
    proxy_available(&s).await;
    let proxy = pod.0.clone();
    let (ip, _) = proxy.rsplit_once(':').expect("ip:port");
    let plain_stats = format!("{ip}:{LOOPBACK_PORT}");
    let reloads = proxy_follows(&s, &plain_stats, &list, 1).await;
    let refused = stat(&proxy, "pid").await;
    s.step(&format!(
        "a plain `stats` on the proxy's port {proxy}: {refused:?}"
    ));
    assert!(refused.is_err(), "the proxy's port speaks TLS only");
    let stored = over_tls(&s, "fill", &proxy, &ca).await;
    s.step(&format!(
        "{stored} of {KEYS} keys stored over TLS through cache-proxy.{ns}.svc over {:?}",
        list.servers
    ));
    assert_eq!(stored, KEYS);
    apply(&s, "cache", spec(3)).await;
    let list = published(&s, 3, &BTreeSet::new(), Duration::from_secs(300)).await;
    proxy_follows(&s, &plain_stats, &list, reloads + 1).await;
    let hits = over_tls(&s, "count", &proxy, &ca).await;
    s.step(&format!(
        "after the scale 2 -> 3: {hits} of {KEYS} keys hit over TLS through the proxy, servers {:?}",
        list.servers
    ));
    assert_eq!(hits, KEYS, "every key hits over TLS after the scale");
    same_proxy(&s, &pod, "scale 2 -> 3").await;
    let read = read_by_the_operator(&s).await;
    s.step(&format!("the operator read the proxy over TLS: {read}"));
}
