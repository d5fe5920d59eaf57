//! Prometheus's own `promtool`, to evaluate the alerts' and the dashboard's PromQL as Prometheus does,
//! or a skip where it is missing.
//!
//! No crate evaluates PromQL with Prometheus's semantics (staleness, `offset`, set operators), and the
//! alerts' expressions depend on exactly those. Debian's `prometheus` package carries promtool; .ci/run
//! extracts it from the package (without installing the server) when missing.

use std::path::PathBuf;
use std::process::Command;

/// `$PROMTOOL`, else `promtool` on the `PATH`; `None` (after printing a `skipped:` line) when neither
/// runs. Under CI (`CI` set) a missing promtool fails the test.
pub fn promtool() -> Option<PathBuf> {
    let candidate = std::env::var_os("PROMTOOL")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("promtool"));
    let runs = Command::new(&candidate)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if runs {
        return Some(candidate);
    }
    let reason = format!("{} does not run", candidate.display());
    assert!(
        std::env::var_os("CI").is_none(),
        "promtool is needed for the alert evaluation tests under CI (.ci/run extracts it): {reason}"
    );
    eprintln!("skipped: {reason}");
    None
}
