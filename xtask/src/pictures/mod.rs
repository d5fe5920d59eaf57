//! `cargo xtask dashboard-pictures` (`make dashboard-pictures`): the dashboard's main panels drawn from
//! a real run, for the docs. The bench records the operator's `/metrics` every second (`bench --record
//! DIR`, and `bench --operand --record DIR` for the operand's series); this evaluates each pictured
//! panel's own PromQL, read from the dashboard JSON, over those scrapes ([`promql`]) and draws the result
//! as an SVG line chart ([`plot`]) under `docs/images/`.
//!
//! Grafana is not packaged where the project installs from, so the pictures are what Grafana would
//! draw, computed as Prometheus would: the panel's queries with every variable at "All" and
//! `$__rate_interval` at [`RATE_INTERVAL`] ([`panels::instantiate`]).

pub mod exposition;
pub mod panels;
pub mod plot;
pub mod promql;
pub mod recording;

use std::path::{Path, PathBuf};

use panels::{Picture, instantiate, legend};
use plot::{Chart, Line};
use promql::{EvalError, Query};
use recording::{Recording, RecordingError};

/// What `$__rate_interval` stands for in the pictures. Grafana makes it at least four scrape intervals
/// (4 s at the recording's one scrape a second); 15 s smooths the one-second steps of the collector and
/// of the reader's traffic without hiding a rollout's dip.
pub const RATE_INTERVAL: &str = "15s";

/// A picture that cannot be made.
#[derive(Debug, thiserror::Error)]
pub enum PictureError {
    #[error(transparent)]
    Panel(#[from] panels::PanelError),
    #[error(transparent)]
    Recording(#[from] RecordingError),
    #[error("the panel {panel:?}, query {query:?}: {source}")]
    Query {
        panel: String,
        query: String,
        source: EvalError,
    },
    #[error(transparent)]
    Draw(#[from] plot::DrawError),
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Draws every picture of [`panels::PICTURES`] from the recordings in `samples` into `out`; returns the
/// files written.
pub fn draw_all(
    dashboard_path: &Path,
    samples: &Path,
    out: &Path,
    rate_interval: &str,
) -> Result<Vec<PathBuf>, PictureError> {
    let dashboard = panels::read_dashboard(dashboard_path)?;
    std::fs::create_dir_all(out).map_err(|source| PictureError::Write {
        path: out.to_owned(),
        source,
    })?;
    let mut written = Vec::new();
    let mut recordings: Vec<(&str, Recording)> = Vec::new();
    for picture in panels::PICTURES {
        if !recordings
            .iter()
            .any(|(name, _)| *name == picture.recording)
        {
            recordings.push((
                picture.recording,
                Recording::read(samples, picture.recording)?,
            ));
        }
        let Some((_, recording)) = recordings.iter().find(|(n, _)| *n == picture.recording) else {
            continue;
        };
        let svg = render(&dashboard, &picture, recording, rate_interval)?;
        let path = out.join(picture.file);
        std::fs::write(&path, svg).map_err(|source| PictureError::Write {
            path: path.clone(),
            source,
        })?;
        written.push(path);
    }
    Ok(written)
}

/// One picture as SVG: the panel's queries evaluated over `recording`, a line per series and query.
pub fn render(
    dashboard: &serde_json::Value,
    picture: &Picture,
    recording: &Recording,
    rate_interval: &str,
) -> Result<String, PictureError> {
    let panel = panels::panel(dashboard, picture.panel)?;
    let mut lines = Vec::new();
    for target in &panel.targets {
        let query_error = |source| PictureError::Query {
            panel: panel.title.clone(),
            query: target.expr.clone(),
            source,
        };
        let query = Query::parse(&instantiate(dashboard, &target.expr, rate_interval))
            .map_err(query_error)?;
        for (labels, points) in query.over(recording).map_err(query_error)? {
            lines.push(Line {
                legend: legend(&target.legend, &labels),
                points,
            });
        }
    }
    let queries: Vec<String> = panel.targets.iter().map(|t| t.expr.clone()).collect();
    let start_ms = recording.scrapes.first().copied().unwrap_or_default();
    let chart = Chart {
        title: &panel.title,
        queries: &queries,
        unit: panel.unit.as_deref(),
        lines,
        marks: recording
            .marks
            .iter()
            .map(|m| (m.at_ms, m.label.clone()))
            .collect(),
        start_ms,
        end_ms: recording.scrapes.last().copied().unwrap_or(start_ms),
        x_description: format!(
            "seconds from the start of the recording (one scrape a second; rates over {rate_interval})"
        ),
    };
    Ok(plot::svg(&chart)?)
}
