//! The alert rules and the dashboard's warm-handover queries evaluated by Prometheus's own promtool
//! (`promtool check rules`, `promtool test rules`) on series written out sample by sample: the rules load,
//! and `MemcachedHandoverFailed` fires for each failure within the hour after it, a series' first failure
//! and a restarted operator's included, and not after.

mod common;

use std::path::Path;
use std::process::Command;

use common::helm;
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
    write_spec(dir, &alerts_spec(&repo_root()).unwrap())
}

/// `spec` (rule groups) as a Prometheus rule file.
fn write_spec(dir: &Path, spec: &Value) -> std::path::PathBuf {
    let path = dir.join("rules.yaml");
    std::fs::write(&path, serde_json::to_string_pretty(spec).unwrap()).unwrap();
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

/// The runbook URL of alert `name` in the rules.
fn alert_url(name: &str) -> String {
    let spec = alerts_spec(&repo_root()).unwrap();
    spec["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap().iter())
        .find(|r| r["alert"] == name)
        .unwrap_or_else(|| panic!("no alert {name}"))["annotations"]["runbook_url"]
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
    test_spec(&alerts_spec(&repo_root()).unwrap(), group);
}

/// [`test_rules`] against the rule groups `spec`, in a scratch directory of the group's own.
fn test_spec(spec: &Value, group: Value) {
    let Some(promtool) = promtool() else {
        return;
    };
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = scratch(&format!("alerts-evaluated-{n}"));
    write_spec(&dir, spec);
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

/// A `promql_expr_test`: at `eval_time`, alert `name` fires (with `severity`), or does not fire at all
/// (`None`). Read through Prometheus's ALERTS series, so the alert's other labels and annotations do not
/// have to be spelt out.
fn alerts_at(eval_time: &str, name: &str, severity: Option<&str>) -> Value {
    let firing = format!("ALERTS{{alertname=\"{name}\", alertstate=\"firing\"}}");
    match severity {
        Some(severity) => {
            json!({"expr": format!("count by (severity) ({firing})"), "eval_time": eval_time,
            "exp_samples": [{"labels": format!("{{severity=\"{severity}\"}}"), "value": 1}]})
        }
        None => json!({"expr": firing, "eval_time": eval_time, "exp_samples": []}),
    }
}

#[test]
fn a_server_the_proxy_marks_down_for_5_minutes_alerts_with_its_slot() {
    let down = |pod: &str, slot: u32, values: &str| {
        json!({"series": format!(
            "memcached_proxy_backend_down{{namespace=\"ns\",memcached=\"a\",pod=\"{pod}\",slot=\"{slot}\",backend=\"10.0.0.{slot}:11211\"}}"
        ), "values": values})
    };
    let firing_slot = |eval_time: &str| {
        json!({"expr": "count by (slot, backend) (ALERTS{alertname=\"MemcachedProxyBackendDown\", alertstate=\"firing\"})",
               "eval_time": eval_time,
               "exp_samples": [{"labels": "{slot=\"1\",backend=\"10.0.0.1:11211\"}", "value": 1}]})
    };
    test_rules(json!({
        "interval": "1m",
        "input_series": [
            // Proxy pod p-1 marks slot 1 down from 11 m to 31 m; p-2 marks it down too from 20 m (one
            // alert per slot, not per proxy pod), and marks slot 0 down for 4 minutes at 41 m (a restart:
            // no alert).
            down("p-1", 1, "0x10 1x20 0x30"),
            down("p-2", 1, "0x19 1x11 0x30"),
            down("p-2", 0, "0x40 1x3 0x15"),
            down("p-1", 0, "0x60"),
        ],
        "promql_expr_test": [
            alerts_at("10m", "MemcachedProxyBackendDown", None),
            alerts_at("15m", "MemcachedProxyBackendDown", None),
            alerts_at("16m", "MemcachedProxyBackendDown", Some("warning")),
            firing_slot("16m"),
            firing_slot("25m"),
            firing_slot("31m"),
            alerts_at("32m", "MemcachedProxyBackendDown", None),
            alerts_at("44m", "MemcachedProxyBackendDown", None),
            alerts_at("50m", "MemcachedProxyBackendDown", None),
        ],
    }));
}

#[test]
fn a_proxy_with_no_ready_pod_for_5_minutes_pages_from_the_leaders_series_only() {
    let condition = |pod: &str, memcached: &str, values: &str| {
        json!({"series": format!(
            "memcached_operator_instance_condition{{instance=\"{pod}\",pod=\"{pod}\",namespace=\"ns\",memcached=\"{memcached}\",condition=\"ProxyAvailable\"}}"
        ), "values": values})
    };
    let leader = |pod: &str, values: &str| json!({"series": format!("memcached_operator_leader{{instance=\"{pod}\",pod=\"{pod}\"}}"), "values": values});
    let firing = |eval_time: &str, memcached: &str| {
        json!({"expr": "count by (memcached) (ALERTS{alertname=\"MemcachedProxyUnavailable\", alertstate=\"firing\"})",
               "eval_time": eval_time,
               "exp_samples": [{"labels": format!("{{memcached=\"{memcached}\"}}"), "value": 1}]})
    };
    test_rules(json!({
        "interval": "1m",
        "input_series": [
            // op-1 leads. Instance `a`'s proxy has no ready pod from 10 m to 30 m; `b`'s loses its pods
            // for 3 minutes (a rollout of a single replica: no page). op-2, not leading, keeps stale
            // zeros for `c` (no page: only the leader's values count).
            leader("op-1", "1x60"),
            leader("op-2", "0x60"),
            condition("op-1", "a", "1x9 0x20 1x30"),
            condition("op-1", "b", "1x19 0x3 1x37"),
            condition("op-2", "c", "0x60"),
        ],
        "promql_expr_test": [
            alerts_at("14m", "MemcachedProxyUnavailable", None),
            alerts_at("16m", "MemcachedProxyUnavailable", Some("critical")),
            firing("16m", "a"),
            firing("29m", "a"),
            alerts_at("31m", "MemcachedProxyUnavailable", None),
            alerts_at("45m", "MemcachedProxyUnavailable", None),
        ],
    }));
}

#[test]
fn an_identity_refused_a_tenth_of_its_requests_for_10_minutes_alerts_by_identity() {
    let counter = |name: &str, pod: &str, identity: &str, values: &str| {
        json!({"series": format!(
            "memcached_proxy_access_{name}_total{{namespace=\"ns\",memcached=\"a\",pod=\"{pod}\",identity=\"{identity}\"}}"
        ), "values": values})
    };
    let firing = |eval_time: &str| {
        json!({"expr": "count by (identity) (ALERTS{alertname=\"MemcachedProxyAccessRefusals\", alertstate=\"firing\"})",
               "eval_time": eval_time,
               "exp_samples": [{"labels": "{identity=\"orders\"}", "value": 1}]})
    };
    test_rules(json!({
        "interval": "1m",
        "input_series": [
            // `orders`, 1 request a second on each of two proxy pods; p-1 refuses 0.3 a second of them
            // from 11 m to 41 m (15 % of the identity's requests); p-2 restarts at 26 m (a counter reset,
            // which must neither stop nor start the alert).
            counter("requests", "p-1", "orders", "0+60x60"),
            counter("refusals", "p-1", "orders", "0x10 0+18x30 540x20"),
            counter("requests", "p-2", "orders", "0+60x25 0+60x35"),
            counter("refusals", "p-2", "orders", "0x60"),
            // `reports`: 10 requests a second, 1 % refused throughout: below the share.
            counter("requests", "p-1", "reports", "0+600x60"),
            counter("refusals", "p-1", "reports", "0+6x60"),
            // `unknown`: every request refused, but one every 2 minutes: below the floor.
            counter("requests", "p-1", "unknown", "0+0.5x60"),
            counter("refusals", "p-1", "unknown", "0+0.5x60"),
        ],
        "promql_expr_test": [
            alerts_at("10m", "MemcachedProxyAccessRefusals", None),
            alerts_at("18m", "MemcachedProxyAccessRefusals", None),
            alerts_at("25m", "MemcachedProxyAccessRefusals", Some("warning")),
            firing("25m"),
            firing("30m"),
            firing("40m"),
            alerts_at("50m", "MemcachedProxyAccessRefusals", None),
        ],
    }));
}

#[test]
fn an_operator_not_scraped_yet_warns_and_does_not_page() {
    // No series of the operator at all (no ServiceMonitor, or 403 on every scrape) for an hour.
    test_rules(json!({
        "interval": "1m",
        "input_series": [],
        "promql_expr_test": [
            alerts_at("14m", "MemcachedOperatorMetricsAbsent", None),
            alerts_at("16m", "MemcachedOperatorMetricsAbsent", Some("warning")),
            alerts_at("60m", "MemcachedOperatorMetricsAbsent", Some("warning")),
            alerts_at("60m", "MemcachedOperatorNoLeader", None),
        ],
    }));
}

#[test]
fn a_fleet_rollout_with_no_instance_finished_for_an_hour_warns() {
    // The leader rolls 30 instances in the first 30 minutes, then the 10 left wait behind rollouts that
    // never settle; at 131 m the fleet is through. The follower reports an empty queue all along.
    let pending = |pod: &str, values: &str| {
        json!({"series": format!(
            "memcached_operator_fleet_rollout_instances{{pod=\"{pod}\",state=\"pending\"}}"
        ), "values": values})
    };
    let completed = |pod: &str, values: &str| {
        json!({"series": format!(
            "memcached_operator_fleet_rollout_completed_total{{pod=\"{pod}\"}}"
        ), "values": values})
    };
    test_rules(json!({
        "interval": "1m",
        "input_series": [
            pending("op-1", "40-1x30 10x99 0x20"),
            completed("op-1", "0+1x30 30x99 40x20"),
            pending("op-2", "0x150"),
            completed("op-2", "0x150"),
        ],
        "promql_expr_test": [
            alerts_at("60m", "MemcachedOperatorFleetRolloutStalled", None),
            alerts_at("92m", "MemcachedOperatorFleetRolloutStalled", None),
            alerts_at("102m", "MemcachedOperatorFleetRolloutStalled", Some("warning")),
            alerts_at("125m", "MemcachedOperatorFleetRolloutStalled", Some("warning")),
            alerts_at("140m", "MemcachedOperatorFleetRolloutStalled", None),
        ],
    }));
}

#[test]
fn scraped_replicas_without_a_leader_page() {
    test_rules(json!({
        "interval": "1m",
        "input_series": [
            {"series": "memcached_operator_leader{pod=\"op-1\"}", "values": "1x10 0x20"},
            {"series": "memcached_operator_leader{pod=\"op-2\"}", "values": "0x30"},
        ],
        "promql_expr_test": [
            alerts_at("10m", "MemcachedOperatorNoLeader", None),
            alerts_at("14m", "MemcachedOperatorNoLeader", None),
            alerts_at("16m", "MemcachedOperatorNoLeader", Some("critical")),
            alerts_at("16m", "MemcachedOperatorMetricsAbsent", None),
        ],
    }));
}

#[test]
fn a_hit_ratio_threshold_is_stated_as_a_percentage() {
    let Some(rules) = chart_rules(json!({"MemcachedHitRatioLow": {"threshold": 0.7}})) else {
        return;
    };
    let text = rules.to_string();
    assert!(text.contains("less than 70% of gets"), "{text}");
    assert!(text.contains("threshold 70%"), "{text}");
    assert!(text.contains("< 0.7"), "{text}");
}

/// The rule groups of the chart's PrometheusRule rendered with `alerts` as prometheusRule.alerts.
fn chart_rules(alerts: Value) -> Option<Value> {
    let rendering = helm::render(json!({"prometheusRule": {"enabled": true, "alerts": alerts}}))?;
    let objects = rendering.objects().unwrap();
    let rule = objects
        .iter()
        .find(|o| o["kind"] == "PrometheusRule")
        .expect("the PrometheusRule");
    Some(rule["spec"].clone())
}

#[test]
fn the_charts_alert_settings_change_what_fires() {
    // Gets hitting 60 % at 2 per second: under the default 80 %, over a threshold of 50 %.
    let gets = |status: &str, per_minute: u32| {
        json!({"series": format!(
            "memcached_commands_total{{namespace=\"ns\",memcached=\"a\",pod=\"a-0\",command=\"get\",status=\"{status}\"}}"
        ), "values": format!("0+{per_minute}x60")})
    };
    let series = json!([gets("hit", 72), gets("miss", 48)]);
    let Some(defaults) = chart_rules(json!({})) else {
        return;
    };
    test_spec(
        &defaults,
        json!({"interval": "1m", "input_series": series,
               "promql_expr_test": [alerts_at("45m", "MemcachedHitRatioLow", Some("warning"))]}),
    );
    let Some(adjusted) = chart_rules(json!({
        "MemcachedHitRatioLow": {"threshold": 0.5},
        "MemcachedOperatorMetricsAbsent": {"enabled": false},
        "MemcachedOperatorNoLeader": {"severity": "warning", "for": "30m"},
    })) else {
        return;
    };
    let rules: Vec<&Value> = adjusted["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap())
        .collect();
    assert!(
        rules
            .iter()
            .all(|r| r["alert"] != "MemcachedOperatorMetricsAbsent")
    );
    let hit_ratio = rules
        .iter()
        .find(|r| r["alert"] == "MemcachedHitRatioLow")
        .unwrap();
    for text in ["summary", "description"] {
        let said = hit_ratio["annotations"][text].as_str().unwrap();
        assert!(
            said.contains("50%") && !said.contains("80%"),
            "{text}: {said}"
        );
    }
    test_spec(
        &adjusted,
        json!({"interval": "1m", "input_series": [
                  gets("hit", 72), gets("miss", 48),
                  {"series": "memcached_operator_leader{pod=\"op-1\"}", "values": "0x60"}],
               "promql_expr_test": [
                  alerts_at("45m", "MemcachedHitRatioLow", None),
                  alerts_at("20m", "MemcachedOperatorNoLeader", None),
                  alerts_at("31m", "MemcachedOperatorNoLeader", Some("warning"))]}),
    );
}

#[test]
fn the_charts_runbook_urls_follow_the_base_url() {
    let Some(rendering) = helm::render(json!({"prometheusRule": {
        "enabled": true, "runbookBaseUrl": "https://runbooks.test/memcached/"}}))
    else {
        return;
    };
    let objects = rendering.objects().unwrap();
    let rule = objects
        .iter()
        .find(|o| o["kind"] == "PrometheusRule")
        .unwrap();
    for group in rule["spec"]["groups"].as_array().unwrap() {
        for alert in group["rules"].as_array().unwrap() {
            let url = alert["annotations"]["runbook_url"].as_str().unwrap();
            let original = alert_url(alert["alert"].as_str().unwrap());
            let anchor = original.split_once('#').unwrap().1;
            assert_eq!(url, format!("https://runbooks.test/memcached#{anchor}"));
        }
    }
}
