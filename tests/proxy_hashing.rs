//! The operator's model of the proxy's key placement (`Scheme::ProxyJump`) against a real proxy-capable
//! memcached running the route configuration the operator generates (`resources::proxy::routes`), and
//! its reload on SIGHUP.
//!
//! Needs a memcached 1.6.23 or later built with `--enable-proxy`, named by `MEMCACHED_PROXY_BINARY`; the
//! test passes with a message saying so when it is unset or missing (CI has none). The same binary runs
//! the backends, as plain servers.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use memcached_operator::hashing::{Placement, Scheme};
use memcached_operator::resources::proxy::routes;

mod common;
use common::proxy::{Process, free_port, proxy_binary, start};

const KEYS: usize = 400;

/// Sends `command` and reads the reply up to a line in `ends`.
fn ask(port: u16, command: &str, ends: &[&str]) -> Vec<String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    stream.write_all(command.as_bytes()).unwrap();
    let mut lines = Vec::new();
    for line in BufReader::new(stream).lines() {
        let line = line.unwrap();
        let end = ends.iter().any(|e| line.starts_with(e));
        lines.push(line);
        if end {
            return lines;
        }
    }
    panic!("{command:?}: no reply ending with {ends:?}: {lines:?}");
}

fn stat(port: u16, name: &str) -> u64 {
    let prefix = format!("STAT {name} ");
    ask(port, "stats\r\n", &["END"])
        .iter()
        .find_map(|l| l.strip_prefix(&prefix).map(|v| v.parse().unwrap()))
        .unwrap_or_else(|| panic!("no {name} in stats"))
}

/// Writes the configuration over the first `count` backends and has the proxy reload it; returns how
/// long the reload took to be counted.
fn reload(proxy: &Process, proxy_port: u16, config: &Path, backends: &[String]) -> Duration {
    let list: Vec<&str> = backends.iter().map(String::as_str).collect();
    std::fs::write(config, routes::config("pool", &list)).unwrap();
    let before = stat(proxy_port, "proxy_config_reloads");
    let started = Instant::now();
    let pid = proxy.0.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-HUP", &pid])
            .status()
            .unwrap()
            .success()
    );
    while stat(proxy_port, "proxy_config_reloads") == before {
        assert_eq!(stat(proxy_port, "proxy_config_reload_fails"), 0);
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "no reload counted"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    started.elapsed()
}

/// Sets every key through the proxy, then asks each backend which keys it holds.
fn placements(proxy_port: u16, backends: &[u16], keys: &[String]) -> Vec<usize> {
    for &port in backends {
        ask(port, "flush_all\r\n", &["OK"]);
    }
    for key in keys {
        ask(
            proxy_port,
            &format!("set {key} 0 0 1\r\nx\r\n"),
            &["STORED", "SERVER_ERROR", "ERROR"],
        );
    }
    keys.iter()
        .map(|key| {
            let holders: Vec<usize> = (0..backends.len())
                .filter(|&i| {
                    ask(backends[i], &format!("mg {key} k\r\n"), &["HD", "EN"])[0].starts_with("HD")
                })
                .collect();
            assert_eq!(holders.len(), 1, "{key} on {holders:?}");
            holders[0]
        })
        .collect()
}

#[test]
fn the_proxy_places_keys_where_the_operator_expects_and_reloads_on_sighup() {
    let Some(binary) = proxy_binary() else {
        eprintln!(
            "skipped: MEMCACHED_PROXY_BINARY does not name a proxy-capable memcached (1.6.23 or later \
             built with --enable-proxy)"
        );
        return;
    };
    let ports: Vec<u16> = (0..5).map(|_| free_port()).collect();
    let _backends: Vec<Process> = ports.iter().map(|&p| start(&binary, p, &[])).collect();
    let addresses: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    let dir = std::env::temp_dir().join(format!("proxy-hashing-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join(routes::CONFIG_KEY);
    std::fs::write(&config, routes::config("pool", &[])).unwrap();
    let proxy_port = free_port();
    let option = format!("proxy_config=routelib,proxy_arg={}", config.display());
    let proxy = start(&binary, proxy_port, &["-o".to_owned(), option]);
    let keys: Vec<String> = (0..KEYS)
        .map(|i| format!("user:{i}:{}", i * 7919))
        .collect();
    let mut delays = Vec::new();
    for count in [1, 3, 4, 5, 2] {
        delays.push(reload(&proxy, proxy_port, &config, &addresses[..count]));
        let got = placements(proxy_port, &ports[..count], &keys);
        let placement = Placement::new(Scheme::ProxyJump, &addresses[..count]).unwrap();
        for (key, got) in keys.iter().zip(got) {
            assert_eq!(
                placement.server(key.as_bytes()),
                Some(got),
                "{key} over {count}"
            );
        }
    }
    eprintln!("reloads counted after {delays:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}
