//! The OLM bundle: the committed `bundle/` and `bundle.Dockerfile` are what `cargo xtask bundle` writes,
//! and they follow the rules OLM (and `operator-sdk bundle validate`) checks that can be checked offline.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use common::{STALE, XTASK, normalize, read, repo, yaml_docs};
use memcached_operator::api::Memcached;
use memcached_operator::manifests;
use serde_json::{Value, json};
use xtask::bundle::{self, Options};
use xtask::install::{self, default_operator_image};

fn bundle_file(path: &str) -> String {
    read(&format!("{}/{path}", bundle::BUNDLE_DIR))
}

fn csv() -> Value {
    yaml_docs(&bundle_file(bundle::CSV_PATH)).remove(0)
}

fn files_under(dir: &Path) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for sub in ["manifests", "metadata"] {
        for entry in std::fs::read_dir(dir.join(sub)).unwrap() {
            let name = entry.unwrap().file_name().to_string_lossy().into_owned();
            out.insert(format!("{sub}/{name}"));
        }
    }
    out
}

#[test]
fn committed_bundle_matches_xtask() {
    let rendered = bundle::render(&Options::default(), bundle::BUNDLE_DIR).unwrap();
    for (path, content) in &rendered.files {
        assert!(
            bundle_file(path) == *content,
            "{}/{path} {STALE}",
            bundle::BUNDLE_DIR
        );
    }
    assert!(
        read(bundle::DOCKERFILE) == rendered.dockerfile,
        "{} {STALE}",
        bundle::DOCKERFILE
    );
    let expected: BTreeSet<String> = rendered.files.iter().map(|(p, _)| p.clone()).collect();
    assert_eq!(
        files_under(&repo(bundle::BUNDLE_DIR)),
        expected,
        "bundle/ holds files the generator does not write: run `make manifests`"
    );
}

#[test]
fn bundle_command_writes_the_committed_bundle_and_drops_stale_files() {
    let tmp = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("bundle-command-{}", std::process::id()));
    let dir = tmp.join("bundle");
    std::fs::create_dir_all(dir.join("manifests")).unwrap();
    std::fs::write(dir.join("manifests/old_v1_service.yaml"), "stale").unwrap();

    let out = Command::new(XTASK)
        .args(["bundle", "--output-dir"])
        .arg(&dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        files_under(&dir),
        files_under(&repo(bundle::BUNDLE_DIR)),
        "stale files must go"
    );
    for file in files_under(&dir) {
        assert!(
            std::fs::read_to_string(dir.join(&file)).unwrap() == bundle_file(&file),
            "{}/{file} {STALE}",
            bundle::BUNDLE_DIR
        );
    }
    assert!(
        std::fs::read_to_string(tmp.join(bundle::DOCKERFILE)).unwrap() == read(bundle::DOCKERFILE),
        "{} {STALE}",
        bundle::DOCKERFILE
    );
    std::fs::remove_dir_all(&tmp).unwrap();
}

#[test]
fn csv_has_the_fields_olm_requires() {
    let csv = csv();
    let annotations = annotations();
    let package = &annotations["operators.operatorframework.io.bundle.package.v1"];
    assert_eq!(csv["apiVersion"], "operators.coreos.com/v1alpha1");
    assert_eq!(csv["kind"], "ClusterServiceVersion");
    let version = csv["spec"]["version"].as_str().unwrap();
    assert_eq!(version, env!("CARGO_PKG_VERSION"));
    bundle::parse_version(version).unwrap();
    assert_eq!(csv["metadata"]["name"], format!("{package}.v{version}"));

    let spec = &csv["spec"];
    for field in ["displayName", "description", "maturity"] {
        assert!(
            spec[field].as_str().is_some_and(|s| !s.is_empty()),
            "spec.{field}"
        );
    }
    let min_kube = spec["minKubeVersion"].as_str().unwrap();
    bundle::parse_version(min_kube).unwrap();
    assert_eq!(min_kube, "1.24.0");
    assert!(spec["provider"]["name"].is_string());
    for maintainer in spec["maintainers"].as_array().unwrap() {
        assert!(maintainer["name"].is_string());
        assert!(maintainer["email"].as_str().unwrap().contains('@'));
    }
    for link in spec["links"].as_array().unwrap() {
        assert!(link["name"].is_string());
        assert!(link["url"].as_str().unwrap().starts_with("https://"));
    }
    assert!(!spec["keywords"].as_array().unwrap().is_empty());
    let capabilities = csv["metadata"]["annotations"]["capabilities"]
        .as_str()
        .unwrap();
    assert!(
        [
            "Basic Install",
            "Seamless Upgrades",
            "Full Lifecycle",
            "Deep Insights",
            "Auto Pilot"
        ]
        .contains(&capabilities)
    );
    assert_eq!(
        csv["metadata"]["annotations"]["containerImage"],
        default_operator_image().as_str()
    );

    let icon = &spec["icon"][0];
    assert!(
        ["image/svg+xml", "image/png", "image/jpeg", "image/gif"]
            .contains(&icon["mediatype"].as_str().unwrap())
    );
    let svg = decode_base64(icon["base64data"].as_str().unwrap());
    assert!(String::from_utf8(svg).unwrap().starts_with("<svg"));

    let modes: BTreeMap<&str, bool> = spec["installModes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["type"].as_str().unwrap(),
                m["supported"].as_bool().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        modes,
        BTreeMap::from([
            ("AllNamespaces", true),
            ("MultiNamespace", false),
            ("OwnNamespace", true),
            ("SingleNamespace", true),
        ]),
        "all four install modes, each once; the operator watches all namespaces or exactly one"
    );
}

#[test]
fn csv_install_strategy_deploys_the_install_deployment() {
    let csv = csv();
    let install = &csv["spec"]["install"];
    assert_eq!(install["strategy"], "deployment");
    let deployments = install["spec"]["deployments"].as_array().unwrap();
    assert_eq!(deployments.len(), 1);
    let objects = install::install(&default_operator_image()).unwrap();
    let deployment = install::operator_deployment(&objects).unwrap();
    assert_eq!(deployments[0]["name"], deployment["metadata"]["name"]);
    // The proxy pods run the operator's image: OLM's operator is told which one it runs.
    assert_eq!(
        install::manager_env(&deployments[0], "OPERATOR_IMAGE"),
        Some(default_operator_image().as_str())
    );
    let spec = &deployments[0]["spec"];
    let labels = &spec["template"]["metadata"]["labels"];
    for (key, value) in spec["selector"]["matchLabels"].as_object().unwrap() {
        assert_eq!(
            &labels[key], value,
            "the selector must match the pod labels"
        );
    }

    // The same Deployment as the one-file install, plus WATCH_NAMESPACE from OLM's target namespaces.
    let mut expected = deployment["spec"].clone();
    let index = install::manager_container_index(deployment).unwrap();
    expected["template"]["spec"]["containers"][index]["env"]
        .as_array_mut()
        .unwrap()
        .push(
            json!({"name": "WATCH_NAMESPACE", "valueFrom": {"fieldRef": {
            "fieldPath": "metadata.annotations['olm.targetNamespaces']"}}}),
        );
    assert!(
        normalize(spec) == normalize(&expected),
        "the CSV's Deployment is not the install's (plus WATCH_NAMESPACE): run `make manifests`"
    );
    let mut cli = <memcached_operator::cli::Cli as clap::CommandFactory>::command();
    let run = cli.find_subcommand_mut("run").unwrap();
    assert!(
        run.get_arguments()
            .any(|a| a.get_env().is_some_and(|env| env == "WATCH_NAMESPACE")),
        "the operator must read WATCH_NAMESPACE"
    );

    // Every rule of the operator is about namespaced resources: all in `permissions`, which OLM makes
    // Roles in the target namespace for OwnNamespace/SingleNamespace installs (ClusterRoles only for
    // AllNamespaces); none in `clusterPermissions`.
    let account = spec["template"]["spec"]["serviceAccountName"].clone();
    let entries = install["spec"]["permissions"].as_array().unwrap();
    assert_eq!(entries.len(), 1, "{entries:?}");
    assert_eq!(entries[0]["serviceAccountName"], account);
    let mut expected = serde_json::to_value(manifests::manager_role()).unwrap()["rules"]
        .as_array()
        .unwrap()
        .clone();
    expected.extend(
        serde_json::to_value(manifests::leader_election_role()).unwrap()["rules"]
            .as_array()
            .unwrap()
            .clone(),
    );
    let mut got = entries[0]["rules"].as_array().unwrap().clone();
    let key = |v: &Value| v.to_string();
    got.sort_by_key(key);
    expected.sort_by_key(key);
    assert_eq!(
        got, expected,
        "permissions must be config/rbac's manager-role and leader-election-role"
    );
    assert_eq!(
        install["spec"]["clusterPermissions"],
        json!([{
            "serviceAccountName": account,
            "rules": serde_json::to_value(manifests::metrics_auth_role()).unwrap()["rules"],
        }]),
        "only metrics-auth-role's reviews (cluster-scoped) need a ClusterRole"
    );
}

#[test]
fn owned_crds_match_the_bundled_crds() {
    let csv = csv();
    let owned = csv["spec"]["customresourcedefinitions"]["owned"]
        .as_array()
        .unwrap();
    let crd = serde_json::to_value(manifests::crd()).unwrap();
    let bundled = yaml_docs(&bundle_file("manifests/cache.example.com_memcacheds.yaml")).remove(0);
    assert!(
        normalize(&bundled) == normalize(&crd),
        "the bundled CRD is not the generated one: run `make manifests`"
    );
    // Every CRD file of the bundle is owned, and every owned entry names a served version of a bundled CRD.
    let crd_files: Vec<String> = files_under(&repo(bundle::BUNDLE_DIR))
        .into_iter()
        .filter(|f| {
            yaml_docs(&bundle_file(f))
                .first()
                .is_some_and(|d| d["kind"] == "CustomResourceDefinition")
        })
        .collect();
    assert_eq!(crd_files.len(), 1, "{crd_files:?}");

    let versions: Vec<&Value> = crd["spec"]["versions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|v| v["served"] == true)
        .collect();
    assert_eq!(owned.len(), versions.len());
    for (entry, version) in owned.iter().zip(versions) {
        assert_eq!(entry["name"], crd["metadata"]["name"]);
        assert_eq!(entry["version"], version["name"]);
        assert_eq!(entry["kind"], crd["spec"]["names"]["kind"]);
        assert!(entry["displayName"].is_string() && entry["description"].is_string());

        let root = &version["schema"]["openAPIV3Schema"]["properties"];
        for (side, key) in [("spec", "specDescriptors"), ("status", "statusDescriptors")] {
            let descriptors = entry[key].as_array().unwrap();
            let paths: Vec<&str> = descriptors
                .iter()
                .map(|d| d["path"].as_str().unwrap())
                .collect();
            for path in &paths {
                assert!(
                    resolve(&root[side], path).is_some(),
                    "{key}: {side}.{path} is not in the CRD schema"
                );
            }
            for d in descriptors {
                assert!(d["displayName"].is_string(), "{d}");
            }
            // Every top-level field is described.
            for field in root[side]["properties"].as_object().unwrap().keys() {
                assert!(
                    paths
                        .iter()
                        .any(|p| p == field || p.starts_with(&format!("{field}."))),
                    "{key} lacks {side}.{field}"
                );
            }
        }
    }
    let descriptor = |key: &str, path: &str| {
        owned[0][key]
            .as_array()
            .unwrap()
            .iter()
            .find(|d| d["path"] == path)
            .unwrap_or_else(|| panic!("{key} has no {path}"))["x-descriptors"]
            .clone()
    };
    assert_eq!(
        descriptor("specDescriptors", "size"),
        json!(["urn:alm:descriptor:com.tectonic.ui:podCount"])
    );
    assert_eq!(
        descriptor("statusDescriptors", "conditions"),
        json!(["urn:alm:descriptor:io.kubernetes.conditions"])
    );
}

/// The schema of `path` (dots between field names) under `schema`.
fn resolve<'a>(schema: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('.')
        .try_fold(schema, |node, field| node["properties"].get(field))
}

#[test]
fn alm_examples_are_the_samples_and_valid_memcacheds() {
    let csv = csv();
    let examples: Vec<Value> = serde_json::from_str(
        csv["metadata"]["annotations"]["alm-examples"]
            .as_str()
            .unwrap(),
    )
    .expect("alm-examples must be a JSON array");
    assert!(
        examples == install::samples().unwrap(),
        "alm-examples are not config/samples: run `make manifests`"
    );
    assert_eq!(
        examples[0]["metadata"]["name"], "memcached-sample",
        "the tutorial's sample comes first: the console pre-fills its form with it"
    );
    let owned = &csv["spec"]["customresourcedefinitions"]["owned"];
    let crd = serde_json::to_value(manifests::crd()).unwrap();
    let group = crd["spec"]["group"].as_str().unwrap();
    for example in &examples {
        let matches_owned = owned.as_array().unwrap().iter().any(|o| {
            example["kind"] == o["kind"]
                && example["apiVersion"] == format!("{group}/{}", o["version"].as_str().unwrap())
        });
        assert!(
            matches_owned,
            "{} is not an owned kind",
            example["apiVersion"]
        );
        let version = example["apiVersion"]
            .as_str()
            .unwrap()
            .rsplit('/')
            .next()
            .unwrap();
        let schema = crd["spec"]["versions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == version)
            .unwrap()["schema"]["openAPIV3Schema"]
            .clone();
        for part in ["spec", "status"] {
            if let Some(value) = example.get(part) {
                validate(value, &schema["properties"][part], part)
                    .unwrap_or_else(|e| panic!("{}: {e}", example["metadata"]["name"]));
            }
        }
        let _: Memcached = serde_json::from_value(example.clone())
            .unwrap_or_else(|e| panic!("{}: {e}", example["metadata"]["name"]));
    }
}

/// The OpenAPI checks the API server applies to a custom object, for the keywords structural schemas use:
/// unknown fields, types, required fields, bounds, lengths, enums, list sizes.
fn validate(value: &Value, schema: &Value, path: &str) -> Result<(), String> {
    if value.is_null() && schema["nullable"] == true {
        return Ok(());
    }
    if schema["x-kubernetes-int-or-string"] == true {
        return if value.is_i64() || value.is_u64() || value.is_string() {
            Ok(())
        } else {
            Err(format!("{path}: must be an integer or a string"))
        };
    }
    if let Some(values) = schema["enum"].as_array()
        && !values.contains(value)
    {
        return Err(format!("{path}: must be one of {values:?}"));
    }
    let bound = |key: &str| schema[key].as_f64();
    match schema["type"].as_str().unwrap_or_default() {
        "object" => {
            let object = value
                .as_object()
                .ok_or(format!("{path}: must be an object"))?;
            for (key, child) in object {
                let child_path = format!("{path}.{key}");
                if let Some(child_schema) = schema["properties"].get(key) {
                    validate(child, child_schema, &child_path)?;
                } else if schema["additionalProperties"].is_object() {
                    validate(child, &schema["additionalProperties"], &child_path)?;
                } else if schema["x-kubernetes-preserve-unknown-fields"] != true {
                    return Err(format!("{child_path}: unknown field"));
                }
            }
            for required in schema["required"].as_array().into_iter().flatten() {
                if !object.contains_key(required.as_str().unwrap()) {
                    return Err(format!("{path}.{}: required", required.as_str().unwrap()));
                }
            }
        }
        "array" => {
            let items = value.as_array().ok_or(format!("{path}: must be a list"))?;
            if bound("minItems").is_some_and(|m| (items.len() as f64) < m)
                || bound("maxItems").is_some_and(|m| (items.len() as f64) > m)
            {
                return Err(format!("{path}: wrong number of items"));
            }
            for (i, item) in items.iter().enumerate() {
                validate(item, &schema["items"], &format!("{path}[{i}]"))?;
            }
        }
        "integer" | "number" => {
            let is_integer = value.is_i64() || value.is_u64();
            if schema["type"] == "integer" && !is_integer {
                return Err(format!("{path}: must be an integer"));
            }
            let n = value.as_f64().ok_or(format!("{path}: must be a number"))?;
            if bound("minimum").is_some_and(|m| n < m) || bound("maximum").is_some_and(|m| n > m) {
                return Err(format!("{path}: out of range"));
            }
        }
        "string" => {
            let s = value.as_str().ok_or(format!("{path}: must be a string"))?;
            let len = s.chars().count() as f64;
            if bound("minLength").is_some_and(|m| len < m)
                || bound("maxLength").is_some_and(|m| len > m)
            {
                return Err(format!("{path}: wrong length"));
            }
        }
        "boolean" => {
            value
                .as_bool()
                .ok_or(format!("{path}: must be true or false"))?;
        }
        _ => {}
    }
    Ok(())
}

#[test]
fn the_validator_rejects_what_the_api_server_rejects() {
    let crd = serde_json::to_value(manifests::crd()).unwrap();
    let spec = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"];
    assert!(validate(&json!({"size": 3}), spec, "spec").is_ok());
    for bad in [
        json!({"size": 65}),
        json!({"size": "3"}),
        json!({"sise": 3}),
    ] {
        assert!(validate(&bad, spec, "spec").is_err(), "{bad}");
    }
}

fn annotations() -> BTreeMap<String, String> {
    let doc = yaml_docs(&bundle_file(bundle::ANNOTATIONS_PATH)).remove(0);
    doc["annotations"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_owned()))
        .collect()
}

#[test]
fn annotations_and_bundle_dockerfile_agree() {
    let annotations = annotations();
    let key = |k: &str| annotations[&format!("operators.operatorframework.io.bundle.{k}")].as_str();
    assert_eq!(key("mediatype.v1"), "registry+v1");
    assert_eq!(key("manifests.v1"), "manifests/");
    assert_eq!(key("metadata.v1"), "metadata/");
    assert_eq!(key("package.v1"), bundle::PACKAGE);
    let channels: Vec<&str> = key("channels.v1").split(',').collect();
    assert!(
        channels.contains(&key("channel.default.v1")),
        "the default channel must be one of the channels"
    );

    let dockerfile = read(bundle::DOCKERFILE);
    let labels: BTreeMap<String, String> = dockerfile
        .lines()
        .filter_map(|l| l.strip_prefix("LABEL "))
        .map(|l| {
            let (k, v) = l.split_once('=').unwrap();
            (k.to_owned(), v.to_owned())
        })
        .collect();
    assert_eq!(
        labels, annotations,
        "bundle.Dockerfile LABELs must equal metadata/annotations.yaml"
    );
    assert!(dockerfile.lines().any(|l| l == "FROM scratch"));
    assert!(dockerfile.contains("COPY bundle/manifests /manifests/"));
    assert!(dockerfile.contains("COPY bundle/metadata /metadata/"));
}

#[test]
fn bundle_ships_only_objects_olm_installs_as_they_are() {
    for file in files_under(&repo(bundle::BUNDLE_DIR)) {
        if !file.starts_with("manifests/") {
            continue;
        }
        for doc in yaml_docs(&bundle_file(&file)) {
            let kind = doc["kind"].as_str().unwrap();
            assert!(
                [
                    "ClusterServiceVersion",
                    "CustomResourceDefinition",
                    "Service"
                ]
                .contains(&kind),
                "{file}: {kind} does not belong in the bundle"
            );
            assert!(
                doc["metadata"].get("namespace").is_none() || kind == "ClusterServiceVersion",
                "{file}: OLM chooses the namespace"
            );
        }
    }
}

fn decode_base64(text: &str) -> Vec<u8> {
    const ALPHABET: &str = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    assert_eq!(text.len() % 4, 0, "base64 comes in groups of four");
    let mut out = Vec::new();
    for group in text.as_bytes().chunks(4) {
        let mut n = 0u32;
        let mut pad = 0;
        for &c in group {
            n <<= 6;
            if c == b'=' {
                pad += 1;
            } else {
                n |= ALPHABET.find(c as char).expect("base64 alphabet") as u32;
            }
        }
        let bytes = [(n >> 16) as u8, (n >> 8) as u8, n as u8];
        out.extend_from_slice(&bytes[..3 - pad]);
    }
    out
}
