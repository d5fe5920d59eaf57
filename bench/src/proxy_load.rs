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
//! Two groups ([`crate::proxy_rig`] prepares the servers and proxies): plain text (direct to the server,
//! through the proxy), and TLS (direct to a server serving TLS; through a proxy serving TLS and speaking
//! it to the server; through a proxy with access control; with [`LoadOptions::control`], through the TLS
//! proxy again, an A/A path). Each proxy is started afresh for each of its measurements and stopped
//! after it. A request that fails (a refused key, an
//! error) fails the run: every answer is compared with the one expected.

use std::fmt;
use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio_rustls::rustls::ClientConfig;

use crate::proxy_hop::version;
use crate::proxy_rig::{Launch, Rig, round_order};
use crate::proxy_wire::{
    HANDSHAKE_RETRIES, Reader, STALL, Workload, Writer, connect_retrying, store, timed_out,
};

/// Requests each connection keeps in flight while the capacity is measured.
pub const CAPACITY_WINDOW: usize = 8;
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

/// The control path's name (see [`LoadOptions::control`]).
pub const CONTROL: &str = "proxy TLS, again";

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
    /// A control: the TLS proxy measured a second time as a path of its own (an A/A comparison), so
    /// the report shows how far two runs of the same proxy differ on this machine.
    pub control: bool,
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
        self.added_over(2, 1)
    }

    /// With the control path (a fourth: the TLS proxy again), how much its added latency differs from
    /// the second's, in % of the second's: p50 and p99. What two runs of one proxy differ by.
    pub fn control_difference(&self) -> Option<(f64, f64)> {
        self.added_over(3, 1)
    }

    /// How much path `i`'s added latency differs from path `base`'s, in % of `base`'s: p50 and p99.
    fn added_over(&self, i: usize, base: usize) -> Option<(f64, f64)> {
        if self.paths.len() <= i {
            return None;
        }
        let (base, path) = (self.added(base), self.added(i));
        Some((
            (path.0 - base.0) / base.0 * 100.0,
            (path.1 - base.1) / base.1 * 100.0,
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

/// Starts the servers, measures each group (each proxy started afresh for each of its measurements),
/// and stops them.
pub fn run(options: &LoadOptions) -> Result<LoadReport, String> {
    let load_before = load_average();
    let rig = Rig::prepare(&options.proxy_args)?;
    let plain = [
        Path::direct("direct", rig.plain_port, None),
        Path::proxied("proxy", &rig.proxy, None),
    ];
    let client = Some(rig.pki.client.clone());
    let mut tls = vec![
        Path::direct("direct TLS", rig.tls_port, client.clone()),
        Path::proxied("proxy TLS", &rig.tls_proxy, client.clone()),
        Path::proxied(
            "proxy mTLS+access",
            &rig.access_proxy,
            Some(rig.pki.identified.clone()),
        ),
    ];
    if options.control {
        tls.push(Path::proxied(CONTROL, &rig.tls_proxy, client));
    }
    let groups = vec![
        group(&rig, "plain", &plain, options, None)?,
        group(&rig, "TLS", &tls, options, None)?,
    ];
    Ok(LoadReport {
        server_version: version(&rig.server_binary),
        proxy_version: version(&rig.proxy_binary),
        proxy_args: rig.proxy.args.clone(),
        proxy_tls_args: rig.tls_proxy.args.clone(),
        handshake_retries: HANDSHAKE_RETRIES.load(Ordering::Relaxed),
        proxy_access_args: rig.access_proxy.describe(),
        connections: options.connections,
        capacity_window: CAPACITY_WINDOW,
        seconds: options.seconds,
        rounds: options.rounds,
        load_average: (load_before, load_average()),
        cores: std::thread::available_parallelism().map_or(0, |n| n.get()),
        groups,
    })
}

/// One path of a group: its name, where it listens, the client's TLS, and for a proxy its launch.
struct Path<'a> {
    name: &'static str,
    port: u16,
    tls: Option<Arc<ClientConfig>>,
    launch: Option<&'a Launch>,
}

impl<'a> Path<'a> {
    fn direct(name: &'static str, port: u16, tls: Option<Arc<ClientConfig>>) -> Self {
        Path {
            name,
            port,
            tls,
            launch: None,
        }
    }

    fn proxied(name: &'static str, launch: &'a Launch, tls: Option<Arc<ClientConfig>>) -> Self {
        Path {
            name,
            port: launch.port,
            tls,
            launch: Some(launch),
        }
    }

    /// One measurement of the path; a proxy is started for it and stopped after, so where the proxy's
    /// threads land against the client's on the machine's cores is drawn again at every measurement
    /// (kept for a whole run, one draw swung a path's median by tens of microseconds).
    fn measure(
        &self,
        rig: &Rig,
        workload: Workload,
        rate: Option<f64>,
        options: &LoadOptions,
    ) -> Result<Samples, String> {
        let _proxy = self.launch.map(|launch| rig.start(launch)).transpose()?;
        measure(self.port, self.tls.as_ref(), workload, rate, options)
    }
}

/// One group: the keys stored on the group's server (through its direct path), then for each workload
/// the direct path's capacity and each step on each path.
fn group(
    rig: &Rig,
    transport: &'static str,
    paths: &[Path<'_>],
    options: &LoadOptions,
    missing: Option<String>,
) -> Result<Group, String> {
    let direct = &paths[0];
    store(direct.port, direct.tls.as_ref())?;
    let mut capacities = Vec::new();
    let mut rows = Vec::new();
    for workload in Workload::ALL {
        let mut window_per_second = Vec::new();
        for path in paths {
            let achieved = path
                .measure(rig, workload, None, options)
                .map_err(|e| {
                    format!(
                        "{transport} {} window of {}: {e}",
                        path.name,
                        workload.name()
                    )
                })?
                .figures()
                .achieved_per_second;
            window_per_second.push(achieved);
        }
        // The open loop costs the client more than the window does (a wake-up and a write per
        // request), on the same cores: from the direct path's window down, the first rate it sustains.
        let mut capacity = window_per_second[0];
        let mut sustained = false;
        for _ in 0..CAPACITY_TRIES {
            let measured = direct
                .measure(rig, workload, Some(capacity), options)
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
            for round in 0..options.rounds.max(1) {
                for i in round_order(round, paths.len()) {
                    let path = &paths[i];
                    let measured = path
                        .measure(rig, workload, Some(offered), options)
                        .map_err(|e| {
                            let name = path.name;
                            format!("{transport} {name}, {} at {step} %: {e}", workload.name())
                        })?;
                    samples[i].add(measured);
                }
            }
            let mut figures = Vec::new();
            for (Path { name: path, .. }, samples) in paths.iter().zip(samples) {
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
        paths: paths.iter().map(|path| path.name).collect(),
        capacities,
        rows,
        missing,
    })
}

fn load_average() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next()?.parse().ok())
        .unwrap_or(f64::NAN)
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
             {} rounds per path and step, the paths in alternating order (forward, backward), pooled",
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
            for _ in group.paths.iter().skip(2).take(2) {
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
            if let [_, proxy, _, again] = group.paths.as_slice() {
                write!(f, " | {:<17}", format!("{again} over {proxy}"))?;
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
                if let Some((p50, p99)) = row.control_difference() {
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
