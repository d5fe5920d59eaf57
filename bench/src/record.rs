//! `--record DIR`: the operator's `/metrics` scraped every second into a file of samples, for the pictures
//! of the dashboard's panels (`cargo xtask dashboard-pictures`, which evaluates the dashboard's own PromQL
//! over them). A Prometheus server would do the same, but none is packaged where the project installs from.
//!
//! The file holds one JSON object a line, a scrape each: `{"at_ms": <Unix time in ms>, "text": <the
//! exposition as the operator sent it>}`. The text is kept as sent, not parsed here, so that what is
//! recorded is exactly what a Prometheus server would have scraped, and one parser (the plotter's, tested
//! on the operator's own output) reads it.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::Serialize;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::process;

/// Between two scrapes: as often as the operator's collector reads the servers in a recorded run
/// (`--stats-interval=1s`), so that each change is seen once.
pub const SCRAPE_INTERVAL: Duration = Duration::from_secs(1);

/// One line of a recording.
#[derive(Debug, Serialize)]
pub struct Scrape<'a> {
    /// When the answer arrived, in milliseconds since the Unix epoch.
    pub at_ms: u64,
    /// The exposition text as the operator sent it.
    pub text: &'a str,
}

/// A recording under way: a task scraping `/metrics` every [`SCRAPE_INTERVAL`] until [`Recorder::finish`].
pub struct Recorder {
    path: PathBuf,
    stop: oneshot::Sender<()>,
    task: JoinHandle<Result<Counts, String>>,
}

/// What a recording holds: scrapes written, and scrapes that got no answer (skipped, as a Prometheus
/// server would have a gap).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Counts {
    pub written: usize,
    pub failed: usize,
}

impl Recorder {
    /// Starts scraping `http://metrics/metrics` into `dir/name.jsonl` (the directory created if need be;
    /// an older file of that name is replaced).
    pub fn start(metrics: SocketAddr, dir: &Path, name: &str) -> Result<Self, String> {
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let path = dir.join(format!("{name}.jsonl"));
        let file =
            File::create(&path).map_err(|e| format!("cannot create {}: {e}", path.display()))?;
        let (stop, stopped) = oneshot::channel();
        let task = tokio::spawn(scrape_until(metrics, BufWriter::new(file), stopped));
        Ok(Self { path, stop, task })
    }

    /// Takes a last scrape, stops, and says where the samples are and how many were written.
    pub async fn finish(self) -> Result<(PathBuf, Counts), String> {
        let _ = self.stop.send(());
        let counts = self
            .task
            .await
            .map_err(|e| format!("the recorder failed: {e}"))??;
        Ok((self.path, counts))
    }
}

/// With `--record DIR`: starts recording the convergence of a benchmark run.
pub fn start_convergence(
    operator: &crate::process::Operator,
    options: &crate::Options,
) -> Result<Option<Recorder>, String> {
    options
        .record
        .as_deref()
        .map(|dir| {
            Recorder::start(
                operator.metrics_address()?,
                dir,
                crate::CONVERGENCE_RECORDING,
            )
        })
        .transpose()
}

/// Ends the recording of a convergence (if any), writes its marks, and says where they went.
pub async fn finish_convergence(
    recorder: Option<Recorder>,
    options: &crate::Options,
    marks: &[Mark],
) -> Result<(), String> {
    let (Some(recorder), Some(dir)) = (recorder, options.record.as_deref()) else {
        return Ok(());
    };
    let (path, counts) = recorder.finish().await?;
    write_marks(dir, crate::CONVERGENCE_RECORDING, marks)?;
    eprintln!(
        "recorded {} scrapes of /metrics ({} without an answer) in {}",
        counts.written,
        counts.failed,
        path.display()
    );
    Ok(())
}

async fn scrape_until(
    metrics: SocketAddr,
    mut out: BufWriter<File>,
    mut stopped: oneshot::Receiver<()>,
) -> Result<Counts, String> {
    let mut counts = Counts::default();
    let mut ticks = tokio::time::interval(SCRAPE_INTERVAL);
    // A slow scrape (a busy machine) delays the next one rather than bunching them up.
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let last = tokio::select! {
            _ = ticks.tick() => false,
            _ = &mut stopped => true,
        };
        match process::metrics_text(metrics).await {
            Ok(text) => {
                write_scrape(&mut out, unix_ms(), &text)?;
                counts.written += 1;
            }
            Err(_) => counts.failed += 1,
        }
        if last {
            out.flush()
                .map_err(|e| format!("cannot write a recording: {e}"))?;
            return Ok(counts);
        }
    }
}

/// Appends one scrape as a JSON line.
pub fn write_scrape(out: &mut impl Write, at_ms: u64, text: &str) -> Result<(), String> {
    let line = serde_json::to_string(&Scrape { at_ms, text })
        .map_err(|e| format!("cannot encode a scrape: {e}"))?;
    writeln!(out, "{line}").map_err(|e| format!("cannot write a recording: {e}"))
}

/// A moment of the run worth a line on its pictures ("rollout starts", "all Available"), written beside
/// the samples as `DIR/<name>.marks.json`: the plotter draws each as a labelled vertical line, so a
/// reader sees what the curves answer to.
#[derive(Clone, Debug, Serialize)]
pub struct Mark {
    pub at_ms: u64,
    pub label: String,
}

impl Mark {
    /// `label`, now.
    pub fn now(label: impl Into<String>) -> Self {
        Self {
            at_ms: unix_ms(),
            label: label.into(),
        }
    }
}

/// Writes `marks` to `dir/name.marks.json`.
pub fn write_marks(dir: &Path, name: &str, marks: &[Mark]) -> Result<PathBuf, String> {
    let path = dir.join(format!("{name}.marks.json"));
    let json =
        serde_json::to_string_pretty(marks).map_err(|e| format!("cannot encode the marks: {e}"))?;
    std::fs::write(&path, json).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    Ok(path)
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scrape_is_one_json_line_that_keeps_the_text_as_sent() {
        let mut out = Vec::new();
        let text = "# TYPE up gauge\nup{pod=\"a\\\"b\"} 1\n";
        write_scrape(&mut out, 1_700_000_000_123, text).unwrap();
        write_scrape(&mut out, 1_700_000_001_123, "x 2\n").unwrap();
        let out = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 2, "{out}");
        let first: serde_json::Value = serde_json::from_str(lines[0]).unwrap();
        assert_eq!(first["at_ms"], 1_700_000_000_123u64);
        assert_eq!(first["text"], text);
    }
}
