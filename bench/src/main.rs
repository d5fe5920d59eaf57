//! `cargo run --release -p bench` (`make bench`): the scale benchmark's command line. Builds the release
//! operator binary unless `--operator` names one, runs the benchmark `--runs` times (against the fake, or
//! with `--real` a control plane from `$KUBEBUILDER_ASSETS`), and prints a table per run (and the ranges
//! over the runs) or, with `--json`, the reports as JSON; with `--real --scale`, the floor and the operator
//! at each size, in one table ([`bench::real::scale`]). Progress goes to stderr.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::Duration;

use bench::operand::OperandOptions;
use bench::real::scale::ScaleOptions;
use bench::real::{CREATES_IN_FLIGHT, RealOptions};
use bench::{Options, Report};
use clap::Parser;
use serde::Serialize;

/// `--timeout-seconds` unless given (not with `--scale`, whose timeouts grow with each size).
const TIMEOUT_SECONDS: u64 = 600;

/// Runs the memcached-operator binary against an in-process fake API server (or, with --real, a real
/// kube-apiserver) holding N instances and reports how fast and how cheaply it converges.
#[derive(Debug, Parser)]
#[command(name = "bench")]
struct Cli {
    /// Instances created at once.
    #[arg(long, short = 'n', default_value_t = 300)]
    instances: usize,
    /// The fake API server's answer time for every request, in milliseconds (not with --real).
    #[arg(long, default_value_t = 5)]
    latency_ms: u64,
    /// From a pod's creation to its readiness, in milliseconds.
    #[arg(long, default_value_t = 1000)]
    pod_start_ms: u64,
    /// Length of the settled window in which writes are counted, in seconds.
    #[arg(long, default_value_t = 60)]
    settle_seconds: u64,
    /// Give up when the instances are not all Available after this many seconds [default: 600; with
    /// --scale, half a second per instance of each size, at least 600].
    #[arg(long)]
    timeout_seconds: Option<u64>,
    /// The operator binary [default: build and run target/release/memcached-operator].
    #[arg(long)]
    operator: Option<PathBuf>,
    /// An extra argument for the operator, e.g. --operator-arg=--concurrency=16 (repeatable).
    #[arg(long = "operator-arg", allow_hyphen_values = true)]
    operator_args: Vec<String>,
    /// An environment variable for the operator, e.g. --operator-env TOKIO_WORKER_THREADS=1 (repeatable;
    /// the operator gets no other).
    #[arg(long = "operator-env", value_parser = parse_env)]
    operator_env: Vec<(String, String)>,
    /// Runs, each with a fresh fake API server and operator.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    runs: u32,
    /// Print the reports as JSON (a list, one per run) instead of tables.
    #[arg(long)]
    json: bool,
    /// Serve the fake API server over plain HTTP instead of TLS. Over TLS (the default) it offers HTTP/2
    /// and HTTP/1.1 by ALPN as a real API server does, with a CA made at start in the operator's
    /// kubeconfig; over plain HTTP a Kubernetes client speaks HTTP/1.1, one connection per request in
    /// flight, as the figures before the operator spoke HTTP/2 were measured. Either way the report counts
    /// the operator's connections by protocol.
    #[arg(long, conflicts_with = "real")]
    plain_http: bool,
    /// Run against a real control plane instead of the fake: etcd, kube-apiserver,
    /// kube-controller-manager and kube-scheduler from $KUBEBUILDER_ASSETS, with the stand-in kubelet of
    /// the envtest crate (pods Ready after --pod-start-ms, no memcached), the operator's CRD and RBAC from
    /// config/, and the operator under its own ServiceAccount. Requests are counted from the API server's
    /// audit log.
    #[arg(long)]
    real: bool,
    /// With --real: after the settled window, stop the operator, start a new one, and count its requests
    /// and writes from its start until --settle-seconds after it is ready.
    #[arg(long, requires = "real")]
    restart_settled: bool,
    /// With --real: no operator. A stand-in controller in the bench writes each new instance's Deployment
    /// and first status only, 64 instances at a time, as soon as its watch sees the instance: the least
    /// time to a workload and to a first status that this control plane allows, to read the operator's
    /// figures against.
    #[arg(long, requires = "real", conflicts_with_all = ["restart_settled", "record", "runs", "operator", "operator_args", "operator_env"])]
    floor: bool,
    /// With --real: the curve over sizes. For each size (instances, comma-separated; 300,1000,3000 when
    /// none is given), the floor (as --floor) and then the operator, each on a fresh control plane, in one
    /// table: the operator's CPU and CPU per instance (and its ratio to the smallest size's), peak RSS,
    /// status writes, requests and watch re-opens per instance, settled writes, Available against the
    /// floor. One size works too: --sizes 10000.
    #[arg(
        long,
        alias = "sizes",
        value_name = "SIZES",
        num_args = 0..=1,
        value_delimiter = ',',
        default_missing_values = ["300", "1000", "3000"],
        value_parser = parse_size,
        requires = "real",
        conflicts_with_all = ["instances", "floor", "restart_settled", "record", "runs"]
    )]
    scale: Option<Vec<usize>>,
    /// With --real: instances created at once through the admin client.
    #[arg(long, default_value_t = CREATES_IN_FLIGHT, requires = "real")]
    creates_in_flight: usize,
    /// Scrape the operator's /metrics every second into DIR (convergence.jsonl, or operand.jsonl with
    /// --operand, and the run's moments in *.marks.json), for `cargo xtask dashboard-pictures`.
    #[arg(long, value_name = "DIR")]
    record: Option<PathBuf>,
    /// Instead of the convergence of --instances: two instances of 3 real memcached servers (Debian's, run
    /// by the stand-in kubelet on a control plane from $KUBEBUILDER_ASSETS), one with warm handover and
    /// one without, each read by a cache-aside client hashing with ketama over its published list,
    /// through a rollout, a scale-down and a scale-up, the operator reading their statistics every
    /// second. Needs --record.
    #[arg(long, requires = "record", conflicts_with_all = ["real", "plain_http", "runs", "restart_settled"])]
    operand: bool,
    /// Instead of the convergence of --instances: warm handovers on a control plane from
    /// $KUBEBUILDER_ASSETS whose stand-in kubelet runs Debian's memcached per pod. A rollout of each
    /// workload, a scale-down and a scale-up, each of an instance filled with 20 000 keys: the keys that
    /// hit afterwards, the time, the operator's requests and peak RSS.
    #[arg(long, conflicts_with_all = ["real", "plain_http", "runs", "restart_settled", "operand", "record"])]
    handovers: bool,
    /// Instead of the convergence of --instances: what the proxy's hop costs a client. One memcached
    /// server ($MEMCACHED_BINARY, else /usr/bin/memcached) and a proxy-capable memcached
    /// ($MEMCACHED_PROXY_BINARY) running the operator's proxy arguments and route configuration; get
    /// latency direct and through the proxy, for the bench's client and pymemcache.
    #[arg(long, conflicts_with_all = ["real", "plain_http", "runs", "restart_settled", "operand", "record", "handovers"])]
    proxy_hop: bool,
    /// With --proxy-hop: counted gets of each path for each client.
    #[arg(long, default_value_t = 50_000, requires = "proxy_hop")]
    samples: usize,
    /// With --proxy-hop: an extra argument for the proxy after the operator's, e.g. --proxy-arg=-t
    /// --proxy-arg=1 (repeatable), to try a setting.
    #[arg(long = "proxy-arg", allow_hyphen_values = true, requires = "proxy_hop")]
    proxy_args: Vec<String>,
    /// With --proxy-hop: instead of one waiting client, an open loop as memcached's maintainers measure
    /// their proxy: for plain gets, 8 pipelined gets and 10-key multi-gets, the direct path's capacity,
    /// then --steps of it offered at a fixed rate to each path (plain text and TLS, direct and through
    /// the proxy), p50 and p99 per request and the proxy's added latency (--json for JSON).
    #[arg(long, requires = "proxy_hop")]
    open_loop: bool,
    /// With --proxy-hop: instead of latency under load, the proxy's own cost per request, the TLS proxy
    /// against the proxy with access control: its CPU time (every thread, user and kernel) and the
    /// round trip, one request in flight, for gets, 8 pipelined gets and 10-key multi-gets (--json).
    #[arg(long, requires = "proxy_hop", conflicts_with = "open_loop")]
    cost: bool,
    /// With --open-loop: the TLS proxy measured a second time as a path of its own (an A/A control),
    /// to show how far two runs of one proxy differ on this machine.
    #[arg(long, requires = "open_loop")]
    control: bool,
    /// With --open-loop: client connections, each with a writer and a reader thread.
    #[arg(long, default_value_t = 4, requires = "open_loop")]
    connections: usize,
    /// With --open-loop: the offered rates, in percent of the direct path's capacity.
    #[arg(long, value_delimiter = ',', default_values_t = [10u32, 50, 80], requires = "open_loop")]
    steps: Vec<u32>,
    /// With --open-loop: counted seconds of each measurement (after half a second of warm-up).
    #[arg(long, default_value_t = 1.0, requires = "open_loop")]
    step_seconds: f64,
    /// With --open-loop: measurements of each path at each step, the paths alternating (pooled).
    #[arg(long, default_value_t = 2, requires = "open_loop")]
    rounds: usize,
    /// Instead of the convergence of --instances: the operator's probe and /metrics servers (in this
    /// process, on loopback) under a flood of --idle and --reconnecting connections to each, from
    /// --sources loopback addresses; /healthz and /metrics latencies and failures.
    #[arg(long, conflicts_with_all = ["real", "plain_http", "runs", "operand", "record", "handovers", "proxy_hop"])]
    http_flood: bool,
    /// With --http-flood: idle connections held to each server.
    #[arg(long, default_value_t = 1000, requires = "http_flood")]
    idle: usize,
    /// With --http-flood: clients per server that connect, send half a request, and reconnect.
    #[arg(long, default_value_t = 300, requires = "http_flood")]
    reconnecting: usize,
    /// With --http-flood: loopback addresses the flood comes from (127.0.1.1 and up).
    #[arg(long, default_value_t = 50, requires = "http_flood")]
    sources: u8,
    /// With --http-flood: seconds of probing.
    #[arg(long, default_value_t = 20, requires = "http_flood")]
    seconds: u64,
    /// With --operand: how long each phase goes on once the operator is done with it, in seconds.
    #[arg(long, default_value_t = 30, requires = "operand")]
    phase_seconds: u64,
}

/// Prints a report as JSON with `json`, else as its table; or its error.
fn print_report(
    outcome: Result<impl std::fmt::Display + Serialize, String>,
    json: bool,
) -> ExitCode {
    let outcome = match (json, outcome) {
        (true, Ok(report)) => serde_json::to_string_pretty(&report).map_err(|e| e.to_string()),
        (_, outcome) => outcome.map(|report| report.to_string()),
    };
    print_outcome(outcome)
}

/// Prints a one-report run's report, or its error.
fn print_outcome(outcome: Result<impl std::fmt::Display, String>) -> ExitCode {
    match outcome {
        Ok(report) => {
            println!("{report}");
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::FAILURE
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if cli.proxy_hop {
        return proxy_hop(&cli);
    }
    if cli.http_flood {
        return print_outcome(bench::http_flood::run(bench::http_flood::FloodOptions {
            idle: cli.idle,
            reconnecting: cli.reconnecting,
            sources: cli.sources,
            seconds: cli.seconds,
        }));
    }
    // Before a release build of minutes: without the binaries, --real cannot run at all.
    if (cli.real || cli.operand || cli.handovers)
        && let Err(error) = bench::real::assets()
    {
        eprintln!("error: {error}");
        return ExitCode::FAILURE;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap_or(Path::new("."));
    let real = RealOptions {
        config_dir: root.join("config"),
        restart_settled: cli.restart_settled,
        creates_in_flight: cli.creates_in_flight,
    };
    if cli.floor {
        let floor = bench::real::floor::FloorOptions {
            instances: cli.instances,
            pod_start: Duration::from_millis(cli.pod_start_ms),
            timeout: Duration::from_secs(cli.timeout_seconds.unwrap_or(TIMEOUT_SECONDS)),
            creates_in_flight: cli.creates_in_flight,
            config_dir: real.config_dir.clone(),
        };
        eprintln!(
            "the floor: {} instances on a real control plane, no operator",
            floor.instances
        );
        let outcome = match tokio::runtime::Runtime::new() {
            Ok(runtime) => runtime.block_on(bench::real::floor::run(&floor)),
            Err(error) => Err(format!("cannot start the async runtime: {error}")),
        };
        return print_report(outcome, cli.json);
    }
    let operator = match &cli.operator {
        Some(path) => path.clone(),
        None => match build_release() {
            Ok(path) => path,
            Err(error) => {
                eprintln!("error: {error}");
                return ExitCode::FAILURE;
            }
        },
    };
    let options = Options {
        operator,
        operator_args: cli.operator_args.clone(),
        operator_env: cli.operator_env.clone(),
        instances: cli.instances,
        latency: Duration::from_millis(cli.latency_ms),
        pod_start: Duration::from_millis(cli.pod_start_ms),
        settle: Duration::from_secs(cli.settle_seconds),
        timeout: Duration::from_secs(cli.timeout_seconds.unwrap_or(TIMEOUT_SECONDS)),
        tls: !cli.plain_http,
        record: cli.record.clone(),
    };
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    if let Some(sizes) = &cli.scale {
        let scale = ScaleOptions::new(sizes.clone(), cli.timeout_seconds.map(Duration::from_secs));
        eprintln!(
            "the curve: {:?} instances against {}, each size's floor and operator on fresh control planes",
            scale.sizes,
            options.operator.display()
        );
        let outcome = runtime.block_on(bench::real::scale::run(&options, &real, &scale));
        return print_report(outcome, cli.json);
    }
    if cli.handovers {
        eprintln!(
            "warm handovers against {}, on a real control plane",
            options.operator.display()
        );
        return print_outcome(
            runtime.block_on(bench::handovers::run(&options, root.join("config"))),
        );
    }
    if let (true, Some(record_dir)) = (cli.operand, &cli.record) {
        let operand = OperandOptions {
            config_dir: root.join("config"),
            record_dir: record_dir.clone(),
            size: 3,
            // 3000 values of 2000 bytes: about 2 MiB a server, an eighth of its 16 MiB, so that the
            // memory panel shows use against the limit without evictions.
            keys: 3000,
            value_bytes: 2000,
            memory_mb: 16,
            reads_per_second: 200,
            warmup_seconds: 10,
            phase: Duration::from_secs(cli.phase_seconds),
        };
        eprintln!(
            "operand run: two instances of {} real memcached servers, handover on and off, against {}",
            operand.size,
            options.operator.display()
        );
        return print_outcome(runtime.block_on(bench::operand::run(&options, &operand)));
    }
    let mut reports = Vec::new();
    for run in 1..=cli.runs {
        eprintln!(
            "run {run} of {}: {} instances against {}{}",
            cli.runs,
            cli.instances,
            options.operator.display(),
            if cli.real {
                ", on a real control plane"
            } else if cli.plain_http {
                ", over plain HTTP"
            } else {
                ", over TLS"
            }
        );
        let result = if cli.real {
            runtime.block_on(bench::real::run(&options, &real))
        } else {
            runtime.block_on(bench::run(&options))
        };
        match result {
            Ok(report) => {
                if !cli.json {
                    println!("{}", report.table());
                }
                reports.push(report);
            }
            Err(error) => {
                eprintln!("error: {error}");
                return ExitCode::FAILURE;
            }
        }
    }
    if cli.json {
        match serde_json::to_string_pretty(&reports) {
            Ok(json) => println!("{json}"),
            Err(error) => {
                eprintln!("error: {error}");
                return ExitCode::FAILURE;
            }
        }
    } else if reports.len() > 1 {
        println!("{}", ranges(&reports));
    }
    ExitCode::SUCCESS
}

/// `--proxy-hop`: skipped (success, with the reason) when a binary is missing.
fn proxy_hop(cli: &Cli) -> ExitCode {
    if let Err(why) = bench::proxy_hop::binaries() {
        eprintln!("skipped: {why}");
        return ExitCode::SUCCESS;
    }
    if cli.cost {
        return print_report(bench::proxy_cost::run(&cli.proxy_args), cli.json);
    }
    if cli.open_loop {
        let options = bench::proxy_load::LoadOptions {
            connections: cli.connections.max(1),
            steps: cli.steps.clone(),
            seconds: cli.step_seconds.max(0.1),
            rounds: cli.rounds.max(1),
            proxy_args: cli.proxy_args.clone(),
            control: cli.control,
        };
        return print_report(bench::proxy_load::run(&options), cli.json);
    }
    let options = bench::proxy_hop::HopOptions {
        samples: cli.samples.max(1),
        proxy_args: cli.proxy_args.clone(),
    };
    print_outcome(bench::proxy_hop::run(&options))
}

/// A headline figure: its name, how to read it from a report (if that run has it), its unit.
type Figure = (&'static str, fn(&Report) -> Option<f64>, &'static str);

/// Minimum and maximum of the headline figures over the runs (those every run has).
fn ranges(reports: &[Report]) -> String {
    let figures: [Figure; 13] = [
        ("all children exist", |r| Some(r.children_seconds), "s"),
        (
            "workload after create, max",
            |r| r.workload_after_create.map(|d| d.max),
            "s",
        ),
        (
            "first status after create, max",
            |r| r.first_status_after_create.map(|d| d.max),
            "s",
        ),
        (
            "first status written after create (audit), max",
            |r| r.first_status_written_after_create.map(|d| d.max),
            "s",
        ),
        ("pods ready", |r| r.pods_ready_seconds, "s"),
        ("all Available", |r| Some(r.available_seconds), "s"),
        (
            "requests per instance",
            |r| Some(r.requests_per_instance),
            "",
        ),
        ("CPU, converging", |r| Some(r.cpu_converge_seconds), "s"),
        ("CPU, whole run", |r| Some(r.cpu_total_seconds), "s"),
        ("peak RSS", |r| Some(r.peak_rss_mib), "MiB"),
        ("writes when settled", |r| Some(r.settled_writes as f64), ""),
        (
            "API server connections",
            |r| r.connections.map(|c| (c.http2 + c.http1) as f64),
            "",
        ),
        (
            "writes after a restart",
            |r| r.restart.as_ref().map(|r| r.writes_total as f64),
            "",
        ),
    ];
    let mut out = format!("ranges over {} runs (min – max):\n", reports.len());
    for (name, figure, unit) in figures {
        let Some(values) = reports.iter().map(figure).collect::<Option<Vec<f64>>>() else {
            continue;
        };
        let values = values.into_iter();
        let min = values.clone().fold(f64::INFINITY, f64::min);
        let max = values.fold(f64::NEG_INFINITY, f64::max);
        out.push_str(&format!("{name:<28} {min:.2} – {max:.2} {unit}\n"));
    }
    out
}

/// A size of `--scale`: at least one instance.
fn parse_size(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(0) => Err("a size is at least 1 instance".to_owned()),
        Ok(n) => Ok(n),
        Err(e) => Err(format!("{s:?} is not a number of instances: {e}")),
    }
}

fn parse_env(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .filter(|(key, _)| !key.is_empty())
        .map(|(key, value)| (key.to_owned(), value.to_owned()))
        .ok_or_else(|| format!("{s:?} is not KEY=VALUE"))
}

/// Builds the release operator binary and returns its path.
fn build_release() -> Result<PathBuf, String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .ok_or("no workspace root")?;
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    eprintln!(
        "building the release operator binary (cargo build --release --bin memcached-operator)"
    );
    let status = Command::new(cargo)
        .args(["build", "--release", "--bin", "memcached-operator"])
        .current_dir(root)
        .status()
        .map_err(|e| format!("cannot run cargo: {e}"))?;
    if !status.success() {
        return Err(format!("cargo build failed ({status})"));
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    Ok(target.join("release").join("memcached-operator"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_well_formed_and_passes_operator_flags_through() {
        Cli::command().debug_assert();
        let cli = Cli::try_parse_from(["bench", "-n", "5", "--operator-arg", "--concurrency=16"])
            .unwrap();
        assert_eq!(cli.instances, 5);
        assert_eq!(cli.operator_args, ["--concurrency=16"]);
        assert!(Cli::try_parse_from(["bench", "--runs", "0"]).is_err());
        let cli =
            Cli::try_parse_from(["bench", "--operator-env", "TOKIO_WORKER_THREADS=1"]).unwrap();
        assert_eq!(
            cli.operator_env,
            [("TOKIO_WORKER_THREADS".into(), "1".into())]
        );
        assert!(Cli::try_parse_from(["bench", "--operator-env", "=1"]).is_err());
        assert!(!cli.plain_http, "TLS unless asked, as a real API server");
        assert!(
            Cli::try_parse_from(["bench", "--plain-http"])
                .unwrap()
                .plain_http
        );
        assert!(!cli.real, "the fake unless asked");
    }

    #[test]
    fn real_server_flags() {
        let cli =
            Cli::try_parse_from(["bench", "--real", "--restart-settled", "-n", "150"]).unwrap();
        assert!(cli.real && cli.restart_settled);
        assert_eq!(cli.creates_in_flight, CREATES_IN_FLIGHT);
        assert!(Cli::try_parse_from(["bench", "--restart-settled"]).is_err());
        assert!(Cli::try_parse_from(["bench", "--creates-in-flight", "8"]).is_err());
        assert!(
            Cli::try_parse_from(["bench", "--real", "--floor"])
                .unwrap()
                .floor
        );
        assert!(Cli::try_parse_from(["bench", "--floor"]).is_err());
        assert!(Cli::try_parse_from(["bench", "--real", "--floor", "--restart-settled"]).is_err());
        assert!(Cli::try_parse_from(["bench", "--real", "--plain-http"]).is_err());
    }

    #[test]
    fn scale_flags() {
        let sizes = |args: &[&str]| Cli::try_parse_from(args).map(|cli| cli.scale);
        assert_eq!(
            sizes(&["bench", "--real", "--scale"]).unwrap(),
            Some(bench::real::scale::DEFAULT_SIZES.to_vec())
        );
        assert_eq!(
            sizes(&["bench", "--real", "--scale", "30,60"]).unwrap(),
            Some(vec![30, 60])
        );
        assert_eq!(
            sizes(&["bench", "--real", "--sizes", "10000", "--json"]).unwrap(),
            Some(vec![10_000])
        );
        assert_eq!(sizes(&["bench", "--real"]).unwrap(), None);
        assert!(
            sizes(&["bench", "--scale"]).is_err(),
            "a real control plane only"
        );
        assert!(sizes(&["bench", "--real", "--scale", "0,300"]).is_err());
        assert!(sizes(&["bench", "--real", "--scale", "-n", "5"]).is_err());
        assert!(sizes(&["bench", "--real", "--scale", "--floor"]).is_err());
        let cli = Cli::try_parse_from(["bench", "--real", "--scale"]).unwrap();
        assert_eq!(cli.timeout_seconds, None, "each size's own");
    }

    #[test]
    fn recording_flags() {
        let cli = Cli::try_parse_from(["bench", "--real", "--record", "samples"]).unwrap();
        assert_eq!(cli.record, Some(PathBuf::from("samples")));
        let cli = Cli::try_parse_from(["bench", "--operand", "--record", "samples"]).unwrap();
        assert!(cli.operand);
        assert_eq!(cli.phase_seconds, 30);
        assert!(
            Cli::try_parse_from(["bench", "--operand"]).is_err(),
            "an operand run is only for its recording"
        );
        assert!(Cli::try_parse_from(["bench", "--operand", "--record", "d", "--real"]).is_err());
        assert!(Cli::try_parse_from(["bench", "--phase-seconds", "5"]).is_err());
    }
}
