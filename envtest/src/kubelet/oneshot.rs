//! Pods that run to completion with the operator's image, such as the Helm chart's `helm test` pod: the
//! stand-in kubelet has no container runtime, but it has the operator binary the image would run, so it
//! runs that binary as a process with the container's arguments, and reports the pod `Succeeded` or
//! `Failed` by its exit code, as a kubelet reports a pod whose `restartPolicy` is `Never`.
//!
//! Which pods: those whose `restartPolicy` is not `Always` (long-running pods of the operator's image,
//! such as the operator's own Deployment, stay status only: the tests run the operator themselves) and
//! whose first container's image is of one of [`OperatorImage::repositories`] (any tag or digest).
//!
//! What the process gets, as the container would: the arguments after the image's entrypoint (the
//! container's `command` past the binary, then its `args`; a `command` naming another program fails to
//! start, exit code 128, as it would in the operator's distroless image); the container's `env` (plain
//! values, and the downward API's `metadata.name`, `metadata.namespace`, `spec.serviceAccountName`,
//! `spec.nodeName` and `status.podIP`; other sources are left out); `HOSTNAME`, the pod's name; and the
//! pod's ServiceAccount's credentials as a kubeconfig (`KUBECONFIG`) holding a token from the TokenRequest
//! API, its context in the pod's namespace, in place of the mounted token of an in-cluster config, so
//! what the account's RBAC does not allow fails here as in a cluster. A pod with
//! `automountServiceAccountToken: false` gets no credentials, unless the container mounts a volume at the
//! token's directory itself (a projected token, [`has_credentials`]). Its output goes to
//! [`log_path`]; deleting the pod kills it.

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::{Api, ResourceExt};
use serde_json::{Value, json};
use tokio::sync::watch;
use tracing::{info, warn};

use super::Context;
use super::pod::{after_start_delay, deleting, newest, terminate, until_deleting};
use super::status::{self, Running};
use crate::process::Process;

/// The operator's image, as far as the stand-in kubelet runs it: the binary it holds, and the image
/// repositories that name it.
#[derive(Clone, Debug)]
pub struct OperatorImage {
    /// Repositories (`registry.example.com/memcached-operator`), without tag or digest.
    pub repositories: Vec<String>,
    /// The operator binary the image's entrypoint is.
    pub binary: PathBuf,
    /// The API server the processes reach, and the CA that signed its certificate; [`crate::Env`]
    /// sets them to its control plane's.
    pub server: String,
    pub ca_cert: PathBuf,
}

impl OperatorImage {
    /// `binary` for the images of `repositories`, against the control plane's API server.
    pub fn new(binary: impl Into<PathBuf>, repositories: &[&str]) -> OperatorImage {
        OperatorImage {
            repositories: repositories.iter().map(|r| (*r).to_owned()).collect(),
            binary: binary.into(),
            server: String::new(),
            ca_cert: PathBuf::new(),
        }
    }

    /// Whether the kubelet runs `pod` as a one-shot process of the binary.
    pub fn runs(&self, pod: &Pod) -> bool {
        let Some(spec) = pod.spec.as_ref() else {
            return false;
        };
        let once = spec
            .restart_policy
            .as_deref()
            .is_some_and(|p| p != "Always");
        let image = spec.containers.first().and_then(|c| c.image.as_deref());
        once && image.is_some_and(|i| self.repositories.iter().any(|r| r == repository(i)))
    }
}

/// An image reference without its tag and digest.
pub fn repository(image: &str) -> &str {
    let image = image.split_once('@').map_or(image, |(name, _)| name);
    match image.rsplit_once(':') {
        // A colon after the last slash separates the tag; before it, it is a registry's port.
        Some((name, tag)) if !tag.contains('/') => name,
        _ => image,
    }
}

/// Where the process of pod `namespace/name` writes its output, under the kubelet's `log_dir`.
pub fn log_path(log_dir: &Path, namespace: &str, name: &str) -> PathBuf {
    log_dir.join(format!("oneshot-{namespace}-{name}.log"))
}

/// How often the process is looked at.
const TICK: Duration = Duration::from_millis(200);
/// Exit code of a container whose command cannot be started (a runtime's `StartError`).
const START_ERROR: i32 = 128;

/// Runs the pod whose versions arrive on `pods` until its process has exited and the pod's phase says
/// so, or the pod is deleted.
pub async fn run(ctx: Arc<Context>, mut pods: watch::Receiver<Pod>) {
    let mut local = pods.borrow_and_update().clone();
    let (name, namespace, uid) = (
        local.name_any(),
        local.namespace().unwrap_or_default(),
        local.uid().unwrap_or_default(),
    );
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), &namespace);
    local = after_start_delay(&ctx, local, &mut pods).await;
    let Some(ip) = ctx.ips.lease() else {
        warn!(pod = %name, %namespace, "no loopback address left for the pod");
        return;
    };
    let mut run = Running {
        ip: ip.ip(),
        started: Timestamp::now(),
        exited: None,
        finished: None,
        waiting: Default::default(),
    };
    let kubeconfig = ctx
        .options
        .log_dir
        .join("oneshot")
        .join(format!("{uid}.kubeconfig"));
    let mut process = None;
    if !deleting(&local) {
        match start(&ctx, &local, &kubeconfig, &mut pods).await {
            Some(Ok(started)) => process = Some(started),
            Some(Err(code)) => {
                run.exited = Some(code);
                run.finished = Some(Timestamp::now());
            }
            None => {}
        }
        local = newest(local, pods.borrow_and_update().clone());
    }
    let mut reported: Option<&'static str> = None;
    loop {
        if deleting(&local) {
            terminate(&ctx, &api, &name, Some(&uid), &local, process.take()).await;
            let _ = std::fs::remove_file(&kubeconfig);
            return;
        }
        if let (None, Some(child)) = (run.exited, process.as_mut())
            && let Some(exit) = child.exit_status()
        {
            let code = exit
                .code()
                .or_else(|| exit.signal().map(|s| 128 + s))
                .unwrap_or(-1);
            info!(pod = %name, %namespace, "the pod's process exited ({exit})");
            run.exited = Some(code);
            run.finished = Some(Timestamp::now());
            let _ = std::fs::remove_file(&kubeconfig);
        }
        let phase = phase(&run);
        if reported != Some(phase) {
            let params = PatchParams {
                field_manager: Some(super::FIELD_MANAGER.to_owned()),
                ..PatchParams::default()
            };
            let patch = patch(&local, &run, Timestamp::now());
            match api
                .patch_status(&name, &params, &Patch::Strategic(&patch))
                .await
            {
                Ok(pod) => {
                    local = newest(local, pod);
                    reported = Some(phase);
                    if phase != "Running" {
                        // A pod in a terminal phase is deleted at once by the API server: nothing
                        // is left to do.
                        return;
                    }
                }
                Err(kube::Error::Api(s)) if s.code == 404 => return,
                Err(e) => warn!(pod = %name, %namespace, "status patch failed: {e}"),
            }
        }
        tokio::select! {
            changed = pods.changed() => {
                if changed.is_err() {
                    return;
                }
                local = newest(local, pods.borrow_and_update().clone());
            }
            () = tokio::time::sleep(TICK) => {}
        }
    }
}

/// The pod's phase while it runs, and once its process has exited.
fn phase(run: &Running) -> &'static str {
    match run.exited {
        None => "Running",
        Some(0) => "Succeeded",
        Some(_) => "Failed",
    }
}

/// The status patch of [`status::patch`], with the terminal phase once the process has exited and the
/// readiness conditions a kubelet gives a completed pod.
pub fn patch(pod: &Pod, run: &Running, now: Timestamp) -> Value {
    let mut patch = status::patch(pod, run, now);
    if run.exited.is_some() {
        patch["status"]["phase"] = json!(phase(run));
        if let Some(conditions) = patch["status"]["conditions"].as_array_mut() {
            for condition in conditions {
                if condition["type"] == "Ready" || condition["type"] == "ContainersReady" {
                    condition["reason"] = json!("PodCompleted");
                    condition["message"] = Value::Null;
                }
            }
        }
    }
    patch
}

/// Starts the pod's process: `Some(Err(exit code))` when it cannot start, `None` when the pod was deleted
/// while its credentials were awaited.
async fn start(
    ctx: &Context,
    pod: &Pod,
    kubeconfig: &Path,
    pods: &mut watch::Receiver<Pod>,
) -> Option<Result<Process, i32>> {
    let container = pod.spec.as_ref()?.containers.first()?;
    let log = log_path(
        &ctx.options.log_dir,
        &pod.namespace().unwrap_or_default(),
        &pod.name_any(),
    );
    start_container(ctx, pod, container, kubeconfig, pods, &log, &|s| {
        s.to_owned()
    })
    .await
}

/// Starts `container` of `pod` as a process of the operator binary, as [module docs](self) say, its
/// output to `log`; `map` rewrites each argument and environment value (paths of the pod's volumes, the
/// pod's loopback). `Some(Err(exit code))` when it cannot start, `None` when the pod was deleted while
/// its credentials were awaited or no operator binary is known.
pub(super) async fn start_container(
    ctx: &Context,
    pod: &Pod,
    container: &Container,
    kubeconfig: &Path,
    pods: &mut watch::Receiver<Pod>,
    log: &Path,
    map: &(dyn Fn(&str) -> String + Sync),
) -> Option<Result<Process, i32>> {
    let options = ctx.options.operator.as_ref()?;
    let (name, namespace) = (pod.name_any(), pod.namespace().unwrap_or_default());
    let spec = pod.spec.as_ref()?;
    let Some(args) = arguments(container, &options.binary) else {
        warn!(pod = %name, %namespace, "the container's command is not the operator binary");
        return Some(Err(START_ERROR));
    };
    let args: Vec<String> = args.iter().map(|a| map(a)).collect();
    let account = spec.service_account_name.as_deref().unwrap_or("default");
    let mut cmd = Command::new(&options.binary);
    cmd.args(&args)
        .env("HOSTNAME", &name)
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("KUBERNETES_SERVICE_PORT");
    if has_credentials(pod, container) {
        let token = credentials(ctx, pod, account, pods).await?;
        let user = format!("system:serviceaccount:{namespace}:{account}");
        if let Some(dir) = kubeconfig.parent() {
            let _ = std::fs::create_dir_all(dir);
        }
        if let Err(e) = crate::kubeconfig::write(
            kubeconfig,
            &options.server,
            &options.ca_cert,
            (&user, &token),
            Some(&namespace),
        ) {
            warn!(pod = %name, %namespace, "cannot write the pod's kubeconfig: {e:#}");
            return Some(Err(START_ERROR));
        }
        cmd.env("KUBECONFIG", kubeconfig);
    } else {
        // No token: neither a kubeconfig nor an in-cluster configuration.
        cmd.env("KUBECONFIG", kubeconfig.with_extension("absent"));
    }
    for (key, value) in environment(pod, container) {
        cmd.env(key, map(&value));
    }
    match Process::start(&format!("{namespace}/{name}/{}", container.name), cmd, log) {
        Ok(process) => {
            info!(pod = %name, %namespace, pid = process.pid(), "running {} {}", options.binary.display(), args.join(" "));
            Some(Ok(process))
        }
        Err(e) => {
            warn!(pod = %name, %namespace, "cannot start the pod's process: {e:#}");
            Some(Err(START_ERROR))
        }
    }
}

/// Where every Kubernetes client looks for a pod's token.
const TOKEN_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// Whether `container` gets its ServiceAccount's credentials: the pod mounts the token into every
/// container (`automountServiceAccountToken` not `false`), or the container mounts a volume at the
/// token's directory itself (a projected token, as the proxy's configuration writer has).
pub fn has_credentials(pod: &Pod, container: &Container) -> bool {
    let automount = pod
        .spec
        .as_ref()
        .is_some_and(|s| s.automount_service_account_token != Some(false));
    let mounted = container
        .volume_mounts
        .iter()
        .flatten()
        .any(|m| m.mount_path.trim_end_matches('/') == TOKEN_DIR);
    automount || mounted
}

/// A token of the pod's ServiceAccount, retried every two seconds (as a kubelet keeps the pod in
/// `ContainerCreating` while it cannot get one); `None` once the pod is deleted.
async fn credentials(
    ctx: &Context,
    pod: &Pod,
    account: &str,
    pods: &mut watch::Receiver<Pod>,
) -> Option<String> {
    let namespace = pod.namespace().unwrap_or_default();
    let mut warned = false;
    loop {
        match crate::install::service_account_token(&ctx.client, &namespace, account).await {
            Ok(token) => return Some(token),
            Err(e) if !warned => {
                warn!(pod = %pod.name_any(), %namespace, "no token for the pod yet: {e:#}");
                warned = true;
            }
            Err(_) => {}
        }
        tokio::select! {
            () = tokio::time::sleep(Duration::from_secs(2)) => {}
            () = until_deleting(pods) => return None,
        }
    }
}

/// The process's arguments: the container's `command` past the entrypoint, then its `args`; `None` when
/// the command names a program other than `binary` (by file name: the image's path differs from the
/// machine's).
pub fn arguments(container: &Container, binary: &Path) -> Option<Vec<String>> {
    let mut args = Vec::new();
    if let Some((program, rest)) = container
        .command
        .as_deref()
        .and_then(<[String]>::split_first)
    {
        if Path::new(program).file_name() != binary.file_name() {
            return None;
        }
        args.extend(rest.iter().cloned());
    }
    args.extend(container.args.iter().flatten().cloned());
    Some(args)
}

/// The container's environment as the kubelet would set it, as far as the stand-in knows the values.
pub fn environment(pod: &Pod, container: &Container) -> Vec<(String, String)> {
    let spec = pod.spec.as_ref();
    container
        .env
        .iter()
        .flatten()
        .filter_map(|var| {
            let value = match (&var.value, &var.value_from) {
                (Some(value), _) => value.clone(),
                (None, Some(from)) => {
                    let path = from.field_ref.as_ref()?.field_path.as_str();
                    match path {
                        "metadata.name" => pod.name_any(),
                        "metadata.namespace" => pod.namespace().unwrap_or_default(),
                        "spec.serviceAccountName" => spec?.service_account_name.clone()?,
                        "spec.nodeName" => spec?.node_name.clone()?,
                        "status.podIP" => pod.status.as_ref()?.pod_ip.clone()?,
                        _ => return None,
                    }
                }
                (None, None) => String::new(),
            };
            Some((var.name.clone(), value))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(restart: &str, image: &str, command: Option<Vec<&str>>) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "t", "namespace": "ns"},
            "spec": {
                "restartPolicy": restart,
                "serviceAccountName": "sa",
                "nodeName": "node-0",
                "containers": [{
                    "name": "check", "image": image, "command": command,
                    "args": ["check", "--timeout=1m"],
                    "env": [
                        {"name": "A", "value": "1"},
                        {"name": "NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                        {"name": "SA", "valueFrom": {"fieldRef": {"fieldPath": "spec.serviceAccountName"}}},
                        {"name": "S", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
                    ],
                }],
            },
        }))
        .unwrap()
    }

    #[test]
    fn only_pods_that_run_once_with_the_operators_image() {
        let image = OperatorImage::new("/bin/memcached-operator", &["registry.example.com/op"]);
        assert!(image.runs(&pod("Never", "registry.example.com/op:v1", None)));
        assert!(image.runs(&pod("OnFailure", "registry.example.com/op@sha256:ab", None)));
        assert!(!image.runs(&pod("Always", "registry.example.com/op:v1", None)));
        assert!(!image.runs(&pod("Never", "registry.example.com/other:v1", None)));
        assert_eq!(repository("localhost:5000/op:v1"), "localhost:5000/op");
        assert_eq!(repository("localhost:5000/op"), "localhost:5000/op");
    }

    #[test]
    fn the_container_arguments_and_environment_reach_the_process() {
        let binary = Path::new("/target/debug/memcached-operator");
        let p = pod("Never", "op", Some(vec!["/memcached-operator"]));
        let container = &p.spec.as_ref().unwrap().containers[0];
        assert_eq!(
            arguments(container, binary).unwrap(),
            ["check", "--timeout=1m"]
        );
        let p = pod("Never", "op", Some(vec!["/bin/sh", "-c"]));
        assert_eq!(
            arguments(&p.spec.as_ref().unwrap().containers[0], binary),
            None
        );
        let p = pod("Never", "op", None);
        let env = environment(&p, &p.spec.as_ref().unwrap().containers[0]);
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        assert_eq!(env, [("A", "1"), ("NS", "ns"), ("SA", "sa")]);
    }

    #[test]
    fn an_exited_process_ends_the_pod_in_a_terminal_phase() {
        let p = pod("Never", "op", None);
        let mut run = Running {
            ip: "127.1.0.9".parse().unwrap(),
            started: Timestamp::now(),
            exited: None,
            finished: None,
            waiting: Default::default(),
        };
        assert_eq!(
            patch(&p, &run, Timestamp::now())["status"]["phase"],
            "Running"
        );
        for (code, phase) in [(0, "Succeeded"), (1, "Failed")] {
            run.exited = Some(code);
            let patch = patch(&p, &run, Timestamp::now());
            assert_eq!(patch["status"]["phase"], phase);
            let state = &patch["status"]["containerStatuses"][0]["state"]["terminated"];
            assert_eq!(state["exitCode"], code);
            let ready = patch["status"]["conditions"]
                .as_array()
                .unwrap()
                .iter()
                .find(|c| c["type"] == "Ready")
                .unwrap()
                .clone();
            assert_eq!(ready["status"], "False");
            assert_eq!(ready["reason"], "PodCompleted");
        }
    }
}
