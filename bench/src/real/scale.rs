//! `--real --scale [SIZES]`: the curve of the operator's cost over the number of instances. For each size,
//! smallest first, the fair floor ([`super::floor`]) and then the operator ([`super::run`]), each on a
//! control plane of its own as a single run has, every figure read from their reports; one table puts the
//! sizes side by side, with each size's CPU per instance against the smallest size's.
//!
//! A run's timeout grows with its size ([`timeout_for`]) unless `--timeout-seconds` fixes it, so that a
//! single large size (`--sizes 10000`) is a bench run like any other.

use std::fmt;
use std::time::Duration;

use serde::Serialize;

use super::floor::{self, FloorOptions, FloorReport};
use super::{RealOptions, STATS_WRITES};
use crate::{Options, Report};

/// The sizes of `--scale` without a list.
pub const DEFAULT_SIZES: [usize; 3] = [300, 1000, 3000];

/// A run's shortest timeout, and what each instance adds to it ([`timeout_for`]).
pub const MIN_TIMEOUT: Duration = Duration::from_secs(600);
pub const TIMEOUT_PER_INSTANCE: Duration = Duration::from_millis(500);

/// The reconciler's status writes, as the requests of a [`Report`] name them.
const STATUS_WRITES: &str = "patch memcacheds/status";

/// What `--scale` adds to [`Options`] and [`RealOptions`].
#[derive(Clone, Debug)]
pub struct ScaleOptions {
    /// Instances per run, smallest first, each once.
    pub sizes: Vec<usize>,
    /// Each run's timeout; by default [`timeout_for`] its size.
    pub timeout: Option<Duration>,
}

impl ScaleOptions {
    pub fn new(mut sizes: Vec<usize>, timeout: Option<Duration>) -> Self {
        sizes.sort_unstable();
        sizes.dedup();
        Self { sizes, timeout }
    }
}

/// The timeout of a run of `instances`: [`TIMEOUT_PER_INSTANCE`] each, at least [`MIN_TIMEOUT`] (10 000
/// instances: 5 000 s).
pub fn timeout_for(instances: usize) -> Duration {
    let instances = u32::try_from(instances).unwrap_or(u32::MAX);
    MIN_TIMEOUT.max(TIMEOUT_PER_INSTANCE.saturating_mul(instances))
}

/// Every size's floor and operator runs, and the figures the table shows.
#[derive(Clone, Debug, Serialize)]
pub struct ScaleReport {
    pub sizes: Vec<SizeRun>,
}

/// One size: its figures, and the two reports they come from.
#[derive(Clone, Debug, Serialize)]
pub struct SizeRun {
    pub figures: Figures,
    pub floor: FloorReport,
    pub operator: Report,
}

/// One row of the table. Requests and writes count from the first create to the settled window (the
/// operator's [`Report::requests`]).
#[derive(Clone, Copy, Debug, Serialize, PartialEq)]
pub struct Figures {
    pub instances: usize,
    /// Operator CPU from the first create until every instance was Available.
    pub cpu_converge_seconds: f64,
    pub cpu_per_instance_ms: f64,
    /// `cpu_per_instance_ms` over that of the smallest size.
    pub cpu_per_instance_vs_smallest: f64,
    pub peak_rss_mib: f64,
    /// What the operator's caches hold at the end, per instance, in kB (all resources).
    pub caches_kb_per_instance: f64,
    /// The reconciler's `patch memcacheds/status`, per instance.
    pub status_writes_per_instance: f64,
    /// The stats collector's writes of `status.stats`, per instance.
    pub stats_writes_per_instance: f64,
    /// Every request but watch re-opens and stats writes, per instance.
    pub requests_per_instance: f64,
    /// Watches opened after the first create: all re-opens, the operator's watches being open before it.
    pub watch_reopens: usize,
    pub settled_writes: usize,
    pub settle_seconds: u64,
    /// Until every instance was `Available=True`.
    pub available_seconds: f64,
    /// The floor's time to every pod Ready, its equivalent of every instance Available.
    pub floor_seconds: Option<f64>,
    pub available_over_floor: Option<f64>,
}

impl Figures {
    /// The row of one size (`cpu_per_instance_vs_smallest` left at 1, for [`ScaleReport::new`]).
    pub fn of(operator: &Report, floor: &FloorReport) -> Self {
        let n = operator.instances.max(1) as f64;
        let count = |key: &str| operator.requests.get(key).copied().unwrap_or_default();
        let watch_reopens: usize = operator
            .requests
            .iter()
            .filter(|(key, _)| key.starts_with("watch "))
            .map(|(_, count)| count)
            .sum();
        let stats_writes = count(STATS_WRITES);
        let others = operator
            .requests_total
            .saturating_sub(watch_reopens + stats_writes);
        let floor_seconds = floor.pods_ready_seconds;
        Self {
            instances: operator.instances,
            cpu_converge_seconds: operator.cpu_converge_seconds,
            cpu_per_instance_ms: operator.cpu_converge_seconds * 1000.0 / n,
            cpu_per_instance_vs_smallest: 1.0,
            peak_rss_mib: operator.peak_rss_mib,
            caches_kb_per_instance: operator.caches.values().map(|c| c.bytes).sum::<u64>() as f64
                / 1000.0
                / n,
            status_writes_per_instance: count(STATUS_WRITES) as f64 / n,
            stats_writes_per_instance: stats_writes as f64 / n,
            requests_per_instance: others as f64 / n,
            watch_reopens,
            settled_writes: operator.settled_writes,
            settle_seconds: operator.settle_seconds,
            available_seconds: operator.available_seconds,
            floor_seconds,
            available_over_floor: floor_seconds
                .filter(|s| *s > 0.0)
                .map(|s| operator.available_seconds / s),
        }
    }
}

impl ScaleReport {
    /// The sizes' runs, smallest first, each size's CPU per instance against the first's.
    pub fn new(runs: Vec<(FloorReport, Report)>) -> Self {
        let mut sizes: Vec<SizeRun> = runs
            .into_iter()
            .map(|(floor, operator)| SizeRun {
                figures: Figures::of(&operator, &floor),
                floor,
                operator,
            })
            .collect();
        let smallest = sizes.first().map(|s| s.figures.cpu_per_instance_ms);
        if let Some(smallest) = smallest.filter(|ms| *ms > 0.0) {
            for size in &mut sizes {
                size.figures.cpu_per_instance_vs_smallest =
                    size.figures.cpu_per_instance_ms / smallest;
            }
        }
        Self { sizes }
    }
}

/// Runs each size's floor and operator, each on a fresh control plane, and prints their own reports to
/// stderr as they come (a failure at a large size keeps the smaller ones' figures there).
pub async fn run(
    options: &Options,
    real: &RealOptions,
    scale: &ScaleOptions,
) -> Result<ScaleReport, String> {
    let mut runs = Vec::new();
    for &instances in &scale.sizes {
        let options = Options {
            instances,
            timeout: scale.timeout.unwrap_or_else(|| timeout_for(instances)),
            ..options.clone()
        };
        eprintln!(
            "{instances} instances: the fair floor, then the operator, each on a fresh control plane \
             (timeout {} s each)",
            options.timeout.as_secs()
        );
        let floor = floor::run(&floor_options(&options, real)).await?;
        eprintln!("{floor}\n");
        let operator = super::run(&options, real).await?;
        eprintln!("{}", operator.table());
        runs.push((floor, operator));
    }
    Ok(ScaleReport::new(runs))
}

/// The floor of the run that `options` describe.
fn floor_options(options: &Options, real: &RealOptions) -> FloorOptions {
    FloorOptions {
        instances: options.instances,
        pod_start: options.pod_start,
        timeout: options.timeout,
        creates_in_flight: real.creates_in_flight,
        config_dir: real.config_dir.clone(),
    }
}

/// The table's columns: header, and the cell of a row.
type Column = (&'static str, fn(&Figures) -> String);

const COLUMNS: [Column; 14] = [
    ("instances", |f| f.instances.to_string()),
    ("operator CPU converging (s)", |f| {
        format!("{:.2}", f.cpu_converge_seconds)
    }),
    ("CPU per instance (ms)", |f| {
        format!("{:.1}", f.cpu_per_instance_ms)
    }),
    ("vs smallest", |f| {
        format!("{:.2}x", f.cpu_per_instance_vs_smallest)
    }),
    ("peak RSS (MiB)", |f| format!("{:.1}", f.peak_rss_mib)),
    ("caches (kB / instance)", |f| {
        format!("{:.2}", f.caches_kb_per_instance)
    }),
    ("status writes / instance", |f| {
        format!("{:.2}", f.status_writes_per_instance)
    }),
    ("stats writes / instance", |f| {
        format!("{:.2}", f.stats_writes_per_instance)
    }),
    ("requests / instance", |f| {
        format!("{:.2}", f.requests_per_instance)
    }),
    ("watch re-opens", |f| f.watch_reopens.to_string()),
    ("settled writes", |f| {
        format!("{} in {} s", f.settled_writes, f.settle_seconds)
    }),
    ("Available (s)", |f| format!("{:.1}", f.available_seconds)),
    ("fair floor (s)", |f| seconds(f.floor_seconds)),
    ("Available / floor", |f| {
        f.available_over_floor
            .map_or("–".to_owned(), |r| format!("{r:.2}x"))
    }),
];

fn seconds(value: Option<f64>) -> String {
    value.map_or("–".to_owned(), |s| format!("{s:.1}"))
}

/// How the columns are counted, printed under the table.
const NOTES: &str = "\
- operator CPU: user + system, from the first create until every instance was Available; vs smallest: CPU \
per instance over that of the smallest size.
- status writes: the reconciler's `patch memcacheds/status`; stats writes: the stats collector's applies of \
`status.stats`, told apart in the audit log by their field manager (memcached-operator-stats). Both from the \
first create to the settled window, as every request here.
- requests: all the operator's requests but watch re-opens and stats writes, per instance. Watch re-opens \
are counted apart, in all: every watch is open before the first create, so each one after it re-opens one \
the API server closed (a re-list that follows one stays among the requests).
- caches: what the operator's packed caches of children and pods hold at the end of the settled window \
(its `memcached_operator_cache_bytes`), per instance; the report of each run splits it by resource.
- settled writes: the operator's writes in the settled window, which starts 2 s after all Available.
- fair floor: `--floor` on a control plane of its own: no operator, a stand-in creates each instance's \
four children (Deployment, Service, headless Service, server list) and writes its first status; seconds from the first create until every pod was Ready, the floor's \
equivalent of all Available.";

impl fmt::Display for ScaleReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(first) = self.sizes.first() {
            writeln!(
                f,
                "memcached-operator at scale on {}: instances of size 1, pods Ready {} ms after binding, \
                 every run on a fresh control plane\n",
                first.operator.server, first.operator.pod_start_ms
            )?;
        }
        let rows: Vec<Vec<String>> = self
            .sizes
            .iter()
            .map(|size| {
                COLUMNS
                    .iter()
                    .map(|(_, cell)| cell(&size.figures))
                    .collect()
            })
            .collect();
        write_table(f, &rows)?;
        write!(f, "\n{NOTES}")
    }
}

/// A Markdown table, every column as wide as its widest cell.
fn write_table(f: &mut fmt::Formatter<'_>, rows: &[Vec<String>]) -> fmt::Result {
    let widths: Vec<usize> = COLUMNS
        .iter()
        .enumerate()
        .map(|(i, (header, _))| {
            rows.iter()
                .map(|row| row[i].chars().count())
                .fold(header.chars().count(), usize::max)
        })
        .collect();
    let line = |cells: Vec<String>| {
        let cells: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(cell, width)| format!("{cell:<width$}"))
            .collect();
        format!("| {} |", cells.join(" | "))
    };
    writeln!(
        f,
        "{}",
        line(COLUMNS.iter().map(|(h, _)| h.to_string()).collect())
    )?;
    writeln!(
        f,
        "{}",
        line(widths.iter().map(|w| "-".repeat(*w)).collect())
    )?;
    for row in rows {
        writeln!(f, "{}", line(row.clone()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn report(instances: usize, cpu: f64, requests: &[(&str, usize)]) -> Report {
        let requests: BTreeMap<String, usize> =
            requests.iter().map(|(k, n)| (k.to_string(), *n)).collect();
        Report {
            server: "real kube-apiserver v1.28.7".into(),
            instances,
            latency_ms: None,
            pod_start_ms: 1000,
            children_seconds: 8.0,
            pods_ready_seconds: Some(9.0),
            available_seconds: 12.0,
            workload_after_create: None,
            first_status_after_create: None,
            workload_written_after_create: None,
            first_status_written_after_create: None,
            requests_total: requests.values().sum(),
            requests_per_instance: 0.0,
            requests,
            refused: BTreeMap::new(),
            events: BTreeMap::new(),
            cpu_startup_seconds: 0.1,
            cpu_converge_seconds: cpu,
            cpu_total_seconds: cpu + 1.0,
            peak_rss_mib: 19.25,
            fake_cpu_seconds: 0.0,
            control_plane_cpu_seconds: BTreeMap::new(),
            settled_writes: 0,
            settled_writes_by: BTreeMap::new(),
            settle_seconds: 60,
            connections: None,
            responses_by_protocol: None,
            caches: BTreeMap::new(),
            restart: None,
        }
    }

    fn floor(instances: usize, pods_ready: Option<f64>) -> FloorReport {
        FloorReport {
            server: "real kube-apiserver v1.28.7".into(),
            instances,
            concurrency: floor::CONCURRENCY,
            created_seconds: 1.0,
            workloads_seconds: 2.0,
            workload_after_create: None,
            first_status_after_create: None,
            pods_ready_seconds: pods_ready,
            failed_writes: 0,
            control_plane_cpu_seconds: BTreeMap::new(),
        }
    }

    #[test]
    fn watch_reopens_and_stats_writes_are_counted_apart_from_the_requests() {
        let operator = report(
            100,
            1.5,
            &[
                ("patch deployments", 100),
                ("patch memcacheds/status", 200),
                (STATS_WRITES, 50),
                ("watch services", 2),
                ("watch memcacheds", 1),
                ("list services", 2),
            ],
        );
        let figures = Figures::of(&operator, &floor(100, Some(10.0)));
        assert_eq!(figures.watch_reopens, 3);
        assert_eq!(figures.status_writes_per_instance, 2.0);
        assert_eq!(figures.stats_writes_per_instance, 0.5);
        assert_eq!(figures.requests_per_instance, 3.02, "302 of 355 requests");
        assert_eq!(figures.cpu_per_instance_ms, 15.0);
        assert_eq!(figures.available_over_floor, Some(1.2));
        assert_eq!(
            Figures::of(&operator, &floor(100, None)).available_over_floor,
            None
        );
    }

    #[test]
    fn cpu_per_instance_is_read_against_the_smallest_size() {
        let report = ScaleReport::new(vec![
            (floor(300, Some(20.0)), report(300, 3.0, &[])),
            (floor(3000, Some(200.0)), report(3000, 75.0, &[])),
        ]);
        let ratios: Vec<f64> = report
            .sizes
            .iter()
            .map(|s| s.figures.cpu_per_instance_vs_smallest)
            .collect();
        assert_eq!(ratios, [1.0, 2.5]);
        let table = report.to_string();
        let lines: Vec<&str> = table.lines().filter(|l| l.starts_with('|')).collect();
        assert_eq!(lines.len(), 4, "header, rule, two sizes:\n{table}");
        assert!(lines[0].contains("| instances |"), "{table}");
        assert!(lines[3].starts_with("| 3000 "), "{table}");
        assert!(lines[3].contains("| 25.0 "), "CPU per instance: {table}");
        assert!(lines[3].contains("| 2.50x "), "{table}");
        let widths = |l: &str| l.split('|').map(str::len).collect::<Vec<_>>();
        assert_eq!(widths(lines[0]), widths(lines[3]), "aligned:\n{table}");
        assert!(table.contains("field manager"), "the notes: {table}");
    }

    #[test]
    fn sizes_run_smallest_first_and_timeouts_grow_with_them() {
        let options = ScaleOptions::new(vec![3000, 300, 1000, 300], None);
        assert_eq!(options.sizes, [300, 1000, 3000]);
        assert_eq!(timeout_for(300), MIN_TIMEOUT);
        assert_eq!(timeout_for(10_000), Duration::from_secs(5000));
    }
}
