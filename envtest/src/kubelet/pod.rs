//! One pod's life on the stand-in kubelet: a task per pod, fed the pod's latest version by the kubelet's
//! single watch.
//!
//! Start: after the start delay, note the containers whose images cannot be pulled ([`image`]), write the
//! Secret volumes memcached needs ([`volumes`]; the pod waits while a Secret cannot be read), take a
//! loopback IP (one whose port no other process on the machine listens on), optionally start memcached
//! on it, then report the pod (Running, or Pending while a container waits for its image). While it
//! runs: re-report whenever what the status should say changes (a readiness gate passes or fails, the
//! process exits, an image pull is retried or backs off). Deletion: kill the process, wait the
//! termination delay, delete the pod for good (grace period 0, preconditioned on its uid so a successor
//! of the same name is safe), remove its volumes.

use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use kube::{Api, ResourceExt};
use tokio::sync::watch;
use tracing::{debug, info, warn};

use super::ip::IpLease;
use super::status::{self, Running};
use super::volumes::{self, Mounts};
use super::{Context, image, memcached};
use crate::net::wait_for_listener;
use crate::process::Process;

/// Runs the pod whose versions arrive on `pods` until it is deleted or the sender goes away.
pub async fn run(ctx: Arc<Context>, mut pods: watch::Receiver<Pod>) {
    let first = pods.borrow_and_update().clone();
    let (name, namespace, uid) = (
        first.name_any(),
        first.namespace().unwrap_or_default(),
        first.uid(),
    );
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), &namespace);
    let mut local = first;

    local = after_start_delay(&ctx, local, &mut pods).await;
    // What cannot be pulled is known before anything starts: the pod gets its sandbox (an IP) all the
    // same, and the containers whose images were pulled run.
    let pulls = Pulls::of(&local);
    let volumes_dir = ctx
        .options
        .log_dir
        .join("volumes")
        .join(uid.as_deref().unwrap_or(&name));
    let mounts = mount_volumes(&ctx, &mut pods, &mut local, &pulls, &volumes_dir).await;
    let Some(Sandbox {
        ip: _lease,
        mut run,
        mut server,
    }) = start(&ctx, &local, &pulls, &mounts).await
    else {
        warn!(pod = %name, %namespace, "no loopback address left for the pod");
        return;
    };
    let tick = if server.is_some() {
        Duration::from_millis(250)
    } else {
        Duration::from_secs(1)
    };
    // The kubelet's sync of the Secret volumes of a running pod (see `volumes`).
    let mut next_volume_sync = Instant::now() + VOLUME_SYNC;

    loop {
        if deleting(&local) {
            terminate(&ctx, &api, &name, uid.as_deref(), &local, server.take()).await;
            let _ = std::fs::remove_dir_all(&volumes_dir);
            return;
        }
        if let (None, Some(process)) = (run.exited, server.as_mut())
            && let Some(exit) = process.exit_status()
        {
            info!(pod = %name, %namespace, "memcached exited ({exit}); the pod is not ready");
            run.exited = Some(exit.code().unwrap_or(-1));
            run.finished = Some(Timestamp::now());
        }
        if !mounts.is_empty() && server.is_some() && Instant::now() >= next_volume_sync {
            next_volume_sync = Instant::now() + VOLUME_SYNC;
            sync_volumes(&ctx, &local, &volumes_dir).await;
        }
        let next_pull_change = pulls.update(&mut run);
        match report(&api, &local, &run).await {
            Ok(Some(pod)) => local = newest(local, pod),
            Ok(None) => {}
            Err(Gone) => return,
        }
        tokio::select! {
            changed = pods.changed() => {
                if changed.is_err() {
                    return;
                }
                local = newest(local, pods.borrow_and_update().clone());
            }
            () = tokio::time::sleep(next_pull_change.map_or(tick, |d| d.min(tick))) => {}
        }
    }
}

/// The containers of a pod whose images cannot be pulled ([`image`]), and when the first attempt was.
struct Pulls {
    failing: Vec<(String, String, String)>,
    since: Instant,
}

impl Pulls {
    /// (container, image, error) for every init and app container whose image cannot be pulled.
    fn of(pod: &Pod) -> Pulls {
        let failing = pod
            .spec
            .iter()
            .flat_map(|s| s.init_containers.iter().flatten().chain(&s.containers))
            .filter_map(|c| {
                let image = c.image.clone().unwrap_or_default();
                let error = image::pull_error(&image)?;
                Some((c.name.clone(), image, error))
            })
            .collect();
        Pulls {
            failing,
            since: Instant::now(),
        }
    }

    fn fails(&self, container: &str) -> bool {
        self.failing.iter().any(|(name, _, _)| name == container)
    }

    /// Sets `run.waiting` to the containers' pull states now; returns when the next one changes.
    fn update(&self, run: &mut Running) -> Option<Duration> {
        let elapsed = self.since.elapsed();
        let mut next: Option<Duration> = None;
        for (name, image, error) in &self.failing {
            let (waiting, lasts) = image::pull_state(image, error, elapsed);
            run.waiting.insert(name.clone(), waiting);
            next = Some(next.map_or(lasts, |n| n.min(lasts)));
        }
        next
    }
}

/// A pod's sandbox as the stand-in has it: a loopback address, and its memcached when it runs one.
struct Sandbox {
    ip: IpLease,
    run: Running,
    server: Option<Process>,
}

/// Addresses tried before giving up on finding one on which the pod's port is free.
const ADDRESS_ATTEMPTS: usize = 16;

/// Takes a loopback address for the pod and, when the kubelet runs memcached and the pod's `memcached`
/// container has its image, starts it there.
///
/// Other stand-in kubelets on this machine (other test binaries) hand out the same range of addresses,
/// so an address whose port something else listens on already is passed over, and so is one that
/// memcached could not bind after all (it exits at once): a client of this pod must reach this pod's
/// memcached, never another cluster's.
async fn start(ctx: &Context, pod: &Pod, pulls: &Pulls, mounts: &Mounts) -> Option<Sandbox> {
    let (name, namespace) = (pod.name_any(), pod.namespace().unwrap_or_default());
    let args = memcached_args(ctx, pod, pulls);
    let (Some(binary), Some(args), false) = (&ctx.options.memcached, args, deleting(pod)) else {
        let ip = ctx.ips.lease()?;
        return Some(Sandbox {
            run: running(ip.ip()),
            ip,
            server: None,
        });
    };
    let log = ctx
        .options
        .log_dir
        .join(format!("memcached-{namespace}-{name}.log"));
    // Leases of addresses passed over, held until the end so the pool offers others meanwhile.
    let mut passed_over = Vec::new();
    for _ in 0..ADDRESS_ATTEMPTS {
        let lease = ctx.ips.lease()?;
        let ip = lease.ip();
        if !port_free(ip, args.port) {
            debug!(pod = %name, %namespace, "{ip}:{} is taken on this machine; trying another address", args.port);
            passed_over.push(lease);
            continue;
        }
        let mut run = running(ip);
        let mut process = match memcached::start(binary, ip, &args, mounts, &log) {
            Ok(process) => process,
            Err(e) => {
                warn!(pod = %name, %namespace, "cannot start memcached: {e:#}");
                run.exited = Some(-1);
                run.finished = Some(Timestamp::now());
                return Some(Sandbox {
                    ip: lease,
                    run,
                    server: None,
                });
            }
        };
        let listening = wait_for_listener(ip.into(), args.port, Duration::from_secs(5)).await;
        // Whoever answered, a memcached that has exited did not bind the address: someone else did.
        tokio::time::sleep(Duration::from_millis(20)).await;
        if let Some(exit) = process.exit_status()
            && !port_free(ip, args.port)
        {
            debug!(pod = %name, %namespace, "memcached exited at start ({exit}): {ip}:{} was taken meanwhile", args.port);
            passed_over.push(lease);
            continue;
        }
        if let Err(e) = listening {
            warn!(pod = %name, %namespace, "memcached does not listen: {e}");
            process.stop(Duration::from_secs(1));
        }
        return Some(Sandbox {
            ip: lease,
            run,
            server: Some(process),
        });
    }
    warn!(pod = %name, %namespace, "no address among {ADDRESS_ATTEMPTS} tried has port {} free", args.port);
    None
}

/// The memcached the kubelet runs for `pod`, if it runs one: it runs memcached, the pod has a `memcached`
/// container, its image was pulled, and it is not an image that runs no server ([`image::runs_server`]).
fn memcached_args(ctx: &Context, pod: &Pod, pulls: &Pulls) -> Option<memcached::ServerArgs> {
    ctx.options.memcached.as_ref()?;
    let serves = pod
        .spec
        .as_ref()?
        .containers
        .iter()
        .find(|c| c.name == memcached::CONTAINER)
        .and_then(|c| c.image.as_deref())
        .is_none_or(image::runs_server);
    memcached::server_args(pod).filter(|_| serves && !pulls.fails(memcached::CONTAINER))
}

/// How often the Secret volumes of a running pod are brought up to date. A kubelet does it at its sync
/// period plus its Secret cache's TTL (about a minute by default); the stand-in is quicker, so that tests
/// of a rotation do not wait a minute.
const VOLUME_SYNC: Duration = Duration::from_secs(3);

/// Writes changed Secrets into the running pod's volumes ([`volumes::mount`] again, which rewrites only
/// what changed, atomically). A Secret that cannot be read leaves the files as they are, as a kubelet does.
async fn sync_volumes(ctx: &Context, pod: &Pod, dir: &std::path::Path) {
    let Some(container) = pod
        .spec
        .as_ref()
        .and_then(|s| s.containers.iter().find(|c| c.name == memcached::CONTAINER))
    else {
        return;
    };
    if let Err(e) = volumes::mount(&ctx.client, pod, container, dir).await {
        debug!(pod = %pod.name_any(), "cannot update the pod's volumes: {e:#}");
    }
}

/// Writes the Secret volumes the pod's memcached needs into `dir` ([`volumes`]), retrying every two
/// seconds while a Secret cannot be read (the pod waits, as a kubelet's waits in ContainerCreating),
/// until they are written or the pod is deleted.
async fn mount_volumes(
    ctx: &Context,
    pods: &mut watch::Receiver<Pod>,
    local: &mut Pod,
    pulls: &Pulls,
    dir: &std::path::Path,
) -> Mounts {
    let (name, namespace) = (local.name_any(), local.namespace().unwrap_or_default());
    let mut warned = false;
    loop {
        let wanted = memcached_args(ctx, local, pulls).filter(memcached::needs_volumes);
        let container = local
            .spec
            .as_ref()
            .and_then(|s| s.containers.iter().find(|c| c.name == memcached::CONTAINER));
        let (Some(_), Some(container), false) = (wanted, container, deleting(local)) else {
            return Mounts::default();
        };
        match volumes::mount(&ctx.client, local, container, dir).await {
            Ok(mounts) => return mounts,
            Err(e) if !warned => {
                warn!(pod = %name, %namespace, "cannot mount the pod's volumes, retrying: {e:#}");
                warned = true;
            }
            Err(e) => debug!(pod = %name, %namespace, "cannot mount the pod's volumes: {e:#}"),
        }
        tokio::select! {
            () = tokio::time::sleep(Duration::from_secs(2)) => {}
            () = until_deleting(pods) => {}
        }
        *local = newest(local.clone(), pods.borrow_and_update().clone());
    }
}

fn running(ip: Ipv4Addr) -> Running {
    Running {
        ip,
        started: Timestamp::now(),
        exited: None,
        finished: None,
        waiting: Default::default(),
    }
}

/// Whether nothing listens on `ip:port` now (a bind succeeds; std sets `SO_REUSEADDR`, so connections
/// left in TIME_WAIT do not count).
pub(super) fn port_free(ip: Ipv4Addr, port: u16) -> bool {
    std::net::TcpListener::bind((ip, port)).is_ok()
}

/// Waits the kubelet's start delay (cut short by a deletion) unless the pod is being deleted already, and
/// returns the newest version of the pod.
pub(super) async fn after_start_delay(
    ctx: &Context,
    local: Pod,
    pods: &mut watch::Receiver<Pod>,
) -> Pod {
    if deleting(&local) {
        return local;
    }
    tokio::select! {
        () = tokio::time::sleep(ctx.options.pod_start_delay) => {}
        () = until_deleting(pods) => {}
    }
    newest(local, pods.borrow_and_update().clone())
}

/// The pod is gone from the API server: nothing is left to report.
pub(super) struct Gone;

/// Patches the pod's status to what `run` says when it says otherwise; the pod as patched, `None` when
/// nothing was to be said or the patch failed (an outage or a conflict: the next tick tries again).
pub(super) async fn report(
    api: &Api<Pod>,
    local: &Pod,
    run: &Running,
) -> Result<Option<Pod>, Gone> {
    if status::up_to_date(local, run) {
        return Ok(None);
    }
    let patch = status::patch(local, run, Timestamp::now());
    let params = PatchParams {
        field_manager: Some(super::FIELD_MANAGER.to_owned()),
        ..PatchParams::default()
    };
    let name = local.name_any();
    match api
        .patch_status(&name, &params, &Patch::Strategic(&patch))
        .await
    {
        Ok(pod) => Ok(Some(pod)),
        Err(kube::Error::Api(s)) if s.code == 404 => Err(Gone),
        Err(e) => {
            let namespace = local.namespace().unwrap_or_default();
            debug!(pod = %name, %namespace, "status patch failed: {e}");
            Ok(None)
        }
    }
}

pub(super) fn deleting(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_some()
}

pub(super) async fn until_deleting(pods: &mut watch::Receiver<Pod>) {
    while !deleting(&pods.borrow_and_update()) {
        if pods.changed().await.is_err() {
            // The kubelet stopped feeding this pod; wait for the start delay instead.
            std::future::pending::<()>().await;
        }
    }
}

/// The later of two versions of a pod, by resourceVersion (etcd's revision, a number in practice); the
/// newer argument wins when they cannot be compared.
pub(super) fn newest(old: Pod, new: Pod) -> Pod {
    let version = |p: &Pod| p.resource_version().and_then(|v| v.parse::<u64>().ok());
    match (version(&old), version(&new)) {
        (Some(o), Some(n)) if o > n => old,
        _ => new,
    }
}

/// Kills the pod's process, waits the termination delay (at most the pod's grace period), and deletes
/// the pod for good.
pub(super) async fn terminate(
    ctx: &Context,
    api: &Api<Pod>,
    name: &str,
    uid: Option<&str>,
    pod: &Pod,
    server: Option<Process>,
) {
    if let Some(mut process) = server {
        process.stop(Duration::from_secs(2));
    }
    let grace = pod
        .metadata
        .deletion_grace_period_seconds
        .map_or(Duration::MAX, |s| {
            Duration::from_secs(s.max(0).unsigned_abs())
        });
    tokio::time::sleep(ctx.options.pod_termination_delay.min(grace)).await;
    let params = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions {
            uid: uid.map(str::to_owned),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    loop {
        match api.delete(name, &params).await {
            Ok(_) => return,
            // Gone already, or a new pod of the same name: not ours to delete.
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => return,
            Err(e) => {
                debug!(pod = %name, "delete failed, retrying: {e}");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}
