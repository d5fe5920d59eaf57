//! Step 17: ServiceMonitors created and removed with the spec where the cluster serves
//! monitoring.coreos.com/v1, else `Degraded` `ServiceMonitorUnavailable`.

use serde_json::json;

use crate::checks::{
    check_owner, condition, expect_degraded, expect_eq, names, push_err, result, selector_labels,
};
use crate::env::{E2e, delete_instance};
use crate::kubectl::{
    apply_yaml_ok, compact, get_required, gone, kubectl, kubectl_json, kubectl_ok, secs, uid_of,
};
use crate::names::{API_VERSION, APP_NAME, EXPORTER_NAME, MC, METRICS_PORT_NAME, SERVICE_MONITORS};

pub const MONITOR_NAME: &str = "memcached-monitor";

pub fn step_service_monitor(env: &E2e, served_at_start: bool) {
    let ns = env.ns.as_str();
    let served = service_monitors_served();
    if served != served_at_start {
        eprintln!(
            "    SKIP: the ServiceMonitor API was {}served when the operator started and is {}served now; the \
             operator only looks at start, so neither outcome can be checked",
            if served_at_start { "" } else { "not " },
            if served { "" } else { "not " }
        );
        return;
    }
    apply_yaml_ok(&format!(
        "apiVersion: {API_VERSION}\nkind: Memcached\nmetadata:\n  name: {MONITOR_NAME}\n  namespace: {ns}\n\
         spec:\n  size: 1\n  monitoring:\n    exporter:\n      enabled: true\n    serviceMonitor:\n      \
         enabled: true\n      interval: 30s\n"
    ));
    let uid = uid_of(MC, ns, MONITOR_NAME);
    if served {
        eprintln!("    the cluster serves {SERVICE_MONITORS}");
        env.wait(
            &format!("ServiceMonitor {MONITOR_NAME} scraping the port named {METRICS_PORT_NAME}"),
            secs(60),
            || {
                let sm = get_required(SERVICE_MONITORS, ns, MONITOR_NAME)?;
                let mut p = Vec::new();
                push_err(
                    &mut p,
                    expect_eq(
                        "spec.endpoints[0].port",
                        &sm["spec"]["endpoints"][0]["port"],
                        &json!(METRICS_PORT_NAME),
                    ),
                );
                push_err(
                    &mut p,
                    expect_eq(
                        "spec.selector.matchLabels",
                        &sm["spec"]["selector"]["matchLabels"],
                        &selector_labels(MONITOR_NAME),
                    ),
                );
                push_err(&mut p, check_owner(&sm, MONITOR_NAME, &uid, true));
                result(p, &sm)
            },
        );
        let mc = kubectl_json(&["get", MC, MONITOR_NAME, "-n", ns, "-o", "json"]);
        if let Some(c) = condition(&mc, "Degraded") {
            assert_ne!(
                c["reason"],
                "ServiceMonitorUnavailable",
                "the API is served, yet Memcached {MONITOR_NAME} reports {}",
                compact(c)
            );
        }
        let patch = r#"{"spec":{"monitoring":{"serviceMonitor":{"enabled":false}}}}"#;
        kubectl_ok(&[
            "patch",
            MC,
            MONITOR_NAME,
            "-n",
            ns,
            "--type=merge",
            "-p",
            patch,
        ]);
        env.wait(
            &format!(
                "ServiceMonitor {MONITOR_NAME} to be deleted with serviceMonitor.enabled=false"
            ),
            secs(60),
            || gone(SERVICE_MONITORS, ns, MONITOR_NAME),
        );
    } else {
        eprintln!("    the cluster does not serve {SERVICE_MONITORS}");
        env.wait(
            &format!("Memcached {MONITOR_NAME}: Degraded=True, reason ServiceMonitorUnavailable"),
            secs(60),
            || {
                let mc = get_required(MC, ns, MONITOR_NAME)?;
                expect_degraded(&mc, "ServiceMonitorUnavailable", "ServiceMonitor")
            },
        );
        env.wait(
            &format!("Deployment {MONITOR_NAME} (with the exporter) and Service {MONITOR_NAME} (with the metrics port) to be applied anyway"),
            secs(60),
            || {
                let dep = get_required("deployments.apps", ns, MONITOR_NAME)?;
                let svc = get_required("services", ns, MONITOR_NAME)?;
                let mut p = Vec::new();
                let containers = names(&dep["spec"]["template"]["spec"]["containers"]);
                if containers != [APP_NAME, EXPORTER_NAME] {
                    p.push(format!("pod template containers are {containers:?}"));
                }
                let ports = names(&svc["spec"]["ports"]);
                if ports != [APP_NAME, METRICS_PORT_NAME] {
                    p.push(format!("Service ports are {ports:?}"));
                }
                push_err(&mut p, check_owner(&dep, MONITOR_NAME, &uid, true));
                result(p, &json!({"containers": containers, "ports": ports}))
            },
        );
    }
    delete_instance(env, MONITOR_NAME);
}

/// Whether the cluster serves the Prometheus Operator's ServiceMonitor (`kubectl api-resources`).
pub fn service_monitors_served() -> bool {
    let out = kubectl(&[
        "api-resources",
        "--api-group=monitoring.coreos.com",
        "-o",
        "name",
    ]);
    if !out.status.success() {
        // Discovery can fail for an unrelated group while still listing this one.
        eprintln!(
            "    (kubectl api-resources: {})",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .any(|l| l.trim() == SERVICE_MONITORS)
}
