//! One pod's life on the stand-in kubelet: a task per pod, fed the pod's latest version by the kubelet's
//! single watch.
//!
//! Start: after the start delay, take a loopback IP, optionally start memcached on it, then report the
//! pod Running. While it runs: re-report whenever what the status should say changes (a readiness gate
//! passes or fails, the process exits). Deletion: kill the process, wait the termination delay, delete
//! the pod for good (grace period 0, preconditioned on its uid so a successor of the same name is safe).

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use kube::{Api, ResourceExt};
use tokio::sync::watch;
use tracing::{debug, info, warn};

use super::status::{self, Running};
use super::{Context, memcached};
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

    if !deleting(&local) {
        tokio::select! {
            () = tokio::time::sleep(ctx.options.pod_start_delay) => {}
            () = until_deleting(&mut pods) => {}
        }
        local = newest(local, pods.borrow_and_update().clone());
    }
    let Some(ip) = ctx.ips.lease() else {
        warn!(pod = %name, %namespace, "no loopback address left for the pod");
        return;
    };
    let mut run = Running {
        ip: ip.ip(),
        started: Timestamp::now(),
        exited: None,
        finished: None,
    };
    let mut server = None;
    if let (Some(binary), Some(args), false) = (
        &ctx.options.memcached,
        memcached::server_args(&local),
        deleting(&local),
    ) {
        let log = ctx
            .options
            .log_dir
            .join(format!("memcached-{namespace}-{name}.log"));
        match memcached::start(binary, run.ip, &args, &log) {
            Ok(mut process) => {
                let listening =
                    wait_for_listener(run.ip.into(), args.port, Duration::from_secs(5)).await;
                if let Err(e) = listening {
                    warn!(pod = %name, %namespace, "memcached does not listen: {e}");
                    process.stop(Duration::from_secs(1));
                }
                server = Some(process);
            }
            Err(e) => {
                warn!(pod = %name, %namespace, "cannot start memcached: {e:#}");
                run.exited = Some(-1);
                run.finished = Some(Timestamp::now());
            }
        }
    }
    let tick = if server.is_some() {
        Duration::from_millis(250)
    } else {
        Duration::from_secs(1)
    };

    loop {
        if deleting(&local) {
            terminate(&ctx, &api, &name, uid.as_deref(), &local, server.take()).await;
            return;
        }
        if let (None, Some(process)) = (run.exited, server.as_mut())
            && let Some(exit) = process.exit_status()
        {
            info!(pod = %name, %namespace, "memcached exited ({exit}); the pod is not ready");
            run.exited = Some(exit.code().unwrap_or(-1));
            run.finished = Some(Timestamp::now());
        }
        if !status::up_to_date(&local, &run) {
            let patch = status::patch(&local, &run, Timestamp::now());
            let params = PatchParams {
                field_manager: Some(super::FIELD_MANAGER.to_owned()),
                ..PatchParams::default()
            };
            match api
                .patch_status(&name, &params, &Patch::Strategic(&patch))
                .await
            {
                Ok(pod) => local = newest(local, pod),
                Err(kube::Error::Api(s)) if s.code == 404 => return,
                // An outage or a conflict: the next tick tries again.
                Err(e) => debug!(pod = %name, %namespace, "status patch failed: {e}"),
            }
        }
        tokio::select! {
            changed = pods.changed() => {
                if changed.is_err() {
                    return;
                }
                local = newest(local, pods.borrow_and_update().clone());
            }
            () = tokio::time::sleep(tick) => {}
        }
    }
}

fn deleting(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_some()
}

async fn until_deleting(pods: &mut watch::Receiver<Pod>) {
    while !deleting(&pods.borrow_and_update()) {
        if pods.changed().await.is_err() {
            // The kubelet stopped feeding this pod; wait for the start delay instead.
            std::future::pending::<()>().await;
        }
    }
}

/// The later of two versions of a pod, by resourceVersion (etcd's revision, a number in practice); the
/// newer argument wins when they cannot be compared.
fn newest(old: Pod, new: Pod) -> Pod {
    let version = |p: &Pod| p.resource_version().and_then(|v| v.parse::<u64>().ok());
    match (version(&old), version(&new)) {
        (Some(o), Some(n)) if o > n => old,
        _ => new,
    }
}

/// Kills the pod's process, waits the termination delay (at most the pod's grace period), and deletes
/// the pod for good.
async fn terminate(
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
