//! ServiceMonitors, the table's kind of a CRD, follow what the cluster serves: watched and applied as
//! every kind of the table where monitoring.coreos.com/v1 is served, never asked for where it is not.

use axum::http::Method;
use fake_apiserver::Req;
use serde_json::json;

use crate::checks::{MANAGED, UNMANAGED, assert_created, lines, of};
use crate::cluster::paths::{SERVICE_MONITORS, STATUS};
use crate::cluster::world::{World, memcached};
use crate::harness::run_once;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn service_monitors_follow_what_the_cluster_serves() {
    let mut instance = memcached();
    instance["spec"]["monitoring"] =
        json!({"exporter": {"enabled": true}, "serviceMonitor": {"enabled": true}});

    // Served: listed and watched by label (the operator's own, and others' of a child's name), and one
    // applied for the instance.
    let world = World {
        memcacheds: vec![instance.clone()],
        installed: vec![SERVICE_MONITORS.rsplit('/').next().unwrap()],
        ..World::default()
    };
    let requests = run_once(world, "monitors-served").await;
    let lists = |selector| {
        of(&requests, &Method::GET, SERVICE_MONITORS)
            .into_iter()
            .filter(|r| !r.is_watch() && r.param("labelSelector") == Some(selector))
            .count()
    };
    assert_eq!(lists(MANAGED), 1, "{}", lines(&requests));
    assert_eq!(lists(UNMANAGED), 1, "{}", lines(&requests));
    let applied = of(
        &requests,
        &Method::PATCH,
        &format!("{SERVICE_MONITORS}/cache"),
    );
    assert_eq!(applied.len(), 1, "{}", lines(&requests));
    assert_created(applied[0], "ServiceMonitor");
    assert_eq!(applied[0].body["spec"]["endpoints"][0]["port"], "metrics");

    // Not served: never listed, and the status says why instead of an error loop.
    let world = World {
        memcacheds: vec![instance],
        ..World::default()
    };
    let requests = run_once(world, "monitors-missing").await;
    assert!(
        of(&requests, &Method::GET, SERVICE_MONITORS).is_empty(),
        "{}",
        lines(&requests)
    );
    let statuses = of(&requests, &Method::PATCH, STATUS);
    let status = &statuses.last().expect("a status patch").body["status"];
    let degraded = status["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Degraded")
        .unwrap();
    assert_eq!(degraded["reason"], "ServiceMonitorUnavailable", "{status}");
    assert_eq!(sample_errors(&requests), 0);
}

/// Failed requests other than the expected 404s (for the Lease before it exists and undiscovered APIs).
pub fn sample_errors(requests: &[Req]) -> usize {
    requests
        .iter()
        .filter(|r| !(200..300).contains(&r.status) && r.status != 404)
        .count()
}
