//! A real memcached for a pod: the container named `memcached`, run as a local process on the pod's
//! loopback IP and container port, so that clients of the operator (its statistics collector, tests
//! with a memcached client) talk to a real server.
//!
//! The pod's arguments that change what clients see are taken over: the memory limit (`-m`),
//! `-o modern`, TLS (`-Z` and the `ssl_*` options) and ASCII authentication (`-Y`), their files from the
//! pod's Secret volumes ([`super::volumes`]). Those that would strain a shared machine (connection
//! limits, threads, item sizes, verbosity, other options) are left out; `-U 0` (no UDP) always.

use std::net::Ipv4Addr;
use std::path::Path;
use std::process::Command;

use anyhow::Result;
use k8s_openapi::api::core::v1::{Container, Pod};

use super::volumes::Mounts;
use crate::process::Process;

/// The container the operator runs memcached in.
pub const CONTAINER: &str = "memcached";

/// How to run a pod's memcached.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServerArgs {
    pub port: u16,
    pub memory_mb: u32,
    pub modern: bool,
    /// `-Z`: TLS on.
    pub tls: bool,
    /// The `ssl_*` options of every `-o` (certificate, key, CA, verify mode), as the pod has them.
    pub ssl_options: Vec<String>,
    /// `-Y`: the auth file, as the pod has it.
    pub auth_file: Option<String>,
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
    let options: Vec<&str> = words
        .windows(2)
        .filter(|w| w[0] == "-o" || w[0] == "--extended")
        .flat_map(|w| w[1].split(','))
        .chain(
            words
                .iter()
                .filter_map(|w| w.strip_prefix("--extended="))
                .flat_map(|o| o.split(',')),
        )
        .collect();
    Some(ServerArgs {
        port: container_port(container)
            .or_else(|| value("-p").and_then(|p| p.parse().ok()))
            .unwrap_or(11211),
        memory_mb: value("-m").and_then(|m| m.parse().ok()).unwrap_or(64),
        modern: options.contains(&"modern"),
        tls: words.iter().any(|w| *w == "-Z" || *w == "--enable-ssl"),
        ssl_options: options
            .iter()
            .filter(|o| o.starts_with("ssl_"))
            .map(|o| (*o).to_owned())
            .collect(),
        auth_file: value("-Y")
            .or_else(|| value("--auth-file="))
            .or_else(|| value("--auth-file"))
            .map(str::to_owned),
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

/// Whether memcached needs files from the pod's volumes (TLS or auth).
pub fn needs_volumes(args: &ServerArgs) -> bool {
    args.tls || !args.ssl_options.is_empty() || args.auth_file.is_some()
}

/// The command line for `args` on `ip`, with the pod's paths mapped to its volumes' files.
pub fn command_line(ip: Ipv4Addr, args: &ServerArgs, mounts: &Mounts) -> Vec<String> {
    let mut line: Vec<String> = vec![
        "-U".into(),
        "0".into(),
        "-l".into(),
        ip.to_string(),
        "-p".into(),
        args.port.to_string(),
        "-m".into(),
        args.memory_mb.to_string(),
    ];
    let options: Vec<String> = args
        .modern
        .then(|| "modern".to_owned())
        .into_iter()
        .chain(args.ssl_options.iter().map(|o| mounts.map(o)))
        .collect();
    if !options.is_empty() {
        line.extend(["-o".to_owned(), options.join(",")]);
    }
    if args.tls {
        line.push("-Z".to_owned());
    }
    if let Some(file) = &args.auth_file {
        line.extend(["-Y".to_owned(), mounts.map(file)]);
    }
    line
}

/// Starts `binary` for `args` on `ip`, logging to `log`; paths under the pod's mounts are mapped to the
/// files written for them (`mounts`).
///
/// As root, memcached insists on `-u <user>`; it gets `-u root`, because switching to another user would
/// clear the parent-death signal ([`crate::process`]) and the server would outlive a killed test binary.
pub fn start(
    binary: &Path,
    ip: Ipv4Addr,
    args: &ServerArgs,
    mounts: &Mounts,
    log: &Path,
) -> Result<Process> {
    let mut cmd = Command::new(binary);
    let line = command_line(ip, args, mounts);
    cmd.args(line);
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
                modern: true,
                ssl_options: vec!["ssl_chain_cert=x".to_owned()],
                ..ServerArgs::default()
            })
        );
    }

    #[test]
    fn tls_and_auth_are_taken_over_with_their_files_in_the_pod_volumes() {
        let pod: Pod = serde_json::from_value(json!({
            "spec": {"containers": [
                {"name": "memcached", "command": ["memcached"],
                 "args": ["-p", "11211", "-m", "64", "-c", "4096", "-t", "8",
                          "-o", "modern,ssl_chain_cert=/etc/memcached/tls/tls.crt,ssl_key=/etc/memcached/tls/tls.key",
                          "-Z", "-Y", "/etc/memcached/auth/auth-file", "-o", "lru_crawler,ssl_verify_mode=2"]},
            ]},
        }))
        .unwrap();
        let args = server_args(&pod).unwrap();
        assert!(args.tls && needs_volumes(&args));
        assert_eq!(
            args.auth_file.as_deref(),
            Some("/etc/memcached/auth/auth-file")
        );
        let mounts = Mounts::from_pairs(&[
            ("/etc/memcached/tls", "/k/tls"),
            ("/etc/memcached/auth", "/k/auth"),
        ]);
        assert_eq!(
            command_line(Ipv4Addr::new(127, 1, 1, 2), &args, &mounts).join(" "),
            "-U 0 -l 127.1.1.2 -p 11211 -m 64 \
             -o modern,ssl_chain_cert=/k/tls/tls.crt,ssl_key=/k/tls/tls.key,ssl_verify_mode=2 \
             -Z -Y /k/auth/auth-file"
        );
        let plain = ServerArgs {
            port: 11211,
            memory_mb: 64,
            ..ServerArgs::default()
        };
        assert!(!needs_volumes(&plain));
        assert_eq!(
            command_line(Ipv4Addr::new(127, 1, 1, 2), &plain, &Mounts::default()).join(" "),
            "-U 0 -l 127.1.1.2 -p 11211 -m 64"
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
                ..ServerArgs::default()
            })
        );
        let other: Pod =
            serde_json::from_value(json!({"spec": {"containers": [{"name": "web"}]}})).unwrap();
        assert_eq!(server_args(&other), None);
    }
}
