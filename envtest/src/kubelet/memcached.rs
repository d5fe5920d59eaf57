//! A real memcached for a pod: the container named `memcached`, run as a local process on the pod's
//! loopback IP and container port, so that clients of the operator (its statistics collector, tests
//! with a memcached client) talk to a real server.
//!
//! Only the pod's arguments that are safe on a shared machine are taken over: the memory limit (`-m`)
//! and `-o modern`. TLS, SASL, connection limits and the like are left out; `-U 0` (no UDP) always.

use std::net::Ipv4Addr;
use std::path::Path;
use std::process::Command;

use anyhow::Result;
use k8s_openapi::api::core::v1::{Container, Pod};

use crate::process::Process;

/// The container the operator runs memcached in.
pub const CONTAINER: &str = "memcached";

/// How to run a pod's memcached.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerArgs {
    pub port: u16,
    pub memory_mb: u32,
    pub modern: bool,
}

/// The memcached settings of `pod`, or `None` when it has no container named `memcached`.
pub fn server_args(pod: &Pod) -> Option<ServerArgs> {
    let container = pod
        .spec
        .as_ref()?
        .containers
        .iter()
        .find(|c| c.name == CONTAINER)?;
    let words: Vec<&str> = container
        .command
        .iter()
        .chain(container.args.iter())
        .flatten()
        .map(String::as_str)
        .collect();
    let value = |flag: &str| {
        words
            .windows(2)
            .find(|w| w[0] == flag)
            .map(|w| w[1])
            .or_else(|| {
                words
                    .iter()
                    .find_map(|w| w.strip_prefix(flag))
                    .filter(|v| !v.is_empty())
            })
    };
    Some(ServerArgs {
        port: container_port(container)
            .or_else(|| value("-p").and_then(|p| p.parse().ok()))
            .unwrap_or(11211),
        memory_mb: value("-m").and_then(|m| m.parse().ok()).unwrap_or(64),
        modern: words
            .windows(2)
            .any(|w| w[0] == "-o" && w[1].split(',').any(|o| o == "modern")),
    })
}

/// The port named `memcached`, else the first TCP port of the container.
fn container_port(container: &Container) -> Option<u16> {
    let ports = container.ports.as_deref().unwrap_or_default();
    ports
        .iter()
        .find(|p| p.name.as_deref() == Some(CONTAINER))
        .or_else(|| ports.first())
        .and_then(|p| u16::try_from(p.container_port).ok())
}

/// Starts `binary` for `args` on `ip`, logging to `log`.
///
/// As root, memcached insists on `-u <user>`; it gets `-u root`, because switching to another user would
/// clear the parent-death signal ([`crate::process`]) and the server would outlive a killed test binary.
pub fn start(binary: &Path, ip: Ipv4Addr, args: &ServerArgs, log: &Path) -> Result<Process> {
    let mut cmd = Command::new(binary);
    cmd.args(["-U", "0", "-l"])
        .arg(ip.to_string())
        .arg("-p")
        .arg(args.port.to_string())
        .arg("-m")
        .arg(args.memory_mb.to_string());
    if args.modern {
        cmd.args(["-o", "modern"]);
    }
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        cmd.args(["-u", "root"]);
    }
    Process::start(&format!("memcached {ip}:{}", args.port), cmd, log)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn port_memory_and_modern_come_from_the_memcached_container() {
        let pod: Pod = serde_json::from_value(json!({
            "spec": {"containers": [
                {"name": "exporter", "ports": [{"containerPort": 9150}]},
                {"name": "memcached", "args": ["-p", "11311", "-m", "128", "-o", "modern,ssl_chain_cert=x", "-c", "9"],
                 "ports": [{"name": "memcached", "containerPort": 11311}]},
            ]},
        }))
        .unwrap();
        assert_eq!(
            server_args(&pod),
            Some(ServerArgs {
                port: 11311,
                memory_mb: 128,
                modern: true
            })
        );
    }

    #[test]
    fn defaults_without_ports_or_args_and_none_without_the_container() {
        let pod: Pod =
            serde_json::from_value(json!({"spec": {"containers": [{"name": "memcached", "command": ["memcached", "-m64"]}]}}))
                .unwrap();
        assert_eq!(
            server_args(&pod),
            Some(ServerArgs {
                port: 11211,
                memory_mb: 64,
                modern: false
            })
        );
        let other: Pod =
            serde_json::from_value(json!({"spec": {"containers": [{"name": "web"}]}})).unwrap();
        assert_eq!(server_args(&other), None);
    }
}
