//! The dashboard's pictures (`cargo xtask dashboard-pictures`, docs/images/*.svg): drawn from the
//! dashboard's own queries, so that they cannot show something the dashboard does not ask; and read from
//! what the operator really serves on `/metrics`. The pictures are not drawn again here (that takes a
//! control plane and minutes of real runs); their queries are held to the dashboard's.

mod common;

use std::collections::BTreeMap;

use common::read;
use memcached_operator::metrics::Metrics;
use memcached_operator::telemetry::stats::Stats;
use serde_json::Value;
use xtask::chart::DASHBOARD_PATH;
use xtask::pictures::panels::{self, PICTURES, instantiate};
use xtask::pictures::plot::{queries_of, title_of};
use xtask::pictures::promql::{Query, Value as Result};
use xtask::pictures::recording::Recording;
use xtask::pictures::{RATE_INTERVAL, exposition, render};

fn dashboard() -> Value {
    serde_json::from_str(&read(DASHBOARD_PATH)).expect("the dashboard is JSON")
}

/// The `expr` of each target of the panel titled `title`, read straight from the JSON.
fn exprs_in_json(dashboard: &Value, title: &str) -> Vec<String> {
    let mut panels: Vec<&Value> = Vec::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        panels.push(panel);
        panels.extend(panel["panels"].as_array().into_iter().flatten());
    }
    let panel = panels
        .into_iter()
        .find(|p| p["title"] == title)
        .unwrap_or_else(|| panic!("no panel {title:?} in {DASHBOARD_PATH}"));
    panel["targets"]
        .as_array()
        .expect("targets")
        .iter()
        .map(|t| t["expr"].as_str().expect("an expr").to_owned())
        .collect()
}

#[test]
fn each_pictured_panel_is_read_with_the_dashboards_queries_verbatim() {
    let dashboard = dashboard();
    for picture in PICTURES {
        let panel = panels::panel(&dashboard, picture.panel).unwrap();
        let exprs: Vec<String> = panel.targets.iter().map(|t| t.expr.clone()).collect();
        assert_eq!(
            exprs,
            exprs_in_json(&dashboard, picture.panel),
            "{}",
            picture.panel
        );
    }
}

#[test]
fn each_committed_picture_carries_its_panels_title_and_current_queries() {
    let dashboard = dashboard();
    for picture in PICTURES {
        let path = format!("docs/images/{}", picture.file);
        let svg = read(&path);
        assert_eq!(title_of(&svg).as_deref(), Some(picture.panel), "{path}");
        assert_eq!(
            queries_of(&svg),
            Some(exprs_in_json(&dashboard, picture.panel)),
            "{path} was drawn from other queries than the dashboard's panel {:?} has now: run `make \
             dashboard-pictures` (docs/operations.md, Dashboard) and commit the pictures",
            picture.panel
        );
    }
}

#[test]
fn the_docs_show_every_picture() {
    let operations = read("docs/operations.md");
    for picture in PICTURES {
        assert!(
            operations.contains(&format!("(images/{})", picture.file)),
            "docs/operations.md does not show images/{}",
            picture.file
        );
    }
}

#[test]
fn variables_stand_at_all_and_the_intervals_at_their_setting() {
    let dashboard = dashboard();
    for picture in PICTURES {
        for expr in exprs_in_json(&dashboard, picture.panel) {
            let query = instantiate(&dashboard, &expr, RATE_INTERVAL);
            assert!(!query.contains('$'), "{query}");
            let back = query
                .replace(&format!("[{RATE_INTERVAL}]"), "[$__rate_interval]")
                .replace(&format!("offset {RATE_INTERVAL}"), "offset $__interval")
                .replace("namespace=~\".*\"", "namespace=~\"$namespace\"")
                .replace("memcached=~\".*\"", "memcached=~\"$memcached\"");
            assert_eq!(back, expr, "only the variables were replaced");
            Query::parse(&query).unwrap();
        }
    }
}

/// The operator's metrics as its `/metrics` serves them: a reconcile, and one instance whose pod `a`
/// was read with `hits` hits and `misses` misses and pod `b` could not be read.
fn operator_metrics(hits: u64, misses: u64) -> String {
    let metrics = Metrics::default();
    metrics.reconciled(None);
    metrics.operand().set_instance(
        ("shop".to_owned(), "cache".to_owned()),
        BTreeMap::from([
            (
                "cache-a".to_owned(),
                Some(Stats {
                    get_hits: hits,
                    get_misses: misses,
                    curr_items: 42,
                    bytes: 4096,
                    limit_maxbytes: 64 << 20,
                    ..Stats::default()
                }),
            ),
            ("cache-b".to_owned(), None),
        ]),
    );
    metrics.encode()
}

#[test]
fn the_operators_own_metrics_text_is_read() {
    let samples = exposition::parse(&operator_metrics(30, 10)).unwrap();
    let find = |name: &str, label: (&str, &str)| {
        samples
            .iter()
            .find(|s| s.name == name && s.labels.get(label.0).map(String::as_str) == Some(label.1))
            .unwrap_or_else(|| panic!("no {name} with {label:?} in {samples:#?}"))
    };
    assert_eq!(
        find("memcached_operator_reconcile_total", ("result", "success")).value,
        1.0
    );
    let hits = find("memcached_commands_total", ("status", "hit"));
    assert_eq!(hits.value, 30.0);
    assert_eq!(hits.labels["namespace"], "shop");
    assert_eq!(hits.labels["memcached"], "cache");
    assert_eq!(hits.labels["pod"], "cache-a");
    assert_eq!(find("memcached_up", ("pod", "cache-b")).value, 0.0);
    assert_eq!(
        find("memcached_current_items", ("pod", "cache-a")).value,
        42.0
    );
}

#[test]
fn the_dashboards_hit_ratio_is_evaluated_over_the_operators_metrics() {
    let dashboard = dashboard();
    let mut recording = Recording::default();
    // 20 s of scrapes while pod a serves 3 hits and 1 miss a second.
    for second in 0..20u64 {
        recording
            .push(1_000 * second as i64, &operator_metrics(3 * second, second))
            .unwrap();
    }
    let [hit_ratio] = exprs_in_json(&dashboard, "Hit ratio").try_into().unwrap();
    let query = Query::parse(&instantiate(&dashboard, &hit_ratio, RATE_INTERVAL)).unwrap();
    let Result::Vector(ratios) = query.at(&recording, 19_000).unwrap() else {
        panic!("a vector")
    };
    let ratio = ratios.values().next().copied().unwrap_or_default();
    assert_eq!(ratios.len(), 1, "{ratios:?}");
    assert!((ratio - 0.75).abs() < 1e-9, "{ratio}");

    let svg = render(&dashboard, &PICTURES[0], &recording, RATE_INTERVAL).unwrap();
    assert_eq!(queries_of(&svg), Some(vec![hit_ratio]));
    assert!(svg.contains("shop/cache"), "the legend names the instance");
}
