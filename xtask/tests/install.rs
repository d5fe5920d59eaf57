//! The one-file install: the committed `dist/install.yaml` is what `cargo xtask install` prints, which is
//! `kubectl kustomize config/default` with the operator image set, and it runs a production-ready operator.

mod common;

use std::collections::BTreeSet;
use std::process::Command;

use common::{STALE, XTASK, id, normalize, read, repo, xtask, yaml_docs};
use serde_json::Value;
use xtask::install::{self, default_operator_image};

#[test]
fn committed_install_matches_xtask() {
    assert!(
        read(install::INSTALL_PATH) == install::install_yaml(&default_operator_image()).unwrap(),
        "{} {STALE}",
        install::INSTALL_PATH
    );
    assert!(
        xtask(&["install"]) == read(install::INSTALL_PATH),
        "`cargo xtask install` must print {} (the default image is {})",
        install::INSTALL_PATH,
        default_operator_image()
    );
}

/// The guarantee that `kubectl apply -f dist/install.yaml` and `kubectl apply -k config/default` install the
/// same thing: `cargo xtask install` adds nothing to kustomize's rendering but its header and the image,
/// object for object and in the same order (and it renders the committed CRD and roles as generated).
#[test]
fn install_is_what_kustomize_renders() {
    let out = Command::new(xtask::kubectl::kubectl())
        .args(["kustomize", "config/default"])
        .current_dir(repo(""))
        .output()
        .expect("kubectl must be installed to compare with `kubectl kustomize`");
    assert!(
        out.status.success(),
        "kubectl kustomize config/default failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let kustomize: Vec<Value> = yaml_docs(&String::from_utf8(out.stdout).unwrap())
        .iter()
        .map(normalize)
        .collect();
    // config/manager/kustomization.yaml makes the operator image controller:latest.
    let ours: Vec<Value> = yaml_docs(&xtask(&["install", "--image", "controller:latest"]))
        .iter()
        .map(normalize)
        .collect();
    let ids = |docs: &[Value]| docs.iter().map(id).collect::<Vec<_>>();
    assert_eq!(
        ids(&ours),
        ids(&kustomize),
        "`cargo xtask install` and `kubectl kustomize config/default` render different objects (or orders)"
    );
    for (mine, theirs) in ours.iter().zip(&kustomize) {
        assert!(
            mine == theirs,
            "{} differs from kustomize's rendering:\n{}\n--- kustomize:\n{}",
            id(mine),
            serde_json::to_string_pretty(mine).unwrap(),
            serde_json::to_string_pretty(theirs).unwrap()
        );
    }
}

#[test]
fn image_flag_changes_only_the_operator_image() {
    let default = install::install(&default_operator_image()).unwrap();
    let other = install::install("registry.test/op@sha256:feed").unwrap();
    let mut changed = Vec::new();
    for (a, b) in default.iter().zip(&other) {
        if a != b {
            changed.push(id(a));
        }
    }
    assert_eq!(
        changed,
        ["Deployment memcached-operator-system/memcached-operator-controller-manager"]
    );
    let deployment = install::operator_deployment(&other).unwrap();
    assert_eq!(
        install::manager_container(deployment).unwrap()["image"],
        "registry.test/op@sha256:feed"
    );
    assert_eq!(
        install::manager_env(deployment, "OPERATOR_IMAGE"),
        Some("registry.test/op@sha256:feed"),
        "the proxy pods run the operator's image: the operator must be told which one it is"
    );
    let out = Command::new(XTASK)
        .args(["install", "--image", ""])
        .output()
        .unwrap();
    assert!(!out.status.success(), "an empty image must be refused");
}

/// What the install adds to `config/default`'s checks in tests/manifests.rs (security contexts, probes,
/// environment, RBAC), which hold for the install too since it is kustomize's rendering (see above).
#[test]
fn install_runs_a_production_ready_operator() {
    let objects = yaml_docs(&read(install::INSTALL_PATH));
    let namespace = &objects[0];
    assert_eq!(namespace["kind"], "Namespace");
    assert_eq!(
        namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"],
        "restricted"
    );
    let kinds: BTreeSet<&str> = objects
        .iter()
        .map(|o| o["kind"].as_str().unwrap())
        .collect();
    for kind in [
        "Namespace",
        "CustomResourceDefinition",
        "ServiceAccount",
        "Role",
        "ClusterRole",
        "RoleBinding",
        "ClusterRoleBinding",
        "Service",
        "Deployment",
    ] {
        assert!(kinds.contains(kind), "the install lacks a {kind}");
    }

    let deployment = install::operator_deployment(&objects).unwrap();
    assert_eq!(
        deployment["spec"]["replicas"], 1,
        "one replica by default; scaling to 2 is safe with leader election"
    );
    let manager = install::manager_container(deployment).unwrap();
    assert_eq!(manager["image"], default_operator_image());
    assert_eq!(
        install::manager_env(deployment, "OPERATOR_IMAGE"),
        Some(default_operator_image().as_str())
    );
    let args: Vec<&str> = manager["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert!(args.contains(&"--log-format=json"), "{args:?}");
    for kind in ["requests", "limits"] {
        for resource in ["cpu", "memory"] {
            assert!(
                manager["resources"][kind][resource].is_string(),
                "{kind}.{resource}"
            );
        }
    }
}

#[test]
fn makefile_defaults_agree_with_xtask() {
    let makefile = read("Makefile");
    assert!(
        makefile.contains(&format!("IMAGE_TAG_BASE ?= {}", install::IMAGE_REPOSITORY)),
        "the Makefile's IMAGE_TAG_BASE must be {}",
        install::IMAGE_REPOSITORY
    );
    assert!(makefile.contains("IMG ?= $(IMAGE_TAG_BASE):v$(VERSION)"));
    for target in [
        "manifests:",
        "docs:",
        "build-installer:",
        "bundle:",
        "bundle-build:",
        "bundle-push:",
    ] {
        assert!(
            makefile.lines().any(|l| l.starts_with(target)),
            "make {target} is missing"
        );
    }
}

/// The drift check CI runs: every committed generated file is what `cargo xtask manifests` writes.
#[test]
fn check_passes_on_the_committed_tree() {
    let stale = xtask::generate::stale(&repo("")).unwrap();
    assert!(stale.is_empty(), "{stale:?} {STALE}");
    let out = Command::new(XTASK).arg("check").output().unwrap();
    assert!(
        out.status.success(),
        "cargo xtask check failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
