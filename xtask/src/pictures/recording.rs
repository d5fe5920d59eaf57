//! A recording of the bench (`bench --record DIR`): `NAME.jsonl`, one scrape of the operator's
//! `/metrics` a line (`{"at_ms": …, "text": …}`), and `NAME.marks.json`, the moments of the run. Read
//! into series as a Prometheus server would store them: each series its samples with the scrape's time,
//! and a series missing from a scrape stale from that scrape on (Prometheus writes a staleness marker).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::exposition::{self, ExpositionError, Labels};

/// The label that holds a series' metric name, as in PromQL.
pub const NAME_LABEL: &str = "__name__";

/// A recording that cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum RecordingError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}, line {line}: not a scrape: {source}")]
    Line {
        path: PathBuf,
        line: usize,
        source: serde_json::Error,
    },
    #[error("{path}, the scrape of line {line}: {source}")]
    Exposition {
        path: PathBuf,
        line: usize,
        source: ExpositionError,
    },
    #[error("{path}: not a list of marks: {source}")]
    Marks {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error("{0}: no scrapes")]
    Empty(PathBuf),
}

#[derive(Deserialize)]
struct Scrape {
    at_ms: i64,
    text: String,
}

/// A moment of the run, drawn as a labelled line.
#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct Mark {
    pub at_ms: i64,
    pub label: String,
}

/// One stored sample.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Point {
    pub at_ms: i64,
    pub value: f64,
}

/// The scrapes of a run as series.
#[derive(Clone, Debug, Default)]
pub struct Recording {
    /// The times of the scrapes, in order.
    pub scrapes: Vec<i64>,
    /// Each series (its labels with [`NAME_LABEL`]) and its samples, in order of time.
    pub series: BTreeMap<Labels, Vec<Point>>,
    pub marks: Vec<Mark>,
}

impl Recording {
    /// Reads `dir/name.jsonl` and, if it exists, `dir/name.marks.json`.
    pub fn read(dir: &Path, name: &str) -> Result<Self, RecordingError> {
        let path = dir.join(format!("{name}.jsonl"));
        let read = |path: &Path| {
            std::fs::read_to_string(path).map_err(|source| RecordingError::Read {
                path: path.to_owned(),
                source,
            })
        };
        let mut recording = Recording::default();
        for (index, line) in read(&path)?.lines().enumerate() {
            let scrape: Scrape =
                serde_json::from_str(line).map_err(|source| RecordingError::Line {
                    path: path.clone(),
                    line: index + 1,
                    source,
                })?;
            recording
                .push(scrape.at_ms, &scrape.text)
                .map_err(|source| RecordingError::Exposition {
                    path: path.clone(),
                    line: index + 1,
                    source,
                })?;
        }
        if recording.scrapes.is_empty() {
            return Err(RecordingError::Empty(path));
        }
        let marks = dir.join(format!("{name}.marks.json"));
        if marks.exists() {
            recording.marks =
                serde_json::from_str(&read(&marks)?).map_err(|source| RecordingError::Marks {
                    path: marks,
                    source,
                })?;
        }
        Ok(recording)
    }

    /// Adds a scrape taken at `at_ms` (after every scrape already added).
    pub fn push(&mut self, at_ms: i64, text: &str) -> Result<(), ExpositionError> {
        for sample in exposition::parse(text)? {
            let mut labels = sample.labels;
            labels.insert(NAME_LABEL.to_owned(), sample.name);
            self.series.entry(labels).or_default().push(Point {
                at_ms,
                value: sample.value,
            });
        }
        self.scrapes.push(at_ms);
        Ok(())
    }

    /// The latest scrape at or before `at_ms`.
    pub fn scrape_at(&self, at_ms: i64) -> Option<i64> {
        let after = self.scrapes.partition_point(|t| *t <= at_ms);
        after.checked_sub(1).map(|i| self.scrapes[i])
    }
}
