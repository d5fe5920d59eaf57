//! envtest for memcached-operator: a real Kubernetes control plane on loopback, as Kubebuilder projects
//! get from controller-runtime's `envtest`, written in Rust so that the operator's tests and the bench can
//! run the operator binary against a real API server instead of a fake one.
//!
//! What a fake cannot tell us and this can: the server's defaulting, validation (CEL rules of the CRD),
//! RBAC under the operator's own ServiceAccount, server-side apply's field ownership, garbage collection
//! through owner references, and what the built-in controllers do with the operator's objects.
//!
//! - [`assets`]: the binaries in `$KUBEBUILDER_ASSETS` (`etcd`, `kube-apiserver`,
//!   `kube-controller-manager`, optionally `kube-scheduler`), or `None`, so callers can skip honestly;
//! - [`ControlPlane`]: those binaries running in a temporary directory on free loopback ports, with an
//!   admin kubeconfig, an audit log of every request ([`audit`]), and a restart of the API server alone;
//! - [`Kubelet`]: a stand-in kubelet that registers Ready nodes and runs pods as status only (or as real
//!   `memcached` processes on loopback addresses), honouring readiness gates and deletion;
//! - [`Env`]: both, plus an admin client; [`SharedEnv`]: one `Env` per test binary, shared by its tests;
//! - [`install_operator_rbac`] and [`Operator`]: the CRD and RBAC from `config/`, and the operator binary
//!   running under its own ServiceAccount's token.
//!
//! Nothing here builds Kubernetes: it only runs the binaries it is given.

pub mod assets;
pub mod audit;
pub mod control_plane;
pub mod env;
pub mod install;
pub mod kubeconfig;
pub mod kubelet;
pub mod net;
pub mod operator;
pub mod pki;
pub mod process;
pub mod retry;

pub use assets::{Assets, assets};
pub use audit::{AuditEvent, AuditLog, Mark, RequestCounts, RequestKey};
pub use control_plane::{ControlPlane, ControlPlaneOptions};
pub use env::{Env, EnvOptions, SharedEnv, create_namespace};
pub use install::{
    OperatorCredentials, install_operator_manifest, install_operator_overlay, install_operator_rbac,
};
pub use kubelet::{Kubelet, KubeletOptions};
pub use operator::Operator;

use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering};

static SKIPPED: AtomicUsize = AtomicUsize::new(0);

/// The line a caller prints when it skips a scenario for want of binaries, so that skips are visible and
/// countable in a test log (`grep -c '^envtest: skipped'`).
pub fn skip_message(scenario: &str) -> String {
    let reason = assets::why_missing().unwrap_or_else(|| assets::MISSING_REASON.to_owned());
    format!("envtest: skipped {scenario}: {reason}")
}

/// Reports a skipped scenario: prints [`skip_message`] straight to the process's stderr (past the test
/// harness's capture, so a skip shows without `--nocapture`) and counts it ([`skipped`]).
pub fn skip(scenario: &str) {
    SKIPPED.fetch_add(1, Ordering::Relaxed);
    let _ = writeln!(std::io::stderr().lock(), "{}", skip_message(scenario));
}

/// [`skip`] for a reason other than the control plane's binaries (a tool the scenario needs is missing).
pub fn skip_because(scenario: &str, reason: &str) {
    SKIPPED.fetch_add(1, Ordering::Relaxed);
    let _ = writeln!(
        std::io::stderr().lock(),
        "envtest: skipped {scenario}: {reason}"
    );
}

/// How many scenarios this process has skipped.
pub fn skipped() -> usize {
    SKIPPED.load(Ordering::Relaxed)
}
