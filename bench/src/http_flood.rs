//! `--http-flood`: whether the operator's probes and `/metrics` stay answered while other clients hold
//! idle connections to them and reconnect in a loop (issue 45, item 2). In one process, on loopback only:
//! the operator's own probe server and its `/metrics` server (plain HTTP, without the token check, as
//! with `--metrics-secure=false`: the same accept loop and budget as over HTTPS) run on a runtime of
//! their own with two worker threads, as in a pod of two cores; the flooding clients on another of two,
//! and the prober on a thread of its own (as the kubelet is a process of its own).
//!
//! Against each server: `idle` connections that send nothing, each opened again a second after the
//! server closes it; and `reconnecting` clients that connect, send half a request head, wait 200 ms, close and
//! start over. They connect from `sources` loopback addresses (127.0.1.x, Linux routes all of
//! 127.0.0.0/8 to loopback), as that many pods would; the prober connects from 127.0.0.1, as the
//! kubelet from its node's address. Every 100 ms the prober sends `GET /healthz` and `GET /metrics`, each
//! on a new connection with a 1 s timeout (the kubelet's default): the report gives their latencies
//! (p50, p99, max) and failures (no complete `200` answer within the second).
//!
//! Bounded: at most [`MAX_IDLE`] idle and [`MAX_RECONNECTING`] reconnecting clients per server, at most
//! [`MAX_SECONDS`] of probing. The process's open-file limit (RLIMIT_NOFILE) is raised to its hard limit
//! when the soft one is too low for the clients and the servers' connections.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use memcached_operator::manager::http::{self, Health};
use memcached_operator::manager::metrics_auth::Gate;
use memcached_operator::metrics::Metrics;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

pub const MAX_IDLE: usize = 5000;
pub const MAX_RECONNECTING: usize = 1000;
pub const MAX_SECONDS: u64 = 120;
const PROBE_INTERVAL: Duration = Duration::from_millis(100);
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);
const WARMUP: Duration = Duration::from_secs(3);

/// What the flood is made of.
#[derive(Debug, Clone, Copy)]
pub struct FloodOptions {
    pub idle: usize,
    pub reconnecting: usize,
    pub sources: u8,
    pub seconds: u64,
}

/// One endpoint's answers under the flood.
#[derive(Debug, Default)]
pub struct Latencies {
    pub path: &'static str,
    pub answered: Vec<Duration>,
    pub failures: usize,
    /// Of the failures: no connection within the second; closed without an answer; no answer in time.
    pub unconnected: usize,
    pub closed: usize,
    pub late: usize,
}

/// The report: each endpoint's latencies and the flood actually held.
#[derive(Debug)]
pub struct FloodReport {
    pub options: FloodOptions,
    pub endpoints: Vec<Latencies>,
    /// Most idle connections open at once (not yet closed by the server, as the clients see them), per
    /// server.
    pub idle_open: [usize; 2],
    /// Connections the reconnecting clients opened over the run, per server.
    pub reconnects: [usize; 2],
    pub nofile: String,
}

/// Runs the flood and the probes.
pub fn run(options: FloodOptions) -> Result<FloodReport, String> {
    let options = FloodOptions {
        idle: options.idle.min(MAX_IDLE),
        reconnecting: options.reconnecting.min(MAX_RECONNECTING),
        sources: options.sources.max(1),
        seconds: options.seconds.clamp(1, MAX_SECONDS),
    };
    let nofile = raise_nofile(2 * 2 * (options.idle + options.reconnecting) + 1024);
    let runtime = |threads: usize, what: &str| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .enable_all()
            .build()
            .map_err(|e| format!("cannot start the {what}' runtime: {e}"))
    };
    let servers = runtime(2, "servers")?;
    let addrs = servers.block_on(start_servers())?;
    let flood = runtime(2, "flooding clients")?;
    let stop = Instant::now() + WARMUP + Duration::from_secs(options.seconds);
    let (idle_open, reconnects) = flood.block_on(async { start_flood(options, addrs, stop) });
    // The prober on a thread of its own, as the kubelet is a process of its own: its latencies are the
    // servers', not the flooding clients' queue.
    let prober = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the prober's runtime: {e}"))?;
    let (endpoints, idle_held) = prober.block_on(probe_until(addrs, stop, &idle_open));
    let report = FloodReport {
        options,
        endpoints,
        idle_open: idle_held,
        reconnects: [0, 1].map(|i| reconnects[i].load(Ordering::Relaxed)),
        nofile,
    };
    servers.shutdown_background();
    flood.shutdown_background();
    Ok(report)
}

async fn start_servers() -> Result<[SocketAddr; 2], String> {
    let loopback: SocketAddr = "127.0.0.1:0".parse().map_err(|_| "loopback")?;
    let probes = http::serve(loopback, http::probes(Arc::new(Health::default())))
        .await
        .map_err(|e| format!("cannot serve the probes: {e}"))?;
    let metrics = http::serve(
        loopback,
        http::metrics(Arc::new(Metrics::default()), Gate::new(None)),
    )
    .await
    .map_err(|e| format!("cannot serve /metrics: {e}"))?;
    Ok([probes, metrics])
}

type Counters = Vec<Arc<AtomicUsize>>;

/// Starts the idle and reconnecting clients against both servers, until `stop`; returns the counters of
/// idle connections open and of reconnections, per server.
fn start_flood(
    options: FloodOptions,
    addrs: [SocketAddr; 2],
    stop: Instant,
) -> (Counters, Counters) {
    let mut idle_open = Vec::new();
    let mut reconnects = Vec::new();
    for to in addrs {
        let open = Arc::new(AtomicUsize::new(0));
        let opened = Arc::new(AtomicUsize::new(0));
        for i in 0..options.idle {
            tokio::spawn(idle(to, source(i, options.sources), open.clone(), stop));
        }
        for i in 0..options.reconnecting {
            let from = source(options.idle + i, options.sources);
            tokio::spawn(reconnecting(to, from, opened.clone(), stop));
        }
        idle_open.push(open);
        reconnects.push(opened);
    }
    (idle_open, reconnects)
}

/// After the warm-up, probes both servers every [`PROBE_INTERVAL`] until `stop`.
/// Also returns the most idle connections open at once to each server, as the clients saw them.
async fn probe_until(
    addrs: [SocketAddr; 2],
    stop: Instant,
    idle_open: &Counters,
) -> (Vec<Latencies>, [usize; 2]) {
    let mut held = [0, 0];
    tokio::time::sleep(WARMUP).await;
    let mut endpoints = vec![
        Latencies {
            path: "/healthz",
            ..Latencies::default()
        },
        Latencies {
            path: "/metrics",
            ..Latencies::default()
        },
    ];
    let mut tick = tokio::time::interval(PROBE_INTERVAL);
    while Instant::now() < stop {
        tick.tick().await;
        for (most, open) in held.iter_mut().zip(idle_open) {
            *most = (*most).max(open.load(Ordering::Relaxed));
        }
        let (healthz, metrics) =
            tokio::join!(probe(addrs[0], "/healthz"), probe(addrs[1], "/metrics"));
        for (latencies, outcome) in endpoints.iter_mut().zip([healthz, metrics]) {
            match outcome {
                Ok(took) => latencies.answered.push(took),
                Err(failure) => {
                    latencies.failures += 1;
                    match failure {
                        Failure::Unconnected => latencies.unconnected += 1,
                        Failure::Closed => latencies.closed += 1,
                        Failure::Late => latencies.late += 1,
                    }
                }
            }
        }
    }
    (endpoints, held)
}

/// The loopback address of the flooding client number `i`.
fn source(i: usize, sources: u8) -> Ipv4Addr {
    Ipv4Addr::new(127, 0, 1, 1 + (i % usize::from(sources)) as u8)
}

async fn connect(to: SocketAddr, from: Ipv4Addr) -> Option<TcpStream> {
    let socket = TcpSocket::new_v4().ok()?;
    socket.bind(SocketAddr::from((from, 0))).ok()?;
    tokio::time::timeout(Duration::from_secs(1), socket.connect(to))
        .await
        .ok()?
        .ok()
}

/// Holds a connection that sends nothing; opens it again a second after the server closes it.
async fn idle(to: SocketAddr, from: Ipv4Addr, open: Arc<AtomicUsize>, stop: Instant) {
    while Instant::now() < stop {
        if let Some(mut stream) = connect(to, from).await {
            open.fetch_add(1, Ordering::Relaxed);
            let mut byte = [0u8; 1];
            let _ = tokio::time::timeout_at(stop.into(), stream.read(&mut byte)).await;
            open.fetch_sub(1, Ordering::Relaxed);
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Connects, sends half a request head, waits 200 ms, closes; again.
async fn reconnecting(to: SocketAddr, from: Ipv4Addr, opened: Arc<AtomicUsize>, stop: Instant) {
    while Instant::now() < stop {
        if let Some(mut stream) = connect(to, from).await {
            opened.fetch_add(1, Ordering::Relaxed);
            let _ = stream
                .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
                .await;
            tokio::time::sleep(Duration::from_millis(200)).await;
        } else {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Why a probe failed.
#[derive(Debug, Clone, Copy)]
enum Failure {
    /// No connection within the timeout.
    Unconnected,
    /// Closed (or refused, or answered other than `200`) without a `200`.
    Closed,
    /// Connected, but no complete answer within the timeout.
    Late,
}

/// How long `GET path` took on a new connection from 127.0.0.1, if answered `200` within the timeout.
async fn probe(to: SocketAddr, path: &str) -> Result<Duration, Failure> {
    let started = Instant::now();
    let deadline = tokio::time::Instant::from_std(started + PROBE_TIMEOUT);
    let mut stream = match tokio::time::timeout_at(deadline, TcpStream::connect(to)).await {
        Ok(Ok(stream)) => stream,
        Ok(Err(_)) => return Err(Failure::Closed),
        Err(_) => return Err(Failure::Unconnected),
    };
    let exchange = async {
        let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.ok()?;
        let mut response = Vec::new();
        stream.read_to_end(&mut response).await.ok()?;
        response.starts_with(b"HTTP/1.1 200").then_some(())
    };
    match tokio::time::timeout_at(deadline, exchange).await {
        Ok(Some(())) => Ok(started.elapsed()),
        Ok(None) => Err(Failure::Closed),
        Err(_) => Err(Failure::Late),
    }
}

/// Raises the soft open-file limit to the hard one when it is below `needed`; says what it is.
fn raise_nofile(needed: usize) -> String {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit only read and write the struct given.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return "unknown".to_owned();
    }
    let before = limit.rlim_cur;
    if (before as usize) < needed && limit.rlim_max > before {
        limit.rlim_cur = limit.rlim_max;
        // SAFETY: as above.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) } == 0 {
            return format!("{before} raised to {}", limit.rlim_cur);
        }
    }
    format!("{before} (not raised)")
}

fn quantile(sorted: &[Duration], q: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let at = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[at.min(sorted.len() - 1)]
}

impl std::fmt::Display for FloodReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let o = &self.options;
        writeln!(
            f,
            "flood per server: {} idle + {} reconnecting connections from {} loopback addresses; {} s of probes every {} ms (timeout {} s); RLIMIT_NOFILE {}",
            o.idle,
            o.reconnecting,
            o.sources,
            o.seconds,
            PROBE_INTERVAL.as_millis(),
            PROBE_TIMEOUT.as_secs(),
            self.nofile
        )?;
        writeln!(
            f,
            "idle connections open at once, at most (client side): probes {}, metrics {}; reconnections: probes {}, metrics {}",
            self.idle_open[0], self.idle_open[1], self.reconnects[0], self.reconnects[1]
        )?;
        writeln!(
            f,
            "| endpoint | requests | failures (unconnected, closed, late) | p50 | p99 | max |"
        )?;
        writeln!(f, "|---|---|---|---|---|---|")?;
        for endpoint in &self.endpoints {
            let mut sorted = endpoint.answered.clone();
            sorted.sort();
            let ms = |d: Duration| format!("{:.1} ms", d.as_secs_f64() * 1000.0);
            writeln!(
                f,
                "| {} | {} | {} ({}, {}, {}) | {} | {} | {} |",
                endpoint.path,
                sorted.len() + endpoint.failures,
                endpoint.failures,
                endpoint.unconnected,
                endpoint.closed,
                endpoint.late,
                ms(quantile(&sorted, 0.5)),
                ms(quantile(&sorted, 0.99)),
                ms(sorted.last().copied().unwrap_or_default()),
            )?;
        }
        Ok(())
    }
}
