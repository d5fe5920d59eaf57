//! The stats collector in the real binary: `--stats-interval=1s` against one ready pod whose address is
//! a real memcached (Debian's `memcached`, on 127.0.0.1; CI must install it: these fail when `CI` is
//! set and it is missing, and are skipped with a message elsewhere). `/metrics` shows the pod's series,
//! the fake API receives the `status.stats` apply under the collector's field manager, and a restart
//! against an instance whose stored stats match what the server reports writes nothing.

use std::time::Duration;

use axum::http::Method;
use serde_json::{Value, json};

use crate::checks::{of, sample, writes};
use crate::cluster;
use crate::cluster::paths::{APPLY, STATUS};
use crate::cluster::world::World;
use crate::common::memcached::{RealServer, exercise, real_binary};
use crate::harness::{WAIT, http_get, run_once_with, start_run_with, stop_and_check_release};
use crate::reconcile::ready_pod;

/// A real memcached after two sets and two hits (no miss), or `None` when it is not installed (see the
/// module doc). `name` tells the tests apart.
async fn exercised_memcached(name: &str) -> Option<RealServer> {
    let binary = real_binary()?;
    let server = RealServer::start(&binary, name, &[], &[]).await;
    exercise(server.address, None, &["a", "b"], 0).await;
    Some(server)
}

/// The instance on the server's port, with one ready pod at the server's address.
fn world(server: &RealServer) -> World {
    let mut world = World::default();
    world.memcacheds[0]["spec"] = json!({"size": 1, "containerPort": server.address.port()});
    world.pods = vec![ready_pod("cache-a", "127.0.0.1")];
    world
}

/// The `status.stats` applies among `requests`: the collector's, not the reconciler's.
fn stats_applies(requests: &[fake_apiserver::Req]) -> Vec<Value> {
    of(requests, &Method::PATCH, STATUS)
        .into_iter()
        .filter(|r| r.param("fieldManager") == Some("memcached-operator-stats"))
        .map(|r| {
            assert_eq!(r.content_type.as_deref(), Some(APPLY));
            assert_eq!(r.param("force"), Some("true"));
            r.body.clone()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_reads_a_real_memcached_into_metrics_and_status() {
    let Some(server) = exercised_memcached("telemetry").await else {
        return;
    };

    let fake = cluster::start_with(world(&server), None).await;
    let (_scratch, mut op, metrics, _probes) =
        start_run_with(&fake, "telemetry", &["--stats-interval=1s"]);
    let labels = "namespace=\"default\",memcached=\"cache\",pod=\"cache-a\"";
    op.wait_until("the pod's series on /metrics", WAIT, || {
        let metrics = metrics.clone();
        async move {
            http_get(&metrics, "/metrics")
                .await
                .is_some_and(|(_, text)| {
                    sample(&text, &format!("memcached_up{{{labels}}}")) == Some(1.0)
                })
        }
    })
    .await;
    let (_, text) = http_get(&metrics, "/metrics").await.unwrap();
    for (series, value) in [
        (format!("memcached_current_items{{{labels}}}"), 2.0),
        (
            format!("memcached_commands_total{{{labels},command=\"get\",status=\"hit\"}}"),
            2.0,
        ),
        (
            format!("memcached_limit_bytes{{{labels}}}"),
            8.0 * 1024.0 * 1024.0,
        ),
    ] {
        assert_eq!(sample(&text, &series), Some(value), "{series} in\n{text}");
    }

    op.wait_until("the status.stats apply", WAIT, || {
        let done = !stats_applies(&fake.requests()).is_empty();
        async move { done }
    })
    .await;
    let applies = stats_applies(&fake.requests());
    let stats = &applies[0]["status"]["stats"];
    assert_eq!(applies[0]["metadata"]["name"], "cache", "{:#}", applies[0]);
    assert_eq!(
        (
            &stats["items"],
            &stats["hitRatioPercent"],
            &stats["serversRead"],
            &stats["serversReady"]
        ),
        (&json!(2), &json!(100), &json!(1), &json!(1)),
        "{stats}"
    );
    assert_eq!(
        applies[0]["status"].as_object().unwrap().len(),
        1,
        "only stats"
    );
    // A few more collections at 1 s: the stats did not change, and the 5 m interval holds anyway.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(stats_applies(&fake.requests()).len(), 1);
    stop_and_check_release(&mut op, &fake).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_against_matching_stats_writes_no_stats() {
    let Some(server) = exercised_memcached("telemetry-restart").await else {
        return;
    };

    // First run: learn what the collector writes.
    let first = run_once_with(world(&server), "telemetry-1", &["--stats-interval=1s"]).await;
    let applies = stats_applies(&first);
    assert!(!applies.is_empty(), "{:#?}", writes(&first));

    // The instance now holds those stats, as the API server would after the apply.
    let mut settled = world(&server);
    settled.memcacheds[0]["status"] =
        json!({"stats": applies[applies.len() - 1]["status"]["stats"]});
    let second = run_once_with(settled, "telemetry-2", &["--stats-interval=1s"]).await;
    assert!(
        stats_applies(&second).is_empty(),
        "unchanged stats are not written again: {:#?}",
        stats_applies(&second)
    );
}
