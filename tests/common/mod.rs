//! Helpers shared by the tests that read the repository's files.
#![allow(dead_code, unused_imports)] // each test crate uses its own subset

use std::path::{Path, PathBuf};

use serde_json::Value;

/// A path inside the repository.
pub fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
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

pub mod mock;
