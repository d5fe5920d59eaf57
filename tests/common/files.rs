//! The repository's files and binaries, for tests. xtask's tests include this file too
//! (xtask/tests/common), so it finds the repository root from whichever package compiles it, and it has
//! no submodules or dependencies beyond serde_json and serde-saphyr.
#![allow(dead_code)] // each test crate uses its own subset

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// A path inside the repository: below the workspace root, the nearest directory holding Cargo.lock.
pub fn repo(path: &str) -> PathBuf {
    let package = Path::new(env!("CARGO_MANIFEST_DIR"));
    let root = package
        .ancestors()
        .find(|dir| dir.join("Cargo.lock").is_file())
        .unwrap_or(package);
    root.join(path)
}

/// A repository file's text.
pub fn read(path: &str) -> String {
    std::fs::read_to_string(repo(path)).unwrap_or_else(|e| panic!("cannot read {path}: {e}"))
}

/// The names under which a Prometheus text exposition's metrics are scraped: counters carry a `_total`
/// suffix their `# TYPE` line leaves out.
pub fn metric_names(exposition: &str) -> Vec<String> {
    exposition
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|line| {
            let mut parts = line.split_whitespace();
            let (name, kind) = (parts.next()?, parts.next()?);
            Some(if kind == "counter" {
                format!("{name}_total")
            } else {
                name.to_owned()
            })
        })
        .collect()
}

/// The YAML documents of `text`, empty ones left out.
pub fn yaml_docs(text: &str) -> Vec<Value> {
    serde_saphyr::from_multiple::<Value>(text)
        .unwrap()
        .into_iter()
        .filter(|d| !d.is_null())
        .collect()
}

/// What the program `bin` prints with `args`; fails the test when it fails.
pub fn output_of(bin: &str, args: &[&str]) -> String {
    let out = Command::new(bin).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{bin} {args:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}
