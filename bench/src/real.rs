//! `--real`: the same scenario against a real control plane instead of the fake. etcd, kube-apiserver,
//! kube-controller-manager and kube-scheduler from `$KUBEBUILDER_ASSETS` with the stand-in kubelet (the
//! workspace's `envtest` crate; pods become Running and Ready as status only, no memcached runs), the
//! operator's CRD and RBAC installed from `config/`, and the operator binary running under a token of its
//! own ServiceAccount, measured from `/proc` as against the fake ([`crate::process`]).
//!
//! The phases are the fake's: the operator starts and syncs its caches; N `Memcached` objects of size 1 are
//! created in namespace [`NAMESPACE`] through an admin client, [`CREATES_IN_FLIGHT`] at a time (t0 at the
//! first create); the admin client's watches time the moments every instance has its workload and both
//! Services, every instance's pod is Ready (the floor the control plane and the kubelet set), and every
//! instance's status says `Available=True`; then, after the same grace, the settled window.
//!
//! Requests are counted from the API server's audit log ([`envtest::AuditLog`]), the operator's user only:
//! the convergence from t0 to the settled window, and the writes of the window (the stats collector's
//! `status.stats` writes apart from the reconciler's status writes, by field manager). A real server has no
//! connection counter of ours, so the report reads the operator's own
//! `memcached_operator_kube_responses_total{protocol}` from its `/metrics` instead.
//!
//! `--restart-settled` then stops the operator (SIGTERM), starts another, and counts its requests from its
//! start until `--settle-seconds` after it is ready: a restart of a settled operator should write nothing.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Debug;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use envtest::audit::Timestamp;
use envtest::kubelet::Capacity;
use envtest::{AuditEvent, ControlPlaneOptions, Env, EnvOptions, KubeletOptions};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{Event as CoreEvent, Pod, Service};
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, ListParams, PostParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde_json::json;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::process::{self, Operator};
use crate::record;
use crate::{CacheFootprint, Delays, GRACE, Options, Report, Restart, WATCHES_OPEN};

pub mod floor;
pub mod scale;

/// The namespace the instances are created in.
pub const NAMESPACE: &str = "bench";

/// Creates in flight at once, through the admin client.
pub const CREATES_IN_FLIGHT: usize = 32;

/// Pods per stand-in node, as a kubelet's default `maxPods`.
pub const PODS_PER_NODE: u32 = 110;

/// The processes of the control plane whose CPU the report shows (`comm`, at most 15 characters).
const CONTROL_PLANE: [&str; 4] = [
    "kube-apiserver",
    "etcd",
    "kube-controller",
    "kube-scheduler",
];

/// Verbs that change something, as the audit log names them (server-side apply is a `patch`).
const WRITES: [&str; 5] = ["create", "update", "patch", "delete", "deletecollection"];

/// What `--real` adds to [`Options`].
#[derive(Clone, Debug)]
pub struct RealOptions {
    /// The operator's kustomizations (`config/`, with `default`), installed minus the Deployment.
    pub config_dir: PathBuf,
    /// After the settled window, restart the operator and count the new one's requests over a further
    /// window.
    pub restart_settled: bool,
    pub creates_in_flight: usize,
}

/// The control plane's binaries, or an error saying what to set.
pub fn assets() -> Result<envtest::Assets, String> {
    envtest::assets().ok_or_else(|| {
        let reason = envtest::assets::why_missing().unwrap_or_else(|| "no assets".to_owned());
        format!(
            "--real needs a Kubernetes control plane's binaries ({reason}): set {var} to a directory \
             holding etcd, kube-apiserver, kube-controller-manager and kube-scheduler, as Kubebuilder's \
             envtest does, e.g. `{var}=/opt/kubebuilder-assets/bin make bench ARGS=--real` \
             (`setup-envtest use 1.28.x -p path` prints one)",
            var = envtest::assets::ASSETS_VAR
        )
    })
}

/// Starts a control plane from `$KUBEBUILDER_ASSETS` with 3 stand-in nodes that run Debian's memcached
/// for each pod (the runs that need real servers: `--operand`, `--handovers`).
pub async fn start_with_memcached(options: &Options) -> Result<Env, String> {
    let assets = assets()?;
    Env::start(
        &assets,
        EnvOptions {
            control_plane: ControlPlaneOptions::default(),
            kubelet: KubeletOptions {
                nodes: 3,
                pod_start_delay: options.pod_start,
                memcached: Some(envtest::kubelet::DEBIAN_MEMCACHED.into()),
                ..KubeletOptions::default()
            },
        },
    )
    .await
    .map_err(|e| format!("the control plane did not start: {e:#}"))
}

/// Runs the scenario once against a control plane started for it, and stops the control plane.
pub async fn run(options: &Options, real: &RealOptions) -> Result<Report, String> {
    let env = start_env(options.instances, options.pod_start).await?;
    let report = measure(&env, options, real).await;
    env.stop().await;
    report
}

/// A control plane with stand-in nodes enough for `instances` pods (status only, Ready `pod_start` after
/// they are bound).
async fn start_env(instances: usize, pod_start: Duration) -> Result<Env, String> {
    let assets = assets()?;
    let started = Instant::now();
    let env = Env::start(
        &assets,
        EnvOptions {
            control_plane: ControlPlaneOptions::default(),
            kubelet: KubeletOptions {
                nodes: instances / 100 + 3,
                capacity: Capacity {
                    pods: PODS_PER_NODE,
                    ..Capacity::default()
                },
                pod_start_delay: pod_start,
                memcached: None,
                ..KubeletOptions::default()
            },
        },
    )
    .await
    .map_err(|e| format!("the control plane did not start: {e:#}"))?;
    eprintln!(
        "control plane up in {:.1} s ({} stand-in nodes); its directory: {}",
        started.elapsed().as_secs_f64(),
        env.kubelet().map_or(0, |k| k.nodes().len()),
        env.control_plane().dir().display()
    );
    Ok(env)
}

async fn measure(env: &Env, options: &Options, real: &RealOptions) -> Result<Report, String> {
    let audit = env.control_plane().audit();
    let Prepared {
        client,
        version,
        credentials,
    } = prepare(env, &real.config_dir).await?;

    let names: Vec<String> = (0..options.instances)
        .map(|i| format!("bench-{i:05}"))
        .collect();
    let progress = Arc::new(Mutex::new(Progress {
        expected: names.iter().cloned().collect(),
        ..Progress::default()
    }));
    let watches = Watches::start(&client, &progress).await?;

    let mut operator = Operator::start(options, &credentials.kubeconfig, true)?;
    operator.wait_ready(Duration::from_secs(60)).await?;
    let recorder = record::start_convergence(&operator, options)?;
    let mut marks = Vec::new();
    tokio::time::sleep(WATCHES_OPEN).await;
    let cpu_startup = operator.cpu_seconds()?;
    eprintln!(
        "operator ready as {}; creating {} instances in namespace {NAMESPACE}, {} at a time",
        credentials.user, options.instances, real.creates_in_flight
    );

    let own_cpu_start = process::own_cpu_seconds().unwrap_or_default();
    let plane_cpu_start = process::children_cpu_seconds(&CONTROL_PLANE);
    let t0_mark = audit.mark().map_err(|e| format!("{e:#}"))?;
    let t0 = Instant::now();
    marks.push(record::Mark::now(format!(
        "{} instances created",
        options.instances
    )));
    let created = create_instances(&client, &names, real.creates_in_flight).await?;
    let first_created = created
        .iter()
        .map(|(_, at)| *at)
        .min()
        .ok_or_else(|| "no instances to create".to_owned())?;
    lock(&progress).created = created.into_iter().collect();
    eprintln!(
        "created {} instances in {:.2} s (the first answered after {:.2} s)",
        options.instances,
        t0.elapsed().as_secs_f64(),
        (first_created - t0).as_secs_f64()
    );

    let deadline = t0 + options.timeout;
    let available_at = loop {
        if let Some(at) = lock(&progress).available_at {
            break at;
        }
        operator.check_running()?;
        env.control_plane()
            .check_running()
            .map_err(|e| format!("{e:#}"))?;
        if Instant::now() > deadline {
            let p = lock(&progress);
            return Err(format!(
                "after {:?}, {} of {} instances have their children, {} a Ready pod, and {} are \
                 Available; the operator's log: {}",
                options.timeout,
                p.complete.len(),
                options.instances,
                p.pods_ready.len(),
                p.available.len(),
                operator.log_path().display()
            ));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let cpu_converged = operator.cpu_seconds()?;
    marks.push(record::Mark::now("all Available"));
    // Available follows the pods' readiness, so the pods' watch has seen it too, or is about to.
    let pods_wait = Instant::now() + Duration::from_secs(10);
    while lock(&progress).pods_ready_at.is_none() && Instant::now() < pods_wait {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(GRACE).await;
    let settle_mark = audit.mark().map_err(|e| format!("{e:#}"))?;
    tokio::time::sleep(options.settle).await;
    let settle_end = audit.mark().map_err(|e| format!("{e:#}"))?;
    operator.check_running()?;
    record::finish_convergence(recorder, options, &marks).await?;
    let cpu_total = operator.cpu_seconds()?;
    let own_cpu = process::own_cpu_seconds().unwrap_or_default() - own_cpu_start;
    let plane_cpu = cpu_since(
        &plane_cpu_start,
        &process::children_cpu_seconds(&CONTROL_PLANE),
    );
    let peak_rss_mib = operator.peak_rss_kib()? as f64 / 1024.0;
    let metrics = operator.metrics().await?;
    let (responses, caches) = (responses_by_protocol(&metrics), caches(&metrics));

    let restart = if real.restart_settled {
        operator.terminate(Duration::from_secs(10)).await;
        Some(restart(env, options, &credentials.kubeconfig, &credentials.user).await?)
    } else {
        operator.stop();
        None
    };

    // In blocking mode a request's line is written before its answer; requests still in flight when the
    // window closed are written a moment later.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (ours, others): (Vec<AuditEvent>, Vec<AuditEvent>) = audit
        .read_since(&t0_mark)
        .map_err(|e| format!("{e:#}"))?
        .into_iter()
        .partition(|e| e.user == credentials.user);
    let written = Written::new(&others, &ours);
    let converging: Vec<&AuditEvent> = ours
        .iter()
        .filter(|e| e.received < settle_mark.at())
        .collect();
    let settled: Vec<&AuditEvent> = ours
        .iter()
        .filter(|e| e.received >= settle_mark.at() && e.received < settle_end.at())
        .filter(|e| is_write(e))
        .collect();
    let requests = by_request(converging.iter().copied());
    let mut refused = BTreeMap::new();
    for e in converging.iter().filter(|e| e.code >= 400) {
        *refused.entry(format!("{} {}", key(e), e.code)).or_insert(0) += 1;
    }
    let events = events_by_reason(&client).await?;
    drop(watches);

    let p = lock(&progress);
    let since_t0 = |at: Option<Instant>| at.map(|at| (at - t0).as_secs_f64());
    Ok(Report {
        server: format!("real kube-apiserver {version}"),
        instances: options.instances,
        latency_ms: None,
        pod_start_ms: options.pod_start.as_millis() as u64,
        children_seconds: since_t0(p.children_at).unwrap_or((available_at - t0).as_secs_f64()),
        pods_ready_seconds: since_t0(p.pods_ready_at),
        available_seconds: (available_at - t0).as_secs_f64(),
        workload_after_create: p.after_create(&p.workload_seen),
        first_status_after_create: p.after_create(&p.status_seen),
        workload_written_after_create: written.after_create(|e| {
            e.verb == "patch" && e.resource == "deployments" && e.subresource.is_empty()
        }),
        first_status_written_after_create: written.after_create(|e| {
            e.verb == "patch" && e.resource == "memcacheds" && e.subresource == "status"
        }),
        requests_total: converging.len(),
        requests_per_instance: converging.len() as f64 / options.instances.max(1) as f64,
        requests,
        refused,
        events,
        cpu_startup_seconds: cpu_startup,
        cpu_converge_seconds: cpu_converged - cpu_startup,
        cpu_total_seconds: cpu_total,
        peak_rss_mib,
        fake_cpu_seconds: own_cpu,
        control_plane_cpu_seconds: plane_cpu,
        settled_writes: settled.len(),
        settled_writes_by: by_request(settled.iter().copied()),
        settle_seconds: options.settle.as_secs(),
        connections: None,
        responses_by_protocol: Some(responses),
        caches,
        restart,
    })
}

/// What a run starts from: the admin client, the server's version, the operator's credentials.
struct Prepared {
    client: Client,
    version: String,
    credentials: envtest::OperatorCredentials,
}

/// Installs the operator's CRD, ServiceAccount and RBAC from `config_dir`, creates [`NAMESPACE`], and
/// makes the API server's first write of the new resource ([`warm_up`]) before anything is measured.
async fn prepare(env: &Env, config_dir: &Path) -> Result<Prepared, String> {
    let client = env.client().clone();
    let version = client
        .apiserver_version()
        .await
        .map_err(|e| format!("GET /version: {e}"))?
        .git_version;
    let credentials = env
        .install_operator_rbac(config_dir)
        .await
        .map_err(|e| format!("cannot install the operator's CRD and RBAC: {e:#}"))?;
    envtest::create_namespace(&client, NAMESPACE, &[])
        .await
        .map_err(|e| format!("{e:#}"))?;
    let warm_up = warm_up(&client).await?;
    eprintln!(
        "a dry-run create of a Memcached took {:.2} s (the API server's first write of a new resource)",
        warm_up.as_secs_f64()
    );
    Ok(Prepared {
        client,
        version,
        credentials,
    })
}

/// Starts a second operator against the settled instances and counts its requests from its start until
/// `options.settle` after it is ready.
async fn restart(
    env: &Env,
    options: &Options,
    kubeconfig: &Path,
    user: &str,
) -> Result<Restart, String> {
    let audit = env.control_plane().audit();
    eprintln!("restarting the operator over the settled instances");
    let mark = audit.mark().map_err(|e| format!("{e:#}"))?;
    let started = Instant::now();
    let mut operator = Operator::start(options, kubeconfig, true)?;
    operator.wait_ready(Duration::from_secs(60)).await?;
    let ready = started.elapsed();
    tokio::time::sleep(options.settle).await;
    let end = audit.mark().map_err(|e| format!("{e:#}"))?;
    let window = started.elapsed();
    operator.check_running()?;
    let cpu_seconds = operator.cpu_seconds()?;
    let peak_rss_mib = operator.peak_rss_kib()? as f64 / 1024.0;
    operator.stop();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let events: Vec<AuditEvent> = audit
        .read_since(&mark)
        .map_err(|e| format!("{e:#}"))?
        .into_iter()
        .filter(|e| e.user == user && e.received < end.at())
        .collect();
    let writes: Vec<&AuditEvent> = events.iter().filter(|e| is_write(e)).collect();
    Ok(Restart {
        ready_seconds: ready.as_secs_f64(),
        window_seconds: window.as_secs_f64(),
        requests: by_request(events.iter()),
        writes_total: writes.len(),
        writes_to_children_or_status: writes.iter().filter(|e| e.resource != "events").count(),
        writes: by_request(writes.iter().copied()),
        cpu_seconds,
        peak_rss_mib,
    })
}

/// Creates the instances, `in_flight` at a time; when the first answer came.
async fn create_instances(
    client: &Client,
    names: &[String],
    in_flight: usize,
) -> Result<Vec<(String, Instant)>, String> {
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), NAMESPACE, &memcached_resource());
    futures::stream::iter(names)
        .map(|name| {
            let api = api.clone();
            async move {
                let object: DynamicObject = serde_json::from_value(json!({
                    "apiVersion": "cache.example.com/v1alpha1", "kind": "Memcached",
                    "metadata": {"name": name, "namespace": NAMESPACE},
                    "spec": {"size": 1, "containerPort": 11211}
                }))
                .map_err(|e| e.to_string())?;
                api.create(&PostParams::default(), &object)
                    .await
                    .map(|_| (name.clone(), Instant::now()))
                    .map_err(|e| format!("cannot create Memcached {NAMESPACE}/{name}: {e}"))
            }
        })
        .buffer_unordered(in_flight.max(1))
        .try_collect::<Vec<(String, Instant)>>()
        .await
}

/// A server-side dry run of a create, before anything is measured: kube-apiserver makes the first write
/// of a newly established custom resource wait about 2 s (its admission sets up for the new resource),
/// which a cluster whose CRD is older never shows and which would otherwise fall between t0 and the first
/// instance. Nothing is stored, so the operator sees nothing.
async fn warm_up(client: &Client) -> Result<Duration, String> {
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), NAMESPACE, &memcached_resource());
    let object: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "cache.example.com/v1alpha1", "kind": "Memcached",
        "metadata": {"name": "bench-warm-up", "namespace": NAMESPACE},
        "spec": {"size": 1}
    }))
    .map_err(|e| e.to_string())?;
    let started = Instant::now();
    api.create(
        &PostParams {
            dry_run: true,
            ..PostParams::default()
        },
        &object,
    )
    .await
    .map_err(|e| format!("the dry-run create of a Memcached failed: {e}"))?;
    Ok(started.elapsed())
}

pub(crate) fn memcached_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("cache.example.com", "v1alpha1", "Memcached"),
        "memcacheds",
    )
}

/// The instances' creates and the operator's writes as the API server logged them, to time the operator's
/// writes by the server's clock: from the answer to an instance's create to the answer to the operator's
/// first successful write of one of its objects (named as the instance is).
struct Written<'a> {
    created: HashMap<&'a str, Timestamp>,
    writes: &'a [AuditEvent],
}

impl<'a> Written<'a> {
    fn new(others: &'a [AuditEvent], ours: &'a [AuditEvent]) -> Self {
        let created = others
            .iter()
            .filter(|e| e.verb == "create" && e.resource == "memcacheds" && e.code == 201)
            .filter(|e| e.namespace == NAMESPACE)
            .filter_map(|e| Some((e.name.as_str(), e.completed?)))
            .collect();
        Written {
            created,
            writes: ours,
        }
    }

    /// Per instance, seconds from its create's answer to the answer to the operator's first successful
    /// write that `is`.
    fn after_create(&self, is: impl Fn(&AuditEvent) -> bool) -> Option<Delays> {
        let mut first: HashMap<&str, f64> = HashMap::new();
        for e in self.writes.iter().filter(|e| e.code < 300 && is(e)) {
            let (Some(at), Some(created)) = (e.completed, self.created.get(e.name.as_str())) else {
                continue;
            };
            let delay = at.duration_since(*created).as_secs_f64().max(0.0);
            let earliest = first.entry(e.name.as_str()).or_insert(delay);
            *earliest = earliest.min(delay);
        }
        Delays::of(first.into_values().collect())
    }
}

/// When each instance got its children, a Ready pod, and `Available=True`, as the admin's watches see it.
#[derive(Default)]
struct Progress {
    /// Instance names.
    expected: HashSet<String>,
    workloads: HashSet<String>,
    services: HashMap<String, HashSet<String>>,
    complete: HashSet<String>,
    pods_ready: HashSet<String>,
    available: HashSet<String>,
    children_at: Option<Instant>,
    pods_ready_at: Option<Instant>,
    available_at: Option<Instant>,
    /// Per instance: when its create was answered, its workload first seen, its first status seen.
    created: HashMap<String, Instant>,
    workload_seen: HashMap<String, Instant>,
    status_seen: HashMap<String, Instant>,
}

impl Progress {
    /// Per instance, seconds from its create's answer to `seen` (0 when seen first: the watch was quicker).
    fn after_create(&self, seen: &HashMap<String, Instant>) -> Option<Delays> {
        Delays::of(
            self.created
                .iter()
                .filter_map(|(name, created)| {
                    let at = seen.get(name)?;
                    Some(at.saturating_duration_since(*created).as_secs_f64())
                })
                .collect(),
        )
    }

    fn all(&self, set: &HashSet<String>) -> bool {
        !self.expected.is_empty() && set.len() == self.expected.len()
    }

    fn child(&mut self, owner: Option<String>, service: Option<String>) {
        let Some(owner) = owner.filter(|o| self.expected.contains(o)) else {
            return;
        };
        match service {
            Some(name) => {
                self.services.entry(owner.clone()).or_default().insert(name);
            }
            None => {
                self.workload_seen
                    .entry(owner.clone())
                    .or_insert_with(Instant::now);
                self.workloads.insert(owner.clone());
            }
        }
        let services = self.services.get(&owner).map_or(0, HashSet::len);
        if self.workloads.contains(&owner) && services >= 2 {
            self.complete.insert(owner);
            if self.all(&self.complete) && self.children_at.is_none() {
                self.children_at = Some(Instant::now());
            }
        }
    }

    fn workload<K: Resource>(&mut self, workload: &K) {
        self.child(controller(workload), None);
    }

    fn service(&mut self, service: &Service) {
        self.child(controller(service), Some(service.name_any()));
    }

    fn pod(&mut self, pod: &Pod) {
        let Some(instance) = pod.labels().get("app.kubernetes.io/instance") else {
            return;
        };
        let ready = pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
        if ready && self.expected.contains(instance) {
            self.pods_ready.insert(instance.clone());
            if self.all(&self.pods_ready) && self.pods_ready_at.is_none() {
                self.pods_ready_at = Some(Instant::now());
            }
        }
    }

    fn memcached(&mut self, mc: &DynamicObject) {
        let name = mc.name_any();
        if !self.expected.contains(&name) {
            return;
        }
        if mc.data["status"]["conditions"]
            .as_array()
            .is_some_and(|c| !c.is_empty())
        {
            self.status_seen
                .entry(name.clone())
                .or_insert_with(Instant::now);
        }
        let available = mc.data["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["type"] == "Available" && c["status"] == "True");
        if available {
            self.available.insert(name);
        } else {
            self.available.remove(&name);
        }
        if self.all(&self.available) && self.available_at.is_none() {
            self.available_at = Some(Instant::now());
        }
    }
}

/// The name of the `Memcached` that controls `object`.
fn controller<K: Resource>(object: &K) -> Option<String> {
    object
        .meta()
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true) && o.kind == "Memcached")
        .map(|o| o.name.clone())
}

fn lock(progress: &Mutex<Progress>) -> MutexGuard<'_, Progress> {
    progress.lock().unwrap_or_else(|e| e.into_inner())
}

/// The admin client's watches of the namespace, feeding [`Progress`].
struct Watches(Vec<JoinHandle<()>>);

impl Watches {
    /// Starts the watches and waits until each has listed.
    async fn start(client: &Client, progress: &Arc<Mutex<Progress>>) -> Result<Self, String> {
        let mut tasks = Vec::new();
        let mut synced = Vec::new();
        let mut add = |task: JoinHandle<()>, listed: oneshot::Receiver<()>| {
            tasks.push(task);
            synced.push(listed);
        };
        let (tx, rx) = oneshot::channel();
        add(
            watch(
                Api::<Deployment>::namespaced(client.clone(), NAMESPACE),
                progress,
                |p, o| p.workload(o),
                tx,
            ),
            rx,
        );
        let (tx, rx) = oneshot::channel();
        add(
            watch(
                Api::<StatefulSet>::namespaced(client.clone(), NAMESPACE),
                progress,
                |p, o| p.workload(o),
                tx,
            ),
            rx,
        );
        let (tx, rx) = oneshot::channel();
        add(
            watch(
                Api::<Service>::namespaced(client.clone(), NAMESPACE),
                progress,
                Progress::service,
                tx,
            ),
            rx,
        );
        let (tx, rx) = oneshot::channel();
        add(
            watch(
                Api::<Pod>::namespaced(client.clone(), NAMESPACE),
                progress,
                Progress::pod,
                tx,
            ),
            rx,
        );
        let (tx, rx) = oneshot::channel();
        add(
            watch(
                Api::<DynamicObject>::namespaced_with(
                    client.clone(),
                    NAMESPACE,
                    &memcached_resource(),
                ),
                progress,
                Progress::memcached,
                tx,
            ),
            rx,
        );
        let watches = Watches(tasks);
        let listed = futures::future::join_all(synced);
        match tokio::time::timeout(Duration::from_secs(30), listed).await {
            Ok(results) if results.iter().all(Result::is_ok) => Ok(watches),
            _ => Err("the admin client's watches did not list within 30 s".to_owned()),
        }
    }
}

impl Drop for Watches {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}

/// Watches `api`, handing every object seen to `on`; `listed` fires once the initial list is in.
fn watch<K>(
    api: Api<K>,
    progress: &Arc<Mutex<Progress>>,
    on: fn(&mut Progress, &K),
    listed: oneshot::Sender<()>,
) -> JoinHandle<()>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    let progress = progress.clone();
    tokio::spawn(async move {
        let mut listed = Some(listed);
        let mut events = watcher::watcher(api, watcher::Config::default())
            .default_backoff()
            .boxed();
        while let Some(event) = events.next().await {
            match event {
                Ok(Event::Apply(object) | Event::InitApply(object)) => {
                    on(&mut lock(&progress), &object);
                }
                Ok(Event::InitDone) => {
                    if let Some(listed) = listed.take() {
                        let _ = listed.send(());
                    }
                }
                Ok(Event::Delete(_) | Event::Init) => {}
                Err(e) => eprintln!("warning: the admin's watch: {e}"),
            }
        }
    })
}

/// The key of the stats collector's writes of `status.stats` ([`key`]), apart from the reconciler's status
/// writes (`patch memcacheds/status`).
pub const STATS_WRITES: &str = "patch memcacheds/status (stats)";

/// `verb resource[/subresource]`, as the audit log names them; the stats collector's status writes, told
/// from the reconciler's by their field manager, as [`STATS_WRITES`].
fn key(e: &AuditEvent) -> String {
    if e.field_manager == memcached_operator::telemetry::collector::FIELD_MANAGER {
        STATS_WRITES.to_owned()
    } else if e.subresource.is_empty() {
        format!("{} {}", e.verb, e.resource)
    } else {
        format!("{} {}/{}", e.verb, e.resource, e.subresource)
    }
}

fn is_write(e: &AuditEvent) -> bool {
    WRITES.contains(&e.verb.as_str())
}

fn by_request<'a>(events: impl IntoIterator<Item = &'a AuditEvent>) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for e in events {
        *counts.entry(key(e)).or_insert(0) += 1;
    }
    counts
}

/// The events about the instances in the namespace, by reason (a series counts once, as the fake counts
/// them).
async fn events_by_reason(client: &Client) -> Result<BTreeMap<String, usize>, String> {
    let events: Api<CoreEvent> = Api::namespaced(client.clone(), NAMESPACE);
    let list = events
        .list(&ListParams::default())
        .await
        .map_err(|e| format!("cannot list the events: {e}"))?;
    let mut reasons = BTreeMap::new();
    for event in list
        .items
        .iter()
        .filter(|e| e.involved_object.kind.as_deref() == Some("Memcached"))
    {
        let reason = event.reason.clone().unwrap_or_else(|| "<none>".to_owned());
        *reasons.entry(reason).or_insert(0) += 1;
    }
    Ok(reasons)
}

/// `memcached_operator_kube_responses_total` by protocol, from the operator's metrics text.
pub fn responses_by_protocol(metrics: &str) -> BTreeMap<String, u64> {
    by_label(
        metrics,
        "memcached_operator_kube_responses_total",
        "protocol",
    )
}

/// What the operator's caches hold, by resource, from its metrics text.
pub fn caches(metrics: &str) -> BTreeMap<String, CacheFootprint> {
    let mut out: BTreeMap<String, CacheFootprint> = BTreeMap::new();
    for (resource, objects) in by_label(metrics, "memcached_operator_cache_objects", "resource") {
        out.entry(resource).or_default().objects = objects;
    }
    for (resource, bytes) in by_label(metrics, "memcached_operator_cache_bytes", "resource") {
        out.entry(resource).or_default().bytes = bytes;
    }
    out
}

/// The samples of `family` summed by the value of `label`, from a metrics text.
fn by_label(metrics: &str, family: &str, label: &str) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    let label = format!("{label}=");
    for line in metrics.lines() {
        let Some(rest) = line
            .strip_prefix(family)
            .and_then(|rest| rest.strip_prefix('{'))
        else {
            continue;
        };
        let Some((labels, value)) = rest.split_once('}') else {
            continue;
        };
        let key = labels
            .split(',')
            .find_map(|l| l.strip_prefix(label.as_str()))
            .map(|p| p.trim_matches('"').to_owned());
        // An integer for a count, but the text format allows a float.
        let value = value
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<f64>().ok())
            .map(|v| v as u64);
        if let (Some(key), Some(value)) = (key, value) {
            *out.entry(key).or_insert(0) += value;
        }
    }
    out
}

/// Per process name, the CPU seconds between two readings of [`process::children_cpu_seconds`].
fn cpu_since(
    before: &BTreeMap<String, f64>,
    after: &BTreeMap<String, f64>,
) -> BTreeMap<String, f64> {
    after
        .iter()
        .map(|(name, now)| {
            let then = before.get(name).copied().unwrap_or_default();
            (name.clone(), now - then)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn responses_are_read_by_protocol_from_the_metrics_text() {
        let text = "# HELP memcached_operator_kube_responses_total x\n\
                    memcached_operator_kube_responses_total{protocol=\"HTTP/2\"} 1234\n\
                    memcached_operator_kube_responses_total{protocol=\"HTTP/1.1\"} 0\n\
                    memcached_operator_kube_requests_total{verb=\"get\",code=\"200\"} 9\n";
        let counts = responses_by_protocol(text);
        assert_eq!(counts["HTTP/2"], 1234);
        assert_eq!(counts["HTTP/1.1"], 0);
        assert_eq!(counts.len(), 2);
    }

    #[test]
    fn the_caches_are_read_by_resource_from_the_metrics_text() {
        let text = "memcached_operator_cache_objects{resource=\"pods\"} 3000\n\
                    memcached_operator_cache_bytes{resource=\"pods\"} 1200000\n\
                    memcached_operator_cache_bytes_other{resource=\"pods\"} 7\n\
                    memcached_operator_cache_objects{resource=\"services\"} 6000\n\
                    memcached_operator_cache_bytes{resource=\"services\"} 900000\n";
        let caches = caches(text);
        assert_eq!(
            caches["pods"],
            CacheFootprint {
                objects: 3000,
                bytes: 1_200_000
            }
        );
        assert_eq!(caches["services"].bytes, 900_000);
        assert_eq!(caches.len(), 2);
    }

    /// An answered request: `what` is `verb resource[/subresource] name`, answered `at` with `code`.
    fn event(user: &str, what: &str, code: u16, at: &str) -> AuditEvent {
        let [verb, resource, name] = what.split(' ').collect::<Vec<_>>()[..] else {
            panic!("{what}: verb resource name")
        };
        let (resource, subresource) = resource.split_once('/').unwrap_or((resource, ""));
        AuditEvent {
            audit_id: format!("{user} {what} {at}"),
            user: user.to_owned(),
            groups: Vec::new(),
            user_agent: String::new(),
            verb: verb.to_owned(),
            resource: resource.to_owned(),
            subresource: subresource.to_owned(),
            api_group: String::new(),
            namespace: NAMESPACE.to_owned(),
            name: name.to_owned(),
            field_manager: String::new(),
            code,
            received: at.parse().unwrap(),
            completed: Some(at.parse().unwrap()),
        }
    }

    #[test]
    fn writes_are_timed_from_the_create_to_the_first_successful_one_by_the_server_clock() {
        let others = [
            event("admin", "create memcacheds a", 201, "2026-01-01T00:00:01Z"),
            event("admin", "create memcacheds b", 201, "2026-01-01T00:00:02Z"),
            event("admin", "create memcacheds c", 409, "2026-01-01T00:00:02Z"),
        ];
        let ours = [
            event(
                "op",
                "patch memcacheds/status a",
                500,
                "2026-01-01T00:00:01.5Z",
            ),
            event(
                "op",
                "patch memcacheds/status a",
                200,
                "2026-01-01T00:00:03Z",
            ),
            event(
                "op",
                "patch memcacheds/status a",
                200,
                "2026-01-01T00:00:09Z",
            ),
            event(
                "op",
                "patch memcacheds/status b",
                200,
                "2026-01-01T00:00:02.5Z",
            ),
            event(
                "op",
                "patch memcacheds/status c",
                200,
                "2026-01-01T00:00:04Z",
            ),
            event("op", "patch deployments b", 201, "2026-01-01T00:00:07Z"),
        ];
        let written = Written::new(&others, &ours);
        let status = written
            .after_create(|e| e.resource == "memcacheds" && e.subresource == "status")
            .unwrap();
        // a: 2 s (neither the refused write nor the later one), b: 0.5 s; c was never created.
        assert_eq!((status.median, status.max), (2.0, 2.0));
        let workload = written
            .after_create(|e| e.resource == "deployments")
            .unwrap();
        assert_eq!((workload.median, workload.max), (5.0, 5.0));
    }

    #[test]
    fn the_stats_collectors_status_writes_are_counted_apart() {
        let reconciler = event(
            "op",
            "patch memcacheds/status a",
            200,
            "2026-01-01T00:00:01Z",
        );
        let stats = AuditEvent {
            field_manager: memcached_operator::telemetry::collector::FIELD_MANAGER.to_owned(),
            ..reconciler.clone()
        };
        let counts = by_request([&reconciler, &stats, &stats]);
        assert_eq!(counts["patch memcacheds/status"], 1);
        assert_eq!(counts[STATS_WRITES], 2);
    }

    #[test]
    fn children_complete_with_the_workload_and_both_services() {
        let mut p = Progress {
            expected: ["a".to_owned()].into(),
            ..Progress::default()
        };
        p.child(Some("a".into()), Some("a".into()));
        p.child(Some("b".into()), None);
        p.child(Some("a".into()), Some("a".into()));
        assert!(p.children_at.is_none(), "one Service, no workload");
        p.child(Some("a".into()), None);
        assert!(p.children_at.is_none(), "one Service");
        p.child(Some("a".into()), Some("a-headless".into()));
        assert!(p.children_at.is_some());
    }
}
