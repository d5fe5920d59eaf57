//! Helpers shared by xtask's tests, which read the repository's files and run `cargo xtask`.
#![allow(dead_code)] // each test crate uses its own subset

use serde_json::{Value, json};

pub mod helm;
pub mod promql;
pub mod promtool;

// The repository helpers of the operator's tests, shared rather than copied.
#[path = "../../../tests/common/files.rs"]
mod repository;
#[allow(unused_imports)] // each test crate uses its own subset
pub use repository::{read, repo, yaml_docs};

/// The failure message of a drift check.
pub const STALE: &str = "is stale: run `make manifests` and commit the result";

/// The `xtask` binary (what `cargo xtask` runs).
pub const XTASK: &str = env!("CARGO_BIN_EXE_xtask");

/// What `cargo xtask ARGS` prints; fails the test when it fails.
pub fn xtask(args: &[&str]) -> String {
    repository::output_of(XTASK, args)
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
