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

/// What `$__rate_interval` and `$__interval` stand for in the pictures. Grafana makes the first at least
/// four scrape intervals (4 s at the recording's one scrape a second), and the second no shorter than the
/// data source's scrape interval (15 s by default); 15 s smooths the one-second steps of the collector
/// and of the reader's traffic without hiding a rollout's dip. The queries are evaluated at every scrape,
/// so a panel counting per `$__interval` (the handover panels) shows at each second what the 15 s before
/// it added.
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

/// A picture written, and for a ratio (a panel in `percentunit`) the lowest value of each of its lines
/// between each of the run's moments and the next: what the docs quote.
#[derive(Clone, Debug)]
pub struct Drawn {
    pub path: PathBuf,
    pub lowest: Vec<Lowest>,
}

/// The lowest value of a line from a moment of the run (`from`, or the recording's start when it has
/// none) to the next moment (or the recording's end).
#[derive(Clone, Debug, PartialEq)]
pub struct Lowest {
    pub legend: String,
    pub from: String,
    pub value: f64,
}

/// Draws every picture of [`panels::PICTURES`] from the recordings in `samples` into `out`; returns the
/// files written.
pub fn draw_all(
    dashboard_path: &Path,
    samples: &Path,
    out: &Path,
    rate_interval: &str,
) -> Result<Vec<Drawn>, PictureError> {
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
        let (panel, lines) = evaluate(&dashboard, &picture, recording, rate_interval)?;
        let lowest = match panel.unit.as_deref() {
            Some("percentunit") => lowest_between_marks(&lines, &recording.marks),
            _ => Vec::new(),
        };
        let svg = chart(&panel, lines, recording, rate_interval)?;
        let path = out.join(picture.file);
        std::fs::write(&path, svg).map_err(|source| PictureError::Write {
            path: path.clone(),
            source,
        })?;
        written.push(Drawn { path, lowest });
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
    let (panel, lines) = evaluate(dashboard, picture, recording, rate_interval)?;
    chart(&panel, lines, recording, rate_interval)
}

/// The lowest finite value of each line between each mark and the next (from the start before the first
/// mark, if the line has values there), in the order of the lines and then of time.
pub fn lowest_between_marks(lines: &[Line], marks: &[recording::Mark]) -> Vec<Lowest> {
    let mut spans: Vec<(String, i64)> = vec![("start".to_owned(), i64::MIN)];
    spans.extend(marks.iter().map(|m| (m.label.clone(), m.at_ms)));
    let mut out = Vec::new();
    for line in lines {
        for (index, (from, start)) in spans.iter().enumerate() {
            let end = spans.get(index + 1).map_or(i64::MAX, |(_, at)| *at);
            let lowest = line
                .points
                .iter()
                .filter(|p| p.at_ms >= *start && p.at_ms < end && p.value.is_finite())
                .map(|p| p.value)
                .fold(None, |low: Option<f64>, v| {
                    Some(low.map_or(v, |l| l.min(v)))
                });
            if let Some(value) = lowest {
                out.push(Lowest {
                    legend: line.legend.clone(),
                    from: from.clone(),
                    value,
                });
            }
        }
    }
    out
}

/// The panel of `picture` and its queries' lines over `recording`, a line per series and query.
fn evaluate(
    dashboard: &serde_json::Value,
    picture: &Picture,
    recording: &Recording,
    rate_interval: &str,
) -> Result<(panels::Panel, Vec<Line>), PictureError> {
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
    Ok((panel, lines))
}

/// The chart of `panel`'s `lines` as SVG, with the recording's marks.
fn chart(
    panel: &panels::Panel,
    lines: Vec<Line>,
    recording: &Recording,
    rate_interval: &str,
) -> Result<String, PictureError> {
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
            "seconds from the start of the recording (one scrape a second; rates and intervals over \
             {rate_interval})"
        ),
    };
    Ok(plot::svg(&chart)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use recording::{Mark, Point};

    #[test]
    fn the_lowest_value_of_each_line_is_taken_between_moments() {
        let points = [
            (1, 0.5),
            (2, 1.0),
            (3, 0.8),
            (4, f64::NAN),
            (5, 0.9),
            (6, 0.95),
        ]
        .map(|(s, value)| Point {
            at_ms: s * 1000,
            value,
        })
        .to_vec();
        let lines = [Line {
            legend: "ns/cache".to_owned(),
            points,
        }];
        let marks = [
            Mark {
                at_ms: 2000,
                label: "rollout".to_owned(),
            },
            Mark {
                at_ms: 5000,
                label: "scale-down".to_owned(),
            },
        ];
        let lowest: Vec<(String, f64)> = lowest_between_marks(&lines, &marks)
            .into_iter()
            .map(|l| (l.from, l.value))
            .collect();
        assert_eq!(
            lowest,
            [
                ("start".to_owned(), 0.5),
                ("rollout".to_owned(), 0.8),
                ("scale-down".to_owned(), 0.9)
            ]
        );
    }
}
