//! `--operand`: a run for the operand panels of the dashboard (hit ratio, items, memory), recorded with
//! `--record DIR`. On a real control plane from `$KUBEBUILDER_ASSETS` whose stand-in kubelet runs Debian's
//! memcached for each pod, the operator (statistics read every second) runs one instance of
//! [`OperandOptions::size`] servers, and a cache-aside reader ([`crate::cache_client`]) reads a fixed set
//! of keys through it the whole time. The phases, each marked in `DIR/operand.marks.json`:
//!
//! 1. the instance is created and the reader fills it (every first read of a key misses and sets it);
//! 2. a rollout (a changed memory limit) replaces the servers one at a time, each new one empty: its keys
//!    miss again until the reader has set them anew;
//! 3. a scale-down by one server: its keys move to the others, and miss there once.
//!
//! Each phase lasts until the operator has done its part (the Deployment rolled out or scaled) and then
//! [`OperandOptions::phase`] more, so that the curves settle before the next change.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use envtest::Env;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DynamicObject, ListParams, Patch, PatchParams};
use kube::{Api, Client};
use serde_json::{Value, json};

use crate::Options;
use crate::cache_client::{Counts, Reader, Server};
use crate::process::Operator;
use crate::real::{memcached_resource, start_with_memcached};
use crate::record::{Mark, Recorder, write_marks};

/// The namespace and name of the instance.
pub const NAMESPACE: &str = "operand";
pub const INSTANCE: &str = "cache";

/// The name the recording is written under: `DIR/operand.jsonl` and `DIR/operand.marks.json`.
pub const RECORDING: &str = "operand";

/// The field manager of the run's writes to the instance.
const FIELD_MANAGER: &str = "bench-operand";

/// How often the reader looks up the ready servers again (as a client's discovery of a Service's
/// endpoints would).
const DISCOVERY_INTERVAL: Duration = Duration::from_secs(1);

/// What `--operand` adds to [`Options`].
#[derive(Clone, Debug)]
pub struct OperandOptions {
    /// The operator's kustomizations (`config/`), installed minus the Deployment.
    pub config_dir: PathBuf,
    /// Where the recording goes.
    pub record_dir: PathBuf,
    /// Servers of the instance before the scale-down.
    pub size: i32,
    /// Keys the reader reads in turn.
    pub keys: usize,
    /// Bytes of each value.
    pub value_bytes: usize,
    /// Each server's memory for items (`memcached.maxMemoryMB`); the rollout adds one.
    pub memory_mb: u32,
    /// Reads per second.
    pub reads_per_second: u32,
    /// The instance's `rollout.warmupSeconds`.
    pub warmup_seconds: u32,
    /// How long each phase goes on once the operator is done with it.
    pub phase: Duration,
}

/// What the run did: for the docs' captions and the terminal.
#[derive(Debug)]
pub struct OperandReport {
    pub server: String,
    pub recording: PathBuf,
    pub scrapes: usize,
    pub reads: Counts,
    pub seconds: f64,
}

impl std::fmt::Display for OperandReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Counts {
            hits,
            misses,
            errors,
        } = self.reads;
        write!(
            f,
            "operand run on {} in {:.0} s: {hits} hits, {misses} misses, {errors} failed reads; {} \
             scrapes in {}",
            self.server,
            self.seconds,
            self.scrapes,
            self.recording.display()
        )
    }
}

/// Runs the phases against a control plane started for it, and stops everything.
pub async fn run(options: &Options, operand: &OperandOptions) -> Result<OperandReport, String> {
    let env = start_with_memcached(options).await?;
    let report = phases(&env, options, operand).await;
    env.stop().await;
    report
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
    envtest::create_namespace(&client, NAMESPACE, &[])
        .await
        .map_err(|e| format!("{e:#}"))?;

    // The collector reads every server each second, and the status summary follows every few seconds.
    let mut with_stats = options.clone();
    with_stats
        .operator_args
        .extend(["--stats-interval=1s".to_owned()]);
    let mut operator = Operator::start(&with_stats, &credentials.kubeconfig, true)?;
    operator.wait_ready(Duration::from_secs(60)).await?;
    let recorder = Recorder::start(operator.metrics_address()?, &operand.record_dir, RECORDING)?;
    let started = Instant::now();
    let mut marks = Vec::new();

    let spec = |size: i32, memory_mb: u32| {
        json!({
            "size": size,
            "memcached": {"maxMemoryMB": memory_mb},
            "rollout": {"warmupSeconds": operand.warmup_seconds},
            "highAvailability": {"preStopDelaySeconds": 1, "terminationGracePeriodSeconds": 5}
        })
    };
    marks.push(Mark::now(format!("{} servers created", operand.size)));
    apply(&client, spec(operand.size, operand.memory_mb)).await?;
    let stop = Arc::new(AtomicBool::new(false));
    let reader = tokio::spawn(read_all_along(
        client.clone(),
        operand.clone(),
        stop.clone(),
    ));

    let deadline = |phase: &str| {
        let limit =
            Duration::from_secs(u64::from(operand.warmup_seconds + 20) * operand.size as u64 + 60);
        (phase.to_owned(), Instant::now() + limit)
    };
    wait_deployment(
        &client,
        &mut operator,
        operand.size,
        0,
        deadline("creation"),
    )
    .await?;
    tokio::time::sleep(operand.phase).await;

    marks.push(Mark::now("rollout starts"));
    let before = generation(&client).await?;
    apply(&client, spec(operand.size, operand.memory_mb + 1)).await?;
    wait_deployment(
        &client,
        &mut operator,
        operand.size,
        before,
        deadline("rollout"),
    )
    .await?;
    marks.push(Mark::now("rollout done"));
    tokio::time::sleep(operand.phase).await;

    marks.push(Mark::now(format!("scale-down to {}", operand.size - 1)));
    let before = generation(&client).await?;
    apply(&client, spec(operand.size - 1, operand.memory_mb + 1)).await?;
    wait_deployment(
        &client,
        &mut operator,
        operand.size - 1,
        before,
        deadline("scale-down"),
    )
    .await?;
    marks.push(Mark::now("scale-down done"));
    tokio::time::sleep(operand.phase).await;

    stop.store(true, Ordering::Relaxed);
    let reads = reader
        .await
        .map_err(|e| format!("the reader failed: {e}"))?;
    let (recording, counts) = recorder.finish().await?;
    operator.stop();
    write_marks(&operand.record_dir, RECORDING, &marks)?;
    Ok(OperandReport {
        server,
        recording,
        scrapes: counts.written,
        reads,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// Server-side applies the instance's spec.
async fn apply(client: &Client, spec: Value) -> Result<(), String> {
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), NAMESPACE, &memcached_resource());
    let object = json!({
        "apiVersion": "cache.example.com/v1alpha1", "kind": "Memcached",
        "metadata": {"name": INSTANCE, "namespace": NAMESPACE},
        "spec": spec
    });
    api.patch(
        INSTANCE,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(object),
    )
    .await
    .map(|_| ())
    .map_err(|e| format!("cannot apply Memcached {NAMESPACE}/{INSTANCE}: {e}"))
}

/// The generation of the instance's Deployment (0 while it has none).
async fn generation(client: &Client) -> Result<i64, String> {
    let api: Api<Deployment> = Api::namespaced(client.clone(), NAMESPACE);
    let selector = format!("app.kubernetes.io/instance={INSTANCE}");
    let list = api
        .list(&ListParams::default().labels(&selector))
        .await
        .map_err(|e| format!("cannot list the Deployments of {NAMESPACE}/{INSTANCE}: {e}"))?;
    Ok(list
        .items
        .iter()
        .filter_map(|d| d.metadata.generation)
        .max()
        .unwrap_or(0))
}

/// Waits until the instance's Deployment has been changed by the operator (its generation is past
/// `changed_from`: until then the old, finished rollout would pass for the new one), has seen that
/// change, and has `replicas` updated, available servers and no others.
async fn wait_deployment(
    client: &Client,
    operator: &mut Operator,
    replicas: i32,
    changed_from: i64,
    (phase, deadline): (String, Instant),
) -> Result<(), String> {
    let api: Api<Deployment> = Api::namespaced(client.clone(), NAMESPACE);
    let selector = format!("app.kubernetes.io/instance={INSTANCE}");
    loop {
        operator.check_running()?;
        // A failed list (a busy API server) says nothing: ask again.
        if let Ok(list) = api.list(&ListParams::default().labels(&selector)).await
            && list.items.iter().any(|d| {
                d.metadata.generation.unwrap_or(0) > changed_from && rolled_out(d, replicas)
            })
        {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!(
                "the {phase} did not finish: the Deployment of {NAMESPACE}/{INSTANCE} has not \
                 {replicas} updated, available servers; the operator's log: {}",
                operator.log_path().display()
            ));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Whether `deployment` has `replicas` servers, all of its latest template and available.
fn rolled_out(deployment: &Deployment, replicas: i32) -> bool {
    let (Some(spec), Some(status)) = (&deployment.spec, &deployment.status) else {
        return false;
    };
    spec.replicas == Some(replicas)
        && status.observed_generation == deployment.metadata.generation
        && status.replicas == Some(replicas)
        && status.updated_replicas == Some(replicas)
        && status.available_replicas == Some(replicas)
}

/// The reader's loop until `stop`: `reads_per_second` reads of the keys in turn, the ready servers looked
/// up every [`DISCOVERY_INTERVAL`].
async fn read_all_along(client: Client, operand: OperandOptions, stop: Arc<AtomicBool>) -> Counts {
    let pods: Api<Pod> = Api::namespaced(client, NAMESPACE);
    let selector = format!("app.kubernetes.io/instance={INSTANCE}");
    let mut reader = Reader::default();
    let mut servers: Vec<Server> = Vec::new();
    let mut discovered: Option<Instant> = None;
    let mut ticks = tokio::time::interval(Duration::from_secs(1) / operand.reads_per_second.max(1));
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut key = 0;
    while !stop.load(Ordering::Relaxed) {
        ticks.tick().await;
        if discovered.is_none_or(|at| at.elapsed() >= DISCOVERY_INTERVAL) {
            discovered = Some(Instant::now());
            // Keep the servers known when the list fails.
            if let Ok(list) = pods.list(&ListParams::default().labels(&selector)).await {
                servers = list.items.iter().filter_map(ready_server).collect();
                reader.forget_others(&servers);
            }
        }
        if servers.is_empty() {
            continue;
        }
        reader
            .read_through(&format!("key-{key:06}"), &servers, operand.value_bytes)
            .await;
        key = (key + 1) % operand.keys.max(1);
    }
    reader.counts
}

/// A pod that serves: Ready, not being deleted, with an IP; memcached on its `containerPort`.
fn ready_server(pod: &Pod) -> Option<Server> {
    if pod.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let status = pod.status.as_ref()?;
    let ready = status
        .conditions
        .as_ref()?
        .iter()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    if !ready {
        return None;
    }
    let port = pod
        .spec
        .as_ref()?
        .containers
        .iter()
        .find(|c| c.name == "memcached")?
        .ports
        .as_ref()?
        .iter()
        .find_map(|p| u16::try_from(p.container_port).ok())?;
    let ip = status.pod_ip.as_ref()?.parse().ok()?;
    Some(Server {
        pod: pod.metadata.name.clone()?,
        addr: std::net::SocketAddr::new(ip, port),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deployment(generation: i64, observed: i64, replicas: i32, updated: i32) -> Deployment {
        serde_json::from_value(json!({
            "metadata": {"name": "cache", "generation": generation},
            "spec": {"replicas": replicas, "selector": {}, "template": {}},
            "status": {
                "observedGeneration": observed, "replicas": replicas,
                "updatedReplicas": updated, "availableReplicas": replicas
            }
        }))
        .unwrap()
    }

    #[test]
    fn a_rollout_is_done_when_every_server_is_updated_and_the_change_seen() {
        assert!(rolled_out(&deployment(2, 2, 3, 3), 3));
        assert!(
            !rolled_out(&deployment(3, 2, 3, 3), 3),
            "change not seen yet"
        );
        assert!(
            !rolled_out(&deployment(2, 2, 3, 2), 3),
            "an old server left"
        );
        assert!(
            !rolled_out(&deployment(2, 2, 3, 3), 2),
            "not scaled down yet"
        );
    }

    fn pod(ready: &str, deleting: bool) -> Pod {
        let mut pod = json!({
            "metadata": {"name": "cache-a"},
            "spec": {"containers": [
                {"name": "exporter", "ports": [{"containerPort": 9150}]},
                {"name": "memcached", "ports": [{"containerPort": 11211}]}
            ]},
            "status": {"podIP": "127.0.1.2", "conditions": [{"type": "Ready", "status": ready}]}
        });
        if deleting {
            pod["metadata"]["deletionTimestamp"] = json!("2025-01-01T00:00:00Z");
        }
        serde_json::from_value(pod).unwrap()
    }

    #[test]
    fn only_ready_pods_that_stay_serve_on_memcacheds_port() {
        assert_eq!(
            ready_server(&pod("True", false)),
            Some(Server {
                pod: "cache-a".to_owned(),
                addr: "127.0.1.2:11211".parse().unwrap()
            })
        );
        assert_eq!(ready_server(&pod("False", false)), None);
        assert_eq!(ready_server(&pod("True", true)), None);
    }
}
