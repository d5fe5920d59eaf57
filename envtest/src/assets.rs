//! The control-plane binaries, found where Kubebuilder's envtest looks for them: `$KUBEBUILDER_ASSETS`, or,
//! when that is unset, controller-runtime's default directory `/usr/local/kubebuilder/bin`.
//!
//! Absent binaries are not an error but a reason to skip: a machine without them cannot run these tests,
//! and saying so (instead of failing, or passing silently) keeps the skip visible.

use std::path::{Path, PathBuf};

/// The environment variable naming the directory of binaries, as in controller-runtime's envtest.
pub const ASSETS_VAR: &str = "KUBEBUILDER_ASSETS";

/// Where controller-runtime's envtest looks when the variable is unset.
pub const DEFAULT_DIR: &str = "/usr/local/kubebuilder/bin";

/// The skip reason when the variable is unset and the default directory holds no control plane (the
/// common case on a developer's machine).
pub const MISSING_REASON: &str =
    "KUBEBUILDER_ASSETS is not set and /usr/local/kubebuilder/bin holds no control plane";

/// Paths of the binaries of one control plane.
#[derive(Clone, Debug)]
pub struct Assets {
    pub dir: PathBuf,
    pub etcd: PathBuf,
    pub kube_apiserver: PathBuf,
    pub kube_controller_manager: PathBuf,
    /// Without it, the stand-in kubelet binds pods to its nodes itself.
    pub kube_scheduler: Option<PathBuf>,
}

/// The binaries in `$KUBEBUILDER_ASSETS` (or the default directory when it is unset), or `None` when
/// a required binary is missing ([`why_missing`] says which).
pub fn assets() -> Option<Assets> {
    match std::env::var_os(ASSETS_VAR).filter(|d| !d.is_empty()) {
        Some(dir) => Assets::in_dir(Path::new(&dir)).ok(),
        None => Assets::in_dir(Path::new(DEFAULT_DIR)).ok(),
    }
}

/// Why [`assets`] returned `None`, for the skip line; `None` when the assets are there.
pub fn why_missing() -> Option<String> {
    match std::env::var_os(ASSETS_VAR).filter(|d| !d.is_empty()) {
        None => Assets::in_dir(Path::new(DEFAULT_DIR))
            .err()
            .map(|_| MISSING_REASON.to_owned()),
        Some(dir) => Assets::in_dir(Path::new(&dir)).err(),
    }
}

impl Assets {
    /// The binaries in `dir`; the error names the first one missing.
    pub fn in_dir(dir: &Path) -> Result<Assets, String> {
        let find = |name: &str| {
            let path = dir.join(name);
            is_executable(&path).then_some(path)
        };
        let need = |name: &str| {
            find(name).ok_or_else(|| format!("{ASSETS_VAR}={} has no {name}", dir.display()))
        };
        Ok(Assets {
            dir: dir.to_owned(),
            etcd: need("etcd")?,
            kube_apiserver: need("kube-apiserver")?,
            kube_controller_manager: need("kube-controller-manager")?,
            kube_scheduler: find("kube-scheduler"),
        })
    }

    /// `kubectl`, used to render the kustomizations of `config/` and to apply them: `$KUBECTL`, else the
    /// one in the assets directory (Kubebuilder's assets ship one), else the first on `PATH`.
    pub fn kubectl(&self) -> PathBuf {
        if let Some(path) = std::env::var_os("KUBECTL").filter(|p| !p.is_empty()) {
            return PathBuf::from(path);
        }
        let bundled = self.dir.join("kubectl");
        if is_executable(&bundled) {
            return bundled;
        }
        PathBuf::from("kubectl")
    }
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_without_the_binaries_names_the_first_missing() {
        let dir = std::env::temp_dir();
        let err = Assets::in_dir(&dir).expect_err("the temp dir holds no etcd");
        assert!(err.contains("has no etcd"), "{err}");
    }
}
