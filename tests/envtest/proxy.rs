//! The memcached proxy in front of a pool (`spec.proxy`), on real servers and a real proxy: a plain
//! pymemcache `Client` that knows only the proxy (no list, no hashing: `clients.py`'s `plain`) fills
//! 20 000 keys and reads every one back after a scale 3 -> 5, a scale 5 -> 4 and a rollout of the pool
//! (here), and after a StatefulSet rollout ([`statefulset`]), with no proxy pod replaced or restarted;
//! and when one server pod is killed, the proxy's clients miss that slot's keys only ([`server_loss`]);
//! with TLS from the client to the proxy and from the proxy to the servers ([`tls`]).
//!
//! The client connects to the Service `<name>-proxy` as an application would, except that envtest has no
//! kube-proxy (and no endpoint controllers, see the stand-in kubelet): the Service is resolved here to
//! its one endpoint, the ready proxy pod's IP and port (the pod the Service's selector picks).
//!
//! The proxy pods run for real only when `$MEMCACHED_PROXY_BINARY` names a proxy-capable memcached
//! (1.6.23 or later, built with `--enable-proxy`); without it, or without pymemcache (their clients'
//! library, which `.ci/run` installs), the scenarios print `envtest: skipped proxy...: ...` and pass. After each change a scenario waits for the pool to settle
//! (the published list of `status.servers`), for the route ConfigMap `<name>-proxy` to list it, and for
//! the proxy to have reloaded it (its `proxy_config_reloads` counting the change and then staying still).
//! Meanwhile a [`RouteWatch`] times each change of the route ConfigMap to the proxy's reload of it.

mod access;
mod server_loss;
mod statefulset;
mod tls;

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

use crate::instances::{apply, condition, conditions, memcacheds, pods};
use crate::real_clients::{Published, drive, published};
use crate::{PROXY_BINARY_VAR, Scenario, proxy_memcached, wait_for};

const KEYS: usize = 20_000;
const VALUE_LEN: usize = 100;
const PORT: u16 = 11211;
const PROXY_PODS: &str = "app.kubernetes.io/name=memcached-proxy,app.kubernetes.io/instance=cache";
/// The longest a route change may take to reach the proxy (issue 38).
const RELOAD_BOUND: Duration = Duration::from_secs(2);
/// The operator's flags: the stats summary written once (its first), so that the stats' own changes
/// write nothing in a window that counts a settled operator's writes. (A write loop needs no periodic
/// requeue to show: each write is an event that reconciles again.)
const OPERATOR_ARGS: &[&str] = &["--stats-status-interval", "1h"];

fn spec(size: usize, memory: i64) -> Value {
    json!({
        "size": size,
        "memcached": {"maxMemoryMB": memory},
        "scaling": {"drainSeconds": 2},
        "highAvailability": {"preStopDelaySeconds": 1, "terminationGracePeriodSeconds": 5},
        "proxy": {"enabled": true, "replicas": 1},
    })
}

/// The ready proxy pod: (`ip:port` the Service `cache-proxy` leads to, uid, restart count).
async fn proxy_pod(s: &Scenario) -> (String, String, i32) {
    let api = pods(s);
    wait_for("a ready proxy pod", Duration::from_secs(90), || async {
        let listed = api
            .list(&ListParams::default().labels(PROXY_PODS))
            .await
            .map_err(|e| e.to_string())?
            .items;
        let ready: Vec<&Pod> = listed.iter().filter(|p| is_ready(p)).collect();
        let [pod] = ready.as_slice() else {
            return Err(format!(
                "{} proxy pods, {} ready",
                listed.len(),
                ready.len()
            ));
        };
        let status = pod.status.clone().unwrap_or_default();
        let ip = status.pod_ip.ok_or("no IP")?;
        let restarts = status
            .container_statuses
            .iter()
            .flatten()
            .map(|c| c.restart_count)
            .sum();
        Ok((
            format!("{ip}:{PORT}"),
            pod.uid().unwrap_or_default(),
            restarts,
        ))
    })
    .await
}

/// Waits for the instance's status to say that its one proxy pod serves: `ProxyAvailable=True`
/// (`AllProxiesReady`), and `status.proxy` with the pod ready and the Service to connect to. The proxy
/// Deployment's own status change brings the instance back (its owner reference).
async fn proxy_available(s: &Scenario) {
    let api = memcacheds(s);
    let said = wait_for(
        "ProxyAvailable=True in the status",
        Duration::from_secs(60),
        || async {
            let mc = api.get("cache").await.map_err(|e| e.to_string())?;
            let status = mc.status.clone().unwrap_or_default();
            let proxy = status.proxy.clone().ok_or("no status.proxy")?;
            let available = condition(&mc, "ProxyAvailable")
                .filter(|c| c.status == "True" && c.reason == "AllProxiesReady")
                .ok_or_else(|| conditions(&mc))?;
            let counts = (proxy.replicas, proxy.ready_replicas, proxy.service.as_str());
            (counts == (1, 1, "cache-proxy"))
                .then(|| available.message.clone())
                .ok_or(format!("{proxy:?}"))
        },
    )
    .await;
    s.step(&format!("ProxyAvailable: {said}"));
}

fn is_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The proxy's `stats <group>` (`stats` when `group` is empty): every `STAT <name> <value>` line it
/// answers, in order.
async fn stats(address: &str, group: &str) -> Result<Vec<(String, String)>, String> {
    let mut stream = TcpStream::connect(address)
        .await
        .map_err(|e| e.to_string())?;
    let command = format!("stats {group}").trim_end().to_owned() + "\r\n";
    stream
        .write_all(command.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let mut lines = BufReader::new(stream).lines();
    let mut stats = Vec::new();
    while let Some(line) = lines.next_line().await.map_err(|e| e.to_string())? {
        if line == "END" {
            return Ok(stats);
        }
        let mut words = line.splitn(3, ' ').skip(1);
        if let (Some(name), Some(value)) = (words.next(), words.next()) {
            stats.push((name.to_owned(), value.to_owned()));
        }
    }
    Err(format!("no END after {}", command.trim_end()))
}

/// A counter of the proxy's `stats`.
async fn stat(address: &str, name: &str) -> Result<u64, String> {
    let stats = stats(address, "").await?;
    let (_, value) = stats
        .iter()
        .find(|(stat, _)| stat == name)
        .ok_or(format!("no {name} in stats"))?;
    value.parse().map_err(|_| format!("{name} {value}"))
}

/// The proxy's route over `list`: the published servers, a StatefulSet's DNS names by their pods'
/// addresses (the route lists pods' addresses: see `servers::route_servers`).
fn routed(list: &Published) -> Vec<String> {
    list.servers
        .iter()
        .map(|server| {
            let Some((host, port)) = server.rsplit_once(':') else {
                return server.clone();
            };
            match (list.hosts.get(host), port.parse::<i32>()) {
                (Some(ip), Ok(port)) => memcached_operator::resources::servers::entry(ip, port),
                _ => server.clone(),
            }
        })
        .collect()
}

/// Waits until the route ConfigMap lists `list`'s servers (by their pods' addresses: [`routed`]) and the
/// proxy has loaded it: its reload count
/// at least `at_least` (one past the last count when the route changed) and still for two seconds (a
/// reload lands within a second of the writer's signal). Returns the reload count.
async fn proxy_follows(s: &Scenario, proxy: &str, list: &Published, at_least: u64) -> u64 {
    let maps: Api<ConfigMap> = Api::namespaced(s.client.clone(), &s.namespace);
    wait_for(
        "the route ConfigMap to list the servers",
        Duration::from_secs(30),
        || async {
            let map = maps.get("cache-proxy").await.map_err(|e| e.to_string())?;
            let data = map
                .data
                .unwrap_or_default()
                .remove("route.json")
                .unwrap_or_default();
            let route = memcached_operator::resources::proxy::routes::Route::parse(&data)
                .map_err(|e| format!("{e}: {data}"))?;
            (route.servers == routed(list)).then_some(()).ok_or(data)
        },
    )
    .await;
    let first = stat(proxy, "proxy_config_reloads").await.unwrap_or(0);
    let last = Mutex::new((first, Instant::now()));
    wait_for(
        "the proxy to reload the route",
        Duration::from_secs(30),
        || async {
            let now = stat(proxy, "proxy_config_reloads").await?;
            let mut last = last.lock().unwrap_or_else(|e| e.into_inner());
            if now != last.0 {
                *last = (now, Instant::now());
            }
            let still = last.1.elapsed() >= Duration::from_secs(2);
            (now >= at_least && still)
                .then_some(now)
                .ok_or(format!("{now} reloads"))
        },
    )
    .await
}

/// The plain client's `op` (`fill` or `count`) through the proxy: keys stored or hit.
async fn through_proxy(op: &str, proxy: &str) -> usize {
    let answer = drive(json!({
        "op": op, "hashing": "plain", "servers": [proxy], "keys": KEYS, "value_len": VALUE_LEN,
    }))
    .await
    .unwrap_or_else(|e| panic!("the plain client's {op} through {proxy}: {e}"));
    answer["hits"]
        .as_u64()
        .unwrap_or_else(|| panic!("{answer}")) as usize
}

/// Times each change of the route ConfigMap `cache-proxy` to the proxy's reload of it, polling both every
/// 50 ms from its start until [`RouteWatch::stop`]: a change seen at `t` is loaded when the proxy's
/// `proxy_config_reloads` passes the count it had at `t`. Changes that follow each other before a reload
/// are loaded by that one reload (timed from the last of them). The error is the polling's, under 0.1 s.
struct RouteWatch {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Vec<Duration>>,
}

impl RouteWatch {
    fn start(s: &Scenario, proxy: &str) -> Self {
        let maps: Api<ConfigMap> = Api::namespaced(s.client.clone(), &s.namespace);
        let proxy = proxy.to_owned();
        let (stop, mut stopped) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(async move {
            let route = |map: Option<ConfigMap>| map.and_then(|m| m.data).unwrap_or_default();
            let mut seen = route(maps.get_opt("cache-proxy").await.ok().flatten());
            let (mut pending, mut delays) = (None::<(Instant, u64)>, Vec::new());
            loop {
                let count = stat(&proxy, "proxy_config_reloads").await.ok();
                let now = route(maps.get_opt("cache-proxy").await.ok().flatten());
                if let (Some((at, before)), Some(count)) = (pending, count)
                    && count > before
                {
                    delays.push(at.elapsed());
                    pending = None;
                }
                if now != seen
                    && let Some(count) = count
                {
                    seen = now;
                    pending = Some((Instant::now(), count));
                }
                tokio::select! {
                    _ = &mut stopped => return delays,
                    () = tokio::time::sleep(Duration::from_millis(50)) => {}
                }
            }
        });
        Self { stop, task }
    }

    /// The delays of the changes the proxy loaded.
    async fn stop(self) -> Vec<Duration> {
        let _ = self.stop.send(());
        self.task.await.expect("the route watch")
    }
}

/// Checks the route changes of a step reached the proxy within [`RELOAD_BOUND`]; `expected` says whether
/// the step changed the route at all.
fn reloads_in_time(s: &Scenario, step: &str, delays: &[Duration], expected: bool) {
    s.step(&format!(
        "{step}: route changes loaded by the proxy after {:?} (ConfigMap seen changed -> reload counted)",
        delays.iter().map(|d| format!("{:.2} s", d.as_secs_f64())).collect::<Vec<_>>()
    ));
    assert_eq!(
        !delays.is_empty(),
        expected,
        "{step}: the route changed and reached the proxy {} times",
        delays.len()
    );
    if let Some(slowest) = delays.iter().max() {
        assert!(
            *slowest <= RELOAD_BOUND,
            "{step}: the proxy loaded a route change {slowest:?} after it (bound {RELOAD_BOUND:?})"
        );
    }
}

/// The instance `cache`'s TLS Secret `cache-tls` (its Services', its pods' and the proxy's names), and
/// its CA's certificate (PEM), which clients of the proxy trust.
async fn proxy_tls_secret(s: &Scenario) -> String {
    let ns = s.namespace.clone();
    let names = [
        format!("cache.{ns}.svc"),
        format!("*.cache-headless.{ns}.svc"),
        format!("cache-proxy.{ns}.svc"),
    ];
    crate::secrets::tls_secrets(s, "cache-tls", names.to_vec(), None).await;
    let secret = Api::<Secret>::namespaced(s.client.clone(), &ns)
        .get("cache-tls")
        .await
        .expect("the TLS Secret");
    String::from_utf8(secret.data.unwrap_or_default()["ca.crt"].0.clone()).expect("a PEM CA")
}

/// The scenario `name`'s control plane with real servers, or why it cannot run.
async fn start(name: &str) -> Option<Scenario> {
    start_with(name, OPERATOR_ARGS).await
}

/// [`start`], the operator run with `args`.
async fn start_with(name: &str, args: &[&str]) -> Option<Scenario> {
    if envtest::assets().is_none() {
        envtest::skip(name);
        return None;
    }
    if proxy_memcached().is_none() {
        let reason = format!(
            "no proxy-capable memcached (set {PROXY_BINARY_VAR} to a memcached 1.6.23+ built with --enable-proxy)"
        );
        envtest::skip_because(name, &reason);
        return None;
    }
    // Its clients are pymemcache's, as every real-client scenario's.
    if let Err(why) = crate::real_clients::probe("plain", false).await {
        envtest::skip_because(name, &why);
        return None;
    }
    Scenario::start_with_memcached(name, args).await
}

#[tokio::test]
async fn a_plain_client_of_the_proxy_keeps_every_key_through_scales_and_a_rollout() {
    let Some(s) = start("proxy").await else {
        return;
    };
    apply(&s, "cache", spec(3, 64)).await;
    let mut list = published(&s, 3, &BTreeSet::new(), Duration::from_secs(120)).await;
    let (proxy, uid, restarts) = proxy_pod(&s).await;
    proxy_available(&s).await;
    let mut reloads = proxy_follows(&s, &proxy, &list, 1).await;
    let stored = through_proxy("fill", &proxy).await;
    s.step(&format!(
        "{stored} of {KEYS} keys stored through the proxy {proxy} over {:?}",
        list.servers
    ));
    assert_eq!(stored, KEYS);
    let steps: [(&str, usize, i64, bool); 3] = [
        ("scale 3 -> 5", 5, 64, false),
        ("scale 5 -> 4", 4, 64, false),
        ("rollout (-m 64 -> 65)", 4, 65, true),
    ];
    for (step, size, memory, rolls) in steps {
        let watch = RouteWatch::start(&s, &proxy);
        apply(&s, "cache", spec(size, memory)).await;
        let replaced = if rolls {
            list.uids.clone()
        } else {
            BTreeSet::new()
        };
        list = published(&s, size, &replaced, Duration::from_secs(300)).await;
        reloads = proxy_follows(&s, &proxy, &list, reloads + 1).await;
        reloads_in_time(&s, step, &watch.stop().await, true);
        let hits = through_proxy("count", &proxy).await;
        s.step(&format!(
            "after the {step}: {hits} of {KEYS} keys hit through the proxy ({:.2} %), servers {:?}",
            hits as f64 * 100.0 / KEYS as f64,
            list.servers
        ));
        assert_eq!(
            hits, KEYS,
            "every key hits through the proxy after the {step}"
        );
        same_proxy(&s, &(proxy.clone(), uid.clone(), restarts), step).await;
    }
    let proxy_pod = (proxy, uid, restarts);
    server_loss::one_server_killed(&s, &proxy_pod, &list, reloads).await;
}

/// Checks the ready proxy pod is still `was` (address, uid, restarts) after `step`.
async fn same_proxy(s: &Scenario, was: &(String, String, i32), step: &str) {
    let now = proxy_pod(s).await;
    assert_eq!(
        &now, was,
        "the proxy pod is the same, not restarted, after the {step}"
    );
}
