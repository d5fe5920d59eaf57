//! `--proxy-hop` (`make bench-proxy`): what the proxy's hop costs a client. One memcached server (Debian's
//! `/usr/bin/memcached` or `$MEMCACHED_BINARY`) and one proxy-capable memcached (`$MEMCACHED_PROXY_BINARY`,
//! 1.6.23 or later built with `--enable-proxy`) in front of it, started with the operator's own proxy
//! arguments (`resources::proxy::proxy_args_in`) and the route configuration the operator renders over a
//! one-server list (`resources::proxy::routes::config`). Then, for each client, the same key is read over
//! and over, direct to the server and through the proxy, in alternating blocks after a warm-up, so that
//! both paths see the same machine: median, p90 and p99 of each get, gets per second of one client
//! waiting for each answer, and the ratio of the medians.
//!
//! The clients: the bench's own (Rust, blocking socket, `TCP_NODELAY`, text protocol `get`) and
//! pymemcache's plain `Client` run by `python3` (the client the issue's scenario uses), each skipped with
//! a message when it cannot run.

use std::fmt;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use memcached_operator::resources::proxy::{proxy_args_in, routes};
use serde::Deserialize;

use crate::process::Scratch;

/// The key read, and its value's size (a small cached object).
const KEY: &str = "bench:proxy-hop";
const VALUE_BYTES: usize = 100;
/// Gets of each path before any is counted (connections, caches, the proxy's backend connection).
const WARM_UP: usize = 2_000;
/// Gets of one block of one path; the paths alternate, block by block.
const BLOCK: usize = 1_000;

/// What to run.
#[derive(Clone, Debug)]
pub struct HopOptions {
    /// Counted gets of each path, for each client.
    pub samples: usize,
    /// Extra arguments for the proxy, after the operator's (e.g. `-t 1`), to try a setting.
    pub proxy_args: Vec<String>,
}

/// One path's figures, in microseconds, and gets per second of one waiting client.
#[derive(Clone, Copy, Debug, Deserialize)]
pub struct Latency {
    pub median: f64,
    pub p90: f64,
    pub p99: f64,
    pub per_second: f64,
}

impl Latency {
    fn of(mut micros: Vec<f64>) -> Self {
        micros.sort_by(f64::total_cmp);
        let at = |q: f64| micros[((micros.len() - 1) as f64 * q).round() as usize];
        let mean = micros.iter().sum::<f64>() / micros.len() as f64;
        Self {
            median: at(0.5),
            p90: at(0.9),
            p99: at(0.99),
            per_second: 1e6 / mean,
        }
    }
}

/// One client's two paths.
#[derive(Clone, Debug)]
pub struct ClientRow {
    pub client: &'static str,
    /// Both paths, or why this client did not run.
    pub outcome: Result<(Latency, Latency), String>,
}

/// The whole run.
#[derive(Clone, Debug)]
pub struct HopReport {
    pub server_version: String,
    pub proxy_version: String,
    pub proxy_args: Vec<String>,
    pub samples: usize,
    pub rows: Vec<ClientRow>,
}

/// A child process killed when dropped.
pub(crate) struct Process(Child);

impl Process {
    pub(crate) fn id(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The two binaries, or why the run cannot happen (said as a skip, not a failure).
pub fn binaries() -> Result<(PathBuf, PathBuf), String> {
    let server = std::env::var_os("MEMCACHED_BINARY")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/bin/memcached"));
    if !server.is_file() {
        return Err(format!(
            "no memcached server at {} (set MEMCACHED_BINARY)",
            server.display()
        ));
    }
    let proxy = std::env::var_os("MEMCACHED_PROXY_BINARY")
        .map(PathBuf::from)
        .filter(|path| path.is_file())
        .ok_or(
            "MEMCACHED_PROXY_BINARY does not name a proxy-capable memcached (1.6.23 or later built \
             with --enable-proxy)",
        )?;
    Ok((server, proxy))
}

/// Starts the server and the proxy, measures each client, and stops them.
pub fn run(options: &HopOptions) -> Result<HopReport, String> {
    let (server_binary, proxy_binary) = binaries()?;
    let scratch = Scratch::new()?;
    // memcached runs as nobody when the bench is root, and writes its pid file there.
    std::fs::set_permissions(scratch.path(), std::fs::Permissions::from_mode(0o1777))
        .map_err(|e| format!("cannot open the scratch directory to memcached: {e}"))?;
    let server_port = free_port()?;
    let server_args = ["-m", "64", "-t", "2"].map(str::to_owned);
    let _server = start(&server_binary, server_port, &server_args)?;
    let address = format!("127.0.0.1:{server_port}");
    std::fs::write(
        scratch.path().join(routes::CONFIG_KEY),
        routes::config("bench", &[address.as_str()]),
    )
    .map_err(|e| format!("cannot write the route configuration: {e}"))?;
    let proxy_port = free_port()?;
    let dir = scratch.path().to_string_lossy();
    let mut args = proxy_args_in(i32::from(proxy_port), &dir, None, false);
    // The port is given again by `start`, and the listener limited to loopback.
    args.drain(..2);
    args.extend(options.proxy_args.iter().cloned());
    let _proxy = start(&proxy_binary, proxy_port, &args)?;
    set(proxy_port)?;
    let rows = vec![
        ClientRow {
            client: "bench (Rust)",
            outcome: rust_client(server_port, proxy_port, options.samples),
        },
        ClientRow {
            client: "pymemcache",
            outcome: pymemcache(scratch.path(), server_port, proxy_port, options.samples),
        },
    ];
    Ok(HopReport {
        server_version: version(&server_binary),
        proxy_version: version(&proxy_binary),
        proxy_args: args,
        samples: options.samples,
        rows,
    })
}

pub(crate) fn free_port() -> Result<u16, String> {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("no free port: {e}"))
}

pub(crate) fn version(binary: &Path) -> String {
    Command::new(binary)
        .arg("-V")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_else(|e| format!("unknown ({e})"))
}

/// Starts memcached on loopback `port` (UDP off) with `args`, and waits for it to accept.
pub(crate) fn start(binary: &Path, port: u16, args: &[String]) -> Result<Process, String> {
    start_on(binary, "127.0.0.1", port, args)
}

/// [`start`] with the listeners `listen` (`-l`), which must include loopback `port`.
pub(crate) fn start_on(
    binary: &Path,
    listen: &str,
    port: u16,
    args: &[String],
) -> Result<Process, String> {
    let child = Command::new(binary)
        .args(["-l", listen, "-p", &port.to_string(), "-U", "0"])
        // Refused as root without a user to run as (ignored otherwise).
        .args(["-u", "nobody"])
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", binary.display()))?;
    let mut process = Process(child);
    let deadline = Instant::now() + Duration::from_secs(5);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        if let Ok(Some(status)) = process.0.try_wait() {
            return Err(format!("{} {args:?} exited: {status}", binary.display()));
        }
        if Instant::now() > deadline {
            return Err(format!("{} did not listen on {port}", binary.display()));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(process)
}

/// A blocking text-protocol connection with `TCP_NODELAY`.
struct Connection {
    reader: BufReader<TcpStream>,
    line: String,
}

impl Connection {
    fn open(port: u16) -> Result<Self, String> {
        let stream = TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string())?;
        stream.set_nodelay(true).map_err(|e| e.to_string())?;
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .map_err(|e| e.to_string())?;
        Ok(Self {
            reader: BufReader::new(stream),
            line: String::new(),
        })
    }

    /// Sends `command` and reads lines until one starts with an element of `ends`; returns that line.
    fn ask(&mut self, command: &[u8], ends: &[&str]) -> Result<&str, String> {
        self.reader
            .get_mut()
            .write_all(command)
            .map_err(|e| e.to_string())?;
        self.read_until(ends)
    }

    fn read_until(&mut self, ends: &[&str]) -> Result<&str, String> {
        loop {
            self.line.clear();
            if self
                .reader
                .read_line(&mut self.line)
                .map_err(|e| e.to_string())?
                == 0
            {
                return Err("connection closed".to_owned());
            }
            if ends.iter().any(|end| self.line.starts_with(end)) {
                return Ok(&self.line);
            }
        }
    }

    /// One get (`command`) of [`KEY`], which must hit: `VALUE`, the value, `END`.
    fn get(&mut self, command: &[u8]) -> Result<(), String> {
        let first = self.ask(command, &["VALUE", "END", "SERVER_ERROR"])?;
        if !first.starts_with("VALUE") {
            return Err(format!("a get answered {}", first.trim()));
        }
        self.read_until(&["END"]).map(drop)
    }
}

/// Stores [`KEY`] through the proxy (so on the one server both paths read).
fn set(proxy_port: u16) -> Result<(), String> {
    let mut connection = Connection::open(proxy_port)?;
    let mut command = format!("set {KEY} 0 0 {VALUE_BYTES}\r\n").into_bytes();
    command.extend(std::iter::repeat_n(b'v', VALUE_BYTES));
    command.extend(b"\r\n");
    match connection.ask(&command, &["STORED", "SERVER_ERROR", "ERROR", "NOT_STORED"])? {
        line if line.starts_with("STORED") => Ok(()),
        line => Err(format!(
            "the set through the proxy answered {}",
            line.trim()
        )),
    }
}

/// The bench's own client: alternating blocks of [`BLOCK`] gets on each path.
fn rust_client(direct: u16, proxy: u16, samples: usize) -> Result<(Latency, Latency), String> {
    let mut paths = [Connection::open(direct)?, Connection::open(proxy)?];
    let command = format!("get {KEY}\r\n").into_bytes();
    for connection in &mut paths {
        for _ in 0..WARM_UP {
            connection.get(&command)?;
        }
    }
    let mut micros = [Vec::with_capacity(samples), Vec::with_capacity(samples)];
    while micros[1].len() < samples {
        for (connection, micros) in paths.iter_mut().zip(&mut micros) {
            for _ in 0..BLOCK.min(samples - micros.len()) {
                let started = Instant::now();
                connection.get(&command)?;
                micros.push(started.elapsed().as_secs_f64() * 1e6);
            }
        }
    }
    let [direct, proxied] = micros;
    Ok((Latency::of(direct), Latency::of(proxied)))
}

/// pymemcache's plain `Client`, the same alternation, run by python3; prints both paths as JSON.
const PYMEMCACHE: &str = r#"
import json, sys, time
from pymemcache.client.base import Client
direct, proxy, samples, warm_up, block, key = sys.argv[1:7]
samples, warm_up, block = int(samples), int(warm_up), int(block)
paths = [Client(("127.0.0.1", int(direct))), Client(("127.0.0.1", int(proxy)))]
for client in paths:
    for _ in range(warm_up):
        assert client.get(key) is not None
micros = [[], []]
clock = time.perf_counter_ns
while len(micros[1]) < samples:
    for client, out in zip(paths, micros):
        for _ in range(min(block, samples - len(out))):
            started = clock()
            value = client.get(key)
            out.append((clock() - started) / 1000)
            assert value is not None
print(json.dumps(micros))
"#;

fn pymemcache(
    scratch: &Path,
    direct: u16,
    proxy: u16,
    samples: usize,
) -> Result<(Latency, Latency), String> {
    let script = scratch.join("pymemcache_hop.py");
    std::fs::write(&script, PYMEMCACHE).map_err(|e| e.to_string())?;
    let output = Command::new("python3")
        .arg(&script)
        .args([direct, proxy].map(|p| p.to_string()))
        .args([samples, WARM_UP, BLOCK].map(|n| n.to_string()))
        .arg(KEY)
        .output()
        .map_err(|e| format!("skipped: cannot run python3 ({e})"))?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        if stderr.contains("No module named 'pymemcache'") {
            return Err("skipped: python3 has no pymemcache (pip install pymemcache)".to_owned());
        }
        return Err(format!("python3 failed: {}", stderr.trim()));
    }
    let [direct, proxied]: [Vec<f64>; 2] = serde_json::from_slice(&output.stdout)
        .map_err(|e| format!("cannot read pymemcache's samples: {e}"))?;
    Ok((Latency::of(direct), Latency::of(proxied)))
}

impl fmt::Display for HopReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "the proxy's hop: {} gets of a {VALUE_BYTES}-byte value per path and client, in blocks of \
             {BLOCK} alternating, after {WARM_UP}",
            self.samples
        )?;
        writeln!(f, "server: {}", self.server_version)?;
        writeln!(
            f,
            "proxy:  {} {}",
            self.proxy_version,
            self.proxy_args.join(" ")
        )?;
        writeln!(
            f,
            "{:<14} {:<8} {:>9} {:>9} {:>9} {:>10} {:>13}",
            "client", "path", "median", "p90", "p99", "gets/s", "median ratio"
        )?;
        for row in &self.rows {
            match &row.outcome {
                Ok((direct, proxied)) => {
                    for (path, latency, ratio) in [
                        ("direct", direct, String::new()),
                        (
                            "proxy",
                            proxied,
                            format!("{:.2}x", proxied.median / direct.median),
                        ),
                    ] {
                        writeln!(
                            f,
                            "{:<14} {path:<8} {:>7.1}µs {:>7.1}µs {:>7.1}µs {:>10.0} {ratio:>13}",
                            row.client,
                            latency.median,
                            latency.p90,
                            latency.p99,
                            latency.per_second
                        )?;
                    }
                }
                Err(why) => writeln!(f, "{:<14} {why}", row.client)?,
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_read_from_the_sorted_samples() {
        let latency = Latency::of((1..=100).rev().map(f64::from).collect());
        assert_eq!(latency.median, 51.0);
        assert_eq!(latency.p90, 90.0);
        assert_eq!(latency.p99, 99.0);
        assert!((latency.per_second - 1e6 / 50.5).abs() < 1e-6);
    }
}
