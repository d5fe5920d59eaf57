//! Steps 4 and 6 to 8 and 11, on the tutorial's sample `memcached-sample`: its children (the server list
//! with its first ready server), no finalizer, status and events; scaling through the scale subresource;
//! drift of the Deployment reverted; deleted children recreated; deletion by garbage collection.

use serde_json::{Value, json};

use crate::checks::{
    check_deployment, check_ready_status, check_service, condition_status, expect_eq,
    memcached_container, push_err, result,
};
use crate::env::{E2e, OpInfo};
use crate::events::{list_events, summarize_events};
use crate::http::{api_answers_by_protocol, metrics_with_operator_families};
use crate::kubectl::{
    apply_yaml_ok, compact, get_opt, get_required, gone, kubectl_json, kubectl_ok, secs, str_at,
    try_kubectl_json, uid_of,
};
use crate::names::{API_VERSION, MC, PORT, SAMPLE};

/// The finalizer earlier builds put on every instance: this one must never add it.
pub const LEGACY_FINALIZER: &str = "cache.example.com/finalizer";

/// Image written into the Deployment by hand in the drift step; never pulled successfully, which is fine.
pub const DRIFT_IMAGE: &str = "registry.invalid/e2e-drift/memcached:0.0.0";

pub fn step_sample(env: &E2e, op: &OpInfo) {
    let ns = env.ns.as_str();
    // The Kubebuilder/Operator SDK tutorial's config/samples/cache_v1alpha1_memcached.yaml, plus a namespace.
    let sample = format!(
        "apiVersion: cache.example.com/v1alpha1
kind: Memcached
metadata:
  labels:
    app.kubernetes.io/name: memcached-operator
    app.kubernetes.io/managed-by: kustomize
  name: {SAMPLE}
  namespace: {ns}
spec:
  size: 1
  containerPort: 11211
"
    );
    apply_yaml_ok(&sample);
    let mc = kubectl_json(&["get", MC, SAMPLE, "-n", ns, "-o", "json"]);
    let uid = str_at(&mc, "/metadata/uid").to_owned();

    env.wait(
        &format!("Deployment {SAMPLE} to match the expected shape with 1 replica"),
        secs(60),
        || {
            let dep = get_required("deployments.apps", ns, SAMPLE)?;
            check_deployment(&dep, SAMPLE, &uid, 1, PORT)
        },
    );
    env.wait(
        &format!("Service {SAMPLE} to match the expected shape"),
        secs(60),
        || {
            let svc = get_required("services", ns, SAMPLE)?;
            check_service(&svc, SAMPLE, &uid, PORT)
        },
    );

    // The server list is created with the first ready server, never empty: whenever it is first seen, it
    // lists one. (Whether it is seen before the status says Available depends on the timing, not checked.)
    let servers = format!("{SAMPLE}-servers");
    let list = env.wait(
        &format!("ConfigMap {servers} to exist, listing the first ready server"),
        secs(180),
        || {
            let cm = get_required("configmaps", ns, &servers)?;
            let lines = cm["data"]["servers"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            if lines.lines().count() == 1 && lines.ends_with(&format!(":{PORT}\n")) {
                Ok(lines)
            } else {
                Err(format!(
                    "created without a server: data {}",
                    compact(&cm["data"])
                ))
            }
        },
    );
    eprintln!("    {servers}: {}", list.trim());

    env.wait(
        &format!("Memcached {SAMPLE} status: 1 ready pod, Available=True, Progressing=False, Degraded=False"),
        secs(180),
        || check_ready_status(ns, SAMPLE, 1),
    );
    // Reconciled (its status is written), and never given a finalizer.
    let mc = get_required(MC, ns, SAMPLE).unwrap_or_else(|e| panic!("{e}"));
    let finalizers = &mc["metadata"]["finalizers"];
    assert!(
        !finalizers
            .as_array()
            .is_some_and(|f| f.iter().any(|x| x == LEGACY_FINALIZER)),
        "Memcached {SAMPLE} carries the finalizer {LEGACY_FINALIZER}: metadata.finalizers = {}",
        compact(finalizers)
    );

    // Printer columns (and the `mc` short name).
    let table = kubectl_ok(&["get", "mc", "-n", ns]);
    let mut lines = table.lines();
    let header: Vec<&str> = lines
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    // The columns are the CRD's printer columns (kubectl upper-cases them), after NAME.
    let expected: Vec<String> = std::iter::once("NAME".to_owned())
        .chain(printer_columns().iter().map(|c| c.to_uppercase()))
        .collect();
    assert_eq!(
        header, expected,
        "`kubectl get mc` header is wrong; full output:\n{table}"
    );
    assert_eq!(
        header.get(1..4),
        Some(&["SIZE", "READY", "AVAILABLE"][..]),
        "the tutorial's columns come first"
    );
    let row: Vec<&str> = lines
        .find(|l| l.split_whitespace().next() == Some(SAMPLE))
        .unwrap_or_else(|| panic!("`kubectl get mc` has no row for {SAMPLE}:\n{table}"))
        .split_whitespace()
        .collect();
    assert_eq!(
        row.get(1..4),
        Some(&["1", "1", "True"][..]),
        "`kubectl get mc` row for {SAMPLE} should show SIZE 1, READY 1, AVAILABLE True:\n{table}"
    );
    eprintln!("    ok: `kubectl get mc` shows {}", header.join(" "));

    env.wait(
        &format!(
            "a Normal event with reason Created regarding Memcached or Deployment {SAMPLE}, naming the \
             Deployment"
        ),
        secs(60),
        || {
            let events = list_events(ns)?;
            // One event for the whole creation: `Created Deployment NAME with 1 replicas, Service NAME, ...`;
            // the server list is not in it (it comes with the first ready server).
            let deployment = format!("Deployment {SAMPLE} ");
            let found = events.iter().any(|e| {
                e.type_ == "Normal"
                    && e.reason == "Created"
                    && (e.kind == "Memcached" || e.kind == "Deployment")
                    && e.name == SAMPLE
                    && e.note.contains(&deployment)
                    && !e.note.contains("ConfigMap")
            });
            if found {
                Ok(())
            } else {
                Err(format!("events in {ns}: {}", summarize_events(&events)))
            }
        },
    );

    env.wait(
        &format!(
            "GET http://127.0.0.1:{}/metrics to contain memcached_operator_ metrics",
            op.metrics_port
        ),
        secs(60),
        || metrics_with_operator_families(op.metrics_port),
    );
    check_api_protocol(env, op);
}

/// Over TLS the operator negotiates HTTP/2 (one connection for every request and watch) where the API
/// server offers it, as kube-apiserver does by default; over plain HTTP, or through a kubeconfig's
/// `proxy-url`, it speaks HTTP/1.1. The protocol seen is printed either way.
/// The names of the CRD's printer columns, in order.
fn printer_columns() -> Vec<String> {
    memcached_operator::manifests::crd()
        .spec
        .versions
        .first()
        .and_then(|v| v.additional_printer_columns.clone())
        .unwrap_or_default()
        .into_iter()
        .map(|c| c.name)
        .collect()
}

fn check_api_protocol(env: &E2e, op: &OpInfo) {
    let view = |path: &str| {
        kubectl_ok(&[
            "config",
            "view",
            "--minify",
            "-o",
            &format!("jsonpath={{.clusters[0].cluster.{path}}}"),
        ])
    };
    let server = view("server");
    let proxy = view("proxy-url");
    let expected = if server.trim().starts_with("https://") && proxy.trim().is_empty() {
        "HTTP/2"
    } else {
        "HTTP/1.1"
    };
    env.wait(
        &format!(
            "the operator's answers from {} to come over {expected} only",
            server.trim()
        ),
        secs(30),
        || {
            let answers = api_answers_by_protocol(op.metrics_port)?;
            eprintln!("    answers from the API server by protocol: {answers:?}");
            let only_expected = answers
                .iter()
                .all(|(protocol, n)| protocol == expected || *n == 0.0);
            let some = answers.iter().any(|(p, n)| p == expected && *n > 0.0);
            if only_expected && some {
                Ok(())
            } else {
                Err(format!(
                    "answers by protocol: {answers:?}; over TLS an API server that offers no HTTP/2 \
                     (a proxy or load balancer in front of it?) is answered over HTTP/1.1"
                ))
            }
        },
    );
}

pub fn step_scale(env: &E2e, op: &OpInfo) {
    let ns = env.ns.as_str();
    let target = format!("{MC}/{SAMPLE}");
    kubectl_ok(&["scale", &target, "--replicas=3", "-n", ns]);

    env.wait("Memcached spec.size to be 3", secs(15), || {
        let mc = get_required(MC, ns, SAMPLE)?;
        expect_eq("spec.size", &mc["spec"]["size"], &json!(3))
    });
    let uid = uid_of(MC, ns, SAMPLE);
    env.wait(
        &format!("Deployment {SAMPLE} to have spec.replicas 3 (and the expected shape)"),
        secs(30),
        || {
            let dep = get_required("deployments.apps", ns, SAMPLE)?;
            check_deployment(&dep, SAMPLE, &uid, 3, PORT)
        },
    );

    let mut saw_progressing = false;
    env.wait(
        &format!("Memcached {SAMPLE} status: 3 ready pods, Available=True"),
        secs(180),
        || {
            if let Ok(Some(mc)) = get_opt(MC, ns, SAMPLE) {
                saw_progressing |= condition_status(&mc, "Progressing") == Some("True");
            }
            check_ready_status(ns, SAMPLE, 3)
        },
    );
    eprintln!(
        "    info: Progressing=True was {}observed while scaling (timing-dependent, not checked)",
        if saw_progressing { "" } else { "not " }
    );

    let path = format!("/apis/{API_VERSION}/namespaces/{ns}/memcacheds/{SAMPLE}/scale");
    env.wait(
        "the scale subresource to report 3 replicas and a selector",
        secs(30),
        || {
            let scale = try_kubectl_json(&["get", "--raw", &path])?;
            let mut problems = Vec::new();
            push_err(
                &mut problems,
                expect_eq("scale spec.replicas", &scale["spec"]["replicas"], &json!(3)),
            );
            push_err(
                &mut problems,
                expect_eq(
                    "scale status.replicas",
                    &scale["status"]["replicas"],
                    &json!(3),
                ),
            );
            if scale["status"]["selector"]
                .as_str()
                .unwrap_or_default()
                .is_empty()
            {
                problems.push("scale status.selector is empty".into());
            }
            result(problems, &scale)
        },
    );

    env.wait(
        &format!(
            "the current leader's metrics (port {}) to contain memcached_operator_ metrics",
            op.metrics_port
        ),
        secs(60),
        || metrics_with_operator_families(op.metrics_port),
    );
}

/// `metadata.generation` of the sample's Deployment; every spec change (ours or the operator's) bumps it.
pub fn deployment_generation(ns: &str) -> i64 {
    let dep = kubectl_json(&["get", "deployments.apps", SAMPLE, "-n", ns, "-o", "json"]);
    dep["metadata"]["generation"]
        .as_i64()
        .unwrap_or_else(|| panic!("Deployment {SAMPLE} has no metadata.generation"))
}

/// The Deployment's `field` must be back at `want`, and its generation must show that both the hand edit
/// and a revert happened (at least two spec changes since `before`).
pub fn reverted(
    ns: &str,
    before: i64,
    what: &str,
    field: impl Fn(&Value) -> Result<Value, String>,
    want: &Value,
) -> Result<(), String> {
    let dep = get_required("deployments.apps", ns, SAMPLE)?;
    expect_eq(what, &field(&dep)?, want)?;
    let generation = dep["metadata"]["generation"].as_i64().unwrap_or_default();
    if generation >= before + 2 {
        Ok(())
    } else {
        Err(format!(
            "{what} is as wanted, but metadata.generation is {generation} (was {before} before the edit), \
             so the edit and a revert did not both happen"
        ))
    }
}

pub fn step_drift(env: &E2e) {
    let ns = env.ns.as_str();
    let before = deployment_generation(ns);
    let target = format!("deployment.apps/{SAMPLE}");
    kubectl_ok(&["scale", &target, "--replicas=1", "-n", ns]);
    env.wait(
        "the operator to restore Deployment spec.replicas to 3",
        secs(30),
        || {
            reverted(
                ns,
                before,
                "Deployment spec.replicas",
                |d| Ok(d["spec"]["replicas"].clone()),
                &json!(3),
            )
        },
    );

    let dep = kubectl_json(&["get", "deployments.apps", SAMPLE, "-n", ns, "-o", "json"]);
    let before = dep["metadata"]["generation"].as_i64().unwrap_or_default();
    let (index, container) =
        memcached_container(&dep).unwrap_or_else(|e| panic!("{e}; Deployment: {}", compact(&dep)));
    let original = container["image"].as_str().unwrap_or_default().to_owned();
    assert!(
        !original.is_empty(),
        "memcached container has no image: {}",
        compact(container)
    );
    assert_ne!(
        original, DRIFT_IMAGE,
        "operator unexpectedly uses the drift image"
    );
    let patch = json!([
        {"op": "test", "path": format!("/spec/template/spec/containers/{index}/name"), "value": "memcached"},
        {"op": "replace", "path": format!("/spec/template/spec/containers/{index}/image"), "value": DRIFT_IMAGE},
    ])
    .to_string();
    kubectl_ok(&[
        "patch",
        "deployments.apps",
        SAMPLE,
        "-n",
        ns,
        "--type=json",
        "-p",
        &patch,
    ]);
    env.wait(
        &format!("the operator to restore the memcached container image to {original:?}"),
        secs(30),
        || {
            reverted(
                ns,
                before,
                "memcached container image",
                |d| memcached_container(d).map(|(_, c)| c["image"].clone()),
                &json!(original),
            )
        },
    );

    env.wait(
        &format!("Memcached {SAMPLE} to settle at 3 ready pods after the drift"),
        secs(180),
        || check_ready_status(ns, SAMPLE, 3),
    );
}

pub fn step_recreate(env: &E2e) {
    let ns = env.ns.as_str();
    let mc_uid = uid_of(MC, ns, SAMPLE);
    for (resource, kind) in [("deployments.apps", "Deployment"), ("services", "Service")] {
        let old_uid = uid_of(resource, ns, SAMPLE);
        kubectl_ok(&[
            "delete",
            resource,
            SAMPLE,
            "-n",
            ns,
            "--wait=true",
            &format!("--timeout={}s", secs(60).as_secs()),
        ]);
        env.wait(
            &format!("a new {kind} {SAMPLE} (uid other than {old_uid}) to be created"),
            secs(30),
            || match get_opt(resource, ns, SAMPLE)? {
                None => Err("not found".into()),
                Some(o) if o["metadata"]["uid"] == old_uid.as_str() => {
                    Err(format!("still the old object (uid {old_uid})"))
                }
                Some(_) => Ok(()),
            },
        );
        env.wait(
            &format!("the recreated {kind} {SAMPLE} to match the expected shape"),
            secs(30),
            || {
                let obj = get_required(resource, ns, SAMPLE)?;
                if kind == "Deployment" {
                    check_deployment(&obj, SAMPLE, &mc_uid, 3, PORT)
                } else {
                    check_service(&obj, SAMPLE, &mc_uid, PORT)
                }
            },
        );
    }
    env.wait(
        &format!("Memcached {SAMPLE} to be back at 3 ready pods"),
        secs(180),
        || check_ready_status(ns, SAMPLE, 3),
    );
}

pub fn step_delete(env: &E2e) {
    let ns = env.ns.as_str();
    let mc_uid = uid_of(MC, ns, SAMPLE);
    let servers = format!("{SAMPLE}-servers");
    let children = [
        ("deployments.apps", "Deployment", SAMPLE),
        ("services", "Service", SAMPLE),
        ("configmaps", "ConfigMap", servers.as_str()),
    ]
    .map(|(resource, kind, name)| (resource, kind, name, uid_of(resource, ns, name)));

    // No finalizer holds it: the API server deletes it at once, whether the operator runs or not.
    kubectl_ok(&["delete", MC, SAMPLE, "-n", ns, "--wait=false"]);
    env.wait(
        &format!("Memcached {SAMPLE} to be gone (no finalizer holds it)"),
        secs(60),
        || gone(MC, ns, SAMPLE),
    );
    for (resource, kind, name, old_uid) in children {
        env.wait(
            &format!("{kind} {name} to be garbage-collected"),
            secs(120),
            || match get_opt(resource, ns, name)? {
                None => Ok(()),
                Some(o) if o["metadata"]["uid"] == old_uid.as_str() => Err(format!(
                    "still exists (uid {old_uid}, deletionTimestamp {})",
                    o["metadata"]["deletionTimestamp"]
                )),
                Some(o) => Err(format!(
                    "a NEW {kind} was created after the Memcached was deleted (uid {}, was {old_uid})",
                    o["metadata"]["uid"]
                )),
            },
        );
    }
    // Nothing of the operator's runs on deletion: no Warning about it, no failure about a finalizer.
    let events = list_events(ns).unwrap_or_else(|e| panic!("cannot list events: {e}"));
    let after: Vec<_> = events
        .iter()
        .filter(|e| {
            e.name == SAMPLE
                && (e.uid.is_empty() || e.uid == mc_uid)
                && (e.reason == "Deleting"
                    || (e.reason == "ReconcileFailed" && e.note.contains("finalizer")))
        })
        .map(|e| format!("{}: {}", e.reason, e.note))
        .collect();
    assert!(
        after.is_empty(),
        "events about the deletion of {SAMPLE}: {after:?}"
    );
}
