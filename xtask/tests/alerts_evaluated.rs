//! The alert rules and the dashboard's warm-handover queries evaluated by Prometheus's own promtool
//! (`promtool check rules`, `promtool test rules`) on series written out sample by sample: the rules load,
//! and `MemcachedHandoverFailed` fires for each failure within the hour after it, a series' first failure
//! and a restarted operator's included, and not after.

mod common;

use std::path::Path;
use std::process::Command;

use common::promql::without_grafana_variables;
use common::promtool::promtool;
use common::read;
use serde_json::{Value, json};
use xtask::chart::{DASHBOARD_PATH, alerts_spec};
use xtask::repo_root;

/// A directory of its own under the target directory, emptied.
fn scratch(name: &str) -> std::path::PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The rules of the PrometheusRule as a Prometheus rule file (JSON is YAML).
fn write_rules(dir: &Path) -> std::path::PathBuf {
    let path = dir.join("rules.yaml");
    let spec = alerts_spec(&repo_root()).unwrap();
    std::fs::write(&path, serde_json::to_string_pretty(&spec).unwrap()).unwrap();
    path
}

fn run(promtool: &Path, dir: &Path, args: &[&str]) -> String {
    let out = Command::new(promtool)
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| panic!("running promtool {args:?}: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool {args:?}:\n{text}");
    text
}

/// The expression of alert `name`.
fn alert_expr(name: &str) -> String {
    let spec = alerts_spec(&repo_root()).unwrap();
    spec["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap().iter())
        .find(|r| r["alert"] == name)
        .unwrap_or_else(|| panic!("no alert {name}"))["expr"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// The one query of the dashboard panel titled `title`, as Prometheus reads it at a 1 m step.
fn panel_expr(title: &str) -> String {
    let dashboard: Value = serde_json::from_str(&read(DASHBOARD_PATH)).unwrap();
    let panel = dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["title"] == title)
        .unwrap_or_else(|| panic!("no panel {title:?}"));
    without_grafana_variables(panel["targets"][0]["expr"].as_str().unwrap())
}

/// Runs `promtool test rules` on one test group (promtool's unit-test format) against the rule file.
fn test_rules(group: Value) {
    let Some(promtool) = promtool() else {
        return;
    };
    let dir = scratch("alerts-evaluated");
    write_rules(&dir);
    let tests =
        json!({"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": [group]});
    std::fs::write(dir.join("tests.yaml"), tests.to_string()).unwrap();
    let said = run(&promtool, &dir, &["test", "rules", "tests.yaml"]);
    assert!(said.contains("SUCCESS"), "{said}");
}

#[test]
fn prometheus_loads_every_alert_rule() {
    let Some(promtool) = promtool() else {
        return;
    };
    let dir = scratch("alerts-checked");
    write_rules(&dir);
    let said = run(&promtool, &dir, &["check", "rules", "rules.yaml"]);
    assert!(said.contains("SUCCESS"), "{said}");
}

const FAILURES: &str = "memcached_operator_handover_failures_total";

#[test]
fn a_failed_handover_alerts_for_the_hour_after_each_failure() {
    let series = |pod: &str, values: &str| {
        json!({"series": format!(
            "{FAILURES}{{namespace=\"ns\",memcached=\"a\",reason=\"timeout\",pod=\"{pod}\"}}"
        ), "values": values})
    };
    let firing = |eval_time: &str, value: u32| {
        json!({"expr": alert_expr("MemcachedHandoverFailed"), "eval_time": eval_time,
               "exp_samples": [{"labels": "{namespace=\"ns\",memcached=\"a\",reason=\"timeout\"}",
                                "value": value}]})
    };
    let quiet = |eval_time: &str| {
        json!({"expr": alert_expr("MemcachedHandoverFailed"), "eval_time": eval_time,
               "exp_samples": []})
    };
    // promtool's notation: `_xN` is N missing samples, `VxN` is N + 1 samples of V, one a minute from 0 m.
    test_rules(json!({
        "interval": "1m",
        "input_series": [
            // Operator pod op-1: its first failure at 10 m (the series appears with it), a second at 121 m;
            // it is last scraped at 181 m. Its successor op-2 fails once at 200 m (a new series again).
            series("op-1", "_x10 1x110 2x60"),
            series("op-2", "_x200 1x60"),
        ],
        "promql_expr_test": [
            quiet("5m"),
            firing("10m", 1),
            firing("69m", 1),
            quiet("70m"),
            firing("121m", 1),
            firing("180m", 1),
            quiet("181m"),
            quiet("195m"),
            firing("200m", 1),
            firing("259m", 1),
            quiet("260m"),
        ],
    }));
}

#[test]
fn the_handover_panels_count_an_instances_first_copy() {
    // The items of a first copy after the operator started: the series appears at 10 m with them.
    let items = |outcome: &str, values: &str| {
        json!({"series": format!(
            "memcached_operator_handover_items_total{{namespace=\"ns\",memcached=\"a\",outcome=\"{outcome}\",pod=\"op-1\"}}"
        ), "values": values})
    };
    let at = |eval_time: &str, copied: u32| {
        json!({"expr": panel_expr("Handover items by outcome"), "eval_time": eval_time,
               "exp_samples": [{"labels": "{outcome=\"copied\"}", "value": copied}]})
    };
    test_rules(json!({
        "interval": "1m",
        "input_series": [items("copied", "_x10 5000x5 7000x5")],
        "promql_expr_test": [at("10m", 5000), at("12m", 0), at("16m", 2000), at("18m", 0)],
    }));
}
