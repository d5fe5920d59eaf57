//! Helm's own engine, offline, for the chart's tests: `hack/helm_chart.py` drives PyPI's
//! `helm-python-sdk` (Helm v4's Go library behind a C ABI), since no `helm` binary is packaged where CI
//! installs from. The script prints JSON; this module runs it and reads the answer.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use serde_json::Value;

use crate::repo_root;

/// The bridge script, relative to the repository root.
pub const SCRIPT: &str = "hack/helm_chart.py";
/// The script's exit status when the SDK is not installed.
const SDK_MISSING: i32 = 3;

/// Why Helm could not be asked, or what it refused.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// python3 or the SDK is not installed: tests skip, or fail under CI.
    #[error("{0}")]
    Unavailable(String),
    /// Helm refused the values or a template failed; the message is Helm's.
    #[error("helm refused: {0}")]
    Refused(String),
    #[error("{SCRIPT} failed: {0}")]
    Bridge(String),
}

/// What `helm template` would print, by template path, plus the chart's `crds/` files and its NOTES.
#[derive(Debug, Clone)]
pub struct Rendering {
    pub manifests: BTreeMap<String, String>,
    pub crds: BTreeMap<String, String>,
    pub notes: String,
}

impl Rendering {
    /// Every object the templates render that `helm install` creates (not the CRDs, not the test hooks
    /// `helm test` creates), in template path order.
    pub fn objects(&self) -> Result<Vec<Value>, Error> {
        let objects = yaml_objects(self.manifests.values())?;
        Ok(objects.into_iter().filter(|o| !test_hook(o)).collect())
    }

    /// The objects `helm test` creates (annotated `helm.sh/hook: test`), in template path order.
    pub fn test_hooks(&self) -> Result<Vec<Value>, Error> {
        let objects = yaml_objects(self.manifests.values())?;
        Ok(objects.into_iter().filter(test_hook).collect())
    }

    /// The objects of `crds/`, which Helm installs before the templates unless `--skip-crds`.
    pub fn crd_objects(&self) -> Result<Vec<Value>, Error> {
        yaml_objects(self.crds.values())
    }
}

/// Whether `object` is a hook of `helm test`.
fn test_hook(object: &Value) -> bool {
    object["metadata"]["annotations"]["helm.sh/hook"]
        .as_str()
        .is_some_and(|hooks| hooks.split(',').any(|h| h.trim() == "test"))
}

fn yaml_objects<'a>(texts: impl Iterator<Item = &'a String>) -> Result<Vec<Value>, Error> {
    let mut objects = Vec::new();
    for text in texts {
        let docs = serde_saphyr::from_multiple::<Value>(text)
            .map_err(|e| Error::Bridge(format!("rendered YAML cannot be read: {e}\n{text}")))?;
        objects.extend(docs.into_iter().filter(|d| !d.is_null()));
    }
    Ok(objects)
}

/// Lint findings: (severity, path, message); severity 2 is a warning, 3 an error.
pub fn lint(chart: &Path, values: &Value) -> Result<Vec<(u64, String, String)>, Error> {
    let answer = run(&["lint", &chart.display().to_string(), &values.to_string()])?;
    let messages = answer["messages"].as_array().cloned().unwrap_or_default();
    Ok(messages
        .iter()
        .map(|m| {
            (
                m["severity"].as_u64().unwrap_or(0),
                m["path"].as_str().unwrap_or_default().to_owned(),
                m["error"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect())
}

/// The chart rendered as release `release` in `namespace` with `values` (validated against
/// `values.schema.json`, as `helm install` does).
pub fn render(
    chart: &Path,
    values: &Value,
    release: &str,
    namespace: &str,
) -> Result<Rendering, Error> {
    let answer = run(&[
        "render",
        &chart.display().to_string(),
        &values.to_string(),
        release,
        namespace,
    ])?;
    if let Some(error) = answer["error"].as_str() {
        return Err(Error::Refused(error.to_owned()));
    }
    let texts = |key: &str| -> BTreeMap<String, String> {
        answer[key]
            .as_object()
            .map(|m| {
                m.iter()
                    .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
                    .collect()
            })
            .unwrap_or_default()
    };
    Ok(Rendering {
        manifests: texts("manifests"),
        crds: texts("crds"),
        notes: answer["notes"].as_str().unwrap_or_default().to_owned(),
    })
}

/// Runs the bridge script with `args` and reads its JSON answer (printed on failure too).
fn run(args: &[&str]) -> Result<Value, Error> {
    let out = Command::new("python3")
        .arg(repo_root().join(SCRIPT))
        .args(args)
        .output()
        .map_err(|e| Error::Unavailable(format!("cannot run python3: {e}")))?;
    let stderr = String::from_utf8_lossy(&out.stderr).trim().to_owned();
    if out.status.code() == Some(SDK_MISSING) {
        return Err(Error::Unavailable(stderr));
    }
    match serde_json::from_slice::<Value>(&out.stdout) {
        Ok(answer) => Ok(answer),
        Err(e) => Err(Error::Bridge(format!(
            "{}: {e}; stderr: {stderr}",
            out.status
        ))),
    }
}
