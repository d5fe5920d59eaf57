//! Step 24: operand telemetry. An instance with two real memcached pods gets a few sets and gets through
//! its Service (from inside one of its pods, with busybox `nc`: no extra pod to admit under the
//! `restricted` policy); then `status.stats`, the `HIT%`/`MEM%` columns and the operator's `/metrics`
//! show the hits and items. The suite's operators run with `--stats-interval=2s` and
//! `--stats-status-interval=5s` (see `E2e::start_operator`).
//!
//! On the nodes of envtest's stand-in kubelet (labelled [`STAND_IN_LABEL`]), where pods are memcached
//! processes on loopback addresses of this machine, there is no `kubectl exec` and no kube-proxy: there
//! the step checks that the Service sends its memcached port to both pods (its selector and target port,
//! resolved as the endpoints controller does), and sends the same session from this machine to one of
//! them, as the Service would.
//!
//! The operator runs on the machine running the test, not in the cluster, so it reaches the pods only
//! where pod IPs are routable from here (a cluster on this host's network, most cloud VPCs; not kind or
//! minikube from the host). The step probes that first: where the pods are reachable it checks the
//! values; where they are not, it checks that the instance is reported as not readable (`serversRead`
//! 0 of 2, `memcached_up 0`), the other half of the contract, and says so. Either way the series go when
//! the instance is deleted.

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::time::Duration;

use serde_json::Value;

use crate::checks::{check_ready_status, live_pods, pod_ready};
use crate::env::{E2e, OpInfo, delete_instance};
use crate::http::http_get;
use crate::kubectl::{
    apply_yaml_ok, compact, get_required, items, kubectl_json, kubectl_ok, secs, try_kubectl_json,
};
use crate::names::{API_VERSION, APP_NAME, MC, PORT, STAND_IN_LABEL};

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
    let out = session_through_service(env, ns, STATS_NAME, &pods, SCRIPT);
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

/// Sends `script` (ending with `quit`) through Service `name` to one of its `pods`, and returns what
/// memcached answered: from inside the first pod with busybox `nc`, or, on a stand-in kubelet's node (no
/// exec, no kube-proxy; pods are memcached processes on loopback addresses here), from this machine to the
/// backend the Service would pick.
pub fn session_through_service(
    env: &E2e,
    ns: &str,
    name: &str,
    pods: &[Value],
    script: &str,
) -> String {
    let client_pod = pods[0]["metadata"]["name"].as_str().unwrap_or_default();
    if let Some(node) = stand_in_node(&pods[0]) {
        eprintln!(
            "    pod {client_pod} runs on {node}, a node of a stand-in kubelet (label {STAND_IN_LABEL}): \
             no kubectl exec and no kube-proxy there, so the session goes from this machine to a \
             backend of Service {name}"
        );
        let endpoint = env.wait(
            &format!("Service {name} to send its port {APP_NAME} to its pods, on port {PORT}"),
            secs(60),
            || service_backend(ns, name, pods),
        );
        eprintln!("    session with {endpoint}, a backend of Service {name}");
        memcached_session(endpoint, script).unwrap_or_else(|e| panic!("{e}"))
    } else {
        let shell = format!(
            "printf '{}' | nc -w 5 {name}.{ns}.svc {PORT}",
            script.replace("\r\n", "\\r\\n")
        );
        eprintln!("    $ kubectl exec {client_pod} -c {APP_NAME} -- sh -c \"{shell}\"");
        kubectl_ok(&[
            "exec", "-n", ns, client_pod, "-c", APP_NAME, "--", "sh", "-c", &shell,
        ])
    }
}

/// The pod's node when it is a node of a stand-in kubelet (envtest's, which labels its Nodes
/// [`STAND_IN_LABEL`]), else `None`.
pub fn stand_in_node(pod: &Value) -> Option<String> {
    let node = pod["spec"]["nodeName"].as_str()?;
    let labels = kubectl_json(&["get", "node", node, "-o", "jsonpath={.metadata.labels}"]);
    labels[STAND_IN_LABEL]
        .as_str()
        .is_some_and(|v| v == "true")
        .then(|| node.to_owned())
}

/// Where a connection to `service`'s port named `memcached` goes, worked out as the endpoints controller
/// and kube-proxy do it: the ready pods its selector picks, at its `targetPort` (a name or a number)
/// resolved against each pod's container ports. The Service must pick exactly `pods`, each on port
/// `PORT`; returns the address of the first of `pods`.
///
/// The stand-in's pod IPs are loopback addresses, which the API server refuses in Endpoints and
/// EndpointSlices, so the Service's EndpointSlices stay empty there and cannot be read instead.
fn service_backend(ns: &str, service: &str, pods: &[Value]) -> Result<SocketAddr, String> {
    let svc = get_required("services", ns, service)?;
    let port = svc["spec"]["ports"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["name"] == APP_NAME)
        .ok_or_else(|| {
            format!(
                "Service {service} has no port named {APP_NAME}: {}",
                compact(&svc["spec"])
            )
        })?;
    let target = if port["targetPort"].is_null() {
        &port["port"]
    } else {
        &port["targetPort"]
    };
    let selector: Vec<String> = svc["spec"]["selector"]
        .as_object()
        .filter(|s| !s.is_empty())
        .ok_or_else(|| {
            format!(
                "Service {service} has no selector: {}",
                compact(&svc["spec"])
            )
        })?
        .iter()
        .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
        .collect();
    let selected = try_kubectl_json(&[
        "get",
        "pods",
        "-n",
        ns,
        "-l",
        &selector.join(","),
        "-o",
        "json",
    ])?;
    let mut backends = Vec::new();
    for pod in items(&selected) {
        if !pod["metadata"]["deletionTimestamp"].is_null() || !pod_ready(&pod) {
            continue;
        }
        let name = pod["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let container_ports: Vec<&Value> = pod["spec"]["containers"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|c| c["ports"].as_array().into_iter().flatten())
            .collect();
        let resolved = match target {
            Value::String(port_name) => container_ports
                .iter()
                .find(|p| p["name"] == port_name.as_str())
                .and_then(|p| p["containerPort"].as_u64()),
            number => number.as_u64(),
        }
        .and_then(|p| u16::try_from(p).ok())
        .ok_or_else(|| {
            format!("targetPort {target} of Service {service} names no port of pod {name}")
        })?;
        let ip: IpAddr = pod["status"]["podIP"]
            .as_str()
            .and_then(|ip| ip.parse().ok())
            .ok_or_else(|| format!("pod {name} has no pod IP"))?;
        backends.push((name, SocketAddr::new(ip, resolved)));
    }
    // Sorted by pod name, as `want` is.
    backends.sort();
    let picked: Vec<&str> = backends.iter().map(|(n, _)| n.as_str()).collect();
    let mut want: Vec<&str> = pods
        .iter()
        .filter_map(|p| p["metadata"]["name"].as_str())
        .collect();
    want.sort_unstable();
    if picked != want {
        return Err(format!(
            "Service {service} (selector {}) picks the ready pods {picked:?}, want {want:?}",
            selector.join(",")
        ));
    }
    if let Some((name, addr)) = backends.iter().find(|(_, a)| i64::from(a.port()) != PORT) {
        return Err(format!(
            "Service {service} sends port {APP_NAME} to {addr} on pod {name}, want port {PORT}"
        ));
    }
    let first = pods[0]["metadata"]["name"].as_str().unwrap_or_default();
    backends
        .iter()
        .find(|(n, _)| n == first)
        .map(|(_, addr)| *addr)
        .ok_or_else(|| format!("no backend for pod {first}"))
}

/// Sends `script` (ending with `quit`) to the memcached at `addr` and returns all it answered (until it
/// closed the connection, or stopped answering for 5 s after saying something).
pub fn memcached_session(addr: SocketAddr, script: &str) -> Result<String, String> {
    let timeout = Duration::from_secs(5);
    let mut stream = TcpStream::connect_timeout(&addr, timeout)
        .map_err(|e| format!("cannot connect to {addr}: {e}"))?;
    stream
        .set_read_timeout(Some(timeout))
        .and_then(|()| stream.set_write_timeout(Some(timeout)))
        .map_err(|e| format!("{addr}: {e}"))?;
    stream
        .write_all(script.as_bytes())
        .map_err(|e| format!("cannot write to {addr}: {e}"))?;
    let mut answer = String::new();
    match stream.read_to_string(&mut answer) {
        Ok(_) => Ok(answer),
        // A server that answered and then went quiet without closing (memcached keeps a connection it
        // refused a login on): what it said is the answer.
        Err(e)
            if !answer.is_empty() && e.kind() == std::io::ErrorKind::WouldBlock
                || e.kind() == std::io::ErrorKind::TimedOut && !answer.is_empty() =>
        {
            Ok(answer)
        }
        Err(e) => Err(format!("reading from {addr} (so far {answer:?}): {e}")),
    }
}
