//! The one-file install (`cargo xtask install`, committed as `dist/install.yaml`).
//!
//! It is `config/default` as `kubectl kustomize` renders it, from a scratch copy of `config/` in which the
//! CRD and roles are the ones the code generates (so the install always matches the code, even before
//! `make manifests` has rewritten them), with the operator image set by a kustomize `images` entry. The
//! one thing added to kubectl's rendering: kubectl prints integral floats of the CRD schema (`65535.0`)
//! as integers, so the CRD is taken as the code generates it, after checking it is the same object.

use std::path::{Path, PathBuf};

use memcached_operator::{VERSION, manifests};
use serde_json::{Value, json};

use crate::kubectl;

/// Path of the committed one-file install, relative to the repository root.
pub const INSTALL_PATH: &str = "dist/install.yaml";
/// The kustomization the install is rendered from.
pub const DEFAULT_KUSTOMIZATION: &str = "config/default";
/// The kustomization of the operator's Deployment, which sets its image.
pub const MANAGER_KUSTOMIZATION: &str = "config/manager";
/// The kustomization listing the sample `Memcached` objects.
pub const SAMPLES_KUSTOMIZATION: &str = "config/samples";
/// Repository of the operator image (the Makefile's `IMAGE_TAG_BASE`).
pub const IMAGE_REPOSITORY: &str = "registry.example.com/memcached-operator";
/// The kustomize image name of the operator container in `config/manager` (the Kubebuilder convention),
/// which `--image` replaces.
pub const OPERATOR_IMAGE_NAME: &str = "controller";
/// Annotation naming the pod's main container, as the Kubebuilder scaffold sets it.
const DEFAULT_CONTAINER_ANNOTATION: &str = "kubectl.kubernetes.io/default-container";

/// The operator image `install` and `bundle` use unless told otherwise: the repository, tagged with the
/// operator's version (the Makefile's default `IMG`). The committed `dist/install.yaml` and bundle use it.
pub fn default_operator_image() -> String {
    format!("{IMAGE_REPOSITORY}:v{VERSION}")
}

/// Why an install or the samples cannot be rendered.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Kustomize(#[from] kubectl::Error),
    #[error("cannot write YAML: {0}")]
    Yaml(#[from] serde_saphyr::ser_error::Error),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Invalid(String),
}

/// Accepts an image reference: non-empty, no whitespace (the registry checks the rest when pulling).
pub fn parse_image(s: &str) -> Result<String, String> {
    if s.is_empty() || s.contains(char::is_whitespace) {
        Err(format!(
            "{s:?} is not an image reference such as registry.example.com/memcached-operator:v1.0.0"
        ))
    } else {
        Ok(s.to_owned())
    }
}

/// The objects of `config/default` with the kustomize component `component` (such as `config/prometheus`)
/// enabled, as a user does by uncommenting it under `components:` in config/default/kustomization.yaml.
pub fn install_with_component(component: &str) -> Result<Vec<Value>, Error> {
    let scratch = Scratch::new()?;
    let kustomization = scratch
        .config(DEFAULT_KUSTOMIZATION)
        .join("kustomization.yaml");
    let mut text = std::fs::read_to_string(&kustomization).map_err(io(&kustomization))?;
    let relative = component.strip_prefix("config/").unwrap_or(component);
    text.push_str(&format!("components:\n- ../{relative}\n"));
    std::fs::write(&kustomization, text).map_err(io(&kustomization))?;
    Ok(kubectl::kustomize(&scratch.config(DEFAULT_KUSTOMIZATION))?)
}

/// Every object of the install, in `kubectl kustomize` order, with the operator running `image`.
pub fn install(image: &str) -> Result<Vec<Value>, Error> {
    let scratch = Scratch::new()?;
    let overlay = scratch.with_operator_image(DEFAULT_KUSTOMIZATION, image)?;
    let mut objects = kubectl::kustomize(&overlay)?;
    use_generated_crd(&mut objects)?;
    let deployment = operator_deployment(&objects)?;
    let running = manager_container(deployment).and_then(|c| c["image"].as_str());
    if running != Some(image) {
        return Err(Error::Invalid(format!(
            "the operator container runs {running:?}, not {image:?}: config/ no longer names the \
             operator image {OPERATOR_IMAGE_NAME:?} (see config/manager/kustomization.yaml)"
        )));
    }
    let passed = manager_env(deployment, "OPERATOR_IMAGE");
    if passed != Some(image) {
        return Err(Error::Invalid(format!(
            "the operator is told its image is {passed:?}, not {image:?}: the proxy pods would run \
             another image (OPERATOR_IMAGE, see config/manager/kustomization.yaml)"
        )));
    }
    Ok(objects)
}

/// The install as one YAML file, with a header saying what it is and how to apply it.
pub fn install_yaml(image: &str) -> Result<String, Error> {
    let objects = install(image)?;
    let header = format!(
        "# memcached-operator {VERSION}: the complete install in one file, the objects that\n\
         # `kubectl kustomize config/default` renders (namespace, CRD, RBAC, operator Deployment, metrics Service).\n\
         #\n\
         #   kubectl apply --server-side -f install.yaml\n\
         #\n\
         # Generated by `cargo xtask install --image {image}` (make manifests or\n\
         # make build-installer). Do not edit.\n",
    );
    Ok(format!("{header}{}", manifests::to_yaml(&objects)?))
}

/// The sample `Memcached` objects of `config/samples`, in the order its kustomization lists them
/// (`sortOptions: fifo` there): the first is the one the OLM console pre-fills its form with, so the
/// tutorial's sample leads.
pub fn samples() -> Result<Vec<Value>, Error> {
    let scratch = Scratch::new()?;
    Ok(kubectl::kustomize(&scratch.config(SAMPLES_KUSTOMIZATION))?)
}

/// The operator's Deployment: the only Deployment of the install.
pub fn operator_deployment(objects: &[Value]) -> Result<&Value, Error> {
    let mut deployments = objects.iter().filter(|o| o["kind"] == "Deployment");
    match (deployments.next(), deployments.next()) {
        (Some(deployment), None) => Ok(deployment),
        _ => Err(Error::Invalid(
            "the install must hold exactly one Deployment, the operator's".into(),
        )),
    }
}

/// The container running the operator: the one the `kubectl.kubernetes.io/default-container` annotation
/// names, else the first.
pub fn manager_container(deployment: &Value) -> Option<&Value> {
    manager_container_index(deployment)
        .map(|i| &deployment["spec"]["template"]["spec"]["containers"][i])
}

/// The value of the environment variable `name` of the [`manager_container`], when it has one.
pub fn manager_env<'a>(deployment: &'a Value, name: &str) -> Option<&'a str> {
    manager_container(deployment)?["env"]
        .as_array()?
        .iter()
        .find(|e| e["name"] == name)?["value"]
        .as_str()
}

/// Index of [`manager_container`] in the pod's containers.
pub fn manager_container_index(deployment: &Value) -> Option<usize> {
    let template = &deployment["spec"]["template"];
    let containers = template["spec"]["containers"].as_array()?;
    let named = template["metadata"]["annotations"][DEFAULT_CONTAINER_ANNOTATION].as_str();
    match named {
        Some(name) => containers.iter().position(|c| c["name"] == name),
        None => (!containers.is_empty()).then_some(0),
    }
}

/// Replaces kubectl's rendering of the CRD by the CRD as the code generates it, after checking that they
/// are the same object: kubectl reads the schema's `65535.0` as `65535`, which would otherwise make the
/// install's CRD differ in form (not in meaning) from the committed one.
fn use_generated_crd(objects: &mut [Value]) -> Result<(), Error> {
    let crd = serde_json::to_value(manifests::crd())
        .map_err(|e| Error::Invalid(format!("cannot read the generated CRD: {e}")))?;
    let mut found = false;
    for object in objects.iter_mut() {
        if object["kind"] == "CustomResourceDefinition"
            && object["metadata"]["name"] == crd["metadata"]["name"]
        {
            if !same_modulo_integral_floats(object, &crd) {
                return Err(Error::Invalid(format!(
                    "{DEFAULT_KUSTOMIZATION} changes the CRD {}; the install carries it as generated",
                    crd["metadata"]["name"]
                )));
            }
            object.clone_from(&crd);
            found = true;
        }
    }
    if found {
        Ok(())
    } else {
        Err(Error::Invalid(format!(
            "{DEFAULT_KUSTOMIZATION} does not render the CRD {}",
            crd["metadata"]["name"]
        )))
    }
}

/// Whether `a` and `b` are equal when a float with no fractional part equals the integer it holds.
pub fn same_modulo_integral_floats(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x == y || x.as_f64() == y.as_f64(),
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len()
                && x.iter()
                    .zip(y)
                    .all(|(a, b)| same_modulo_integral_floats(a, b))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter().all(|(key, a)| {
                    y.get(key)
                        .is_some_and(|b| same_modulo_integral_floats(a, b))
                })
        }
        _ => a == b,
    }
}

/// An image reference split as a kustomize `images` entry wants it: `newName`, then `newTag` or `digest`.
pub fn image_entry(name: &str, reference: &str) -> Value {
    let (rest, digest) = match reference.split_once('@') {
        Some((rest, digest)) => (rest, Some(digest)),
        None => (reference, None),
    };
    // A tag follows the last colon after the last slash; a colon before it belongs to a registry port.
    let last_part = rest.rfind('/').map_or(0, |i| i + 1);
    let (new_name, tag) = match rest[last_part..].rfind(':') {
        Some(i) => (&rest[..last_part + i], Some(&rest[last_part + i + 1..])),
        None => (rest, None),
    };
    let mut entry = json!({"name": name, "newName": new_name});
    if let Some(tag) = tag {
        entry["newTag"] = json!(tag);
    }
    if let Some(digest) = digest {
        entry["digest"] = json!(digest);
    }
    entry
}

/// A scratch copy of `config/` with the CRD and roles as the code generates them, removed on drop.
struct Scratch {
    dir: PathBuf,
}

impl Scratch {
    fn new() -> Result<Self, Error> {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let dir = std::env::temp_dir().join(format!(
            "memcached-operator-xtask-{}-{nanos}",
            std::process::id()
        ));
        let scratch = Self { dir };
        let root = crate::repo_root();
        copy_dir(&root.join("config"), &scratch.dir.join("config"))?;
        for (path, content) in [
            (manifests::CRD_PATH, manifests::crd_yaml()?),
            (manifests::RBAC_PATH, manifests::rbac_yaml()?),
        ] {
            let target = scratch.dir.join(path);
            std::fs::write(&target, content).map_err(io(&target))?;
        }
        Ok(scratch)
    }

    /// The copy of the kustomization `path` (such as `config/default`).
    fn config(&self, path: &str) -> PathBuf {
        self.dir.join(path)
    }

    /// The kustomization `path` rendering the operator image `image`, as `kustomize edit set image
    /// controller=IMAGE` in `config/manager` would, in the scratch copy (the committed files are left
    /// alone). The image is set where `config/manager` sets it, not in an overlay above `path`: the
    /// `replacements:` there copy it into the container's `OPERATOR_IMAGE`, and an overlay's `images:`
    /// would run after them.
    fn with_operator_image(&self, path: &str, image: &str) -> Result<PathBuf, Error> {
        let file = self
            .config(MANAGER_KUSTOMIZATION)
            .join("kustomization.yaml");
        let text = std::fs::read_to_string(&file).map_err(io(&file))?;
        let mut kustomization: Value = serde_saphyr::from_str(&text)
            .map_err(|e| Error::Invalid(format!("{}: {e}", file.display())))?;
        let images = kustomization["images"]
            .as_array_mut()
            .ok_or_else(|| Error::Invalid(format!("{}: no `images:` list", file.display())))?;
        images.retain(|entry| entry["name"] != OPERATOR_IMAGE_NAME);
        images.push(image_entry(OPERATOR_IMAGE_NAME, image));
        std::fs::write(&file, serde_saphyr::to_string(&kustomization)?).map_err(io(&file))?;
        Ok(self.config(path))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        // Best effort: a leftover directory in the temp dir is harmless.
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Copies the directory tree `from` to `to`.
fn copy_dir(from: &Path, to: &Path) -> Result<(), Error> {
    std::fs::create_dir_all(to).map_err(io(to))?;
    for entry in std::fs::read_dir(from).map_err(io(from))? {
        let path = entry.map_err(io(from))?.path();
        let target = to.join(path.file_name().unwrap_or_default());
        if path.is_dir() {
            copy_dir(&path, &target)?;
        } else {
            std::fs::copy(&path, &target).map_err(io(&path))?;
        }
    }
    Ok(())
}

/// Attaches `path` to an I/O error.
pub(crate) fn io(path: &Path) -> impl FnOnce(std::io::Error) -> Error {
    let path = path.to_path_buf();
    move |source| Error::Io { path, source }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_image_is_the_repository_tagged_with_the_version() {
        assert_eq!(
            default_operator_image(),
            format!("{IMAGE_REPOSITORY}:v{}", memcached_operator::VERSION)
        );
    }

    #[test]
    fn images_split_into_name_tag_and_digest() {
        let entry = |reference| image_entry("controller", reference);
        assert_eq!(
            entry("controller"),
            json!({"name": "controller", "newName": "controller"})
        );
        assert_eq!(
            entry("reg.example:5000/team/op:v1.2"),
            json!({"name": "controller", "newName": "reg.example:5000/team/op", "newTag": "v1.2"})
        );
        assert_eq!(
            entry("reg.example:5000/op@sha256:0123"),
            json!({"name": "controller", "newName": "reg.example:5000/op", "digest": "sha256:0123"})
        );
        assert_eq!(
            entry("op:v1@sha256:0123"),
            json!({"name": "controller", "newName": "op", "newTag": "v1", "digest": "sha256:0123"})
        );
    }

    #[test]
    fn integral_floats_equal_their_integers() {
        assert!(same_modulo_integral_floats(
            &json!({"maximum": 65535.0, "a": [1.0]}),
            &json!({"maximum": 65535, "a": [1]})
        ));
        assert!(!same_modulo_integral_floats(
            &json!({"maximum": 65535.5}),
            &json!({"maximum": 65535})
        ));
        assert!(!same_modulo_integral_floats(
            &json!({"a": 1}),
            &json!({"a": 1, "b": 2})
        ));
    }

    #[test]
    fn install_runs_the_requested_image() {
        let objects = install("reg.example/op@sha256:0123").unwrap();
        let deployment = operator_deployment(&objects).unwrap();
        assert_eq!(
            manager_container(deployment).unwrap()["image"],
            "reg.example/op@sha256:0123"
        );
        assert_eq!(objects[0]["kind"], "Namespace");
    }

    #[test]
    fn samples_are_memcacheds() {
        let samples = samples().unwrap();
        assert!(!samples.is_empty());
        assert!(samples.iter().all(|s| s["kind"] == "Memcached"));
    }
}
