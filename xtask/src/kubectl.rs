//! `kubectl kustomize`, the only kustomize the project uses: kubectl is already a build and CI dependency,
//! and rendering with it means the one-file install, the OLM bundle and `kubectl apply -k config/default`
//! carry the same objects by construction, with no renderer of our own to keep in step.

use std::ffi::OsString;
use std::path::Path;
use std::process::Command;

use serde_json::Value;

/// Environment variable naming the kubectl to run (as the Makefile's `KUBECTL`); `kubectl` when unset.
pub const KUBECTL_ENV: &str = "KUBECTL";

/// Why a kustomization could not be rendered.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "cannot run {kubectl:?}: {source}. kubectl renders config/ (kubectl kustomize); install it, or \
         point the {KUBECTL_ENV} environment variable at it"
    )]
    Missing {
        kubectl: OsString,
        #[source]
        source: std::io::Error,
    },
    #[error("`{kubectl:?} kustomize {dir}` failed ({status}):\n{stderr}")]
    Failed {
        kubectl: OsString,
        dir: String,
        status: std::process::ExitStatus,
        stderr: String,
    },
    #[error("`kubectl kustomize {dir}` printed YAML that cannot be read: {message}")]
    Output { dir: String, message: String },
}

/// The kubectl to run: `$KUBECTL`, else `kubectl` from `PATH`.
pub fn kubectl() -> OsString {
    std::env::var_os(KUBECTL_ENV)
        .filter(|k| !k.is_empty())
        .unwrap_or_else(|| OsString::from("kubectl"))
}

/// The objects `kubectl kustomize dir` renders, in its output order.
pub fn kustomize(dir: &Path) -> Result<Vec<Value>, Error> {
    let kubectl = kubectl();
    let shown = dir.display().to_string();
    let out = Command::new(&kubectl)
        .arg("kustomize")
        .arg(dir)
        .output()
        .map_err(|source| Error::Missing {
            kubectl: kubectl.clone(),
            source,
        })?;
    if !out.status.success() {
        return Err(Error::Failed {
            kubectl,
            dir: shown,
            status: out.status,
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        });
    }
    let text = String::from_utf8(out.stdout).map_err(|e| Error::Output {
        dir: shown.clone(),
        message: e.to_string(),
    })?;
    let docs = serde_saphyr::from_multiple::<Value>(&text).map_err(|e| Error::Output {
        dir: shown,
        message: e.to_string(),
    })?;
    Ok(docs.into_iter().filter(|d| !d.is_null()).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_kubectl_is_named_in_the_error() {
        let error = Error::Missing {
            kubectl: "/nonexistent/kubectl".into(),
            source: std::io::Error::from(std::io::ErrorKind::NotFound),
        };
        let message = error.to_string();
        assert!(message.contains("/nonexistent/kubectl"), "{message}");
        assert!(message.contains(KUBECTL_ENV), "{message}");
    }
}
