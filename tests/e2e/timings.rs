//! Step timings: when each step began, and at the end (also after a failure) a table of how long each
//! took and the total, printed and written to `timings.txt` in the scratch directory, so that a slow
//! step shows and runs can be compared.

use std::fmt::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};

/// The steps begun so far, in order.
pub struct Timings {
    started: Instant,
    steps: Vec<(u32, String, Instant)>,
}

impl Timings {
    pub fn new(started: Instant) -> Timings {
        Timings {
            started,
            steps: Vec::new(),
        }
    }

    pub fn begin(&mut self, step: u32, title: &str) {
        self.steps.push((step, title.to_owned(), Instant::now()));
    }

    /// The table: one line per step (its time is until the next step began, the last one's until `end`),
    /// then the total since the run began. `failed` is the step that failed, if one did.
    pub fn table(&self, end: Instant, failed: Option<u32>) -> String {
        let mut out = String::from("==> step timings\n");
        for (i, (step, title, began)) in self.steps.iter().enumerate() {
            let until = self.steps.get(i + 1).map_or(end, |next| next.2);
            let took = until.saturating_duration_since(*began);
            let mark = if failed == Some(*step) {
                "  FAILED"
            } else {
                ""
            };
            let _ = writeln!(
                out,
                "    step {step:>2} {:>7}  {}{mark}",
                seconds(took),
                short(title)
            );
        }
        let _ = writeln!(
            out,
            "    total   {:>7}",
            seconds(end.saturating_duration_since(self.started))
        );
        out
    }

    /// The step begun last.
    pub fn current(&self) -> Option<u32> {
        self.steps.last().map(|s| s.0)
    }

    /// Prints the table and writes it to `dir/timings.txt`.
    pub fn report(&self, dir: &Path, failed: Option<u32>) {
        let table = self.table(Instant::now(), failed);
        eprint!("\n{table}");
        let path = dir.join("timings.txt");
        if let Err(e) = std::fs::write(&path, &table) {
            eprintln!("    cannot write {}: {e}", path.display());
        } else {
            eprintln!("    (also in {})", path.display());
        }
    }
}

fn seconds(d: Duration) -> String {
    format!("{:.1}s", d.as_secs_f64())
}

/// The title up to its first `:` or `;`, at most 70 characters.
fn short(title: &str) -> String {
    let head = title.split([':', ';']).next().unwrap_or(title).trim();
    if head.chars().count() <= 70 {
        head.to_owned()
    } else {
        format!("{}...", head.chars().take(67).collect::<String>())
    }
}

#[test]
fn each_step_lasts_until_the_next_and_the_total_from_the_start() {
    let t0 = Instant::now();
    let mut timings = Timings::new(t0);
    timings.steps = vec![
        (1, "install: a namespace".to_owned(), t0),
        (2, "operator".to_owned(), t0 + Duration::from_millis(2500)),
        (25, "cleanup".to_owned(), t0 + Duration::from_secs(10)),
    ];
    let table = timings.table(t0 + Duration::from_secs(11), None);
    assert_eq!(
        table,
        "==> step timings\n    step  1    2.5s  install\n    step  2    7.5s  operator\n    \
         step 25    1.0s  cleanup\n    total     11.0s\n"
    );
    assert!(
        timings
            .table(t0 + Duration::from_secs(11), Some(2))
            .contains("operator  FAILED")
    );
}
