//! Embeds the install tree (`config/`) in the binary.
//!
//! `memcached-operator manifests` and `bundle` render the same objects `kubectl kustomize config/default`
//! does, from the same files, so the one-file install, the OLM bundle and the kustomize install cannot
//! diverge. Embedding every YAML file under `config/` (rather than a hand-kept list) means a file added
//! there, such as a new sample, is picked up without touching the Rust code.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

fn main() {
    let root = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let config = root.join("config");
    // Cargo re-runs this script when anything under the directory changes (files added, removed or edited).
    println!("cargo:rerun-if-changed=config");

    let mut files = Vec::new();
    if config.is_dir() {
        collect(&config, &mut files);
    }
    files.sort();

    let mut out = String::from(
        "/// Every YAML file under `config/`: (path relative to the repository root, content).\n\
         pub static CONFIG_FILES: &[(&str, &str)] = &[\n",
    );
    for file in &files {
        let relative = file
            .strip_prefix(&root)
            .expect("under the manifest directory")
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join("/");
        // The path is rebuilt from CARGO_MANIFEST_DIR when the crate compiles, not written out here: a
        // target directory reused by a checkout at another path (a CI cache, a copied tree) must not
        // read the files of the old one.
        let from_root = format!("/{relative}");
        writeln!(
            out,
            "    ({relative:?}, include_str!(concat!(env!(\"CARGO_MANIFEST_DIR\"), {from_root:?}))),"
        )
        .expect("String write");
    }
    out.push_str("];\n");

    let dest =
        PathBuf::from(std::env::var_os("OUT_DIR").expect("set by cargo")).join("config_files.rs");
    std::fs::write(&dest, out).expect("cannot write the embedded config table");
}

/// Every `*.yaml`/`*.yml` file below `dir`, recursively.
fn collect(dir: &Path, files: &mut Vec<PathBuf>) {
    let entries =
        std::fs::read_dir(dir).unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()));
    for entry in entries {
        let path = entry.expect("directory entry").path();
        if path.is_dir() {
            collect(&path, files);
        } else if path
            .extension()
            .is_some_and(|ext| ext == "yaml" || ext == "yml")
        {
            files.push(path);
        }
    }
}
