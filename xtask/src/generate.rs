//! Every generated file of the repository in one list, so that `cargo xtask manifests` writes all of them
//! and `cargo xtask check` (and the drift tests) compare all of them: a generator added here cannot be
//! forgotten by either.

use std::path::{Path, PathBuf};

use memcached_operator::manifests;

use crate::bundle::{self, Options};
use crate::install::{self, io};
use crate::{api_docs, chart, readme, repo_root};

/// Why the generated files cannot be produced or written.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Install(#[from] install::Error),
    #[error(transparent)]
    Bundle(#[from] bundle::Error),
    #[error("cannot write YAML: {0}")]
    Yaml(#[from] serde_saphyr::ser_error::Error),
    #[error(transparent)]
    Readme(#[from] readme::Error),
}

/// One generated file: its path relative to the repository root, and what it must hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct File {
    pub path: String,
    pub content: String,
}

/// Every generated file with its current content: the CRD and roles (`config/`), the one-file install,
/// the API reference and the table of memcached's `-o` sub-options, the OLM bundle, all with their default version and image, and the Helm chart's copies.
pub fn files() -> Result<Vec<File>, Error> {
    let file = |path: &str, content: String| File {
        path: path.to_owned(),
        content,
    };
    let mut files = vec![
        file(manifests::CRD_PATH, manifests::crd_yaml()?),
        file(manifests::RBAC_PATH, manifests::rbac_yaml()?),
        file(
            manifests::NAMESPACED_RBAC_PATH,
            manifests::namespaced_rbac_yaml()?,
        ),
        file(
            manifests::admission::ADMISSION_POLICY_PATH,
            manifests::admission::admission_policy_yaml()?,
        ),
        file(
            install::INSTALL_PATH,
            install::install_yaml(&install::default_operator_image())?,
        ),
        file(api_docs::API_DOCS_PATH, api_docs::api_markdown()),
        file(readme::README_PATH, readme_with_spec_table()?),
        file(
            memcached_operator::api::flags::suboptions::OPTIONS_DOC_PATH,
            memcached_operator::api::flags::suboptions::options_markdown(),
        ),
    ];
    let rendered = bundle::render(&Options::default(), bundle::BUNDLE_DIR)?;
    files.extend(rendered.files.into_iter().map(|(path, content)| File {
        path: format!("{}/{path}", bundle::BUNDLE_DIR),
        content,
    }));
    files.push(file(bundle::DOCKERFILE, rendered.dockerfile));
    files.extend(
        chart::files()?
            .into_iter()
            .map(|(path, content)| File { path, content }),
    );
    Ok(files)
}

/// The README as committed, with its spec table generated anew (the rest of it is written by hand).
fn readme_with_spec_table() -> Result<String, Error> {
    let path = repo_root().join(readme::README_PATH);
    let text = std::fs::read_to_string(&path).map_err(io(&path))?;
    Ok(readme::with_spec_table(&text)?)
}

/// Writes every generated file under the repository root, and removes the files of the bundle's
/// directories that the generator no longer writes; returns the paths written.
pub fn write_all() -> Result<Vec<PathBuf>, Error> {
    let root = repo_root();
    let files = files()?;
    for extra in unlisted_bundle_files(&root, &files) {
        let path = root.join(extra);
        std::fs::remove_file(&path).map_err(io(&path))?;
    }
    let mut written = Vec::new();
    for file in &files {
        let path = root.join(&file.path);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(io(dir))?;
        }
        std::fs::write(&path, &file.content).map_err(io(&path))?;
        written.push(path);
    }
    Ok(written)
}

/// The generated files whose committed copy under `root` is missing or differs from what the code
/// generates, and the files of the bundle's directories that the generator does not write (OLM would still
/// install them). Empty when everything is current.
pub fn stale(root: &Path) -> Result<Vec<String>, Error> {
    let files = files()?;
    Ok(stale_among(root, &files))
}

/// [`stale`] for the given generated `files`.
pub fn stale_among(root: &Path, files: &[File]) -> Vec<String> {
    let mut stale: Vec<String> = files
        .iter()
        .filter(|f| {
            std::fs::read_to_string(root.join(&f.path)).ok().as_deref() != Some(f.content.as_str())
        })
        .map(|f| f.path.clone())
        .chain(unlisted_bundle_files(root, files))
        .collect();
    stale.sort();
    stale
}

/// Files of `bundle/manifests` and `bundle/metadata` under `root` that are not among `files`.
fn unlisted_bundle_files(root: &Path, files: &[File]) -> Vec<String> {
    let mut unlisted = Vec::new();
    for sub in ["manifests", "metadata"] {
        let Ok(entries) = std::fs::read_dir(root.join(bundle::BUNDLE_DIR).join(sub)) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = format!(
                "{}/{sub}/{}",
                bundle::BUNDLE_DIR,
                entry.file_name().to_string_lossy()
            );
            if entry.path().is_file() && !files.iter().any(|f| f.path == path) {
                unlisted.push(path);
            }
        }
    }
    unlisted
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A scratch tree in the temp dir.
    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("generate-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("bundle/manifests")).unwrap();
        dir
    }

    #[test]
    fn stale_lists_missing_changed_and_unlisted_files() {
        let root = scratch("stale");
        let files = [
            File {
                path: "a.yaml".into(),
                content: "a\n".into(),
            },
            File {
                path: "b.yaml".into(),
                content: "b\n".into(),
            },
            File {
                path: "bundle/manifests/c.yaml".into(),
                content: "c\n".into(),
            },
        ];
        std::fs::write(root.join("a.yaml"), "a\n").unwrap();
        std::fs::write(root.join("b.yaml"), "changed\n").unwrap();
        std::fs::write(root.join("bundle/manifests/old.yaml"), "old\n").unwrap();
        assert_eq!(
            stale_among(&root, &files),
            [
                "b.yaml",
                "bundle/manifests/c.yaml",
                "bundle/manifests/old.yaml"
            ]
        );
        std::fs::remove_dir_all(&root).unwrap();
    }
}
