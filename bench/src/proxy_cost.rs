//! `--proxy-hop --cost` (`make bench-proxy ARGS=--cost`): what one request costs the proxy itself, the
//! TLS proxy against the proxy with access control. The open loop ([`crate::proxy_load`]) gives the
//! latency a client sees, whose run-to-run noise on shared cores can be of the size of the access
//! checks' cost; this gives that cost directly, as the proxy's **CPU time per request**: user and
//! kernel, every thread, from `/proc/<pid>/task/*/schedstat` (nanoseconds of CPU, not ticks), over
//! [`REQUESTS`] requests on one connection with one request in flight (a closed loop: every request's
//! whole cost falls within the count), after [`WARM_UP`] requests; and the **round trip** of those
//! requests (the client's wall time per request). A fresh proxy per round; the two proxies alternate,
//! [`ROUNDS`] rounds, and the median round counts. Workloads as the open loop's: a get, 8 pipelined
//! gets, a 10-key multi-get.

use std::fmt;
use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;
use tokio_rustls::rustls::ClientConfig;

use crate::proxy_hop::version;
use crate::proxy_rig::{Launch, Rig};
use crate::proxy_wire::{Reader, Workload, Writer, connect_retrying, store};

/// Requests sent before the counted ones (the route's first use, the backend connection, caches).
const WARM_UP: usize = 500;
/// Counted requests of each round, and the rounds.
pub const REQUESTS: usize = 20_000;
pub const ROUNDS: usize = 7;

/// One proxy's cost of one workload: medians of the rounds, and each round's figures.
#[derive(Clone, Debug, Serialize)]
pub struct Cost {
    pub workload: Workload,
    /// The proxy's CPU time per request, µs.
    pub cpu_micros: f64,
    /// The client's round trip per request, µs.
    pub round_trip_micros: f64,
    pub cpu_micros_rounds: Vec<f64>,
    pub round_trip_micros_rounds: Vec<f64>,
}

/// The whole run.
#[derive(Clone, Debug, Serialize)]
pub struct CostReport {
    pub server_version: String,
    pub proxy_version: String,
    pub proxy_tls_args: Vec<String>,
    pub proxy_access_args: Vec<String>,
    pub cores: usize,
    /// The round trip direct to the TLS server (µs, median of the rounds), workload by workload: what
    /// the proxies' round trips add to.
    pub direct_round_trip_micros: Vec<f64>,
    /// The TLS proxy's costs and the access proxy's, workload by workload.
    pub proxy_tls: Vec<Cost>,
    pub proxy_access: Vec<Cost>,
}

/// Prepares the servers, then measures both proxies, workload by workload.
pub fn run(extra: &[String]) -> Result<CostReport, String> {
    let rig = Rig::prepare(extra)?;
    store(rig.tls_port, Some(&rig.pki.client))?;
    let client = rig.pki.client.clone();
    let paths = [
        (None, client.clone()),
        (Some(&rig.tls_proxy), client),
        (Some(&rig.access_proxy), rig.pki.identified.clone()),
    ];
    let mut direct = Vec::new();
    let mut costs: [Vec<Cost>; 2] = [Vec::new(), Vec::new()];
    for workload in Workload::ALL {
        let mut rounds: [Vec<(f64, f64)>; 3] = [Vec::new(), Vec::new(), Vec::new()];
        for round in 0..ROUNDS {
            for i in crate::proxy_rig::round_order(round, paths.len()) {
                let (launch, tls) = &paths[i];
                rounds[i].push(per_request(&rig, *launch, tls, workload)?);
            }
        }
        let [direct_rounds, proxies @ ..] = rounds;
        let trips: Vec<f64> = direct_rounds.iter().map(|(_, trip)| *trip).collect();
        direct.push(median(&trips));
        for (i, rounds) in proxies.into_iter().enumerate() {
            let (cpu, trip): (Vec<f64>, Vec<f64>) = rounds.into_iter().unzip();
            let cost = Cost {
                workload,
                cpu_micros: median(&cpu),
                round_trip_micros: median(&trip),
                cpu_micros_rounds: cpu,
                round_trip_micros_rounds: trip,
            };
            eprintln!(
                "{}: {}: {:.2} µs of CPU, {:.2} µs round trip per request (direct {:.2} µs)",
                ["proxy TLS", "proxy mTLS+access"][i],
                workload.name(),
                cost.cpu_micros,
                cost.round_trip_micros,
                median(&trips)
            );
            costs[i].push(cost);
        }
    }
    let [proxy_tls, proxy_access] = costs;
    Ok(CostReport {
        server_version: version(&rig.server_binary),
        proxy_version: version(&rig.proxy_binary),
        proxy_tls_args: rig.tls_proxy.describe(),
        proxy_access_args: rig.access_proxy.describe(),
        cores: std::thread::available_parallelism().map_or(0, |n| n.get()),
        direct_round_trip_micros: direct,
        proxy_tls,
        proxy_access,
    })
}

/// A fresh proxy of `launch`: its CPU time and the client's round trip per request of `workload`, µs,
/// over [`REQUESTS`] requests after [`WARM_UP`]; without a launch, the round trip direct to the TLS
/// server (and no CPU time: NaN).
fn per_request(
    rig: &Rig,
    launch: Option<&Launch>,
    tls: &Arc<ClientConfig>,
    workload: Workload,
) -> Result<(f64, f64), String> {
    let proxy = launch.map(|launch| rig.start(launch)).transpose()?;
    let port = launch.map_or(rig.tls_port, |launch| launch.port);
    let cpu = || proxy.as_ref().map_or(Ok(0), |proxy| cpu_nanos(proxy.id()));
    let (mut writer, mut reader) = connect_retrying(port, Some(tls))?;
    let (request, answer) = workload.exchange();
    exchange(&mut writer, &mut reader, &request, &answer, WARM_UP)?;
    let (before, started) = (cpu()?, Instant::now());
    exchange(&mut writer, &mut reader, &request, &answer, REQUESTS)?;
    let (after, took) = (cpu()?, started.elapsed());
    let per = |total: f64| total / REQUESTS as f64;
    let cpu_micros = match proxy {
        Some(_) => per((after - before) as f64 / 1_000.0),
        None => f64::NAN,
    };
    Ok((cpu_micros, per(took.as_secs_f64() * 1e6)))
}

/// `count` times: sends `request`, reads `answer`.
fn exchange(
    writer: &mut Writer,
    reader: &mut Reader,
    request: &[u8],
    answer: &[u8],
    count: usize,
) -> Result<(), String> {
    let mut received = Vec::with_capacity(answer.len() * 2);
    for _ in 0..count {
        writer.send(request).map_err(|e| e.to_string())?;
        reader.expect(answer, &mut received)?;
    }
    Ok(())
}

/// The CPU time of every thread of process `pid`, ns (`schedstat`'s first field: time on a CPU).
fn cpu_nanos(pid: u32) -> Result<u64, String> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).map_err(|e| e.to_string())?;
    let mut total = 0;
    for task in tasks.flatten() {
        let stat = std::fs::read_to_string(task.path().join("schedstat")).unwrap_or_default();
        total += stat
            .split_whitespace()
            .next()
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or(0);
    }
    Ok(total)
}

fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    match sorted.len() {
        0 => f64::NAN,
        n => sorted[n / 2],
    }
}

/// The access proxy's cost over the TLS proxy's: absolute and in % of the TLS proxy's.
pub fn increase(tls: f64, access: f64) -> (f64, f64) {
    (access - tls, (access - tls) / tls * 100.0)
}

impl fmt::Display for CostReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "the proxy's own cost per request on {} cores, one connection, one request in flight: its \
             CPU time (user and kernel, every thread) and the client's round trip, µs; median of \
             {ROUNDS} rounds of {REQUESTS} requests, a fresh proxy each, the paths alternating; a \
             proxy's hop: its round trip minus the direct one",
            self.cores
        )?;
        writeln!(
            f,
            "server: {}; proxy: {}",
            self.server_version, self.proxy_version
        )?;
        writeln!(f, "TLS proxy: {}", self.proxy_tls_args.join(" "))?;
        writeln!(f, "access proxy: {}", self.proxy_access_args.join(" "))?;
        writeln!(
            f,
            "{:<17} | {:>8} {:>8} {:>16} | {:>7} {:>8} {:>8} {:>9} {:>9} {:>16}",
            "workload",
            "CPU TLS",
            "CPU acc.",
            "access adds",
            "RTT dir",
            "RTT TLS",
            "RTT acc.",
            "TLS hop",
            "acc. hop",
            "access adds"
        )?;
        let rows = self.proxy_tls.iter().zip(&self.proxy_access);
        for ((tls, access), direct) in rows.zip(&self.direct_round_trip_micros) {
            let (cpu, cpu_share) = increase(tls.cpu_micros, access.cpu_micros);
            let (tls_hop, access_hop) = (
                tls.round_trip_micros - direct,
                access.round_trip_micros - direct,
            );
            let (hop, hop_share) = increase(tls_hop, access_hop);
            writeln!(
                f,
                "{:<17} | {:>8.2} {:>8.2} {:>7.2} {:>6.1} % | {:>7.2} {:>8.2} {:>8.2} {:>9.2} {:>9.2} {:>7.2} {:>6.1} %",
                tls.workload.name(),
                tls.cpu_micros,
                access.cpu_micros,
                cpu,
                cpu_share,
                direct,
                tls.round_trip_micros,
                access.round_trip_micros,
                tls_hop,
                access_hop,
                hop,
                hop_share
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_increase_is_absolute_and_relative_to_the_tls_proxy() {
        assert_eq!(increase(40.0, 44.0), (4.0, 10.0));
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 3.0);
    }
}
