//! The cluster DNS of the stand-in's pods, as far as the proxy pods need it: the per-pod names a headless
//! Service gives the pods of a StatefulSet (`<hostname>.<subdomain>.<namespace>.svc`, and the same under
//! `.cluster.local`), in a hosts file the kubelet keeps.
//!
//! A StatefulSet's published server list holds those names, and so does the proxy's route configuration;
//! memcached's proxy resolves a backend's name each time it connects (`getaddrinfo`). A real cluster's DNS
//! answers for a pod once it is ready (the operator's headless Service does not publish pods that are
//! not), with the pod's current IP: the kubelet does the same here. Each proxy's memcached runs in a mount
//! namespace of its own where this file is bind-mounted over `/etc/hosts` ([`Hosts::wrap`]), which
//! needs root (`unshare --mount`); without it the proxy runs as is and such names do not resolve for it.
//!
//! The file is rewritten in place (a bind mount holds the file, not its name), only when what it says
//! changes.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use tracing::warn;

/// The hosts file and what it holds, by pod uid.
pub struct Hosts {
    path: PathBuf,
    /// The machine's own `/etc/hosts`, kept at the top (`localhost` and the like).
    base: String,
    entries: Mutex<BTreeMap<String, String>>,
}

impl Hosts {
    /// A hosts file at `path`, holding the machine's `/etc/hosts` until pods are added.
    pub fn new(path: PathBuf) -> Self {
        let base = std::fs::read_to_string("/etc/hosts")
            .unwrap_or_else(|_| "127.0.0.1 localhost\n".to_owned());
        let hosts = Self {
            path,
            base,
            entries: Mutex::default(),
        };
        hosts.write(&BTreeMap::new());
        hosts
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Takes in the newest version of `pod`: its names resolve while it is ready and has an IP.
    pub fn observe(&self, pod: &Pod) {
        let uid = pod.uid().unwrap_or_default();
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        let before = entries.clone();
        match line(pod) {
            Some(line) => entries.insert(uid, line),
            None => entries.remove(&uid),
        };
        if *entries != before {
            self.write(&entries);
        }
    }

    /// Drops the pods whose uid `keep` refuses (deleted, or gone while the watch was down).
    pub fn retain(&self, keep: impl Fn(&str) -> bool) {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        let before = entries.len();
        entries.retain(|uid, _| keep(uid));
        if entries.len() != before {
            self.write(&entries);
        }
    }

    /// `program` with `args`, in a mount namespace where this file is `/etc/hosts` (as root); as is
    /// otherwise.
    pub fn wrap(&self, program: &Path, args: &[String]) -> Command {
        // SAFETY: geteuid has no preconditions and cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            warn!("not root: the proxy cannot have the pods' names in its /etc/hosts");
            let mut cmd = Command::new(program);
            cmd.args(args);
            return cmd;
        }
        let mut cmd = Command::new("unshare");
        cmd.args(["--mount", "--", "sh", "-c"])
            .arg("mount --bind \"$0\" /etc/hosts && exec \"$@\"")
            .arg(&self.path)
            .arg(program)
            .args(args);
        cmd
    }

    fn write(&self, entries: &BTreeMap<String, String>) {
        let mut text = self.base.clone();
        if !text.ends_with('\n') {
            text.push('\n');
        }
        text.push_str("# the stand-in kubelet's ready StatefulSet pods\n");
        for line in entries.values() {
            text.push_str(line);
        }
        // In place, in one write: a reader sees the old or the new names, the file never replaced.
        let written = std::fs::OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(true)
            .open(&self.path)
            .and_then(|mut file| file.write_all(text.as_bytes()));
        if let Err(e) = written {
            warn!("cannot write {}: {e}", self.path.display());
        }
    }
}

/// `<ip> <hostname>.<subdomain>.<namespace>.svc <same>.cluster.local` for a ready pod with a hostname,
/// subdomain and IP.
fn line(pod: &Pod) -> Option<String> {
    if pod.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let spec = pod.spec.as_ref()?;
    let (hostname, subdomain) = (spec.hostname.as_deref()?, spec.subdomain.as_deref()?);
    let status = pod.status.as_ref()?;
    let ready = status
        .conditions
        .iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    let ip = status.pod_ip.as_deref().filter(|ip| !ip.is_empty())?;
    let name = format!(
        "{hostname}.{subdomain}.{}.svc",
        pod.namespace().unwrap_or_default()
    );
    ready.then(|| format!("{ip} {name} {name}.cluster.local\n"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(uid: &str, ip: &str, ready: bool) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "cache-1", "namespace": "ns", "uid": uid},
            "spec": {"hostname": "cache-1", "subdomain": "cache-headless", "containers": []},
            "status": {
                "podIP": ip,
                "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}],
            },
        }))
        .unwrap()
    }

    #[test]
    fn a_ready_statefulset_pod_resolves_to_its_current_ip_and_a_replaced_one_does_not() {
        let dir = std::env::temp_dir().join(format!("dns-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let hosts = Hosts::new(dir.join("hosts"));
        let read = || std::fs::read_to_string(hosts.path()).unwrap();
        hosts.observe(&pod("a", "127.1.0.5", true));
        assert!(read().contains(
            "127.1.0.5 cache-1.cache-headless.ns.svc cache-1.cache-headless.ns.svc.cluster.local\n"
        ));
        // The replacement, same name, not ready yet: the old one is gone, the new one not listed.
        hosts.retain(|uid| uid != "a");
        hosts.observe(&pod("b", "127.1.0.9", false));
        assert!(!read().contains("cache-1.cache-headless"));
        hosts.observe(&pod("b", "127.1.0.9", true));
        assert!(read().contains("127.1.0.9 cache-1.cache-headless.ns.svc "));
        assert!(read().starts_with(&hosts.base));
        let _ = std::fs::remove_dir_all(dir);
    }
}
