//! Proxy pods (the operator's `spec.proxy`): a container named `proxy` running memcached in proxy mode
//! (`-o proxy_config=...`), beside containers of the operator's image (its configuration writer, an init
//! container and a sidecar). When the kubelet knows a proxy-capable memcached
//! ([`super::KubeletOptions::proxy_memcached`], memcached 1.6.23 or later built with `--enable-proxy`) and
//! the operator's binary ([`super::oneshot::OperatorImage`]), it runs such a pod for real:
//!
//! - each `emptyDir` volume is a directory of the pod's own under the kubelet's directory, and paths
//!   under its mount path in arguments and environment values are mapped there; the proxy container's
//!   Secret volumes are written as for memcached pods ([`super::volumes`]);
//! - the pod's loopback (`127.0.0.1:` in a value) is the pod's IP: the stand-in's pods share the
//!   machine's network, each on an address of its own;
//! - init containers of the operator's image run in order as operator processes
//!   ([`super::oneshot::start_container`]: its arguments, environment and a kubeconfig of the pod's
//!   ServiceAccount), each to completion (one that fails runs again after two seconds, as a kubelet
//!   restarts it), before anything else starts;
//! - then the `proxy` container: the proxy-capable memcached on the pod's IP and container port (its
//!   `-l` addresses, a plain loopback listener beside a TLS port included, moved to the pod's IP), with
//!   the container's other arguments (paths mapped), `-U 0` always, with the kubelet's hosts file as its
//!   `/etc/hosts` ([`super::dns`]);
//! - then the other containers of the operator's image, as long-running processes.
//!
//! The pod is Running and Ready once memcached listens; memcached's exit makes it not ready, the other
//! processes' exits are logged. Nothing is restarted (restart counts stay 0). Deleting the pod stops
//! every process, memcached last. Other pods with a `proxy` container, and every proxy pod when the
//! kubelet knows no proxy-capable memcached, are status only ([`super::pod`]): ready, serving nothing.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::{Api, ResourceExt};
use tokio::sync::watch;
use tracing::{info, warn};

use super::Context;
use super::ip::IpLease;
use super::oneshot::{repository, start_container};
use super::pod::{
    Gone, after_start_delay, deleting, newest, port_free, report, terminate, until_deleting,
};
use super::status::Running;
use super::volumes;
use crate::net::wait_for_listener;
use crate::process::Process;

/// The container that runs memcached in proxy mode.
pub const CONTAINER: &str = "proxy";

/// Whether `pod` is a proxy pod: its container [`CONTAINER`] runs memcached with `proxy_config`.
pub fn is_proxy_pod(pod: &Pod) -> bool {
    proxy_container(pod).is_some_and(|c| words(c).iter().any(|w| w.contains("proxy_config=")))
}

fn proxy_container(pod: &Pod) -> Option<&Container> {
    pod.spec
        .as_ref()?
        .containers
        .iter()
        .find(|c| c.name == CONTAINER)
}

/// The container's command past the program, then its arguments.
fn words(container: &Container) -> Vec<String> {
    let command = container.command.iter().flatten().skip(1);
    command
        .chain(container.args.iter().flatten())
        .cloned()
        .collect()
}

/// The port memcached listens on: the container's first port, else its `-p`, else 11211.
pub fn port(container: &Container) -> u16 {
    let declared = container
        .ports
        .iter()
        .flatten()
        .next()
        .and_then(|p| u16::try_from(p.container_port).ok());
    let words = words(container);
    let flag = words
        .windows(2)
        .find(|w| w[0] == "-p")
        .and_then(|w| w[1].parse().ok());
    declared.or(flag).unwrap_or(11211)
}

/// memcached's command line for the container on `ip`: `-U 0 -l <listen> -p <port>`, then the container's
/// arguments without its own `-l`, `-p` and `-U`, each through `map`. `<listen>` is the container's `-l`
/// on the pod's IP ([`listen_on`]), or the pod's IP.
pub fn command_line(
    container: &Container,
    ip: Ipv4Addr,
    map: &dyn Fn(&str) -> String,
) -> Vec<String> {
    let words = words(container);
    let listen = words
        .windows(2)
        .find(|w| w[0] == "-l")
        .map_or_else(|| ip.to_string(), |w| listen_on(&w[1], ip));
    let mut line: Vec<String> = ["-U", "0", "-l", &listen, "-p", &port(container).to_string()]
        .map(str::to_owned)
        .to_vec();
    let mut rest = words.iter();
    while let Some(word) = rest.next() {
        if matches!(word.as_str(), "-l" | "-p" | "-U") {
            rest.next();
            continue;
        }
        line.push(map(word));
    }
    line
}

/// A `-l` value (`[notls:|btls:|mtls:][proto[..]:][tag[..]:]<address>[:<port>]`, comma-separated) on
/// the pod's IP: every address (`*`) and the pod's loopback (`127.0.0.1`) become the pod's IP, which the
/// stand-in's pods listen on instead (they share the machine's network); the prefixes and ports stay.
pub fn listen_on(value: &str, ip: Ipv4Addr) -> String {
    value
        .split(',')
        .map(|entry| {
            let (prefix, rest) = split_prefixes(entry);
            let (host, port) = match rest.rsplit_once(':') {
                Some((host, port)) if !host.contains(':') => (host, Some(port)),
                _ => (rest, None),
            };
            let host = match host {
                "*" | "127.0.0.1" => ip.to_string(),
                other => other.to_owned(),
            };
            let port = port.map(|p| format!(":{p}")).unwrap_or_default();
            format!("{prefix}{host}{port}")
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// An entry of `-l` as (its TLS, protocol and tag prefixes, the address with its port).
fn split_prefixes(entry: &str) -> (&str, &str) {
    let mut rest = entry;
    for tls in ["notls:", "btls:", "mtls:"] {
        if let Some(after) = rest.strip_prefix(tls) {
            rest = after;
            break;
        }
    }
    for bracketed in ["proto[", "tag["] {
        if rest.starts_with(bracketed)
            && let Some(end) = rest.find("]:")
        {
            rest = &rest[end + 2..];
        }
    }
    (&entry[..entry.len() - rest.len()], rest)
}

/// Rewrites a pod's paths and loopback to the stand-in's: each (mount path, local directory) of the
/// pod's `emptyDir` volumes where a path starts (at the start, after `=`, `,` or `:`), and `127.0.0.1:`
/// to the pod's IP.
#[derive(Clone, Debug)]
pub struct PodMap {
    pub dirs: Vec<(String, PathBuf)>,
    pub ip: Ipv4Addr,
}

impl PodMap {
    pub fn map(&self, value: &str) -> String {
        let mut out = value.replace("127.0.0.1:", &format!("{}:", self.ip));
        for (mount, local) in &self.dirs {
            out = replace_path(
                &out,
                mount.trim_end_matches('/'),
                &local.display().to_string(),
            );
        }
        out
    }
}

/// `text` with `from` replaced by `to` where it is a whole path or a path's leading directory.
fn replace_path(text: &str, from: &str, to: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < text.len() {
        let at_start = i == 0 || matches!(text.as_bytes()[i - 1], b'=' | b',' | b':');
        let rest = &text[i..];
        let ends = |r: &str| r.is_empty() || r.starts_with(['/', ',', ':']);
        if at_start && rest.starts_with(from) && ends(&rest[from.len()..]) {
            out.push_str(to);
            i += from.len();
            continue;
        }
        let c = rest.chars().next().unwrap_or_default();
        out.push(c);
        i += c.len_utf8();
    }
    out
}

/// The pod's `emptyDir` volumes as mounted by `container`: (mount path, `dir/<volume>`).
fn empty_dirs(pod: &Pod, container: &Container, dir: &Path) -> Vec<(String, PathBuf)> {
    let volumes = pod
        .spec
        .as_ref()
        .and_then(|s| s.volumes.as_deref())
        .unwrap_or_default();
    container
        .volume_mounts
        .iter()
        .flatten()
        .filter(|m| {
            volumes
                .iter()
                .any(|v| v.name == m.name && v.empty_dir.is_some())
        })
        .map(|m| (m.mount_path.clone(), dir.join(&m.name)))
        .collect()
}

/// What one running proxy pod holds.
struct Processes {
    memcached: Option<Process>,
    sidecars: Vec<Process>,
}

/// Runs the proxy pod whose versions arrive on `pods` until it is deleted or the sender goes away.
pub async fn run(ctx: Arc<Context>, mut pods: watch::Receiver<Pod>) {
    let mut local = pods.borrow_and_update().clone();
    let (name, namespace, uid) = (
        local.name_any(),
        local.namespace().unwrap_or_default(),
        local.uid().unwrap_or_default(),
    );
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), &namespace);
    local = after_start_delay(&ctx, local, &mut pods).await;
    let dir = ctx.options.log_dir.join("volumes").join(&uid);
    let Some(container) = proxy_container(&local).cloned() else {
        return;
    };
    let Some(lease) = lease(&ctx, port(&container)) else {
        warn!(pod = %name, %namespace, "no loopback address with the proxy's port free");
        return;
    };
    let mut run = Running {
        ip: lease.ip(),
        started: Timestamp::now(),
        exited: None,
        finished: None,
        waiting: Default::default(),
    };
    let mut processes = Processes {
        memcached: None,
        sidecars: Vec::new(),
    };
    if !deleting(&local) {
        match start(&ctx, &local, &container, &lease, &dir, &mut pods).await {
            Some(started) => processes = started,
            None => run.exited = Some(-1),
        }
        local = newest(local, pods.borrow_and_update().clone());
    }
    loop {
        if deleting(&local) {
            for mut sidecar in processes.sidecars.drain(..) {
                sidecar.stop(Duration::from_secs(2));
            }
            terminate(
                &ctx,
                &api,
                &name,
                Some(&uid),
                &local,
                processes.memcached.take(),
            )
            .await;
            let _ = std::fs::remove_dir_all(&dir);
            return;
        }
        if let (None, Some(process)) = (run.exited, processes.memcached.as_mut())
            && let Some(exit) = process.exit_status()
        {
            info!(pod = %name, %namespace, "the proxy's memcached exited ({exit}); the pod is not ready");
            run.exited = Some(exit.code().unwrap_or(-1));
            run.finished = Some(Timestamp::now());
        }
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
            () = tokio::time::sleep(Duration::from_millis(250)) => {}
        }
    }
}

/// A loopback address whose `port` nothing on this machine listens on.
fn lease(ctx: &Context, port: u16) -> Option<IpLease> {
    let mut passed_over = Vec::new();
    for _ in 0..16 {
        let lease = ctx.ips.lease()?;
        if port_free(lease.ip(), port) {
            return Some(lease);
        }
        passed_over.push(lease);
    }
    None
}

/// The operator's-image containers of `list` (by image repository).
fn operator_containers<'a>(ctx: &Context, list: &'a [Container]) -> Vec<&'a Container> {
    let Some(operator) = ctx.options.operator.as_ref() else {
        return Vec::new();
    };
    list.iter()
        .filter(|c| {
            let image = c.image.as_deref().unwrap_or_default();
            operator.repositories.iter().any(|r| r == repository(image))
        })
        .collect()
}

/// Init containers to completion, memcached until it listens, then the sidecars; `None` when the pod
/// was deleted meanwhile or memcached cannot start.
async fn start(
    ctx: &Context,
    pod: &Pod,
    container: &Container,
    lease: &IpLease,
    dir: &Path,
    pods: &mut watch::Receiver<Pod>,
) -> Option<Processes> {
    let (name, namespace) = (pod.name_any(), pod.namespace().unwrap_or_default());
    let spec = pod.spec.as_ref()?;
    let kubeconfig = dir.join("kubeconfig");
    let log = |c: &Container| {
        ctx.options
            .log_dir
            .join(format!("proxy-{namespace}-{name}-{}.log", c.name))
    };
    let map_for = |c: &Container| {
        let dirs = empty_dirs(pod, c, dir);
        for (_, local) in &dirs {
            let _ = std::fs::create_dir_all(local);
        }
        PodMap {
            dirs,
            ip: lease.ip(),
        }
    };
    for init in operator_containers(ctx, spec.init_containers.as_deref().unwrap_or_default()) {
        let map = map_for(init);
        loop {
            let started = start_container(ctx, pod, init, &kubeconfig, pods, &log(init), &|v| {
                map.map(v)
            })
            .await?;
            if let Ok(mut process) = started {
                let code = wait_exit(&mut process, pods).await?;
                if code == 0 {
                    break;
                }
            }
            warn!(pod = %name, %namespace, "init container {} failed; running it again", init.name);
            tokio::select! {
                () = tokio::time::sleep(Duration::from_secs(2)) => {}
                () = until_deleting(pods) => return None,
            }
        }
    }
    let binary = ctx.options.proxy_memcached.as_ref()?;
    let map = map_for(container);
    // Its Secret volumes (the instance's certificate, with TLS), as a kubelet mounts them.
    let secrets = match volumes::mount(&ctx.client, pod, container, &dir.join("secrets")).await {
        Ok(mounts) => mounts,
        Err(e) => {
            warn!(pod = %name, %namespace, "the proxy's volumes do not mount: {e:#}");
            return None;
        }
    };
    let mut args = command_line(container, lease.ip(), &|v| secrets.map(&map.map(v)));
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        args.extend(["-u".to_owned(), "root".to_owned()]);
    }
    let cmd = ctx.dns.wrap(binary, &args);
    let port = port(container);
    let memcached = match Process::start(
        &format!("proxy {}:{port}", lease.ip()),
        cmd,
        &log(container),
    ) {
        Ok(process) => process,
        Err(e) => {
            warn!(pod = %name, %namespace, "cannot start the proxy: {e:#}");
            return None;
        }
    };
    if let Err(e) = wait_for_listener(lease.ip().into(), port, Duration::from_secs(5)).await {
        warn!(pod = %name, %namespace, "the proxy does not listen: {e}");
    }
    let mut sidecars = Vec::new();
    for sidecar in operator_containers(ctx, &spec.containers) {
        let map = map_for(sidecar);
        match start_container(ctx, pod, sidecar, &kubeconfig, pods, &log(sidecar), &|v| {
            map.map(v)
        })
        .await
        {
            Some(Ok(process)) => sidecars.push(process),
            Some(Err(code)) => {
                warn!(pod = %name, %namespace, "sidecar {} cannot start ({code})", sidecar.name)
            }
            None => {
                return Some(Processes {
                    memcached: Some(memcached),
                    sidecars,
                });
            }
        }
    }
    Some(Processes {
        memcached: Some(memcached),
        sidecars,
    })
}

/// The process's exit code once it exits; `None` (the process stopped) when the pod is deleted first.
async fn wait_exit(process: &mut Process, pods: &mut watch::Receiver<Pod>) -> Option<i32> {
    loop {
        if let Some(exit) = process.exit_status() {
            return Some(exit.code().unwrap_or(-1));
        }
        if deleting(&pods.borrow()) {
            process.stop(Duration::from_secs(2));
            return None;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod() -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "ns"},
            "spec": {
                "volumes": [{"name": "config", "emptyDir": {}}, {"name": "api-access", "projected": {"sources": []}}],
                "containers": [{
                    "name": "proxy", "command": ["memcached"],
                    "args": ["-p", "11211", "-o", "proxy_config=routelib,proxy_arg=/etc/memcached-proxy/proxy.lua",
                             "-P", "/etc/memcached-proxy/memcached.pid"],
                    "ports": [{"name": "memcached", "containerPort": 11211}],
                    "volumeMounts": [{"name": "config", "mountPath": "/etc/memcached-proxy"}],
                }, {
                    "name": "proxy-config",
                    "volumeMounts": [{"name": "config", "mountPath": "/etc/memcached-proxy"},
                                     {"name": "api-access", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}],
                }],
            },
        }))
        .unwrap()
    }

    #[test]
    fn the_proxy_runs_on_the_pod_ip_with_its_empty_dir_mapped() {
        let pod = pod();
        assert!(is_proxy_pod(&pod));
        let container = proxy_container(&pod).unwrap();
        let ip = Ipv4Addr::new(127, 1, 0, 7);
        let map = PodMap {
            dirs: empty_dirs(&pod, container, Path::new("/k/uid")),
            ip,
        };
        assert_eq!(
            command_line(container, ip, &|v| map.map(v)).join(" "),
            "-U 0 -l 127.1.0.7 -p 11211 -o proxy_config=routelib,proxy_arg=/k/uid/config/proxy.lua \
             -P /k/uid/config/memcached.pid"
        );
        assert_eq!(map.map("--dir=/etc/memcached-proxy"), "--dir=/k/uid/config");
        assert_eq!(map.map("/etc/memcached-proxyx"), "/etc/memcached-proxyx");
        assert_eq!(map.map("127.0.0.1:11211"), "127.1.0.7:11211");
    }

    #[test]
    fn a_tls_proxy_keeps_its_plain_loopback_listener_on_the_pod_ip() {
        let mut pod = pod();
        let container = &mut pod.spec.as_mut().unwrap().containers[0];
        let args = container.args.as_mut().unwrap();
        args.extend(["-Z", "-l", "*,notls:127.0.0.1:11299"].map(str::to_owned));
        let ip = Ipv4Addr::new(127, 1, 0, 7);
        let line = command_line(&pod.spec.unwrap().containers[0], ip, &|v| v.to_owned());
        assert_eq!(
            line[..6].join(" "),
            "-U 0 -l 127.1.0.7,notls:127.1.0.7:11299 -p 11211"
        );
        assert!(line.contains(&"-Z".to_owned()));
        assert_eq!(line.iter().filter(|w| *w == "-l").count(), 1);
        assert_eq!(
            listen_on("[::1]:5,notls:10.0.0.1", ip),
            "[::1]:5,notls:10.0.0.1"
        );
        assert_eq!(
            listen_on(
                "mtls:tag[client]:*:11211,btls:*:11298,notls:127.0.0.1:11299",
                ip
            ),
            "mtls:tag[client]:127.1.0.7:11211,btls:127.1.0.7:11298,notls:127.1.0.7:11299"
        );
    }

    #[test]
    fn a_memcached_container_or_one_without_proxy_config_is_no_proxy() {
        let mut pod = pod();
        pod.spec.as_mut().unwrap().containers[0].args = Some(vec!["-p".into(), "11211".into()]);
        assert!(!is_proxy_pod(&pod));
        pod.spec.as_mut().unwrap().containers.remove(0);
        assert!(!is_proxy_pod(&pod));
    }
}
