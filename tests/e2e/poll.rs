//! Polling: every wait has a timeout, and on timeout panics with what it expected and the last value
//! it saw.

use std::thread;
use std::time::{Duration, Instant};

use crate::kubectl::truncate;
use crate::names::POLL;

/// Polls `check` every second until it returns `Ok` or `timeout` passes; then panics with `desc` and the last
/// error (which should describe what was observed).
pub fn wait_for<T>(
    desc: &str,
    timeout: Duration,
    mut check: impl FnMut() -> Result<T, String>,
) -> T {
    let start = Instant::now();
    let mut last_report = start;
    let mut attempts = 0u32;
    eprintln!("    waiting up to {}s for {desc}", timeout.as_secs());
    loop {
        attempts += 1;
        let last = match check() {
            Ok(value) => {
                eprintln!("    ok after {:.1}s: {desc}", start.elapsed().as_secs_f64());
                return value;
            }
            Err(e) => e,
        };
        if start.elapsed() >= timeout {
            panic!(
                "timed out after {}s ({attempts} checks) waiting for {desc}\n    last observed: {last}",
                timeout.as_secs()
            );
        }
        if last_report.elapsed() >= Duration::from_secs(20) {
            last_report = Instant::now();
            eprintln!(
                "    ...still waiting ({}s) for {desc}: {}",
                start.elapsed().as_secs(),
                truncate(&last, 400)
            );
        }
        thread::sleep(POLL);
    }
}

/// Checks every second for `duration` that `check` keeps returning `Ok`; panics on the first `Err`.
pub fn hold_for(desc: &str, duration: Duration, mut check: impl FnMut() -> Result<(), String>) {
    let start = Instant::now();
    eprintln!("    checking for {}s that {desc}", duration.as_secs());
    loop {
        if let Err(e) = check() {
            panic!(
                "expected for {}s, but broken after {:.1}s: {desc}\n    observed: {e}",
                duration.as_secs(),
                start.elapsed().as_secs_f64()
            );
        }
        if start.elapsed() >= duration {
            eprintln!("    ok: held for {}s: {desc}", duration.as_secs());
            return;
        }
        thread::sleep(POLL);
    }
}
