//! A stand-in kubelet, written for this project: it makes the pods that the built-in controllers create
//! from the operator's Deployments and StatefulSets become Running and Ready (or not), so that the
//! operator sees what it would see on a real cluster, without a container runtime.
//!
//! - registers N Ready nodes ([`node`]) with capacity and the `kubernetes.io/hostname` label the
//!   operator's anti-affinity spreads over;
//! - one watch on all pods; a task per pod on its nodes ([`pod`]), so hundreds of pods cost hundreds of
//!   idle tasks, not hundreds of watches;
//! - binds unscheduled pods round-robin when there is no kube-scheduler;
//! - status through the status subresource by strategic-merge patch under the field manager
//!   `stand-in-kubelet` ([`status`]): Running, a loopback pod IP, container statuses, and Ready only when
//!   every readiness gate passes;
//! - optionally a real memcached per pod ([`memcached`]) whose exit makes the pod not ready, with the
//!   pod's TLS and auth settings and their files from its Secret volumes ([`volumes`]);
//! - images: taken as pulled, except those of a registry under the reserved `.invalid` domain, which
//!   no kubelet can pull: their containers wait with `ErrImagePull`, then `ImagePullBackOff`, and the
//!   pod stays Pending and not ready, and those of `no-server.test`, whose pods run and are ready but
//!   serve nothing: connections are refused ([`image`]);
//! - deletion: the process is killed and the pod deleted for good;
//! - pods that run once (`restartPolicy` not `Always`) with the operator's image, such as `helm test`'s:
//!   the operator binary as a process, the pod `Succeeded` or `Failed` by its exit code ([`oneshot`]);
//! - the operator's proxy pods (`spec.proxy`): a proxy-capable memcached and the configuration writer
//!   (init container and sidecar) as operator processes, their `emptyDir` a directory of the pod's own
//!   ([`proxy`]); the proxies resolve the per-pod names of ready StatefulSet pods ([`dns`]).
//!
//! Not done: probes, restarts, resource limits, volumes other than the Secret volumes of memcached,
//! pulling images, init containers' work (but the proxy pods'), node heartbeats (the node lifecycle controller is off
//! instead), pods on nodes that are not its own, `kubectl exec`/`logs`/`port-forward` (no kubelet API),
//! Service endpoints (pod IPs are loopback addresses, which the API server refuses in Endpoints and
//! EndpointSlices, so the endpoint controllers are off, see [`crate::control_plane`]; and no kube-proxy
//! routes ClusterIPs anyway).
//! Its Nodes carry the label [`node::STAND_IN_LABEL`], so that a client can tell it is talking to a
//! cluster of stand-ins.

pub mod dns;
pub mod image;
pub mod ip;
pub mod memcached;
pub mod node;
pub mod oneshot;
pub mod pod;
pub mod proxy;
pub mod status;
pub mod volumes;

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use anyhow::{Result, bail};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::PostParams;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, ResourceExt};
use serde_json::json;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{debug, warn};

pub use node::Capacity;

/// The field manager of every write the stand-in kubelet makes.
pub const FIELD_MANAGER: &str = "stand-in-kubelet";

/// Debian's memcached, the default for [`KubeletOptions::memcached`].
pub const DEBIAN_MEMCACHED: &str = "/usr/bin/memcached";

/// How the stand-in kubelet behaves.
#[derive(Clone, Debug)]
pub struct KubeletOptions {
    /// Nodes to register (at least 1).
    pub nodes: usize,
    /// Node names are `<prefix>-0`, `<prefix>-1`, …
    pub node_prefix: String,
    pub capacity: Capacity,
    /// Time from a pod's binding being seen to its being reported Running (as a real pod's image pull and
    /// start take).
    pub pod_start_delay: Duration,
    /// Time from a pod's deletion to its removal (at most the pod's grace period).
    pub pod_termination_delay: Duration,
    /// Run this memcached binary for each pod's `memcached` container; `None`: status only.
    pub memcached: Option<PathBuf>,
    /// Run this proxy-capable memcached (1.6.23+, `--enable-proxy`) for proxy pods, with their
    /// configuration writers as processes of [`KubeletOptions::operator`]'s binary ([`proxy`]); `None`,
    /// or no `operator`: proxy pods are status only.
    pub proxy_memcached: Option<PathBuf>,
    /// Bind unscheduled pods to the nodes (when no kube-scheduler runs).
    pub bind_pods: bool,
    /// Where memcached's output goes.
    pub log_dir: PathBuf,
    /// Run pods that run once with the operator's image as processes of its binary ([`oneshot`]);
    /// `None`: status only, as every other pod.
    pub operator: Option<oneshot::OperatorImage>,
}

impl Default for KubeletOptions {
    fn default() -> Self {
        KubeletOptions {
            nodes: 3,
            node_prefix: "envtest-node".to_owned(),
            capacity: Capacity::default(),
            pod_start_delay: Duration::from_millis(100),
            pod_termination_delay: Duration::ZERO,
            memcached: None,
            proxy_memcached: None,
            bind_pods: false,
            log_dir: std::env::temp_dir(),
            operator: None,
        }
    }
}

/// What every pod task shares.
pub struct Context {
    pub client: Client,
    pub options: KubeletOptions,
    pub ips: ip::IpPool,
    /// The per-pod names of ready StatefulSet pods, for the proxies ([`dns`]).
    pub dns: dns::Hosts,
}

struct PodHandle {
    latest: watch::Sender<Pod>,
    task: JoinHandle<()>,
}

type Pods = Arc<Mutex<HashMap<String, PodHandle>>>;

/// The running stand-in kubelet; [`Kubelet::stop`] (or `Drop`) ends its tasks and kills its processes.
pub struct Kubelet {
    nodes: Vec<String>,
    watch: JoinHandle<()>,
    pods: Pods,
}

impl Kubelet {
    /// Registers the nodes and starts watching pods, in the current Tokio runtime.
    pub async fn start(client: Client, options: KubeletOptions) -> Result<Kubelet> {
        if options.nodes == 0 {
            bail!("the stand-in kubelet needs at least one node");
        }
        if let Some(binary) = &options.memcached
            && !binary.is_file()
        {
            bail!(
                "no memcached at {} (apt-get install memcached)",
                binary.display()
            );
        }
        if let Some(binary) = &options.proxy_memcached
            && !binary.is_file()
        {
            bail!("no proxy-capable memcached at {}", binary.display());
        }
        if let Some(operator) = &options.operator
            && !operator.binary.is_file()
        {
            bail!("no operator binary at {}", operator.binary.display());
        }
        std::fs::create_dir_all(&options.log_dir)?;
        let nodes: Vec<String> = (0..options.nodes)
            .map(|i| format!("{}-{i}", options.node_prefix))
            .collect();
        futures::future::try_join_all(
            nodes
                .iter()
                .map(|n| node::register(&client, n, &options.capacity)),
        )
        .await?;
        let dns = dns::Hosts::new(options.log_dir.join("hosts"));
        let ctx = Arc::new(Context {
            client,
            options,
            ips: ip::IpPool::default(),
            dns,
        });
        let pods = Pods::default();
        let watch = tokio::spawn(watch_pods(ctx, pods.clone(), nodes.clone()));
        Ok(Kubelet { nodes, watch, pods })
    }

    pub fn nodes(&self) -> &[String] {
        &self.nodes
    }

    /// Pods it is running (started or about to start).
    pub fn running_pods(&self) -> usize {
        lock(&self.pods)
            .values()
            .filter(|h| !h.task.is_finished())
            .count()
    }

    /// Stops watching and ends every pod task, killing their processes, and waits until they are gone.
    /// The pods stay in the API server as they were.
    pub async fn stop(self) {
        self.watch.abort();
        let tasks: Vec<JoinHandle<()>> = lock(&self.pods).drain().map(|(_, h)| h.task).collect();
        for task in &tasks {
            task.abort();
        }
        for task in tasks {
            let _ = task.await;
        }
    }
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        self.watch.abort();
        for (_, handle) in lock(&self.pods).drain() {
            handle.task.abort();
        }
    }
}

fn lock(pods: &Pods) -> MutexGuard<'_, HashMap<String, PodHandle>> {
    pods.lock().unwrap_or_else(|e| e.into_inner())
}

/// The one watch on all pods, dispatching each version to its pod's task.
async fn watch_pods(ctx: Arc<Context>, pods: Pods, nodes: Vec<String>) {
    let api: Api<Pod> = Api::all(ctx.client.clone());
    let mut events = watcher::watcher(api, watcher::Config::default())
        .default_backoff()
        .boxed();
    let nodes: HashSet<String> = nodes.into_iter().collect();
    let binder = Binder::new(&ctx, &nodes);
    let mut listed = HashSet::new();
    while let Some(event) = events.next().await {
        match event {
            Ok(Event::Init) => listed.clear(),
            Ok(Event::InitApply(pod)) => {
                listed.insert(pod.uid().unwrap_or_default());
                on_pod(&ctx, &pods, &nodes, &binder, pod);
            }
            Ok(Event::InitDone) => {
                // Pods deleted while the watch was down.
                let mut pods = lock(&pods);
                pods.retain(|uid, handle| {
                    let keep = listed.contains(uid);
                    if !keep {
                        handle.task.abort();
                    }
                    keep
                });
                binder.forget_except(&listed);
                ctx.dns.retain(|uid| listed.contains(uid));
            }
            Ok(Event::Apply(pod)) => on_pod(&ctx, &pods, &nodes, &binder, pod),
            Ok(Event::Delete(pod)) => {
                let uid = pod.uid().unwrap_or_default();
                if let Some(handle) = lock(&pods).remove(&uid) {
                    handle.task.abort();
                }
                binder.forget(&uid);
                ctx.dns.retain(|other| other != uid);
            }
            Err(e) => warn!("pod watch: {e}"),
        }
    }
}

fn on_pod(ctx: &Arc<Context>, pods: &Pods, nodes: &HashSet<String>, binder: &Binder, pod: Pod) {
    let Some(uid) = pod.uid() else { return };
    ctx.dns.observe(&pod);
    let node = pod.spec.as_ref().and_then(|s| s.node_name.clone());
    let Some(node) = node else {
        if ctx.options.bind_pods && pod.metadata.deletion_timestamp.is_none() {
            binder.bind(&pod, &uid);
        }
        return;
    };
    if !nodes.contains(&node) {
        return;
    }
    let mut pods = lock(pods);
    if let Some(handle) = pods.get(&uid) {
        handle.latest.send_replace(pod);
        return;
    }
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    if matches!(phase, Some("Succeeded" | "Failed")) {
        return;
    }
    let once = ctx.options.operator.as_ref().is_some_and(|o| o.runs(&pod));
    let proxies = ctx.options.proxy_memcached.is_some() && ctx.options.operator.is_some();
    let proxy = proxies && proxy::is_proxy_pod(&pod);
    let (latest, receiver) = watch::channel(pod);
    let task = if once {
        tokio::spawn(oneshot::run(ctx.clone(), receiver))
    } else if proxy {
        tokio::spawn(proxy::run(ctx.clone(), receiver))
    } else {
        tokio::spawn(pod::run(ctx.clone(), receiver))
    };
    pods.insert(uid, PodHandle { latest, task });
}

/// Binds unscheduled pods to the nodes in turn, through the pods/binding subresource as a scheduler does.
struct Binder {
    client: Client,
    nodes: Vec<String>,
    next: AtomicUsize,
    /// Pods with a binding sent or done, so a pod's later versions do not bind it again.
    bound: Arc<Mutex<HashSet<String>>>,
}

impl Binder {
    fn new(ctx: &Context, nodes: &HashSet<String>) -> Binder {
        let mut nodes: Vec<String> = nodes.iter().cloned().collect();
        nodes.sort();
        Binder {
            client: ctx.client.clone(),
            nodes,
            next: AtomicUsize::new(0),
            bound: Arc::default(),
        }
    }

    fn bind(&self, pod: &Pod, uid: &str) {
        if !self
            .bound
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(uid.to_owned())
        {
            return;
        }
        let node = self.nodes[self.next.fetch_add(1, Ordering::Relaxed) % self.nodes.len()].clone();
        let (name, namespace) = (pod.name_any(), pod.namespace().unwrap_or_default());
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &namespace);
        let bound = self.bound.clone();
        let uid = uid.to_owned();
        tokio::spawn(async move {
            let binding = json!({
                "apiVersion": "v1",
                "kind": "Binding",
                "metadata": {"name": name, "uid": uid},
                "target": {"apiVersion": "v1", "kind": "Node", "name": node},
            });
            let result: kube::Result<serde_json::Value> = api
                .create_subresource("binding", &name, &PostParams::default(), &binding)
                .await;
            match result {
                Ok(_) => debug!(pod = %name, %namespace, %node, "bound"),
                Err(kube::Error::Api(s)) if s.code == 409 || s.code == 404 => {}
                Err(e) => {
                    // Let the pod's next version (or the next relist) try again.
                    warn!(pod = %name, %namespace, "binding failed: {e}");
                    bound.lock().unwrap_or_else(|e| e.into_inner()).remove(&uid);
                }
            }
        });
    }

    fn forget(&self, uid: &str) {
        self.bound
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(uid);
    }

    fn forget_except(&self, listed: &HashSet<String>) {
        self.bound
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|uid| listed.contains(uid));
    }
}
