//! Helpers shared by xtask's tests, which read the repository's files and run `cargo xtask`.
#![allow(dead_code)] // each test crate uses its own subset

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{Value, json};

/// The failure message of a drift check.
pub const STALE: &str = "is stale: run `make manifests` and commit the result";

/// A path inside the repository (the parent of xtask/).
pub fn repo(path: &str) -> PathBuf {
    let xtask = Path::new(env!("CARGO_MANIFEST_DIR"));
    xtask.parent().unwrap().join(path)
}

/// A repository file's text.
pub fn read(path: &str) -> String {
    std::fs::read_to_string(repo(path)).unwrap_or_else(|e| panic!("cannot read {path}: {e}"))
}

/// The YAML documents of `text`, empty ones left out.
pub fn yaml_docs(text: &str) -> Vec<Value> {
    serde_saphyr::from_multiple::<Value>(text)
        .unwrap()
        .into_iter()
        .filter(|d| !d.is_null())
        .collect()
}

/// The `xtask` binary (what `cargo xtask` runs).
pub const XTASK: &str = env!("CARGO_BIN_EXE_xtask");

/// What `cargo xtask ARGS` prints; fails the test when it fails.
pub fn xtask(args: &[&str]) -> String {
    let out = Command::new(XTASK).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "cargo xtask {args:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Numbers compared by value: kustomize prints `65535.0` as `65535`.
pub fn normalize(value: &Value) -> Value {
    match value {
        Value::Number(n) => match n.as_f64() {
            Some(f) if n.is_f64() && f.fract() == 0.0 && f.abs() < 1e15 => json!(f as i64),
            _ => value.clone(),
        },
        Value::Array(items) => Value::Array(items.iter().map(normalize).collect()),
        Value::Object(map) => {
            Value::Object(map.iter().map(|(k, v)| (k.clone(), normalize(v))).collect())
        }
        other => other.clone(),
    }
}

/// `Kind namespace/name` of an object, for messages.
pub fn id(object: &Value) -> String {
    format!(
        "{} {}/{}",
        object["kind"].as_str().unwrap_or_default(),
        object["metadata"]["namespace"].as_str().unwrap_or("-"),
        object["metadata"]["name"].as_str().unwrap_or_default()
    )
}
