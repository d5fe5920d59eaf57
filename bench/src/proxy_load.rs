//! `--proxy-hop --open-loop` (`make bench-proxy ARGS=--open-loop`): the proxy's hop as memcached's
//! maintainers measure their proxy with mc-crusher, at a fixed offered rate rather than one client
//! waiting for each answer. For each workload (a plain `get` of one key; 8 gets written at once on one
//! connection before the 8 answers are read; a 10-key `get k1 … k10`, which the proxy splits into one
//! request per key), first the direct path's capacity on this machine: every connection keeps
//! [`CAPACITY_WINDOW`] requests in flight, and the answers per second are counted. Then at each step
//! (10 %, 50 %, 80 % of that capacity by default) the same rate is offered to each path in turn: each
//! connection has a writer thread that sends on a fixed schedule whatever the answers do (late sends go
//! out at once, so the offered rate holds) and a reader thread that times each answer from the moment its
//! request was written. The p50 and p99 of those times, per request (per batch of 8 or per multi-get),
//! and the answers per second achieved; the proxy's added latency is its figure minus the direct path's.
//!
//! Two groups: plain text (direct to the server, through the proxy), and TLS (direct to a server
//! serving TLS; through a proxy serving TLS to clients and speaking TLS to the server, as the operator
//! runs it with `spec.security.tls`; and through a proxy with access control as with
//! `spec.proxy.access`: the operator's arguments (an `mtls:` client listener tagged `client`, its
//! access library after routelib, the client CA) and its route rendered with one identity, the common
//! name of the bench's client certificate, allowed the bench's key prefix, so every key is checked and
//! passes). The CA, the servers' certificate and the client's are made at run time in the scratch
//! directory. A request that fails (a refused key, an error) fails the run: every answer is compared
//! with the one expected.

use std::fmt;
use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use memcached_operator::proxy_config::Files;
use memcached_operator::resources::proxy::identities::{
    CLIENT_TAG, ClientCa, RouteAccess, RouteIdentity,
};
use memcached_operator::resources::proxy::proxy_args_in;
use memcached_operator::resources::proxy::routes::{self, Route};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair,
};
use serde::Serialize;
use tokio_rustls::rustls::client::Resumption;
use tokio_rustls::rustls::crypto::ring;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio_rustls::rustls::{ClientConfig, ClientConnection, RootCertStore};

use crate::process::Scratch;
use crate::proxy_hop::{binaries, free_port, start, start_on, version};

/// Requests each connection keeps in flight while the capacity is measured.
pub const CAPACITY_WINDOW: usize = 8;
/// Keys read (`bench:hop:0` to `bench:hop:9`), each holding a value of [`VALUE_BYTES`].
const KEYS: usize = 10;
const VALUE_BYTES: usize = 100;
/// Time of each measurement before any answer is counted (connections, caches, backend connections).
const WARM_UP: Duration = Duration::from_millis(500);
/// Rates tried for the direct path's capacity, each [`CAPACITY_BACK_OFF`] of the one before.
const CAPACITY_TRIES: usize = 5;
const CAPACITY_BACK_OFF: f64 = 0.85;
/// A rate is sustained when at least this share of it is answered in the counted time…
const SUSTAINED_SHARE: f64 = 0.98;
/// … with a median under this many µs (a queue that grows has a median of milliseconds).
const SUSTAINED_P50_MICROS: f64 = 1_000.0;

/// Whether `measured` kept up with `offered` (per second).
pub fn sustains(offered: f64, measured: &PathFigures) -> bool {
    measured.achieved_per_second >= offered * SUSTAINED_SHARE
        && measured.p50_micros <= SUSTAINED_P50_MICROS
}

/// How long after the counted time the answers still outstanding are waited for.
const DRAIN: Duration = Duration::from_secs(1);
/// With no answer for this long, a measurement fails.
const STALL: Duration = Duration::from_secs(10);

/// What to run.
#[derive(Clone, Debug)]
pub struct LoadOptions {
    /// Client connections, each with a writer and a reader thread.
    pub connections: usize,
    /// The offered rates, in percent of the direct path's capacity.
    pub steps: Vec<u32>,
    /// Counted seconds of each measurement (after [`WARM_UP`]).
    pub seconds: f64,
    /// Measurements of each path at each step, the paths alternating; their samples are pooled.
    pub rounds: usize,
    /// Extra arguments for the proxy, after the operator's.
    pub proxy_args: Vec<String>,
}

/// One request of a workload: what is written, and the answer expected (always the same bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Workload {
    /// `get bench:hop:0`.
    Get,
    /// `get bench:hop:0` … `get bench:hop:7`, written at once; the request is the batch.
    Pipelined8,
    /// `get bench:hop:0 … bench:hop:9`.
    MultiGet10,
}

impl Workload {
    pub const ALL: [Workload; 3] = [Workload::Get, Workload::Pipelined8, Workload::MultiGet10];

    fn name(self) -> &'static str {
        match self {
            Workload::Get => "get",
            Workload::Pipelined8 => "8 pipelined gets",
            Workload::MultiGet10 => "10-key multi-get",
        }
    }

    /// Keys read by one request.
    pub fn keys(self) -> usize {
        match self {
            Workload::Get => 1,
            Workload::Pipelined8 => 8,
            Workload::MultiGet10 => 10,
        }
    }

    /// The request's bytes and its answer's.
    fn exchange(self) -> (Vec<u8>, Vec<u8>) {
        let value = |k: usize| {
            format!(
                "VALUE {} 0 {VALUE_BYTES}\r\n{}\r\n",
                key(k),
                "v".repeat(VALUE_BYTES)
            )
        };
        match self {
            Workload::Get => (
                format!("get {}\r\n", key(0)).into_bytes(),
                format!("{}END\r\n", value(0)).into_bytes(),
            ),
            Workload::Pipelined8 => (
                (0..8)
                    .map(|k| format!("get {}\r\n", key(k)))
                    .collect::<String>()
                    .into_bytes(),
                (0..8)
                    .map(|k| format!("{}END\r\n", value(k)))
                    .collect::<String>()
                    .into_bytes(),
            ),
            Workload::MultiGet10 => (
                format!("get {}\r\n", (0..10).map(key).collect::<Vec<_>>().join(" ")).into_bytes(),
                format!("{}END\r\n", (0..10).map(value).collect::<String>()).into_bytes(),
            ),
        }
    }
}

fn key(k: usize) -> String {
    format!("bench:hop:{k}")
}

/// One path's figures at one offered rate: answers per second, p50 and p99 in microseconds.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct PathFigures {
    pub achieved_per_second: f64,
    pub p50_micros: f64,
    pub p99_micros: f64,
}

/// One workload at one step, on the paths of a group (in the group's order).
#[derive(Clone, Debug, Serialize)]
pub struct StepRow {
    pub workload: Workload,
    pub step_percent: u32,
    pub offered_per_second: f64,
    pub paths: Vec<PathFigures>,
}

impl StepRow {
    /// With a third path (access control on), how much its added latency exceeds the second's (the
    /// plain proxy's), in % of the second's: p50 and p99.
    pub fn access_increase(&self) -> Option<(f64, f64)> {
        if self.paths.len() < 3 {
            return None;
        }
        let (proxy, access) = (self.added(1), self.added(2));
        Some((
            (access.0 - proxy.0) / proxy.0 * 100.0,
            (access.1 - proxy.1) / proxy.1 * 100.0,
        ))
    }

    /// Path `i`'s p50 and p99 minus the first path's (direct), in microseconds.
    pub fn added(&self, i: usize) -> (f64, f64) {
        let (direct, path) = (&self.paths[0], &self.paths[i]);
        (
            path.p50_micros - direct.p50_micros,
            path.p99_micros - direct.p99_micros,
        )
    }
}

/// The direct path's capacity for one workload: requests (batches, multi-gets) per second.
#[derive(Clone, Debug, Serialize)]
pub struct Capacity {
    pub workload: Workload,
    /// The highest rate the direct path sustained in the open loop (the steps' 100 %).
    pub per_second: f64,
    /// Whether it was sustained (else: the lowest rate tried, which was not).
    pub sustained: bool,
    /// Each path's answers per second with [`CAPACITY_WINDOW`] requests in flight per connection
    /// (a closed loop: what the path does when the client waits for nothing else).
    pub window_per_second: Vec<f64>,
}

/// One transport's paths, capacities and steps.
#[derive(Clone, Debug, Serialize)]
pub struct Group {
    pub transport: &'static str,
    /// The paths measured, direct first.
    pub paths: Vec<&'static str>,
    pub capacities: Vec<Capacity>,
    pub rows: Vec<StepRow>,
    /// Why a path was not measured, if one was left out.
    pub missing: Option<String>,
}

/// The whole run.
#[derive(Clone, Debug, Serialize)]
pub struct LoadReport {
    pub server_version: String,
    pub proxy_version: String,
    pub proxy_args: Vec<String>,
    pub proxy_tls_args: Vec<String>,
    pub proxy_access_args: Vec<String>,
    /// TLS handshakes tried again after the server refused them.
    pub handshake_retries: usize,
    pub connections: usize,
    pub capacity_window: usize,
    pub seconds: f64,
    pub rounds: usize,
    pub cores: usize,
    /// /proc/loadavg's 1-minute figure before and after the run (the cores are shared).
    pub load_average: (f64, f64),
    pub groups: Vec<Group>,
}

/// The certificates of a TLS run, in the scratch directory, and the client's configurations.
struct Pki {
    /// The CA's certificate (PEM): it signs the servers' and the client's.
    ca: String,
    /// Without a client certificate.
    client: Arc<ClientConfig>,
    /// With the client certificate of common name [`CLIENT_CN`].
    identified: Arc<ClientConfig>,
}

/// The client certificate's common name, an identity allowed [`PREFIX`].
const CLIENT_CN: &str = "bench.clients";
const PREFIX: &str = "bench:";

/// Makes a CA, one serving certificate for 127.0.0.1 (the server's and the proxy's, as the operator's
/// proxy serves the instance's certificate) and writes them as `tls.crt`, `tls.key` and `ca.crt` in `dir`.
fn pki(dir: &Path) -> Result<Pki, String> {
    fn failed(what: &'static str) -> impl Fn(rcgen::Error) -> String {
        move |e| format!("cannot make the {what}: {e}")
    }
    let mut params = CertificateParams::new(Vec::<String>::new()).map_err(failed("CA"))?;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(DnType::CommonName, "bench CA");
    let ca = CertifiedIssuer::self_signed(params, KeyPair::generate().map_err(failed("CA key"))?)
        .map_err(failed("CA"))?;
    let mut params = CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])
        .map_err(failed("serving certificate"))?;
    params.distinguished_name.push(DnType::CommonName, "bench");
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let key = KeyPair::generate().map_err(failed("serving key"))?;
    let serving = params
        .signed_by(&key, &ca)
        .map_err(failed("serving certificate"))?;
    for (name, pem) in [
        ("tls.crt", serving.pem()),
        ("tls.key", key.serialize_pem()),
        ("ca.crt", ca.pem()),
    ] {
        let path = dir.join(name);
        std::fs::write(&path, pem).map_err(|e| format!("cannot write {name}: {e}"))?;
        // memcached reads them as nobody.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644))
            .map_err(|e| format!("cannot open {name} to memcached: {e}"))?;
    }
    let mut params =
        CertificateParams::new(Vec::<String>::new()).map_err(failed("client certificate"))?;
    params
        .distinguished_name
        .push(DnType::CommonName, CLIENT_CN);
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let client_key = KeyPair::generate().map_err(failed("client key"))?;
    let client_cert = params
        .signed_by(&client_key, &ca)
        .map_err(failed("client certificate"))?;
    let mut roots = RootCertStore::empty();
    roots
        .add(ca.der().clone())
        .map_err(|e| format!("cannot trust the CA: {e}"))?;
    let builder = || {
        ClientConfig::builder_with_provider(Arc::new(ring::default_provider()))
            .with_safe_default_protocol_versions()
            .map(|b| b.with_root_certificates(roots.clone()))
            .map_err(|e| e.to_string())
    };
    let mut client = builder()?.with_no_client_auth();
    let mut identified = builder()?
        .with_client_auth_cert(
            vec![CertificateDer::from(client_cert.der().to_vec())],
            PrivateKeyDer::try_from(client_key.serialize_der())
                .map_err(|e| format!("the client key: {e}"))?,
        )
        .map_err(|e| format!("the client certificate: {e}"))?;
    // Every connection a full handshake, on every path alike (the proxy with access control resumes
    // sessions since it runs with memcached's session cache; without it, memcached refused a resumed
    // session with an `internal_error` alert when it verifies client certificates).
    client.resumption = Resumption::disabled();
    identified.resumption = Resumption::disabled();
    Ok(Pki {
        ca: ca.pem(),
        client: Arc::new(client),
        identified: Arc::new(identified),
    })
}

/// The proxy's arguments as the operator gives them, for the bench: the port is given by
/// [`start_on`], so `-p` goes, and so does `-l`; returned apart: the clients' listener of the operator's
/// `-l` (with access control, `mtls:tag[client]:…`) on loopback, without the operator's own listeners
/// (`stats`, reloads), which the bench does not use; else `127.0.0.1`.
fn bench_args(args: Vec<String>, extra: &[String]) -> (String, Vec<String>) {
    let mut out = Vec::with_capacity(args.len());
    let mut listen = "127.0.0.1".to_owned();
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "-p" => {
                args.next();
            }
            "-l" => {
                if let Some(clients) = args.next().as_deref().and_then(|l| l.split(',').next())
                    && clients.starts_with("mtls:")
                {
                    listen = clients.replace(":*:", ":127.0.0.1:");
                }
            }
            _ => out.push(arg),
        }
    }
    out.extend(extra.iter().cloned());
    (listen, out)
}

/// Starts the servers and proxies, measures each group, and stops them.
pub fn run(options: &LoadOptions) -> Result<LoadReport, String> {
    let (server_binary, proxy_binary) = binaries()?;
    let load_before = load_average();
    let scratch = Scratch::new()?;
    std::fs::set_permissions(scratch.path(), std::fs::Permissions::from_mode(0o1777))
        .map_err(|e| format!("cannot open the scratch directory to memcached: {e}"))?;
    let dir = scratch.path().to_string_lossy().into_owned();
    let pki = pki(scratch.path())?;
    let server_args = ["-m", "64", "-t", "2"].map(str::to_owned);
    let tls_files = format!("ssl_chain_cert={dir}/tls.crt,ssl_key={dir}/tls.key");

    // Plain text: the server, and the proxy over it.
    let plain_port = free_port()?;
    let _server = start(&server_binary, plain_port, &server_args)?;
    let plain_dir = scratch.path().join("plain");
    let tls_dir = scratch.path().join("tls");
    for sub in [&plain_dir, &tls_dir] {
        std::fs::create_dir_all(sub).map_err(|e| e.to_string())?;
        std::fs::set_permissions(sub, std::fs::Permissions::from_mode(0o1777))
            .map_err(|e| e.to_string())?;
    }
    let address = format!("127.0.0.1:{plain_port}");
    std::fs::write(
        plain_dir.join(routes::CONFIG_KEY),
        routes::config("bench", &[address.as_str()]),
    )
    .map_err(|e| format!("cannot write the route configuration: {e}"))?;
    let proxy_port = free_port()?;
    let (_, proxy_args) = bench_args(
        proxy_args_in(
            i32::from(proxy_port),
            &plain_dir.to_string_lossy(),
            None,
            false,
        ),
        &options.proxy_args,
    );
    let _proxy = start(&proxy_binary, proxy_port, &proxy_args)?;

    // TLS: the server serving TLS, and the proxy serving TLS and speaking it to the server.
    let tls_port = free_port()?;
    let mut tls_server_args = server_args.to_vec();
    tls_server_args.extend(["-Z".to_owned(), "-o".to_owned(), tls_files]);
    let _tls_server = start(&server_binary, tls_port, &tls_server_args)?;
    let address = format!("127.0.0.1:{tls_port}");
    std::fs::write(
        tls_dir.join(routes::CONFIG_KEY),
        routes::tls_config("bench", &[address.as_str()]),
    )
    .map_err(|e| format!("cannot write the TLS route configuration: {e}"))?;
    let tls_proxy_port = free_port()?;
    let (_, proxy_tls_args) = bench_args(
        proxy_args_in(
            i32::from(tls_proxy_port),
            &tls_dir.to_string_lossy(),
            Some(&dir),
            false,
        ),
        &options.proxy_args,
    );
    let _tls_proxy = start(&proxy_binary, tls_proxy_port, &proxy_tls_args)?;

    // Access control: the same, plus client certificates of the CA required on the clients' listener
    // and the operator's access library checking each key against the identity of the certificate's
    // common name (one identity, the bench's keys' prefix), in files as its configuration writer
    // writes them.
    let access_dir = scratch.path().join("access");
    std::fs::create_dir_all(&access_dir).map_err(|e| e.to_string())?;
    std::fs::set_permissions(&access_dir, std::fs::Permissions::from_mode(0o1777))
        .map_err(|e| e.to_string())?;
    let bundle = ClientCa::parse(pki.ca.as_bytes()).map_err(|e| format!("the client CA: {e}"))?;
    let access = RouteAccess {
        epoch: "b0".to_owned(),
        client_ca: bundle.pem.clone(),
        identities: vec![RouteIdentity {
            name: "bench".to_owned(),
            common_name: CLIENT_CN.to_owned(),
            prefixes: vec![PREFIX.to_owned()],
            read_only: false,
        }],
    };
    let route = Route {
        servers: vec![address.clone()],
        backend_tls: true,
        access: Some(access.clone()),
    };
    Route::parse(&route.to_data()).map_err(|e| e.to_string())?;
    Files {
        config: routes::render("bench", &route),
        client_ca: Some(access.client_ca.clone()),
        epoch: Some(access.epoch.clone()),
    }
    .write(&access_dir)
    .map_err(|e| format!("cannot write the access configuration: {e}"))?;
    for entry in std::fs::read_dir(&access_dir)
        .map_err(|e| e.to_string())?
        .flatten()
    {
        let _ = std::fs::set_permissions(entry.path(), std::fs::Permissions::from_mode(0o644));
    }
    let access_port = free_port()?;
    let (access_listen, proxy_access_args) = bench_args(
        proxy_args_in(
            i32::from(access_port),
            &access_dir.to_string_lossy(),
            Some(&dir),
            true,
        ),
        &options.proxy_args,
    );
    if !access_listen.contains(&format!("tag[{CLIENT_TAG}]")) {
        return Err(format!(
            "the operator's access listener is not tagged {CLIENT_TAG}: {access_listen}"
        ));
    }
    let _access_proxy = start_on(
        &proxy_binary,
        &access_listen,
        access_port,
        &proxy_access_args,
    )?;

    let plain: [(&'static str, u16, Option<Arc<ClientConfig>>); 2] =
        [("direct", plain_port, None), ("proxy", proxy_port, None)];
    let tls: [(&'static str, u16, Option<Arc<ClientConfig>>); 3] = [
        ("direct TLS", tls_port, Some(pki.client.clone())),
        ("proxy TLS", tls_proxy_port, Some(pki.client.clone())),
        (
            "proxy mTLS+access",
            access_port,
            Some(pki.identified.clone()),
        ),
    ];
    let groups = vec![
        group("plain", &plain, options, None)?,
        group("TLS", &tls, options, None)?,
    ];
    Ok(LoadReport {
        server_version: version(&server_binary),
        proxy_version: version(&proxy_binary),
        proxy_args,
        proxy_tls_args,
        handshake_retries: HANDSHAKE_RETRIES.load(Ordering::Relaxed),
        proxy_access_args: std::iter::once(format!("-l {access_listen}"))
            .chain(proxy_access_args)
            .collect(),
        connections: options.connections,
        capacity_window: CAPACITY_WINDOW,
        seconds: options.seconds,
        rounds: options.rounds,
        load_average: (load_before, load_average()),
        cores: std::thread::available_parallelism().map_or(0, |n| n.get()),
        groups,
    })
}

/// One group: the keys stored on the group's server (through its direct path), then for each workload
/// the direct path's capacity and each step on each path.
fn group(
    transport: &'static str,
    paths: &[(&'static str, u16, Option<Arc<ClientConfig>>)],
    options: &LoadOptions,
    missing: Option<String>,
) -> Result<Group, String> {
    let (_, direct_port, direct_tls) = &paths[0];
    store(*direct_port, direct_tls.as_ref())?;
    let mut capacities = Vec::new();
    let mut rows = Vec::new();
    for workload in Workload::ALL {
        let mut window_per_second = Vec::new();
        for (path, port, tls) in paths {
            let achieved = measure(*port, tls.as_ref(), workload, None, options)
                .map_err(|e| format!("{transport} {path} window of {}: {e}", workload.name()))?
                .figures()
                .achieved_per_second;
            window_per_second.push(achieved);
        }
        // The open loop costs the client more than the window does (a wake-up and a write per
        // request), on the same cores: from the direct path's window down, the first rate it sustains.
        let mut capacity = window_per_second[0];
        let mut sustained = false;
        for _ in 0..CAPACITY_TRIES {
            let measured = measure(
                *direct_port,
                direct_tls.as_ref(),
                workload,
                Some(capacity),
                options,
            )
            .map_err(|e| format!("{transport} direct capacity of {}: {e}", workload.name()))?
            .figures();
            if sustains(capacity, &measured) {
                sustained = true;
                break;
            }
            capacity *= CAPACITY_BACK_OFF;
        }
        if !sustained {
            capacity /= CAPACITY_BACK_OFF;
        }
        eprintln!(
            "{transport}: {}: windows {window_per_second:.0?}/s, direct capacity {capacity:.0}/s \
             (sustained: {sustained})",
            workload.name()
        );
        capacities.push(Capacity {
            workload,
            per_second: capacity,
            sustained,
            window_per_second,
        });
        for &step in &options.steps {
            let offered = capacity * f64::from(step) / 100.0;
            let mut samples = vec![Samples::default(); paths.len()];
            for _ in 0..options.rounds.max(1) {
                for ((path, port, tls), samples) in paths.iter().zip(&mut samples) {
                    let measured = measure(*port, tls.as_ref(), workload, Some(offered), options)
                        .map_err(|e| {
                        format!("{transport} {path}, {} at {step} %: {e}", workload.name())
                    })?;
                    samples.add(measured);
                }
            }
            let mut figures = Vec::new();
            for ((path, ..), samples) in paths.iter().zip(samples) {
                let measured = samples.figures();
                eprintln!(
                    "{transport}: {} at {step} % ({offered:.0}/s): {path}: {:.0}/s p50 {:.1}µs p99 {:.1}µs",
                    workload.name(),
                    measured.achieved_per_second,
                    measured.p50_micros,
                    measured.p99_micros
                );
                figures.push(measured);
            }
            rows.push(StepRow {
                workload,
                step_percent: step,
                offered_per_second: offered,
                paths: figures,
            });
        }
    }
    Ok(Group {
        transport,
        paths: paths.iter().map(|(path, ..)| *path).collect(),
        capacities,
        rows,
        missing,
    })
}

/// Stores the [`KEYS`] keys.
fn store(port: u16, tls: Option<&Arc<ClientConfig>>) -> Result<(), String> {
    let (mut writer, mut reader) = connect(port, tls)?;
    let mut command = Vec::new();
    for k in 0..KEYS {
        command.extend(format!("set {} 0 0 {VALUE_BYTES}\r\n", key(k)).bytes());
        command.extend(std::iter::repeat_n(b'v', VALUE_BYTES));
        command.extend(b"\r\n");
    }
    writer.send(&command).map_err(|e| e.to_string())?;
    let expected = b"STORED\r\n".repeat(KEYS);
    let mut answer = Vec::new();
    let deadline = Instant::now() + STALL;
    while answer.len() < expected.len() && Instant::now() < deadline {
        match reader.receive(&mut answer) {
            Ok(0) => return Err("the server closed the connection".to_owned()),
            Ok(_) => {}
            Err(e) if timed_out(&e) => {}
            Err(e) => return Err(e.to_string()),
        }
    }
    if answer != expected {
        return Err(format!(
            "the sets answered {:?}",
            String::from_utf8_lossy(&answer)
        ));
    }
    Ok(())
}

fn load_average() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next()?.parse().ok())
        .unwrap_or(f64::NAN)
}

fn timed_out(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

/// TLS handshakes refused by a server and tried again.
static HANDSHAKE_RETRIES: AtomicUsize = AtomicUsize::new(0);

/// [`connect`], its handshake tried up to 5 times.
fn connect_retrying(
    port: u16,
    tls: Option<&Arc<ClientConfig>>,
) -> Result<(Writer, Reader), String> {
    let mut tries = 0;
    loop {
        match connect(port, tls) {
            Err(e) if e.starts_with("TLS handshake") && tries < 4 => {
                tries += 1;
                HANDSHAKE_RETRIES.fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(10));
            }
            outcome => return outcome,
        }
    }
}

/// The writing half of a connection.
struct Writer {
    socket: TcpStream,
    tls: Option<Arc<Mutex<ClientConnection>>>,
}

/// The reading half of a connection.
struct Reader {
    socket: TcpStream,
    tls: Option<Arc<Mutex<ClientConnection>>>,
    buffer: Vec<u8>,
}

/// A connection to `port` on loopback (`TCP_NODELAY`), over TLS with `tls` (handshake done), split
/// into its halves. Over TLS both share the session: the writer holds it only while it encrypts and
/// writes (its socket gives up after 1 ms, so the session is let go while the socket is full), the
/// reader while it decrypts what it read.
fn connect(port: u16, tls: Option<&Arc<ClientConfig>>) -> Result<(Writer, Reader), String> {
    let mut socket = TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string())?;
    socket.set_nodelay(true).map_err(|e| e.to_string())?;
    let session = match tls {
        Some(config) => {
            let name = ServerName::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST).into());
            let mut session =
                ClientConnection::new(config.clone(), name).map_err(|e| e.to_string())?;
            session.set_buffer_limit(None);
            while session.is_handshaking() {
                session
                    .complete_io(&mut socket)
                    .map_err(|e| format!("TLS handshake: {e}"))?;
            }
            socket
                .set_write_timeout(Some(Duration::from_millis(1)))
                .map_err(|e| e.to_string())?;
            Some(Arc::new(Mutex::new(session)))
        }
        None => None,
    };
    socket
        .set_read_timeout(Some(Duration::from_millis(50)))
        .map_err(|e| e.to_string())?;
    let reading = socket.try_clone().map_err(|e| e.to_string())?;
    Ok((
        Writer {
            socket,
            tls: session.clone(),
        },
        Reader {
            socket: reading,
            tls: session,
            buffer: vec![0; 64 * 1024],
        },
    ))
}

impl Writer {
    fn send(&mut self, bytes: &[u8]) -> io::Result<()> {
        let Some(tls) = &self.tls else {
            return self.socket.write_all(bytes);
        };
        let mut session = tls.lock().expect("session");
        session.writer().write_all(bytes)?;
        while session.wants_write() {
            match session.write_tls(&mut self.socket) {
                Ok(_) => {}
                Err(e) if timed_out(&e) => {
                    // The socket is full: let the reader decrypt (and so the server write) meanwhile.
                    drop(session);
                    std::thread::yield_now();
                    session = tls.lock().expect("session");
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

impl Reader {
    /// Reads what has come (waiting at most 50 ms), appends its plain text to `out`; `Ok(0)` when
    /// the peer closed.
    fn receive(&mut self, out: &mut Vec<u8>) -> io::Result<usize> {
        let read = self.socket.read(&mut self.buffer)?;
        if read == 0 {
            return Ok(0);
        }
        let Some(tls) = &self.tls else {
            out.extend_from_slice(&self.buffer[..read]);
            return Ok(read);
        };
        let mut session = tls.lock().expect("session");
        let mut incoming = &self.buffer[..read];
        while !incoming.is_empty() {
            session.read_tls(&mut incoming)?;
            session
                .process_new_packets()
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
            let mut chunk = [0u8; 16 * 1024];
            loop {
                match session.reader().read(&mut chunk) {
                    Ok(0) => break,
                    Ok(n) => out.extend_from_slice(&chunk[..n]),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(read)
    }
}

/// The samples of one or more measurements of a path: latencies in µs, answers and counted seconds.
#[derive(Clone, Debug, Default)]
struct Samples {
    micros: Vec<f64>,
    answered: usize,
    seconds: f64,
}

impl Samples {
    fn add(&mut self, other: Samples) {
        self.micros.extend(other.micros);
        self.answered += other.answered;
        self.seconds += other.seconds;
    }

    fn figures(mut self) -> PathFigures {
        self.micros.sort_by(f64::total_cmp);
        PathFigures {
            achieved_per_second: self.answered as f64 / self.seconds,
            p50_micros: percentile(&self.micros, 0.5),
            p99_micros: percentile(&self.micros, 0.99),
        }
    }
}

/// One path's measurement: with `rate`, that many requests per second offered over the connections
/// on a fixed schedule; without, every connection keeps [`CAPACITY_WINDOW`] requests in flight.
fn measure(
    port: u16,
    tls: Option<&Arc<ClientConfig>>,
    workload: Workload,
    rate: Option<f64>,
    options: &LoadOptions,
) -> Result<Samples, String> {
    let connections = options.connections.max(1);
    let halves = (0..connections)
        .map(|_| connect_retrying(port, tls))
        .collect::<Result<Vec<_>, _>>()?;
    let (request, answer) = workload.exchange();
    let (request, answer) = (Arc::new(request), Arc::new(answer));
    let start = Instant::now() + Duration::from_millis(20);
    let counted = start + WARM_UP;
    let end = counted + Duration::from_secs_f64(options.seconds);
    // Each connection's share of the rate, its sends staggered across the connections.
    let interval = rate.map(|rate| Duration::from_secs_f64(connections as f64 / rate));
    let mut threads = Vec::new();
    for (i, (writer, reader)) in halves.into_iter().enumerate() {
        let (sent_at, pending) = sync_channel::<Instant>(match rate {
            Some(_) => 1 << 20,
            None => CAPACITY_WINDOW,
        });
        let sent = Arc::new(AtomicUsize::new(0));
        let done = Arc::new(AtomicBool::new(false));
        let first =
            start + interval.map_or(Duration::ZERO, |gap| gap * i as u32 / connections as u32);
        let writing = {
            let (request, sent, done) = (request.clone(), sent.clone(), done.clone());
            std::thread::spawn(move || {
                write_loop(
                    writer, &request, first, interval, end, sent_at, &sent, &done,
                )
            })
        };
        let answer = answer.clone();
        let reading = std::thread::spawn(move || {
            read_loop(reader, &answer, pending, &sent, &done, counted, end)
        });
        threads.push((writing, reading));
    }
    let mut micros = Vec::new();
    let mut answered = 0usize;
    let mut failure = None;
    for (writing, reading) in threads {
        if let Err(e) = writing.join().expect("writer") {
            failure.get_or_insert(format!("write: {e}"));
        }
        match reading.join().expect("reader") {
            Ok((times, count)) => {
                micros.extend(times);
                answered += count;
            }
            Err(e) => {
                failure.get_or_insert(e);
            }
        }
    }
    if let Some(failure) = failure {
        return Err(failure);
    }
    if micros.is_empty() {
        return Err("no answer in the counted time".to_owned());
    }
    Ok(Samples {
        micros,
        answered,
        seconds: options.seconds,
    })
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

/// Sends `request` at `first`, `first + interval`, … until `end` (late sends at once), or without an
/// interval as fast as the window (the channel's bound) lets it; each send's time goes to the reader
/// before the request to the server.
#[allow(clippy::too_many_arguments)]
fn write_loop(
    mut writer: Writer,
    request: &[u8],
    first: Instant,
    interval: Option<Duration>,
    end: Instant,
    sent_at: SyncSender<Instant>,
    sent: &AtomicUsize,
    done: &AtomicBool,
) -> io::Result<()> {
    let outcome = (|| {
        let mut due = first;
        loop {
            let now = Instant::now();
            if due > now {
                std::thread::sleep(due - now);
            }
            let now = Instant::now();
            if now >= end {
                return Ok(());
            }
            if sent_at.send(now).is_err() {
                // The reader gave up; it says why.
                return Ok(());
            }
            sent.fetch_add(1, Ordering::SeqCst);
            writer.send(request)?;
            if let Some(interval) = interval {
                due += interval;
            }
        }
    })();
    done.store(true, Ordering::SeqCst);
    outcome
}

/// Reads answers, checks each is `answer`, and times it from its request's send; returns the times
/// (µs) of requests sent from `counted` on, and the answers that came between `counted` and `end`.
/// Requests unanswered [`DRAIN`] after `end` are timed to then (their latency is at least that).
fn read_loop(
    mut reader: Reader,
    answer: &[u8],
    pending: Receiver<Instant>,
    sent: &AtomicUsize,
    done: &AtomicBool,
    counted: Instant,
    end: Instant,
) -> Result<(Vec<f64>, usize), String> {
    let mut micros = Vec::new();
    let mut in_window = 0usize;
    let mut received = Vec::with_capacity(1 << 16);
    let mut offset = 0usize;
    let mut answers = 0usize;
    let mut last_progress = Instant::now();
    loop {
        let now = Instant::now();
        while received.len() - offset >= answer.len() {
            if received[offset..offset + answer.len()] != *answer {
                let until = (offset + answer.len()).min(received.len());
                return Err(format!(
                    "an unexpected answer: {:?}",
                    String::from_utf8_lossy(&received[offset..until])
                ));
            }
            offset += answer.len();
            answers += 1;
            let Ok(sent_at) = pending.recv() else {
                return Err("an answer to no request".to_owned());
            };
            if sent_at >= counted {
                micros.push((now - sent_at).as_secs_f64() * 1e6);
            }
            if now >= counted && now <= end {
                in_window += 1;
            }
            last_progress = now;
        }
        if offset > 0 {
            received.drain(..offset);
            offset = 0;
        }
        if done.load(Ordering::SeqCst) {
            if answers == sent.load(Ordering::SeqCst) {
                return Ok((micros, in_window));
            }
            // A path that fell behind: the requests still unanswered count as waiting until now (a
            // lower bound), and the connection is dropped rather than drained.
            if now > end + DRAIN {
                while let Ok(sent_at) = pending.try_recv() {
                    if sent_at >= counted {
                        micros.push((now - sent_at).as_secs_f64() * 1e6);
                    }
                }
                return Ok((micros, in_window));
            }
        }
        match reader.receive(&mut received) {
            Ok(0) => return Err("the server closed the connection".to_owned()),
            Ok(_) => {}
            Err(e) if timed_out(&e) => {
                if last_progress.elapsed() > STALL && Instant::now() > end {
                    return Err(format!(
                        "no answer for {STALL:?} ({} of {} answered)",
                        answers,
                        sent.load(Ordering::SeqCst)
                    ));
                }
            }
            Err(e) => return Err(e.to_string()),
        }
    }
}

impl fmt::Display for LoadReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "the proxy's hop, open loop: {} connections (a writer and a reader thread each) on {} cores \
             (load average {:.2} before, {:.2} after), {:.1} s counted per measurement after {:.1} s, \
             {} rounds per path and step alternating, pooled",
            self.connections,
            self.cores,
            self.load_average.0,
            self.load_average.1,
            self.seconds,
            WARM_UP.as_secs_f64(),
            self.rounds,
        )?;
        writeln!(f, "server: {}", self.server_version)?;
        writeln!(
            f,
            "proxy:  {} {}",
            self.proxy_version,
            self.proxy_args.join(" ")
        )?;
        writeln!(f, "TLS proxy: {}", self.proxy_tls_args.join(" "))?;
        writeln!(f, "access proxy: {}", self.proxy_access_args.join(" "))?;
        writeln!(
            f,
            "TLS handshakes refused and tried again: {}",
            self.handshake_retries
        )?;
        writeln!(
            f,
            "latency per request (a batch of 8 gets, a 10-key multi-get) from its write to its answer's \
             last byte, in µs; rates in requests/s; * a path that did not keep up (under {:.0} % of the \
             offered rate answered, or a median over {SUSTAINED_P50_MICROS:.0} µs)",
            SUSTAINED_SHARE * 100.0
        )?;
        for group in &self.groups {
            writeln!(f, "\n{}: {}", group.transport, group.paths.join(" vs "))?;
            for capacity in &group.capacities {
                writeln!(
                    f,
                    "  {}: direct capacity {:.0}/s{} ({:.0} keys/s); with {} in flight per connection: {}",
                    capacity.workload.name(),
                    capacity.per_second,
                    if capacity.sustained {
                        ""
                    } else {
                        " (not sustained)"
                    },
                    capacity.per_second * capacity.workload.keys() as f64,
                    self.capacity_window,
                    group
                        .paths
                        .iter()
                        .zip(&capacity.window_per_second)
                        .map(|(path, rate)| format!("{path} {rate:.0}/s"))
                        .collect::<Vec<_>>()
                        .join(", ")
                )?;
            }
            write!(f, "{:<17} {:>4} {:>7}", "workload", "step", "offered")?;
            for _ in &group.paths {
                write!(f, " | {:>7} {:>7} {:>8}", "rate", "p50", "p99")?;
            }
            for _ in group.paths.iter().skip(1) {
                write!(f, " | {:>7} {:>8} {:>6}", "+p50", "+p99", "x p50")?;
            }
            if group.paths.len() > 2 {
                write!(f, " | {:>8} {:>8}", "+p50 %", "+p99 %")?;
            }
            writeln!(f)?;
            write!(f, "{:<30}", "")?;
            for path in &group.paths {
                write!(f, " | {path:<24}")?;
            }
            for path in group.paths.iter().skip(1) {
                write!(f, " | {:<23}", format!("{path}, added"))?;
            }
            if let [_, proxy, access, ..] = group.paths.as_slice() {
                write!(f, " | {:<17}", format!("{access} over {proxy}"))?;
            }
            writeln!(f)?;
            for row in &group.rows {
                write!(
                    f,
                    "{:<17} {:>3}% {:>7.0}",
                    row.workload.name(),
                    row.step_percent,
                    row.offered_per_second
                )?;
                for figures in &row.paths {
                    let mark = if sustains(row.offered_per_second, figures) {
                        ' '
                    } else {
                        '*'
                    };
                    write!(
                        f,
                        " | {:>6.0}{mark} {:>7.1} {:>8.1}",
                        figures.achieved_per_second, figures.p50_micros, figures.p99_micros
                    )?;
                }
                for i in 1..row.paths.len() {
                    let (p50, p99) = row.added(i);
                    write!(
                        f,
                        " | {p50:>7.1} {p99:>8.1} {:>5.2}x",
                        row.paths[i].p50_micros / row.paths[0].p50_micros
                    )?;
                }
                if let Some((p50, p99)) = row.access_increase() {
                    write!(f, " | {p50:>7.1}% {p99:>7.1}%")?;
                }
                writeln!(f)?;
            }
            if let Some(missing) = &group.missing {
                writeln!(f, "  not measured: {missing}")?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_what_the_server_sends() {
        let (request, answer) = Workload::Pipelined8.exchange();
        assert_eq!(request.windows(5).filter(|w| w == b"get b").count(), 8);
        assert_eq!(answer.windows(5).filter(|w| w == b"END\r\n").count(), 8);
        let (request, answer) = Workload::MultiGet10.exchange();
        assert!(request.starts_with(b"get bench:hop:0 bench:hop:1 "));
        assert_eq!(answer.windows(5).filter(|w| w == b"VALUE").count(), 10);
        assert!(answer.ends_with(b"v\r\nEND\r\n"));
    }

    #[test]
    fn the_operators_arguments_lose_their_listeners_and_pod_paths() {
        let extra = ["-t".to_owned(), "2".to_owned()];
        let (listen, args) = bench_args(
            proxy_args_in(11211, "/scratch/tls", Some("/scratch"), false),
            &extra,
        );
        assert_eq!(listen, "127.0.0.1");
        assert!(!args.iter().any(|a| a == "-p" || a == "-l"));
        assert!(
            args.iter()
                .any(|a| a.contains("ssl_chain_cert=/scratch/tls.crt"))
        );
        assert_eq!(args[args.len() - 2..], ["-t", "2"]);
        let (listen, args) = bench_args(
            proxy_args_in(11211, "/scratch/access", Some("/scratch"), true),
            &extra,
        );
        assert_eq!(listen, "mtls:tag[client]:127.0.0.1:11211");
        assert!(args.iter().any(|a| a.contains("access.lua")));
    }

    #[test]
    fn added_latency_is_the_path_minus_direct() {
        let figures = |p50, p99| PathFigures {
            achieved_per_second: 1.0,
            p50_micros: p50,
            p99_micros: p99,
        };
        let row = StepRow {
            workload: Workload::Get,
            step_percent: 10,
            offered_per_second: 1.0,
            paths: vec![figures(10.0, 30.0), figures(25.0, 70.0)],
        };
        assert_eq!(row.added(1), (15.0, 40.0));
    }
}
