//! Release tooling of memcached-operator, run as `cargo xtask <command>` (`cargo xtask --help`).
//!
//! The operator binary runs the operator; everything built for a release lives here: the one-file install
//! ([`install`]), the OLM bundle ([`bundle`]), the API reference ([`api_docs`]) and the README's spec
//! table ([`readme`]), the last three by walking the CRD schema ([`schema`]). Kustomizations are rendered by `kubectl kustomize` ([`kubectl`]), not by a
//! renderer of our own. [`pictures`] draws the dashboard's main panels from the bench's recordings
//! for the docs. [`generate`] lists every generated file, writes them (`cargo xtask manifests`) and
//! finds committed copies that drifted (`cargo xtask check`), the Helm chart's copies ([`chart`])
//! included. The CRD and RBAC come from the operator library (`memcached_operator::manifests`), which its
//! binary prints too. The chart's tests render it with Helm's own engine ([`helm`]).

use std::path::{Path, PathBuf};

pub mod api_docs;
pub mod bundle;
pub mod chart;
pub mod generate;
pub mod helm;
pub mod install;
pub mod kubectl;
pub mod pictures;
pub mod readme;
pub mod schema;

/// The repository root: generated files are written, and `config/` read, relative to it, wherever
/// `cargo xtask` runs from.
pub fn repo_root() -> PathBuf {
    let xtask = Path::new(env!("CARGO_MANIFEST_DIR"));
    xtask.parent().unwrap_or(xtask).to_path_buf()
}
