//! Scale benchmark of memcached-operator (`make bench`): runs the operator binary against an in-process
//! fake API server (the workspace's `fake-apiserver`, which the smoke tests share) with a kubelet
//! ([`kubelet`]), creates N instances at once, and measures how fast and how cheaply the operator
//! converges ([`Report`], with [`progress`]).
//!
//! The phases: the operator starts and syncs its caches (its `/readyz` answers); the N `Memcached`
//! objects are created at once (t0); the run waits until every instance has its workload and Services
//! ("children") and then until every instance reports `Available=True`; after a short grace period for
//! trailing writes, it counts the writes of a settled window. The requests of the convergence are those
//! from t0 to the start of the settled window.
//!
//! The fake is served over TLS offering HTTP/2 and HTTP/1.1 by ALPN, as a real API server is, or with
//! `--plain-http` over plain HTTP ([`endpoint`], `fake_apiserver::tls`); either way the report counts the
//! operator's connections by protocol.
//!
//! `--real` ([`real`]) runs the same scenario against a real control plane from `$KUBEBUILDER_ASSETS`
//! (the workspace's `envtest`), counting the operator's requests from the API server's audit log, and
//! reports in the same [`Report`].
//!
//! `--handovers` ([`handovers`]) measures warm handovers instead: the keys a rollout or a scale keeps, on a
//! real control plane with real memcached servers.
//!
//! `--proxy-hop` ([`proxy_hop`]) measures what the proxy's hop costs a client: get latency direct to a
//! memcached server and through a proxy-capable memcached running the operator's route configuration;
//! with `--open-loop` ([`proxy_load`]), at fixed offered rates (10, 50, 80 % of the direct path's
//! capacity) for gets, pipelined gets and multi-gets, over plain text, TLS and TLS with access control;
//! with `--cost` ([`proxy_cost`]), the proxy's own CPU time and round trip per request, TLS proxy
//! against the proxy with access control.
//!
//! `--http-flood` ([`http_flood`]) measures whether the operator's probes and `/metrics` stay answered
//! under a flood of idle and reconnecting connections.

pub mod cache_client;
pub mod endpoint;
pub mod handovers;
pub mod http_flood;
pub mod kubelet;
pub mod operand;
pub mod process;
pub mod progress;
pub mod proxy_cost;
pub mod proxy_hop;
pub mod proxy_load;
pub mod proxy_rig;
pub mod proxy_wire;
pub mod real;
pub mod record;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::json;

use fake_apiserver::Fake;

use crate::endpoint::Connections;
use crate::process::{Operator, Scratch};
use crate::progress::Tracker;

/// Writes that land within this long after the last instance became Available still count as converging
/// (the last status patches and events of the last reconciles), not as writes of a settled operator.
pub const GRACE: Duration = Duration::from_secs(2);

/// How long after the operator is ready the instances are created.
pub const WATCHES_OPEN: Duration = Duration::from_millis(500);

/// What to run.
#[derive(Clone, Debug)]
pub struct Options {
    /// The operator binary.
    pub operator: PathBuf,
    /// Extra arguments for the operator (`--concurrency=16`, …).
    pub operator_args: Vec<String>,
    /// Environment variables for the operator (`TOKIO_WORKER_THREADS=1`, …); it gets no other.
    pub operator_env: Vec<(String, String)>,
    /// Instances created at once.
    pub instances: usize,
    /// The fake's answer time for every request.
    pub latency: Duration,
    /// From a pod's creation to its readiness.
    pub pod_start: Duration,
    /// Length of the settled window.
    pub settle: Duration,
    /// The run fails when the instances are not all Available by then.
    pub timeout: Duration,
    /// Serve the fake over TLS (HTTP/2 and HTTP/1.1 by ALPN), as a real API server; else plain HTTP.
    pub tls: bool,
    /// Scrape the operator's `/metrics` every second into `DIR/convergence.jsonl` ([`record`]), from its
    /// readiness to the end of the settled window.
    pub record: Option<PathBuf>,
}

/// The name the convergence's recording is written under: `DIR/convergence.jsonl` and
/// `DIR/convergence.marks.json`.
pub const CONVERGENCE_RECORDING: &str = "convergence";

/// What a run measured. Times are seconds from the creation of the instances.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// What the operator ran against: `fake API server`, or `real kube-apiserver v1.28.7`.
    pub server: String,
    pub instances: usize,
    /// The fake's answer time per request (none on a real server).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub latency_ms: Option<u64>,
    pub pod_start_ms: u64,
    /// Until every instance had its workload and Services.
    pub children_seconds: f64,
    /// On a real server: until every instance had a Ready pod, the floor that its controllers, scheduler
    /// and kubelet set for `available_seconds`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pods_ready_seconds: Option<f64>,
    /// Until every instance's status had `Available=True`.
    pub available_seconds: f64,
    /// On a real server: per instance, from the answer to its create to its workload (Deployment) being
    /// seen by a watch.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workload_after_create: Option<Delays>,
    /// On a real server: per instance, from the answer to its create to its first status (any condition)
    /// being seen by a watch.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_status_after_create: Option<Delays>,
    /// On a real server: per instance, from the answer to its create to the answer to the operator's
    /// first write of its workload, both by the API server's clock (its audit log): the operator's own
    /// delay, without the bench's watch's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workload_written_after_create: Option<Delays>,
    /// The same for the operator's first status write.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_status_written_after_create: Option<Delays>,
    /// Requests from t0 to the settled window, by verb and resource.
    pub requests: BTreeMap<String, usize>,
    pub requests_total: usize,
    /// Of those, the ones refused (an HTTP status of 400 or more), by verb, resource and status.
    pub refused: BTreeMap<String, usize>,
    pub requests_per_instance: f64,
    /// The events the operator recorded, by reason.
    pub events: BTreeMap<String, usize>,
    /// Operator CPU (user + system) while starting and syncing the caches, before t0.
    pub cpu_startup_seconds: f64,
    /// Operator CPU from t0 until every instance was Available.
    pub cpu_converge_seconds: f64,
    /// Operator CPU from start to the end of the settled window.
    pub cpu_total_seconds: f64,
    /// Peak resident memory of the operator (VmHWM).
    pub peak_rss_mib: f64,
    /// CPU of the benchmark process itself (the fake API server and kubelet; on a real server the
    /// stand-in kubelet and the watches) from t0 to the end, which competes with the operator for the same
    /// cores.
    pub fake_cpu_seconds: f64,
    /// On a real server: the CPU of its processes from t0 to the end of the settled window, by process.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub control_plane_cpu_seconds: BTreeMap<String, f64>,
    /// Writes (any non-GET) during the settled window, and its length.
    pub settled_writes: usize,
    /// Those writes by verb and resource.
    pub settled_writes_by: BTreeMap<String, usize>,
    pub settle_seconds: u64,
    /// The operator's connections to the fake over the whole run, by protocol: over TLS, whether its
    /// requests shared HTTP/2 connections or held an HTTP/1.1 connection each. Not counted on a real
    /// server.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub connections: Option<Connections>,
    /// On a real server: the answers the operator got by protocol, from its own
    /// `memcached_operator_kube_responses_total` at the end of the settled window.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub responses_by_protocol: Option<BTreeMap<String, u64>>,
    /// On a real server: what the operator's caches hold at the end of the settled window, by resource
    /// (`memcached_operator_cache_objects` and `memcached_operator_cache_bytes`).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub caches: BTreeMap<String, CacheFootprint>,
    /// `--restart-settled`: what a new operator did with the settled instances.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub restart: Option<Restart>,
}

/// One of the operator's caches: its objects and the bytes they take (as the operator counts them).
#[derive(Clone, Copy, Debug, Default, Serialize, PartialEq)]
pub struct CacheFootprint {
    pub objects: u64,
    pub bytes: u64,
}

/// A per-instance delay over all instances: median and maximum, in seconds.
#[derive(Clone, Copy, Debug, Serialize, PartialEq)]
pub struct Delays {
    pub median: f64,
    pub max: f64,
}

impl Delays {
    /// The median and maximum of `seconds`; `None` when empty.
    pub fn of(mut seconds: Vec<f64>) -> Option<Self> {
        if seconds.is_empty() {
            return None;
        }
        seconds.sort_by(f64::total_cmp);
        Some(Self {
            median: seconds[seconds.len() / 2],
            max: seconds[seconds.len() - 1],
        })
    }
}

/// What a new operator did with settled instances (`--restart-settled`), from its start until the
/// settled window's length after it was ready.
#[derive(Clone, Debug, Serialize)]
pub struct Restart {
    /// From its start to its `/readyz` answering 200.
    pub ready_seconds: f64,
    /// The window counted: from its start to `settle_seconds` after it was ready.
    pub window_seconds: f64,
    /// Its requests in the window (start-up lists and watches included), by verb and resource.
    pub requests: BTreeMap<String, usize>,
    /// Of those, the writes.
    pub writes: BTreeMap<String, usize>,
    pub writes_total: usize,
    /// Writes other than events: to the instances, their status and their children.
    pub writes_to_children_or_status: usize,
    /// Its CPU over the window.
    pub cpu_seconds: f64,
    pub peak_rss_mib: f64,
}

/// The collections of the operator's kinds of children, from its table (the CRDs' not installed).
fn children() -> Vec<fake_apiserver::collections::Collection> {
    use memcached_operator::store::Served;
    memcached_operator::store::kind_names()
        .into_iter()
        .map(|k| {
            fake_apiserver::collections::Collection::new(k.api_version, k.plural, k.kind)
                .of_crd(k.served == Served::IfInstalled)
        })
        .collect()
}

/// Runs the benchmark once.
pub async fn run(options: &Options) -> Result<Report, String> {
    let fake = Fake::start(fake_apiserver::Options {
        latency: options.latency,
        tls: options.tls,
        children: children(),
        ..fake_apiserver::Options::default()
    })
    .await
    .map_err(|e| e.to_string())?;
    let tracker = Tracker::follow(&fake);
    kubelet::start(&fake, options.pod_start);

    let scratch = Scratch::new()?;
    let kubeconfig = scratch.path().join("kubeconfig.yaml");
    endpoint::write_kubeconfig(&fake, &kubeconfig)?;
    let mut operator = Operator::start(options, &kubeconfig, options.record.is_some())?;
    operator.wait_ready(Duration::from_secs(60)).await?;
    let recorder = record::start_convergence(&operator, options)?;
    let mut marks = Vec::new();
    // The watches open right after the initial lists that make the operator ready: let them, so that the
    // requests counted from t0 are those the instances cost.
    tokio::time::sleep(WATCHES_OPEN).await;
    let cpu_startup = operator.cpu_seconds()?;

    let fake_cpu_start = process::own_cpu_seconds().unwrap_or_default();
    let t0 = Instant::now();
    marks.push(record::Mark::now(format!(
        "{} instances created",
        options.instances
    )));
    let first_request = {
        let mut store = fake.store();
        let first_request = store.requests().len();
        for i in 0..options.instances {
            let mc = json!({
                "apiVersion": "cache.example.com/v1alpha1", "kind": "Memcached",
                "metadata": {"name": format!("bench-{i:05}"), "namespace": "default"},
                "spec": {"size": 1, "containerPort": 11211}
            });
            let created = store.create("memcacheds", mc).map_err(|e| e.to_string())?;
            let uid = created["metadata"]["uid"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            tracker.lock().expected.insert(uid);
        }
        first_request
    };

    let deadline = t0 + options.timeout;
    let available_at = loop {
        if let Some(at) = tracker.lock().available_at {
            break at;
        }
        operator.check_running()?;
        if Instant::now() > deadline {
            let progress = tracker.lock();
            return Err(format!(
                "after {:?}, {} of {} instances have their children and {} are Available; the \
                 operator's log: {}",
                options.timeout,
                progress.complete(),
                options.instances,
                progress.available(),
                operator.log_path().display()
            ));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let cpu_converged = operator.cpu_seconds()?;
    marks.push(record::Mark::now("all Available"));
    tokio::time::sleep(GRACE).await;
    let settle_from = fake.count();
    tokio::time::sleep(options.settle).await;
    operator.check_running()?;
    record::finish_convergence(recorder, options, &marks).await?;
    let cpu_total = operator.cpu_seconds()?;
    let fake_cpu = process::own_cpu_seconds().unwrap_or_default() - fake_cpu_start;
    let peak_rss_mib = operator.peak_rss_kib()? as f64 / 1024.0;
    let connections = endpoint::connections(&fake);
    operator.stop();

    let store = fake.store();
    let children_at = tracker.lock().children_at.unwrap_or(available_at);
    let converging = &store.requests()[first_request..settle_from];
    let mut requests = BTreeMap::new();
    for record in converging {
        *requests
            .entry(format!("{} {}", record.verb(), record.resource()))
            .or_insert(0) += 1;
    }
    let mut refused = BTreeMap::new();
    for record in converging.iter().filter(|r| r.status >= 400) {
        *refused
            .entry(format!(
                "{} {} {}",
                record.verb(),
                record.resource(),
                record.status
            ))
            .or_insert(0) += 1;
    }
    let mut settled_writes_by = BTreeMap::new();
    for record in store.requests()[settle_from..]
        .iter()
        .filter(|r| r.is_write())
    {
        *settled_writes_by
            .entry(format!("{} {}", record.verb(), record.resource()))
            .or_insert(0) += 1;
    }
    Ok(Report {
        server: "fake API server".to_owned(),
        instances: options.instances,
        latency_ms: Some(options.latency.as_millis() as u64),
        pod_start_ms: options.pod_start.as_millis() as u64,
        children_seconds: (children_at - t0).as_secs_f64(),
        pods_ready_seconds: None,
        available_seconds: (available_at - t0).as_secs_f64(),
        workload_after_create: None,
        first_status_after_create: None,
        workload_written_after_create: None,
        first_status_written_after_create: None,
        requests_total: converging.len(),
        requests_per_instance: converging.len() as f64 / options.instances.max(1) as f64,
        requests,
        refused,
        events: events_by_reason(&store),
        cpu_startup_seconds: cpu_startup,
        cpu_converge_seconds: cpu_converged - cpu_startup,
        cpu_total_seconds: cpu_total,
        peak_rss_mib,
        fake_cpu_seconds: fake_cpu,
        control_plane_cpu_seconds: BTreeMap::new(),
        settled_writes: settled_writes_by.values().sum(),
        settled_writes_by,
        settle_seconds: options.settle.as_secs(),
        connections: Some(connections),
        responses_by_protocol: None,
        caches: BTreeMap::new(),
        restart: None,
    })
}

/// The events recorded so far, counted by reason (an event patched as a series counts once).
fn events_by_reason(store: &fake_apiserver::Store) -> BTreeMap<String, usize> {
    let mut reasons = BTreeMap::new();
    for event in store.objects("events") {
        let reason = event["reason"].as_str().unwrap_or("<none>").to_owned();
        *reasons.entry(reason).or_insert(0) += 1;
    }
    reasons
}

impl Report {
    /// The report as a table, for people.
    pub fn table(&self) -> String {
        let n = self.instances.max(1) as f64;
        let mut out = match (self.latency_ms, &self.connections) {
            (Some(latency), Some(connections)) => {
                let transport = if connections.tls { "TLS" } else { "plain HTTP" };
                format!(
                    "memcached-operator scale benchmark: {} instances, {latency} ms per request, pods \
                     ready after {} ms, {transport}\n\n",
                    self.instances, self.pod_start_ms
                )
            }
            _ => format!(
                "memcached-operator scale benchmark: {} instances, {}, pods started {} ms after \
                 binding, TLS\n\n",
                self.instances, self.server, self.pod_start_ms
            ),
        };
        let mut rows = vec![
            ("API server", self.server.clone()),
            (
                "all children exist",
                format!("{:.2} s", self.children_seconds),
            ),
        ];
        if let Some(pods) = self.pods_ready_seconds {
            rows.push(("pods ready", format!("{pods:.2} s")));
        }
        rows.push(("all Available", format!("{:.2} s", self.available_seconds)));
        for (name, delays) in [
            ("workload after create", self.workload_after_create),
            ("first status after create", self.first_status_after_create),
            (
                "workload written (audit)",
                self.workload_written_after_create,
            ),
            (
                "first status written (audit)",
                self.first_status_written_after_create,
            ),
        ] {
            if let Some(d) = delays {
                rows.push((
                    name,
                    format!("median {:.2} s, max {:.2} s", d.median, d.max),
                ));
            }
        }
        if let Some(pods) = self.pods_ready_seconds.filter(|p| *p > 0.0) {
            rows.push((
                "Available / pods ready",
                format!("{:.2}x", self.available_seconds / pods),
            ));
        }
        rows.extend([
            (
                "API requests to converge",
                format!(
                    "{} ({:.2} per instance)",
                    self.requests_total, self.requests_per_instance
                ),
            ),
            (
                "CPU, start-up (before t0)",
                format!("{:.2} s", self.cpu_startup_seconds),
            ),
            (
                "CPU, converging",
                format!("{:.2} s", self.cpu_converge_seconds),
            ),
            ("CPU, whole run", format!("{:.2} s", self.cpu_total_seconds)),
            ("peak RSS", format!("{:.1} MiB", self.peak_rss_mib)),
        ]);
        if self.connections.is_some() {
            rows.push((
                "CPU of the fake API server",
                format!("{:.2} s", self.fake_cpu_seconds),
            ));
        } else {
            let total: f64 = self.control_plane_cpu_seconds.values().sum();
            let each: Vec<String> = self
                .control_plane_cpu_seconds
                .iter()
                .map(|(name, cpu)| format!("{name} {cpu:.1}"))
                .collect();
            rows.push((
                "CPU of the control plane",
                format!("{total:.2} s ({})", each.join(", ")),
            ));
            rows.push((
                "CPU of kubelet and watches",
                format!("{:.2} s", self.fake_cpu_seconds),
            ));
        }
        rows.push((
            "writes when settled",
            format!("{} in {} s", self.settled_writes, self.settle_seconds),
        ));
        match (&self.connections, &self.responses_by_protocol) {
            (Some(connections), _) => rows.push(("API server connections", connections.describe())),
            (None, Some(responses)) => rows.push((
                "API responses by protocol",
                format!(
                    "{} HTTP/2, {} HTTP/1.1 (the operator's metric; connections not counted)",
                    responses.get("HTTP/2").copied().unwrap_or_default(),
                    responses.get("HTTP/1.1").copied().unwrap_or_default()
                ),
            )),
            (None, None) => rows.push(("API server connections", "not counted".to_owned())),
        }
        if !self.caches.is_empty() {
            rows.push(("operator's caches", describe_caches(&self.caches, n)));
        }
        for (name, value) in rows {
            out.push_str(&format!("{name:<28} {value}\n"));
        }
        out.push_str("\nrequests to converge, by verb and resource:\n");
        for (what, count) in &self.requests {
            out.push_str(&format!(
                "  {what:<40} {count:>7} {:>8.2}/instance\n",
                *count as f64 / n
            ));
        }
        out.push_str("events recorded, by reason:\n");
        for (reason, count) in &self.events {
            out.push_str(&format!(
                "  {reason:<40} {count:>7} {:>8.2}/instance\n",
                *count as f64 / n
            ));
        }
        if !self.refused.is_empty() {
            out.push_str("of which refused, by verb, resource and status:\n");
            for (what, count) in &self.refused {
                out.push_str(&format!("  {what:<40} {count:>7}\n"));
            }
        }
        if !self.settled_writes_by.is_empty() {
            out.push_str("writes when settled, by verb and resource:\n");
            for (what, count) in &self.settled_writes_by {
                out.push_str(&format!("  {what:<40} {count:>7}\n"));
            }
        }
        if let Some(restart) = &self.restart {
            out.push_str(&restart.table(self.instances));
        }
        out
    }
}

/// The operator's caches in one line: in all, then each resource's bytes per instance (the empty ones left
/// out).
fn describe_caches(caches: &BTreeMap<String, CacheFootprint>, instances: f64) -> String {
    let total: u64 = caches.values().map(|c| c.bytes).sum();
    let each: Vec<String> = caches
        .iter()
        .filter(|(_, c)| c.objects > 0)
        .map(|(resource, c)| {
            format!(
                "{resource} {} objects {:.2} kB/instance",
                c.objects,
                c.bytes as f64 / 1000.0 / instances
            )
        })
        .collect();
    format!(
        "{:.1} MiB, {:.2} kB/instance ({})",
        total as f64 / 1024.0 / 1024.0,
        total as f64 / 1000.0 / instances,
        each.join("; ")
    )
}

impl Restart {
    fn table(&self, instances: usize) -> String {
        let mut out = format!(
            "\na new operator over the {instances} settled instances (--restart-settled):\n"
        );
        let rows = [
            ("ready after", format!("{:.2} s", self.ready_seconds)),
            (
                "window",
                format!("{:.2} s from its start", self.window_seconds),
            ),
            (
                "writes",
                format!(
                    "{} ({} to instances, status or children)",
                    self.writes_total, self.writes_to_children_or_status
                ),
            ),
            ("CPU", format!("{:.2} s", self.cpu_seconds)),
            ("peak RSS", format!("{:.1} MiB", self.peak_rss_mib)),
        ];
        for (name, value) in rows {
            out.push_str(&format!("{name:<28} {value}\n"));
        }
        out.push_str("its requests, by verb and resource:\n");
        for (what, count) in &self.requests {
            out.push_str(&format!("  {what:<40} {count:>7}\n"));
        }
        out
    }
}
