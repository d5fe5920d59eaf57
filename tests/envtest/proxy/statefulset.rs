//! A StatefulSet rollout under the proxy: the published list holds the pods' DNS names,
//! `cache-<i>.cache-headless.<namespace>.svc`, which stay while each pod is replaced; the proxy's route
//! lists the ready pods' addresses in the same slot order (a name is resolved by a blocking lookup on a
//! proxy worker at each reconnect: see docs/clients.md), so it follows each slot's new pod once the pod is
//! ready, when its address changed (the stand-in kubelet's pods get loopback addresses, see its `ip`
//! module). Warm handover copies each server through the spare to its replacement, so the plain client of
//! the proxy reads every key after the rollout, and the proxy pod is the same.

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::{
    KEYS, RouteWatch, proxy_follows, proxy_pod, reloads_in_time, routed, same_proxy, start, stats,
    through_proxy,
};
use crate::instances::apply;
use crate::real_clients::published;
use crate::wait_for;

const SIZE: usize = 3;

fn spec(memory: i64) -> Value {
    json!({
        "size": SIZE, "workload": "StatefulSet",
        "memcached": {"maxMemoryMB": memory},
        "highAvailability": {"preStopDelaySeconds": 1, "terminationGracePeriodSeconds": 5},
        "proxy": {"enabled": true, "replicas": 1},
    })
}

/// The backends the proxy marks down now (`stats proxybe`: `STAT bad_<host:port> <n>`).
async fn down(address: &str) -> Result<Vec<String>, String> {
    let backends = stats(address, "proxybe").await?;
    let bad = backends
        .into_iter()
        .filter_map(|(name, _)| name.strip_prefix("bad_").map(str::to_owned));
    Ok(bad.collect())
}

/// Waits until the proxy marks no backend down, for longer than its retry interval (3 s by default).
async fn backends_up(proxy: &str) {
    let since = Mutex::new(None::<Instant>);
    wait_for(
        "the proxy to mark no backend down for 4 s",
        Duration::from_secs(60),
        || async {
            let bad = down(proxy).await?;
            let mut since = since.lock().unwrap_or_else(|e| e.into_inner());
            if !bad.is_empty() {
                *since = None;
                return Err(format!("down: {bad:?}"));
            }
            let up = *since.get_or_insert_with(Instant::now);
            (up.elapsed() >= Duration::from_secs(4))
                .then_some(())
                .ok_or_else(|| "all up, not for 4 s yet".to_owned())
        },
    )
    .await;
}

#[tokio::test]
async fn a_plain_client_of_the_proxy_keeps_every_key_through_a_statefulset_rollout() {
    let Some(s) = start("proxy-statefulset").await else {
        return;
    };
    apply(&s, "cache", spec(64)).await;
    let list = published(&s, SIZE, &BTreeSet::new(), Duration::from_secs(120)).await;
    let (proxy, uid, restarts) = proxy_pod(&s).await;
    let reloads = proxy_follows(&s, &proxy, &list, 1).await;
    backends_up(&proxy).await;
    let stored = through_proxy("fill", &proxy).await;
    s.step(&format!(
        "{stored} of {KEYS} keys stored through the proxy {proxy} over {:?}",
        list.servers
    ));
    assert_eq!(stored, KEYS);
    let step = "StatefulSet rollout (-m 64 -> 65)";
    let watch = RouteWatch::start(&s, &proxy);
    let started = Instant::now();
    apply(&s, "cache", spec(65)).await;
    let rolled = published(&s, SIZE, &list.uids, Duration::from_secs(300)).await;
    assert_eq!(rolled.servers, list.servers, "the pods' names stay");
    proxy_follows(&s, &proxy, &rolled, reloads).await;
    // The route changes with the pods' addresses, if a replacement got another one.
    let changed = routed(&rolled) != routed(&list);
    reloads_in_time(&s, step, &watch.stop().await, changed);
    backends_up(&proxy).await;
    let hits = through_proxy("count", &proxy).await;
    s.step(&format!(
        "after the {step} ({:.1} s): {hits} of {KEYS} keys hit through the proxy ({:.2} %), \
         every server replaced ({:?} -> {:?})",
        started.elapsed().as_secs_f64(),
        hits as f64 * 100.0 / KEYS as f64,
        list.uids,
        rolled.uids
    ));
    assert_eq!(
        hits, KEYS,
        "every key hits through the proxy after the {step}"
    );
    same_proxy(&s, &(proxy, uid, restarts), step).await;
}
