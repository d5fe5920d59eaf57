//! A small, strict subset of kustomize: enough to render `config/default` and `config/samples` from the
//! files embedded in the binary, with the result `kubectl kustomize` gives.
//!
//! Why not shell out to kubectl: the binary must print the install (`memcached-operator manifests`) and
//! build the OLM bundle anywhere, without kubectl, from exactly the files `kubectl apply -k config/default`
//! uses. A test compares the two renderings, so they cannot drift apart.
//!
//! Supported kustomization fields: `resources` (files and directories), `namespace`, `namePrefix`,
//! `nameSuffix` and `images`, with kustomize's reference fixing (role bindings, service accounts, config
//! maps and secrets named by pods) and its output order. Any other field (patches, generators, labels,
//! replacements, ...) is an error rather than ignored: ignoring it would make the one-file install quietly
//! differ from the kustomize install.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::Value;

/// A kustomization that cannot be rendered, with the file at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {message}")]
pub struct Error {
    pub path: String,
    pub message: String,
}

impl Error {
    fn new(path: &str, message: impl Into<String>) -> Self {
        Self {
            path: path.to_owned(),
            message: message.into(),
        }
    }
}

/// The kustomization fields this renderer understands; `deny_unknown_fields` turns every other field into
/// an error naming it.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Kustomization {
    #[serde(default)]
    api_version: Option<String>,
    #[serde(default)]
    kind: Option<String>,
    #[serde(default)]
    resources: Vec<String>,
    #[serde(default)]
    namespace: Option<String>,
    #[serde(default)]
    name_prefix: Option<String>,
    #[serde(default)]
    name_suffix: Option<String>,
    #[serde(default)]
    images: Vec<ImageEntry>,
}

/// One `images:` entry: containers whose image name is `name` get `newName`, `newTag` or `digest`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ImageEntry {
    name: String,
    #[serde(default)]
    new_name: Option<String>,
    #[serde(default)]
    new_tag: Option<String>,
    #[serde(default)]
    digest: Option<String>,
}

/// Kinds kustomize treats as cluster-scoped: the namespace transformer leaves them alone. Any other kind,
/// including unknown custom kinds, is namespaced, as in kustomize.
const CLUSTER_SCOPED: &[&str] = &[
    "APIService",
    "CertificateSigningRequest",
    "ClusterRole",
    "ClusterRoleBinding",
    "ComponentStatus",
    "CSIDriver",
    "CSINode",
    "CustomResourceDefinition",
    "FlowSchema",
    "IngressClass",
    "MutatingWebhookConfiguration",
    "Namespace",
    "Node",
    "PersistentVolume",
    "PodSecurityPolicy",
    "PriorityClass",
    "PriorityLevelConfiguration",
    "RuntimeClass",
    "StorageClass",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
    "ValidatingWebhookConfiguration",
    "VolumeAttachment",
];

/// Kinds kustomize's `legacy` order puts first, in this order (kustomize's `resid.Gvk` ordering).
const ORDER_FIRST: &[&str] = &[
    "Namespace",
    "ResourceQuota",
    "StorageClass",
    "CustomResourceDefinition",
    "MutatingWebhookConfiguration",
    "ServiceAccount",
    "PodSecurityPolicy",
    "Role",
    "ClusterRole",
    "RoleBinding",
    "ClusterRoleBinding",
    "ConfigMap",
    "Secret",
    "Service",
    "LimitRange",
    "PriorityClass",
    "Deployment",
    "StatefulSet",
    "CronJob",
    "PodDisruptionBudget",
];
/// Kinds the `legacy` order puts last.
const ORDER_LAST: &[&str] = &["ValidatingWebhookConfiguration"];

/// Whether objects of `kind` live in a namespace.
pub fn is_namespaced(kind: &str) -> bool {
    !CLUSTER_SCOPED.contains(&kind)
}

/// Renders kustomizations from a file source (paths relative to the repository root, `/`-separated).
pub struct Renderer<'a> {
    read: &'a dyn Fn(&str) -> Option<String>,
    overrides: BTreeMap<String, String>,
    sort: bool,
}

impl<'a> Renderer<'a> {
    /// A renderer reading files through `read`, which returns `None` for a missing file.
    pub fn new(read: &'a dyn Fn(&str) -> Option<String>) -> Self {
        Self {
            read,
            overrides: BTreeMap::new(),
            sort: true,
        }
    }

    /// Keeps the objects in the order the kustomizations list them (kustomize's `sortOptions: {order:
    /// fifo}`) instead of kustomize's default kind order; for lists where order carries meaning.
    pub fn in_listed_order(mut self) -> Self {
        self.sort = false;
        self
    }

    /// Makes every container image named `name` exactly `reference`, as `kustomize edit set image
    /// name=reference` followed by a build would: the `images:` entry for `name`, wherever it is declared,
    /// is replaced, and images named `name` that no entry covers are replaced too.
    pub fn set_image(mut self, name: &str, reference: &str) -> Self {
        self.overrides.insert(name.to_owned(), reference.to_owned());
        self
    }

    /// The objects `kubectl kustomize dir` prints, in the same order.
    pub fn build(&self, dir: &str) -> Result<Vec<Value>, Error> {
        let mut objects = self.build_dir(dir, 0)?;
        if !self.overrides.is_empty() {
            for object in &mut objects {
                for_each_image(object, &mut |image| {
                    let (name, _, _) = split_image(image);
                    self.overrides.get(name).cloned()
                });
            }
        }
        if self.sort {
            sort_legacy(&mut objects);
        }
        Ok(objects)
    }

    fn build_dir(&self, dir: &str, depth: usize) -> Result<Vec<Value>, Error> {
        let path = join(dir, "kustomization.yaml");
        if depth > 16 {
            return Err(Error::new(&path, "resources nest too deeply (a cycle?)"));
        }
        let text = (self.read)(&path).ok_or_else(|| Error::new(&path, "not found"))?;
        let kustomization: Kustomization = serde_saphyr::from_str(&text).map_err(|e| {
            Error::new(
                &path,
                format!(
                    "{e}\n(memcached-operator renders config/ itself and supports only the kustomization \
                     fields resources, namespace, namePrefix, nameSuffix and images)"
                ),
            )
        })?;
        kustomization.check(&path)?;

        let mut objects = Vec::new();
        for resource in &kustomization.resources {
            let target = normalize(&join(dir, resource)).ok_or_else(|| {
                Error::new(&path, format!("resource {resource:?} leaves the tree"))
            })?;
            if let Some(text) = (self.read)(&target) {
                objects.extend(parse_objects(&target, &text)?);
            } else if (self.read)(&join(&target, "kustomization.yaml")).is_some() {
                objects.extend(self.build_dir(&target, depth + 1)?);
            } else {
                return Err(Error::new(
                    &path,
                    format!(
                        "resource {resource:?} ({target}) is neither a file nor a kustomization"
                    ),
                ));
            }
        }
        check_unique(&objects, &path)?;

        // Transformers run in kustomize's order: namespace, name prefix/suffix, images; then the references
        // between the objects of this level are updated to the new names.
        let before: Vec<Id> = objects.iter().map(Id::of).collect();
        if let Some(namespace) = &kustomization.namespace {
            objects.iter_mut().for_each(|o| set_namespace(o, namespace));
        }
        let prefix = kustomization.name_prefix.as_deref().unwrap_or_default();
        let suffix = kustomization.name_suffix.as_deref().unwrap_or_default();
        if !prefix.is_empty() || !suffix.is_empty() {
            objects
                .iter_mut()
                .for_each(|o| add_prefix_suffix(o, prefix, suffix));
        }
        if !kustomization.images.is_empty() {
            let entries: Vec<ImageEntry> = kustomization.images.clone();
            for object in &mut objects {
                for_each_image(object, &mut |image| self.transform_image(image, &entries));
            }
        }
        check_unique(&objects, &path)?;

        let renames: Vec<(Id, Id)> = before
            .iter()
            .zip(objects.iter().map(Id::of))
            .filter(|(old, new)| *old != new)
            .map(|(old, new)| (old.clone(), new))
            .collect();
        if !renames.is_empty() {
            for (object, old) in objects.iter_mut().zip(&before) {
                fix_references(object, old.namespace.as_deref(), &renames);
            }
        }
        Ok(objects)
    }

    /// The image `image` becomes under `entries` (and the overrides), or `None` to leave it.
    fn transform_image(&self, image: &str, entries: &[ImageEntry]) -> Option<String> {
        let (name, tag, digest) = split_image(image);
        let entry = entries.iter().find(|e| e.name == name)?;
        if let Some(reference) = self.overrides.get(&entry.name) {
            return Some(reference.clone());
        }
        let new_name = entry.new_name.as_deref().unwrap_or(name);
        Some(match (&entry.digest, &entry.new_tag) {
            (Some(d), _) => format!("{new_name}@{d}"),
            (None, Some(t)) => format!("{new_name}:{t}"),
            (None, None) => match (tag, digest) {
                (_, Some(d)) => format!("{new_name}@{d}"),
                (Some(t), None) => format!("{new_name}:{t}"),
                (None, None) => new_name.to_owned(),
            },
        })
    }
}

impl Kustomization {
    fn check(&self, path: &str) -> Result<(), Error> {
        if let Some(kind) = self.kind.as_deref().filter(|k| *k != "Kustomization") {
            return Err(Error::new(
                path,
                format!("kind {kind:?} is not supported (only Kustomization)"),
            ));
        }
        if let Some(version) = self
            .api_version
            .as_deref()
            .filter(|v| !v.starts_with("kustomize.config.k8s.io/"))
        {
            return Err(Error::new(
                path,
                format!("apiVersion {version:?} is not a kustomize API version"),
            ));
        }
        Ok(())
    }
}

/// Identity of an object for kustomize: kind, namespace and name (the API group is left out: references
/// name a kind, never a group).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Id {
    kind: String,
    namespace: Option<String>,
    name: String,
}

impl Id {
    fn of(object: &Value) -> Self {
        let text = |v: &Value| v.as_str().map(str::to_owned);
        Self {
            kind: text(&object["kind"]).unwrap_or_default(),
            namespace: text(&object["metadata"]["namespace"]),
            name: text(&object["metadata"]["name"]).unwrap_or_default(),
        }
    }
}

fn check_unique(objects: &[Value], path: &str) -> Result<(), Error> {
    let mut seen: Vec<(String, Id)> = Vec::new();
    for object in objects {
        let key = (
            object["apiVersion"].as_str().unwrap_or_default().to_owned(),
            Id::of(object),
        );
        if seen.contains(&key) {
            let (_, id) = key;
            return Err(Error::new(
                path,
                format!(
                    "two objects are {} {} in namespace {:?}",
                    id.kind, id.name, id.namespace
                ),
            ));
        }
        seen.push(key);
    }
    Ok(())
}

/// The objects of a YAML file, each checked to have an apiVersion, a kind and a name.
fn parse_objects(path: &str, text: &str) -> Result<Vec<Value>, Error> {
    let docs: Vec<Value> =
        serde_saphyr::from_multiple(text).map_err(|e| Error::new(path, e.to_string()))?;
    let objects: Vec<Value> = docs.into_iter().filter(|d| !d.is_null()).collect();
    for object in &objects {
        let named = object["apiVersion"].is_string()
            && object["kind"].is_string()
            && object["metadata"]["name"].is_string();
        if !named {
            return Err(Error::new(
                path,
                "every document needs apiVersion, kind and metadata.name",
            ));
        }
    }
    Ok(objects)
}

/// `dir/rest`, without doubling slashes.
fn join(dir: &str, rest: &str) -> String {
    if dir.is_empty() || dir == "." {
        rest.to_owned()
    } else {
        format!("{}/{rest}", dir.trim_end_matches('/'))
    }
}

/// Resolves `.` and `..` segments; `None` when the path climbs above the root.
fn normalize(path: &str) -> Option<String> {
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop()?;
            }
            other => parts.push(other),
        }
    }
    Some(parts.join("/"))
}

/// The namespace transformer: namespaced objects move to `namespace`, a Namespace object is renamed to it,
/// and role binding subjects naming the `default` service account follow (kustomize's default).
fn set_namespace(object: &mut Value, namespace: &str) {
    let kind = object["kind"].as_str().unwrap_or_default().to_owned();
    if kind == "Namespace" {
        object["metadata"]["name"] = Value::from(namespace);
    } else if is_namespaced(&kind) {
        object["metadata"]["namespace"] = Value::from(namespace);
    }
    if kind == "RoleBinding" || kind == "ClusterRoleBinding" {
        for subject in array_mut(object, "subjects") {
            if subject["kind"] == "ServiceAccount" && subject["name"] == "default" {
                subject["namespace"] = Value::from(namespace);
            }
        }
    }
}

/// The name prefix/suffix transformer. CustomResourceDefinitions (whose name the API server dictates) and
/// Namespaces keep their names, as in kustomize.
fn add_prefix_suffix(object: &mut Value, prefix: &str, suffix: &str) {
    let kind = object["kind"].as_str().unwrap_or_default();
    if kind == "CustomResourceDefinition" || kind == "Namespace" {
        return;
    }
    if let Some(name) = object["metadata"]["name"].as_str() {
        object["metadata"]["name"] = Value::from(format!("{prefix}{name}{suffix}"));
    }
}

/// Splits an image reference into name, tag and digest: `reg:5000/a/b:1.2@sha256:..`.
pub fn split_image(image: &str) -> (&str, Option<&str>, Option<&str>) {
    let (rest, digest) = match image.split_once('@') {
        Some((rest, digest)) => (rest, Some(digest)),
        None => (image, None),
    };
    let last_slash = rest.rfind('/').map_or(0, |i| i + 1);
    match rest[last_slash..].rfind(':') {
        Some(i) => (
            &rest[..last_slash + i],
            Some(&rest[last_slash + i + 1..]),
            digest,
        ),
        None => (rest, None, digest),
    }
}

/// Calls `change` on every container image (containers, init and ephemeral containers, at any depth) and
/// stores what it returns.
fn for_each_image(value: &mut Value, change: &mut dyn FnMut(&str) -> Option<String>) {
    match value {
        Value::Object(map) => {
            for (key, child) in map.iter_mut() {
                let containers = matches!(
                    key.as_str(),
                    "containers" | "initContainers" | "ephemeralContainers"
                );
                if let (true, Value::Array(items)) = (containers, &mut *child) {
                    for item in items.iter_mut() {
                        if let Some(new) = item["image"].as_str().and_then(&mut *change) {
                            item["image"] = Value::from(new);
                        }
                    }
                }
                for_each_image(child, change);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|i| for_each_image(i, change)),
        _ => {}
    }
}

/// The elements of the array at `object[key]`, if it is one.
fn array_mut<'v>(object: &'v mut Value, key: &str) -> impl Iterator<Item = &'v mut Value> {
    object
        .get_mut(key)
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
}

/// The renamed identity of the object a reference points at, if it was renamed at this level. Namespaced
/// kinds match only in `namespace` (the referrer's, or the one the reference names).
fn renamed<'r>(
    renames: &'r [(Id, Id)],
    kind: &str,
    namespace: Option<&str>,
    name: &str,
) -> Option<&'r Id> {
    renames
        .iter()
        .find(|(old, _)| {
            old.kind == kind
                && old.name == name
                && (!is_namespaced(kind) || old.namespace.as_deref() == namespace)
        })
        .map(|(_, new)| new)
}

/// Points the name at `value` (a string holding a name of `kind`) at the renamed object.
fn fix_name(value: &mut Value, renames: &[(Id, Id)], kind: &str, namespace: Option<&str>) {
    let Some(name) = value.as_str() else { return };
    if let Some(new) = renamed(renames, kind, namespace, name) {
        *value = Value::from(new.name.clone());
    }
}

/// kustomize's name reference transformer, for the references an operator install has: role bindings to
/// roles and service accounts, and pods to service accounts, config maps, secrets and claims.
fn fix_references(object: &mut Value, namespace: Option<&str>, renames: &[(Id, Id)]) {
    let kind = object["kind"].as_str().unwrap_or_default().to_owned();
    match kind.as_str() {
        "RoleBinding" | "ClusterRoleBinding" => {
            let role_kind = object["roleRef"]["kind"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            if role_kind == "Role" || role_kind == "ClusterRole" {
                fix_name(
                    &mut object["roleRef"]["name"],
                    renames,
                    &role_kind,
                    namespace,
                );
            }
            for subject in array_mut(object, "subjects") {
                if subject["kind"] != "ServiceAccount" {
                    continue;
                }
                let subject_ns = subject["namespace"]
                    .as_str()
                    .map(str::to_owned)
                    .or_else(|| namespace.map(str::to_owned));
                let name = subject["name"].as_str().unwrap_or_default();
                if let Some(new) =
                    renamed(renames, "ServiceAccount", subject_ns.as_deref(), name).cloned()
                {
                    subject["name"] = Value::from(new.name);
                    if let Some(ns) = new.namespace {
                        subject["namespace"] = Value::from(ns);
                    }
                }
            }
        }
        _ => {
            if kind == "StatefulSet" {
                fix_name(
                    &mut object["spec"]["serviceName"],
                    renames,
                    "Service",
                    namespace,
                );
            }
            let pod_spec = match kind.as_str() {
                "Pod" => object.pointer_mut("/spec"),
                "Deployment"
                | "StatefulSet"
                | "DaemonSet"
                | "ReplicaSet"
                | "Job"
                | "ReplicationController" => object.pointer_mut("/spec/template/spec"),
                "CronJob" => object.pointer_mut("/spec/jobTemplate/spec/template/spec"),
                _ => None,
            };
            if let Some(pod_spec) = pod_spec {
                fix_pod_references(pod_spec, namespace, renames);
            }
        }
    }
}

fn fix_pod_references(spec: &mut Value, namespace: Option<&str>, renames: &[(Id, Id)]) {
    for key in ["serviceAccountName", "serviceAccount"] {
        if let Some(value) = spec.get_mut(key) {
            fix_name(value, renames, "ServiceAccount", namespace);
        }
    }
    for secret in array_mut(spec, "imagePullSecrets") {
        fix_name(&mut secret["name"], renames, "Secret", namespace);
    }
    for volume in array_mut(spec, "volumes") {
        if let Some(v) = volume.pointer_mut("/configMap/name") {
            fix_name(v, renames, "ConfigMap", namespace);
        }
        if let Some(v) = volume.pointer_mut("/secret/secretName") {
            fix_name(v, renames, "Secret", namespace);
        }
        if let Some(v) = volume.pointer_mut("/persistentVolumeClaim/claimName") {
            fix_name(v, renames, "PersistentVolumeClaim", namespace);
        }
        if let Some(projected) = volume.get_mut("projected") {
            for source in array_mut(projected, "sources") {
                if let Some(v) = source.pointer_mut("/configMap/name") {
                    fix_name(v, renames, "ConfigMap", namespace);
                }
                if let Some(v) = source.pointer_mut("/secret/name") {
                    fix_name(v, renames, "Secret", namespace);
                }
            }
        }
    }
    for list in ["containers", "initContainers", "ephemeralContainers"] {
        for container in array_mut(spec, list) {
            for env in array_mut(container, "env") {
                if let Some(v) = env.pointer_mut("/valueFrom/configMapKeyRef/name") {
                    fix_name(v, renames, "ConfigMap", namespace);
                }
                if let Some(v) = env.pointer_mut("/valueFrom/secretKeyRef/name") {
                    fix_name(v, renames, "Secret", namespace);
                }
            }
            for from in array_mut(container, "envFrom") {
                if let Some(v) = from.pointer_mut("/configMapRef/name") {
                    fix_name(v, renames, "ConfigMap", namespace);
                }
                if let Some(v) = from.pointer_mut("/secretRef/name") {
                    fix_name(v, renames, "Secret", namespace);
                }
            }
        }
    }
}

/// kustomize's `legacy` output order: by kind rank, then by `group_version_kind`, then namespace and name.
fn sort_legacy(objects: &mut [Value]) {
    fn rank(kind: &str) -> i64 {
        if let Some(i) = ORDER_FIRST.iter().position(|k| *k == kind) {
            i as i64 - ORDER_FIRST.len() as i64
        } else if let Some(i) = ORDER_LAST.iter().position(|k| *k == kind) {
            1 + i as i64
        } else {
            0
        }
    }
    fn gvk(object: &Value) -> String {
        let api_version = object["apiVersion"].as_str().unwrap_or_default();
        let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
        let or = |s: &str, placeholder: &str| {
            if s.is_empty() {
                placeholder.to_owned()
            } else {
                s.to_owned()
            }
        };
        let kind = object["kind"].as_str().unwrap_or_default();
        format!(
            "{}_{}_{}",
            or(group, "~G"),
            or(version, "~V"),
            or(kind, "~K")
        )
    }
    objects.sort_by_cached_key(|o| {
        let id = Id::of(o);
        (rank(&id.kind), gvk(o), id.namespace, id.name)
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn render(files: &[(&str, &str)], dir: &str) -> Result<Vec<Value>, Error> {
        let files: BTreeMap<String, String> = files
            .iter()
            .map(|(p, t)| ((*p).to_owned(), (*t).to_owned()))
            .collect();
        let read = move |p: &str| files.get(p).cloned();
        Renderer::new(&read).build(dir)
    }

    #[test]
    fn images_split_into_name_tag_and_digest() {
        assert_eq!(split_image("controller"), ("controller", None, None));
        assert_eq!(
            split_image("controller:latest"),
            ("controller", Some("latest"), None)
        );
        assert_eq!(
            split_image("reg:5000/team/op:v1@sha256:ab"),
            ("reg:5000/team/op", Some("v1"), Some("sha256:ab"))
        );
        assert_eq!(split_image("reg:5000/op"), ("reg:5000/op", None, None));
    }

    #[test]
    fn paths_resolve_dot_dot_but_not_above_the_root() {
        assert_eq!(
            normalize("config/default/../crd").as_deref(),
            Some("config/crd")
        );
        assert_eq!(normalize("../x"), None);
    }

    const BASE: &str = "
apiVersion: v1
kind: ServiceAccount
metadata: {name: sa, namespace: system}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: rb, namespace: system}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: role}
subjects:
- {kind: ServiceAccount, name: sa, namespace: system}
- {kind: ServiceAccount, name: default}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: role, namespace: system}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: d, namespace: system}
spec:
  template:
    spec:
      serviceAccountName: sa
      containers:
      - {name: m, image: controller:latest, envFrom: [{configMapRef: {name: cm}}]}
---
apiVersion: v1
kind: Namespace
metadata: {name: system}
---
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: things.example.com}
";

    #[test]
    fn namespace_prefix_images_and_references_follow_kustomize() {
        let objects = render(
            &[
                (
                    "top/kustomization.yaml",
                    "namespace: ns\nnamePrefix: p-\nresources: [../base]\n",
                ),
                (
                    "base/kustomization.yaml",
                    "resources: [all.yaml]\nimages: [{name: controller, newName: reg/op, newTag: v2}]\n",
                ),
                ("base/all.yaml", BASE),
            ],
            "top",
        )
        .unwrap();
        let kinds: Vec<&str> = objects
            .iter()
            .map(|o| o["kind"].as_str().unwrap())
            .collect();
        assert_eq!(
            kinds,
            [
                "Namespace",
                "CustomResourceDefinition",
                "ServiceAccount",
                "Role",
                "RoleBinding",
                "Deployment"
            ]
        );
        assert_eq!(objects[0]["metadata"], json!({"name": "ns"}));
        assert_eq!(
            objects[1]["metadata"],
            json!({"name": "things.example.com"})
        );
        let binding = &objects[4];
        assert_eq!(binding["metadata"]["name"], "p-rb");
        assert_eq!(binding["roleRef"]["name"], "p-role");
        assert_eq!(
            binding["subjects"],
            json!([{"kind": "ServiceAccount", "name": "p-sa", "namespace": "ns"},
                   {"kind": "ServiceAccount", "name": "default", "namespace": "ns"}])
        );
        let pod = &objects[5]["spec"]["template"]["spec"];
        assert_eq!(pod["serviceAccountName"], "p-sa");
        assert_eq!(pod["containers"][0]["image"], "reg/op:v2");
        // The ConfigMap is not part of the build, so the reference stays as written.
        assert_eq!(
            pod["containers"][0]["envFrom"][0]["configMapRef"]["name"],
            "cm"
        );
    }

    #[test]
    fn set_image_replaces_the_declared_entry_and_bare_names() {
        let files: BTreeMap<String, String> = [
            (
                "k/kustomization.yaml",
                "resources: [d.yaml]\nimages: [{name: controller, newName: other, newTag: x}]\n",
            ),
            (
                "k/d.yaml",
                "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  containers: [{name: a, image: controller}]\n  initContainers: [{name: b, image: helper:1}]\n",
            ),
        ]
        .into_iter()
        .map(|(p, t)| (p.to_owned(), t.to_owned()))
        .collect();
        let read = move |p: &str| files.get(p).cloned();
        let objects = Renderer::new(&read)
            .set_image("controller", "reg/op@sha256:1")
            .set_image("helper", "reg/helper:2")
            .build("k")
            .unwrap();
        assert_eq!(
            objects[0]["spec"]["containers"][0]["image"],
            "reg/op@sha256:1"
        );
        assert_eq!(
            objects[0]["spec"]["initContainers"][0]["image"],
            "reg/helper:2"
        );
    }

    #[test]
    fn unsupported_fields_and_conflicts_are_errors() {
        let err = render(
            &[(
                "k/kustomization.yaml",
                "resources: []\npatches: [{path: p.yaml}]\n",
            )],
            "k",
        )
        .unwrap_err();
        assert_eq!(err.path, "k/kustomization.yaml");
        assert!(err.message.contains("patches"), "{}", err.message);

        let err = render(
            &[
                (
                    "k/kustomization.yaml",
                    "namespace: one\nresources: [a.yaml]\n",
                ),
                (
                    "k/a.yaml",
                    "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c, namespace: x}\n---\n\
                     apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c, namespace: y}\n",
                ),
            ],
            "k",
        )
        .unwrap_err();
        assert!(err.message.contains("two objects"), "{}", err.message);

        let err = render(
            &[("k/kustomization.yaml", "resources: [missing.yaml]\n")],
            "k",
        )
        .unwrap_err();
        assert!(err.message.contains("missing.yaml"), "{}", err.message);
    }
}
