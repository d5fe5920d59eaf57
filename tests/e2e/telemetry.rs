//! Step 24: operand telemetry. An instance with two real memcached pods gets a few sets and gets through
//! its Service (from inside one of its pods, with busybox `nc`: no extra pod to admit under the
//! `restricted` policy); then `status.stats`, the `HIT%`/`MEM%` columns and the operator's `/metrics`
//! show the hits and items. The suite's operators run with `--stats-interval=2s` and
//! `--stats-status-interval=5s` (see `E2e::start_operator`).
//!
//! The operator runs on the machine running the test, not in the cluster, so it reaches the pods only
//! where pod IPs are routable from here (a cluster on this host's network, most cloud VPCs; not kind or
//! minikube from the host). The step probes that first: where the pods are reachable it checks the
//! values; where they are not, it checks that the instance is reported as not readable (`serversRead`
//! 0 of 2, `memcached_up 0`), the other half of the contract, and says so. Either way the series go when
//! the instance is deleted.

use std::net::{IpAddr, SocketAddr, TcpStream};
use std::time::Duration;

use serde_json::Value;

use crate::checks::{check_ready_status, live_pods};
use crate::env::{E2e, OpInfo, delete_instance};
use crate::http::http_get;
use crate::kubectl::{apply_yaml_ok, compact, get_required, kubectl_ok, secs};
use crate::names::{API_VERSION, APP_NAME, MC, PORT};

pub const STATS_NAME: &str = "memcached-stats";

/// Three sets, three hits and a miss, in one connection through the Service; `quit` ends it.
const SCRIPT: &str = "set e2e-1 0 0 3\r\none\r\nset e2e-2 0 0 3\r\ntwo\r\nset e2e-3 0 0 5\r\nthree\r\n\
                      get e2e-1\r\nget e2e-2\r\nget e2e-3\r\nget e2e-missing\r\nquit\r\n";

pub fn step_telemetry(env: &E2e, op: &OpInfo) {
    let ns = env.ns.as_str();
    apply_yaml_ok(&format!(
        "apiVersion: {API_VERSION}\nkind: Memcached\nmetadata:\n  name: {STATS_NAME}\n  namespace: {ns}\n\
         spec:\n  size: 2\n"
    ));
    env.wait(
        &format!("Memcached {STATS_NAME}: 2 ready pods"),
        secs(180),
        || check_ready_status(ns, STATS_NAME, 2),
    );
    let pods = live_pods(ns, STATS_NAME).unwrap_or_else(|e| panic!("{e}"));
    let client_pod = pods[0]["metadata"]["name"].as_str().unwrap_or_default();
    let shell = format!(
        "printf '{}' | nc -w 5 {STATS_NAME}.{ns}.svc {PORT}",
        SCRIPT.replace("\r\n", "\\r\\n")
    );
    eprintln!("    $ kubectl exec {client_pod} -c {APP_NAME} -- sh -c \"{shell}\"");
    let out = kubectl_ok(&[
        "exec", "-n", ns, client_pod, "-c", APP_NAME, "--", "sh", "-c", &shell,
    ]);
    assert!(
        out.matches("STORED").count() == 3 && out.matches("VALUE e2e-").count() == 3,
        "the sets and gets through the Service did not all succeed: {out:?}"
    );

    let reachable = pods.iter().all(|pod| {
        pod["status"]["podIP"]
            .as_str()
            .and_then(|ip| ip.parse::<IpAddr>().ok())
            .is_some_and(|ip| {
                let port = u16::try_from(PORT).unwrap_or(11211);
                TcpStream::connect_timeout(&SocketAddr::new(ip, port), Duration::from_secs(2))
                    .is_ok()
            })
    });
    let series = |text: &str, metric: &str| -> Vec<f64> {
        let prefix = format!("{metric}{{namespace=\"{ns}\",memcached=\"{STATS_NAME}\",");
        text.lines()
            .filter(|l| l.starts_with(&prefix))
            .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
            .collect()
    };
    let metrics = || {
        http_get(op.metrics_port, "/metrics")
            .and_then(|(code, body)| (code == 200).then_some(body).ok_or(format!("HTTP {code}")))
    };

    if reachable {
        let stats = env.wait(
            &format!("Memcached {STATS_NAME}: status.stats with the 3 items and a hit ratio, both servers read"),
            secs(60),
            || {
                let mc = get_required(MC, ns, STATS_NAME)?;
                let stats = &mc["status"]["stats"];
                let ok = stats["items"].as_i64().is_some_and(|n| n >= 3)
                    && stats["hitRatioPercent"].as_i64().is_some()
                    && stats["serversRead"] == 2
                    && stats["serversReady"] == 2;
                if ok { Ok(stats.clone()) } else { Err(format!("status.stats: {}", compact(stats))) }
            },
        );
        assert_eq!(
            stats["hitRatioPercent"],
            75,
            "3 hits and 1 miss: {}",
            compact(&stats)
        );
        env.wait(
            "/metrics: the instance's pods with their items and get hits",
            secs(30),
            || {
                let text = metrics()?;
                let items: f64 = series(&text, "memcached_current_items").iter().sum();
                let hits: f64 = text
                    .lines()
                    .filter(|l| l.contains("status=\"hit\""))
                    .flat_map(|l| series(l, "memcached_commands_total"))
                    .sum();
                let up = series(&text, "memcached_up");
                if up == [1.0, 1.0] && items >= 3.0 && hits >= 3.0 {
                    Ok(())
                } else {
                    Err(format!(
                        "memcached_up {up:?}, items {items}, get hits {hits}"
                    ))
                }
            },
        );
        let table = kubectl_ok(&["get", MC, STATS_NAME, "-n", ns]);
        assert!(
            table.contains("HIT%") && table.contains("MEM%") && table.contains("75"),
            "kubectl get shows the hit ratio:\n{table}"
        );
        eprintln!("    ok: status.stats {}", compact(&stats));
    } else {
        eprintln!(
            "    NOTE: the pod IPs are not reachable from this machine, where the operator runs; checking \
             that the instance is reported as not readable instead of its values"
        );
        env.wait(
            &format!("Memcached {STATS_NAME}: status.stats says 0 of 2 servers read"),
            secs(60),
            || {
                let mc = get_required(MC, ns, STATS_NAME)?;
                let stats: &Value = &mc["status"]["stats"];
                if stats["serversRead"] == 0 && stats["serversReady"] == 2 {
                    Ok(())
                } else {
                    Err(format!("status.stats: {}", compact(stats)))
                }
            },
        );
        env.wait("/metrics: memcached_up 0 for both pods", secs(30), || {
            let up = series(&metrics()?, "memcached_up");
            if up == [0.0, 0.0] {
                Ok(())
            } else {
                Err(format!("memcached_up {up:?}"))
            }
        });
    }

    delete_instance(env, STATS_NAME);
    env.wait(
        &format!("/metrics: no series of {STATS_NAME} after its deletion"),
        secs(60),
        || {
            let up = series(&metrics()?, "memcached_up");
            if up.is_empty() {
                Ok(())
            } else {
                Err(format!("memcached_up {up:?}"))
            }
        },
    );
}
