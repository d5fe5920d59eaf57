//! The Grafana dashboard `config/grafana/memcached-operator.json`: it has the structure Grafana loads
//! (schema version, a Prometheus data source variable, panels with unique ids, positions and queries),
//! every query parses as PromQL and names only metrics the operator exports, and the chart ships it as a
//! ConfigMap for Grafana's dashboard sidecar.

mod common;

use std::collections::BTreeSet;

use common::helm::{self, find};
use common::promql::{metric_names, unknown_metrics, without_grafana_variables};
use common::read;
use serde_json::{Value, json};
use xtask::chart::DASHBOARD_PATH;

fn dashboard() -> Value {
    serde_json::from_str(&read(DASHBOARD_PATH)).expect("the dashboard is JSON")
}

/// Every panel, those inside rows included.
fn panels(dashboard: &Value) -> Vec<&Value> {
    let mut all = Vec::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        all.push(panel);
        all.extend(panel["panels"].as_array().into_iter().flatten());
    }
    all
}

/// Every (panel title, expression) of the dashboard.
fn queries(dashboard: &Value) -> Vec<(String, String)> {
    panels(dashboard)
        .into_iter()
        .flat_map(|panel| {
            let title = panel["title"].as_str().unwrap_or_default().to_owned();
            panel["targets"]
                .as_array()
                .into_iter()
                .flatten()
                .map(move |t| {
                    (
                        title.clone(),
                        t["expr"].as_str().unwrap_or_default().to_owned(),
                    )
                })
        })
        .collect()
}

#[test]
fn dashboard_has_the_structure_grafana_loads() {
    let dashboard = dashboard();
    assert!(dashboard["schemaVersion"].as_u64().unwrap() >= 36);
    assert!(
        dashboard["uid"]
            .as_str()
            .is_some_and(|u| !u.is_empty() && u.len() <= 40)
    );
    assert!(dashboard["title"].as_str().is_some_and(|t| !t.is_empty()));

    let variables = dashboard["templating"]["list"].as_array().unwrap();
    let variable = |name: &str| {
        variables
            .iter()
            .find(|v| v["name"] == name)
            .unwrap_or_else(|| panic!("no ${name}"))
    };
    assert_eq!(variable("datasource")["type"], "datasource");
    assert_eq!(variable("datasource")["query"], "prometheus");
    for name in ["namespace", "memcached"] {
        let v = variable(name);
        assert_eq!(v["type"], "query", "${name}");
        assert_eq!(v["datasource"]["uid"], "${datasource}", "${name}");
        let query = v["query"]["query"].as_str().unwrap();
        assert!(query.starts_with("label_values("), "${name}: {query}");
    }

    let mut ids = BTreeSet::new();
    for panel in panels(&dashboard) {
        let title = panel["title"].as_str().unwrap_or_default();
        let id = panel["id"]
            .as_u64()
            .unwrap_or_else(|| panic!("{title}: no id"));
        assert!(ids.insert(id), "{title}: id {id} is used twice");
        let grid = &panel["gridPos"];
        for key in ["h", "w", "x", "y"] {
            assert!(grid[key].is_u64(), "{title}: gridPos.{key}");
        }
        assert!(
            grid["x"].as_u64().unwrap() + grid["w"].as_u64().unwrap() <= 24,
            "{title}: wider than the grid"
        );
        if panel["type"] == "row" {
            continue;
        }
        assert_eq!(
            panel["datasource"],
            json!({"type": "prometheus", "uid": "${datasource}"}),
            "{title}"
        );
        let targets = panel["targets"]
            .as_array()
            .unwrap_or_else(|| panic!("{title}: no targets"));
        assert!(!targets.is_empty(), "{title}: no targets");
        let mut ref_ids = BTreeSet::new();
        for target in targets {
            assert!(
                target["expr"].as_str().is_some_and(|e| !e.is_empty()),
                "{title}: a target without expr"
            );
            assert!(
                ref_ids.insert(target["refId"].as_str().unwrap().to_owned()),
                "{title}: refId twice"
            );
            assert_eq!(target["datasource"]["uid"], "${datasource}", "{title}");
        }
    }
}

#[test]
fn every_query_parses_and_names_an_exported_metric() {
    let queries = queries(&dashboard());
    assert!(queries.len() >= 15, "{} queries", queries.len());
    for (title, expr) in queries {
        let unknown = unknown_metrics(&without_grafana_variables(&expr))
            .unwrap_or_else(|e| panic!("{title}: {expr} does not parse: {e}"));
        assert!(
            unknown.is_empty(),
            "{title}: {expr} names metrics /metrics does not carry: {unknown:?}"
        );
    }
}

/// The panels the issue asks for, by the metric each needs.
#[test]
fn dashboard_draws_the_instances_and_the_operator() {
    let mut used = BTreeSet::new();
    for (_, expr) in queries(&dashboard()) {
        used.extend(metric_names(&without_grafana_variables(&expr)).unwrap());
    }
    for metric in [
        "memcached_commands_total",                             // hit ratio
        "memcached_current_bytes",                              // memory used ...
        "memcached_limit_bytes",                                // ... against the limit
        "memcached_current_items",                              // items
        "memcached_items_evicted_total",                        // evictions
        "memcached_current_connections",                        // connections
        "memcached_up",                                         // servers up
        "memcached_operator_stats_reads_total",                 // servers read
        "memcached_operator_reconcile_total",                   // reconciles by result
        "memcached_operator_reconcile_duration_seconds_bucket", // reconcile duration
        "memcached_operator_kube_requests_total",               // API requests by verb and code
        "memcached_operator_api_available",                     // API availability
        "memcached_operator_watch_errors_total",                // watch errors
        "memcached_operator_leader",                            // leader
        "memcached_operator_handover_items_total",              // handover items by outcome
        "memcached_operator_handover_bytes_total",              // handover bytes copied
        "memcached_operator_handover_seconds_total",            // time spent copying
        "memcached_operator_handovers_total",                   // handovers finished
        "memcached_proxy_requests_total",                       // proxy requests
        "memcached_proxy_backend_failures_total",               // proxy backend failures
        "memcached_proxy_backend_down",                         // servers the proxy marks down
        "memcached_proxy_access_requests_total",                // proxy requests by identity
        "memcached_proxy_access_refusals_total",                // proxy refusals by identity
        "memcached_operator_handover_failures_total",           // handover failures by reason
    ] {
        assert!(used.contains(metric), "no panel draws {metric}");
    }
}

#[test]
fn chart_ships_the_dashboard_for_the_grafana_sidecar() {
    let Some(off) = helm::render(json!({})) else {
        return;
    };
    assert!(
        off.objects()
            .unwrap()
            .iter()
            .all(|o| o["kind"] != "ConfigMap"),
        "off by default"
    );
    let Some(on) = helm::render(json!({"grafana": {"dashboards": {"enabled": true}}})) else {
        return;
    };
    let objects = on.objects().unwrap();
    let map = find(
        &objects,
        "ConfigMap",
        "memcached-operator-grafana-dashboard",
    )
    .unwrap();
    assert_eq!(map["metadata"]["labels"]["grafana_dashboard"], "1");
    let mut shipped: Value =
        serde_json::from_str(map["data"]["memcached-operator.json"].as_str().unwrap()).unwrap();
    // The uid is the release's (grafana.dashboards.uid, else derived from namespace and release name).
    let uid = shipped["uid"].as_str().unwrap().to_owned();
    assert!(
        uid.starts_with("memcached-") && uid != dashboard()["uid"],
        "{uid}"
    );
    shipped["uid"] = dashboard()["uid"].clone();
    assert!(
        shipped == dashboard(),
        "the chart ships config/grafana's dashboard, the uid aside"
    );

    let Some(custom) = helm::render(json!({"grafana": {"dashboards": {
        "enabled": true, "namespace": "monitoring", "labelKey": "dashboards", "labelValue": "memcached",
        "annotations": {"grafana_folder": "Memcached"}}}}))
    else {
        return;
    };
    let objects = custom.objects().unwrap();
    let map = find(
        &objects,
        "ConfigMap",
        "memcached-operator-grafana-dashboard",
    )
    .unwrap();
    assert_eq!(map["metadata"]["namespace"], "monitoring");
    assert_eq!(map["metadata"]["labels"]["dashboards"], "memcached");
    assert_eq!(
        map["metadata"]["annotations"]["grafana_folder"],
        "Memcached"
    );
}
