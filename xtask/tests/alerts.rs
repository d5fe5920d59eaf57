//! The alerts of `config/prometheus` (a PrometheusRule): every expression parses as PromQL and names only
//! metrics the operator exports, every alert has a runbook section in docs/operations.md, and the chart's
//! PrometheusRule and the kustomize component carry the same rules.

mod common;

use std::collections::BTreeSet;

use common::helm::{self, find};
use common::promql::unknown_metrics;
use common::read;
use serde_json::{Value, json};
use xtask::chart::{ALERTS_PATH, alerts_spec};
use xtask::install;
use xtask::repo_root;

fn rules() -> Vec<Value> {
    alerts_spec(&repo_root()).unwrap()["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|group| group["rules"].as_array().unwrap().clone())
        .collect()
}

#[test]
fn every_alert_parses_and_names_exported_metrics() {
    for rule in rules() {
        let alert = rule["alert"].as_str().unwrap();
        let expr = rule["expr"].as_str().unwrap();
        let unknown =
            unknown_metrics(expr).unwrap_or_else(|e| panic!("{alert}: {expr} does not parse: {e}"));
        assert!(
            unknown.is_empty(),
            "{alert}: {expr} names metrics /metrics does not carry: {unknown:?}"
        );
        assert!(rule["for"].as_str().is_some(), "{alert}: no `for`");
        assert!(
            rule["labels"]["severity"].as_str().is_some(),
            "{alert}: no severity"
        );
        assert!(
            rule["annotations"]["summary"].as_str().is_some(),
            "{alert}: no summary"
        );
    }
}

#[test]
fn the_alerts_cover_caches_and_operator() {
    let alerts: BTreeSet<String> = rules()
        .iter()
        .map(|r| r["alert"].as_str().unwrap().to_owned())
        .collect();
    for alert in [
        "MemcachedEvicting",
        "MemcachedHitRatioLow",
        "MemcachedServerUnreadable",
        "MemcachedProxyBackendDown",
        "MemcachedProxyUnavailable",
        "MemcachedProxyAccessRefusals",
        "MemcachedStatsReadsFailing",
        "MemcachedInstanceDegraded",
        "MemcachedHandoverFailed",
        "MemcachedOperatorReconcileErrors",
        "MemcachedOperatorFleetRolloutStalled",
        "MemcachedOperatorAPIServerUnreachable",
        "MemcachedOperatorNoLeader",
        "MemcachedOperatorMetricsAbsent",
    ] {
        assert!(alerts.contains(alert), "{ALERTS_PATH} lacks {alert}");
    }
    let hit_ratio = rules()
        .into_iter()
        .find(|r| r["alert"] == "MemcachedHitRatioLow")
        .unwrap();
    assert_eq!(
        hit_ratio["for"], "15m",
        "a low hit ratio alerts after 15 minutes"
    );
}

/// GitHub's anchor of a markdown heading.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == '-' || *c == ' ' || *c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

#[test]
fn every_alert_links_a_runbook_section_of_the_operations_guide() {
    let guide = read("docs/operations.md");
    let anchors: BTreeSet<String> = guide
        .lines()
        .filter_map(|line| line.strip_prefix('#'))
        .map(|heading| anchor(heading.trim_start_matches('#')))
        .collect();
    for rule in rules() {
        let alert = rule["alert"].as_str().unwrap();
        let url = rule["annotations"]["runbook_url"]
            .as_str()
            .unwrap_or_else(|| panic!("{alert}: no runbook_url"));
        let (page, section) = url
            .split_once('#')
            .unwrap_or_else(|| panic!("{alert}: {url} has no section"));
        assert!(page.ends_with("/docs/operations.md"), "{alert}: {url}");
        assert!(
            anchors.contains(section),
            "{alert}: docs/operations.md has no section #{section}"
        );
    }
}

#[test]
fn chart_and_kustomize_component_install_the_same_rules() {
    let objects = install::install_with_component("config/prometheus").unwrap();
    let component = objects
        .iter()
        .find(|o| o["kind"] == "PrometheusRule")
        .expect("the component's PrometheusRule");
    assert_eq!(component["metadata"]["name"], "memcached-operator-alerts");
    assert_eq!(
        component["metadata"]["namespace"],
        "memcached-operator-system"
    );
    assert_eq!(component["spec"], alerts_spec(&repo_root()).unwrap());

    let Some(off) = helm::render(json!({})) else {
        return;
    };
    assert!(
        off.objects()
            .unwrap()
            .iter()
            .all(|o| o["kind"] != "PrometheusRule"),
        "off by default"
    );
    let Some(on) =
        helm::render(json!({"prometheusRule": {"enabled": true, "labels": {"release": "prom"}}}))
    else {
        return;
    };
    let objects = on.objects().unwrap();
    let rule = find(&objects, "PrometheusRule", "memcached-operator-alerts").unwrap();
    assert_eq!(rule["metadata"]["labels"]["release"], "prom");
    assert_eq!(
        rule["spec"], component["spec"],
        "the chart's rules are the component's"
    );
}

/// kustomize's runbook links have one base URL, as the chart's `prometheusRule.runbookBaseUrl`: the
/// local-config ConfigMap of `config/prometheus/runbooks.yaml`, which sets every alert's link and is not
/// installed itself.
#[test]
fn the_kustomize_component_takes_one_runbook_base_url() {
    let dir = std::env::temp_dir().join(format!("runbooks-{}", std::process::id()));
    let component = dir.join("prometheus");
    std::fs::create_dir_all(&component).unwrap();
    // The rules keep their links as committed: only the setting changes.
    for file in ["kustomization.yaml", "prometheus_rule.yaml"] {
        let text = read(&format!("config/prometheus/{file}"));
        std::fs::write(component.join(file), text).unwrap();
    }
    let setting = read("config/prometheus/runbooks.yaml");
    let base = setting
        .lines()
        .find_map(|l| l.trim().strip_prefix("baseUrl: "))
        .unwrap();
    std::fs::write(
        component.join("runbooks.yaml"),
        setting.replace(base, "https://docs.test/ops.md"),
    )
    .unwrap();
    let top = dir.join("top");
    std::fs::create_dir_all(&top).unwrap();
    std::fs::write(
        top.join("kustomization.yaml"),
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\ncomponents:\n- ../prometheus\n",
    )
    .unwrap();
    let objects = xtask::kubectl::kustomize(&top).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(
        objects.iter().all(|o| o["kind"] != "ConfigMap"),
        "the runbooks setting must not be installed"
    );
    let rule = objects
        .iter()
        .find(|o| o["kind"] == "PrometheusRule")
        .unwrap();
    let mut links = 0;
    for group in rule["spec"]["groups"].as_array().unwrap() {
        for alert in group["rules"].as_array().unwrap() {
            let url = alert["annotations"]["runbook_url"].as_str().unwrap();
            assert!(url.starts_with("https://docs.test/ops.md#"), "{url}");
            links += 1;
        }
    }
    assert!(links >= 10, "{links} runbook links");
}
