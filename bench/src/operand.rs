//! `--operand`: a run for the operand panels of the dashboard (hit ratio, items, memory, warm handovers),
//! recorded with `--record DIR`. On a real control plane from `$KUBEBUILDER_ASSETS` whose stand-in kubelet
//! runs Debian's memcached for each pod, the operator (statistics read every second) runs two instances
//! side by side, alike but for `spec.handover.enabled`: `handover-on/cache` and `handover-off/cache`
//! ([`SIDES`]). Both declare `spec.clients.hashing: ketama`, and each is read the whole time by a
//! cache-aside client of its own ([`crate::cache_client`]) that follows the instance's published list
//! (re-read every [`LIST_INTERVAL`]) and places keys as libmemcached's ketama does, with the same load.
//! The phases, each applied to both instances at once and marked in `DIR/operand.marks.json`:
//!
//! 1. the instances are created and the readers fill them (every first read of a key misses and sets it);
//! 2. a rollout (a changed memory limit) replaces the servers one at a time, each new one empty: with a
//!    handover the operator copies to it the items clients will look for there before it is published;
//! 3. a scale-down by one server: its keys move to the others;
//! 4. a scale-up by one server, a new one: under ketama its share of the keys moves to it.
//!
//! The scale-down comes first: after a scale-up, a scale-down publishes the list from before it again,
//! and every key it moves goes back to a server that still holds the copy it had then (memcached does
//! not drop items that clients stopped reading), so both instances would hit alike there.
//!
//! Each phase lasts until both instances have settled (`Available`, not `Progressing`, every server
//! published) and then [`OperandOptions::phase`] more, so that the curves settle before the next change.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use envtest::Env;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{Api, Client};
use memcached_operator::api::names::CONFIG_MAP_SUFFIX;
use memcached_operator::hashing::Scheme;
use memcached_operator::resources::servers::SERVERS_KEY;
use serde_json::{Value, json};
use tokio::sync::watch;

use crate::Options;
use crate::cache_client::{Counts, Reader};
use crate::handovers::{INSTANCE, Namespace};
use crate::process::Operator;
use crate::real::start_with_memcached;
use crate::record::{Mark, Recorder, write_marks};

/// The namespaces of the two instances, each named [`INSTANCE`], and whether it hands over.
pub const SIDES: [(&str, bool); 2] = [("handover-on", true), ("handover-off", false)];

/// The name the recording is written under: `DIR/operand.jsonl` and `DIR/operand.marks.json`.
pub const RECORDING: &str = "operand";

/// The hashing both instances declare and their clients place keys with.
pub const HASHING: (&str, Scheme) = ("ketama", Scheme::Ketama);

/// How often a reader reads the published list again (as a client watching the ConfigMap, or re-reading
/// a mounted copy, would).
pub const LIST_INTERVAL: Duration = Duration::from_secs(1);

/// `spec.scaling.drainSeconds` of both instances: how long a scale-down's drained servers stay after the
/// shorter list is published.
const DRAIN_SECONDS: u32 = 10;

/// What `--operand` adds to [`Options`].
#[derive(Clone, Debug)]
pub struct OperandOptions {
    /// The operator's kustomizations (`config/`), installed minus the Deployment.
    pub config_dir: PathBuf,
    /// Where the recording goes.
    pub record_dir: PathBuf,
    /// Servers of each instance at creation; the scale-down removes one, the scale-up adds one again.
    pub size: i32,
    /// Keys each reader reads in turn.
    pub keys: usize,
    /// Bytes of each value.
    pub value_bytes: usize,
    /// Each server's memory for items (`memcached.maxMemoryMB`); the rollout adds one.
    pub memory_mb: u32,
    /// Reads per second, of each reader.
    pub reads_per_second: u32,
    /// The instances' `rollout.warmupSeconds`.
    pub warmup_seconds: u32,
    /// How long each phase goes on once the operator is done with it.
    pub phase: Duration,
}

/// What one reader did during one step (from its change to the next one's).
#[derive(Clone, Debug)]
pub struct Step {
    pub step: String,
    /// The reads of each instance, in the order of [`SIDES`].
    pub reads: Vec<Counts>,
}

/// What the run did: for the docs' captions and the terminal.
#[derive(Debug)]
pub struct OperandReport {
    pub server: String,
    pub recording: PathBuf,
    pub scrapes: usize,
    pub steps: Vec<Step>,
    pub seconds: f64,
}

impl std::fmt::Display for OperandReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "operand run on {} in {:.0} s, {} scrapes in {}; the clients' reads ({} hashing over the \
             published list):",
            self.server,
            self.seconds,
            self.scrapes,
            self.recording.display(),
            HASHING.0
        )?;
        for step in &self.steps {
            for ((namespace, _), reads) in SIDES.iter().zip(&step.reads) {
                let ratio = reads
                    .hit_ratio()
                    .map_or("-".to_owned(), |r| format!("{:.1} %", r * 100.0));
                writeln!(
                    f,
                    "  {:<24} {namespace}/{INSTANCE}: {} hits, {} misses ({ratio} hit), {} failed",
                    step.step, reads.hits, reads.misses, reads.errors
                )?;
            }
        }
        Ok(())
    }
}

/// Runs the phases against a control plane started for it, and stops everything.
pub async fn run(options: &Options, operand: &OperandOptions) -> Result<OperandReport, String> {
    let env = start_with_memcached(options).await?;
    let report = phases(&env, options, operand).await;
    env.stop().await;
    report
}

/// The spec of an instance of `size` servers of `memory_mb` each, handing over or not.
fn spec(operand: &OperandOptions, handover: bool, size: i32, memory_mb: u32) -> Value {
    json!({
        "size": size,
        "memcached": {"maxMemoryMB": memory_mb},
        "rollout": {"warmupSeconds": operand.warmup_seconds},
        "clients": {"hashing": HASHING.0},
        "handover": {"enabled": handover},
        "scaling": {"drainSeconds": DRAIN_SECONDS},
        "highAvailability": {"preStopDelaySeconds": 1, "terminationGracePeriodSeconds": 5}
    })
}

/// The two instances, their readers' counts, and the operator that runs them.
struct Sides<'a> {
    namespaces: Vec<(Namespace, bool)>,
    counts: Vec<watch::Receiver<Counts>>,
    operator: &'a mut Operator,
    operand: &'a OperandOptions,
}

impl Sides<'_> {
    /// Applies the spec of `size` servers of `memory_mb` to both instances and waits until both settled.
    async fn change(&mut self, size: i32, memory_mb: u32) -> Result<(), String> {
        let mut before = Vec::new();
        for (namespace, handover) in &self.namespaces {
            before.push(namespace.generation().await.unwrap_or(0));
            namespace
                .apply(&spec(self.operand, *handover, size, memory_mb))
                .await?;
        }
        for ((namespace, _), generation) in self.namespaces.iter().zip(before) {
            namespace.settled(generation, self.operator).await?;
        }
        Ok(())
    }

    fn counts(&self) -> Vec<Counts> {
        self.counts.iter().map(|c| *c.borrow()).collect()
    }
}

async fn phases(
    env: &Env,
    options: &Options,
    operand: &OperandOptions,
) -> Result<OperandReport, String> {
    let client = env.client().clone();
    let server = client
        .apiserver_version()
        .await
        .map_err(|e| format!("GET /version: {e}"))?
        .git_version;
    let credentials = env
        .install_operator_rbac(&operand.config_dir)
        .await
        .map_err(|e| format!("cannot install the operator's CRD and RBAC: {e:#}"))?;
    for (namespace, _) in SIDES {
        envtest::create_namespace(&client, namespace, &[])
            .await
            .map_err(|e| format!("{e:#}"))?;
    }

    // The collector reads every server each second, and the status summary follows every few seconds.
    let mut with_stats = options.clone();
    with_stats
        .operator_args
        .extend(["--stats-interval=1s".to_owned()]);
    let mut operator = Operator::start(&with_stats, &credentials.kubeconfig, true)?;
    operator.wait_ready(Duration::from_secs(60)).await?;
    let recorder = Recorder::start(operator.metrics_address()?, &operand.record_dir, RECORDING)?;
    let started = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let mut readers = Vec::new();
    let mut counts = Vec::new();
    for (namespace, _) in SIDES {
        let (sender, receiver) = watch::channel(Counts::default());
        readers.push(tokio::spawn(read_all_along(
            client.clone(),
            namespace,
            operand.clone(),
            sender,
            stop.clone(),
        )));
        counts.push(receiver);
    }
    let mut sides = Sides {
        namespaces: SIDES
            .iter()
            .map(|(name, handover)| {
                let namespace = Namespace {
                    client: client.clone(),
                    name: (*name).to_owned(),
                };
                (namespace, *handover)
            })
            .collect(),
        counts,
        operator: &mut operator,
        operand,
    };
    let (size, memory) = (operand.size, operand.memory_mb);
    let changes = [
        (format!("{size} servers created"), None, size, memory),
        ("rollout".to_owned(), Some("rollout done"), size, memory + 1),
        (
            format!("scale-down to {}", size - 1),
            Some("scale-down done"),
            size - 1,
            memory + 1,
        ),
        (
            format!("scale-up to {size}"),
            Some("scale-up done"),
            size,
            memory + 1,
        ),
    ];
    let mut marks = Vec::new();
    let mut steps = Vec::new();
    for (label, done, size, memory_mb) in changes {
        let at_start = sides.counts();
        marks.push(Mark::now(label.clone()));
        eprintln!("operand run: {label}");
        sides.change(size, memory_mb).await?;
        if let Some(done) = done {
            marks.push(Mark::now(done));
        }
        tokio::time::sleep(operand.phase).await;
        let reads = sides
            .counts()
            .into_iter()
            .zip(at_start)
            .map(|(now, then)| now.since(then))
            .collect();
        steps.push(Step { step: label, reads });
    }

    stop.store(true, Ordering::Relaxed);
    for reader in readers {
        reader.await.map_err(|e| format!("a reader failed: {e}"))?;
    }
    let (recording, recorded) = recorder.finish().await?;
    operator.stop();
    write_marks(&operand.record_dir, RECORDING, &marks)?;
    Ok(OperandReport {
        server,
        recording,
        scrapes: recorded.written,
        steps,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// One reader's loop until `stop`: `reads_per_second` reads of the keys in turn over the instance's
/// published list, read again every [`LIST_INTERVAL`]; its counts sent after each read.
async fn read_all_along(
    client: Client,
    namespace: &'static str,
    operand: OperandOptions,
    counts: watch::Sender<Counts>,
    stop: Arc<AtomicBool>,
) {
    let lists: Api<ConfigMap> = Api::namespaced(client, namespace);
    let list_name = format!("{INSTANCE}{CONFIG_MAP_SUFFIX}");
    let mut reader = Reader::new(HASHING.1);
    let mut listed: Option<Instant> = None;
    let mut ticks = tokio::time::interval(Duration::from_secs(1) / operand.reads_per_second.max(1));
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut key = 0;
    while !stop.load(Ordering::Relaxed) {
        ticks.tick().await;
        if listed.is_none_or(|at| at.elapsed() >= LIST_INTERVAL) {
            listed = Some(Instant::now());
            // Until the ConfigMap exists, or when reading it fails, the list known stays.
            if let Ok(Some(list)) = lists.get_opt(&list_name).await {
                reader.follow(&published(&list));
            }
        }
        if reader.servers().is_empty() {
            continue;
        }
        reader
            .read_through(&format!("key-{key:06}"), operand.value_bytes)
            .await;
        counts.send_replace(reader.counts);
        key = (key + 1) % operand.keys.max(1);
    }
}

/// The `host:port` entries of a published list, in slot order.
fn published(list: &ConfigMap) -> Vec<String> {
    list.data
        .as_ref()
        .and_then(|data| data.get(SERVERS_KEY))
        .map(|servers| servers.lines().map(str::to_owned).collect())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_published_list_is_read_in_slot_order() {
        let list: ConfigMap = serde_json::from_value(json!({
            "metadata": {"name": "cache-servers"},
            "data": {SERVERS_KEY: "10.0.0.2:11211\n10.0.0.1:11211\n"}
        }))
        .unwrap();
        assert_eq!(published(&list), ["10.0.0.2:11211", "10.0.0.1:11211"]);
        assert!(published(&ConfigMap::default()).is_empty());
    }

    #[test]
    fn the_two_instances_differ_only_in_their_handover() {
        let operand = OperandOptions {
            config_dir: PathBuf::new(),
            record_dir: PathBuf::new(),
            size: 3,
            keys: 1,
            value_bytes: 1,
            memory_mb: 16,
            reads_per_second: 1,
            warmup_seconds: 10,
            phase: Duration::ZERO,
        };
        let mut on = spec(&operand, true, 3, 16);
        let mut off = spec(&operand, false, 3, 16);
        assert_eq!(on["clients"]["hashing"], "ketama");
        assert_eq!(
            (&on["handover"]["enabled"], &off["handover"]["enabled"]),
            (&json!(true), &json!(false))
        );
        on["handover"] = Value::Null;
        off["handover"] = Value::Null;
        assert_eq!(on, off);
    }
}
