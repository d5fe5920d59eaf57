//! End-to-end test of memcached-operator against a real Kubernetes API server (v1.24 or newer).
//!
//! The test is skipped (and passes) unless `MEMCACHED_E2E=1` and `KUBECONFIG` are both set:
//!
//! ```text
//! MEMCACHED_E2E=1 KUBECONFIG=~/.kube/config cargo test --test e2e -- --nocapture --test-threads=1
//! ```
//!
//! Requirements: `kubectl` (1.24+) on `PATH` (or its path in `$KUBECTL`); a kubeconfig user that may install
//! CRDs and RBAC and impersonate service accounts (cluster-admin); nodes that can pull the memcached image; and
//! no in-cluster memcached-operator Deployment running (it would compete for the leader lease).
//!
//! The operator runs as a local process (this crate's binary), authenticated with a token of its own
//! ServiceAccount, so the RBAC from `config/` is exercised for real. One test, `lifecycle`, walks these steps
//! in order (they share state); each step is printed as `==> step N: ...`:
//!
//!  1. install: a test namespace that enforces the `restricted` Pod Security Standard (checked with a
//!     server-side dry run of a non-compliant pod), then `kubectl kustomize config/default` minus the
//!     Deployment; wait for the CRD
//!  2. operator: check the ServiceAccount's RBAC, write a token kubeconfig, start the operator (leader election on)
//!  3. endpoints and lease: `/healthz`, `/readyz`, `/metrics`; the leader Lease names the operator
//!  4. sample: the tutorial's Memcached produces a correct Deployment, Service, finalizer, status, columns, events
//!  5. leader election: a second operator stays standby, then takes over after the first gets SIGTERM
//!  6. scale to 3 through the scale subresource
//!  7. drift: hand edits of the Deployment are reverted
//!  8. deleted Deployment and Service are recreated
//!  9. invalid specs are rejected at admission
//! 10. an unpullable image makes the instance Degraded
//! 11. deleting the Memcached runs the finalizer and garbage-collects its children
//! 12. production sample (`config/samples/cache_v1alpha1_memcached_full.yaml`): 3 pods with the exporter sidecar
//!     are admitted under `restricted` and become ready (no ReplicaFailure); the Deployment (rollout strategy,
//!     memcached flags, preStop, grace period, anti-affinity, resources, sidecar), client and headless Services,
//!     PodDisruptionBudget and `status.serverList` match the sample
//! 13. the exporter sidecar and the Service's metrics port go away and come back with `monitoring.exporter.enabled`
//! 14. the PodDisruptionBudget goes at size 1, comes back at size 2, goes when disabled; the instance is deleted
//! 15. auth Secret: missing → `Degraded` `SecretNotFound` and nothing applied; created → ready with `-Y` and a
//!     Secret hash on the pod template; rotated → the hash changes and the pods roll; its values appear in no
//!     event, status, child object or operator log
//! 16. a managed flag in `extraArgs` → `Degraded` `InvalidConfig`, nothing applied
//! 17. ServiceMonitor: created and removed with the spec where the cluster serves monitoring.coreos.com/v1,
//!     else `Degraded` `ServiceMonitorUnavailable` (the Deployment is still applied)
//! 18. TLS from a `kubernetes.io/tls` Secret (`-Z`), if `openssl` is on `PATH` to make a certificate
//! 19. cleanup (always, also after a failure): see `impl Drop for E2e`
//!
//! Steps 12 to 14 run three pods requesting 250m CPU and 576Mi memory each plus their exporters (four during a
//! rollout), so the nodes need about 1.1 CPU and 2.5 GiB of requestable capacity left.
//!
//! Knobs: `E2E_KEEP=1` keeps the test namespace and the installed objects (the operator is stopped anyway);
//! `E2E_TIMEOUT_SCALE=2` multiplies every timeout (slow clusters); `KUBECTL=/path/to/kubectl`.
//!
//! Every wait polls with a timeout; on timeout it panics with what it expected and the last value it saw.
//! After a failure the operator logs (last 200 lines) and the namespace's objects and events are printed.

use serde_json::{Value, json};
use std::cell::RefCell;
use std::collections::BTreeSet;
use std::fs;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const SKIP_MESSAGE: &str = "skipping e2e: set MEMCACHED_E2E=1 and KUBECONFIG to run";

const OPERATOR_BIN: &str = env!("CARGO_BIN_EXE_memcached-operator");
const REPO_ROOT: &str = env!("CARGO_MANIFEST_DIR");

const OPERATOR_NS: &str = "memcached-operator-system";
const SERVICE_ACCOUNT: &str = "memcached-operator-controller-manager";
const CRD: &str = "memcacheds.cache.example.com";
/// Fully qualified resource name used with kubectl, so no other `memcached` resource can be picked by mistake.
const MC: &str = "memcacheds.cache.example.com";
const API_VERSION: &str = "cache.example.com/v1alpha1";
const LEASE: &str = "memcached-operator.cache.example.com";
const FINALIZER: &str = "cache.example.com/finalizer";

const SAMPLE: &str = "memcached-sample";
const BAD_IMAGE_NAME: &str = "memcached-badimage";
const BAD_IMAGE: &str = "registry.invalid/does-not-exist:0.0.0";
/// Image written into the Deployment by hand in the drift step; never pulled successfully, which is fine.
const DRIFT_IMAGE: &str = "registry.invalid/e2e-drift/memcached:0.0.0";
const PORT: i64 = 11211;

/// The production-shaped sample, relative to the crate root, and the instance it creates.
const PRODUCTION_SAMPLE: &str = "config/samples/cache_v1alpha1_memcached_full.yaml";
const PRODUCTION: &str = "memcached-production";
const AUTH_NAME: &str = "memcached-auth";
const AUTH_SECRET: &str = "memcached-auth-creds";
/// Credentials written into the auth Secret, then rotated; neither may show up anywhere the operator writes.
const AUTH_CREDENTIALS: &str = "app:s3cret";
const ROTATED_CREDENTIALS: &str = "app:r0tated";
const BAD_CONFIG_NAME: &str = "memcached-badconfig";
const MONITOR_NAME: &str = "memcached-monitor";
const TLS_NAME: &str = "memcached-tls";
const TLS_SECRET: &str = "memcached-tls-certs";

const EXPORTER_NAME: &str = "exporter";
const METRICS_PORT_NAME: &str = "metrics";
const METRICS_PORT: i64 = 9150;
const SECRET_HASH_ANNOTATION: &str = "cache.example.com/secret-hash";
const AUTH_FILE_ARG: &str = "-Y /etc/memcached/auth/auth-file";
const HOSTNAME_TOPOLOGY: &str = "kubernetes.io/hostname";
const PDB: &str = "poddisruptionbudgets.policy";
const SERVICE_MONITORS: &str = "servicemonitors.monitoring.coreos.com";
/// Pod Security Standard the test namespace enforces (and warns and audits with).
const POD_SECURITY_LEVEL: &str = "restricted";

/// Number of the cleanup step, printed by `impl Drop for E2e`.
const CLEANUP_STEP: u32 = 19;

const NAME_KEY: &str = "app.kubernetes.io/name";
const INSTANCE_KEY: &str = "app.kubernetes.io/instance";
const MANAGED_BY_KEY: &str = "app.kubernetes.io/managed-by";
const APP_NAME: &str = "memcached";
const MANAGER_NAME: &str = "memcached-operator";

/// Interval between two checks of a poll loop.
const POLL: Duration = Duration::from_secs(1);
/// Upper bound in seconds for a single kubectl invocation (so a hung API server cannot hang the test).
const KUBECTL_TIMEOUT_SECS: u64 = 120;
/// Field manager for what the test applies server-side.
const FIELD_MANAGER: &str = "memcached-operator-e2e";

// ---------------------------------------------------------------------------------------------------------
// The test
// ---------------------------------------------------------------------------------------------------------

#[test]
fn lifecycle() {
    if !e2e_enabled() {
        eprintln!("{SKIP_MESSAGE}");
        return;
    }

    preflight();
    let mut env = E2e::new();
    eprintln!(
        "test namespace: {}\nscratch dir (operator logs): {}",
        env.ns,
        env.dir.display()
    );

    env.step(
        1,
        "a test namespace enforcing the restricted Pod Security Standard; install the CRD, RBAC and \
         namespace from config/default (without the Deployment)",
    );
    env.create_test_namespace();
    env.check_pod_security();
    env.install();

    env.step(
        2,
        "run the operator locally with its ServiceAccount's permissions",
    );
    env.check_rbac();
    env.write_operator_kubeconfig();
    // The operator looks for the ServiceMonitor API once, when it starts (step 17 depends on it).
    let service_monitors_at_start = service_monitors_served();
    eprintln!(
        "    monitoring.coreos.com ServiceMonitors served at operator start: {service_monitors_at_start}"
    );
    let first = env.start_operator("first");

    env.step(3, "health, readiness and metrics endpoints; leader lease");
    env.wait_http(&first, "/healthz", secs(60));
    env.wait_http(&first, "/readyz", secs(60));
    env.wait_http(&first, "/metrics", secs(30));
    env.wait(
        &format!(
            "Lease {OPERATOR_NS}/{LEASE} to be held by the operator ({})",
            first.identity
        ),
        // A Lease left over by an earlier run has to expire first.
        secs(90),
        || holder_contains(&first.identity),
    );

    env.step(4, "tutorial sample memcached-sample (size 1) gets a Deployment, Service, finalizer and status");
    step_sample(&env, &first);

    env.step(
        5,
        "leader election: a second operator waits, then takes over after SIGTERM to the first",
    );
    let current = step_leader_handover(&env, &first);

    env.step(
        6,
        "scale memcached-sample to 3 through the scale subresource",
    );
    step_scale(&env, &current);

    env.step(7, "drift: hand edits of the Deployment are reverted");
    step_drift(&env);

    env.step(8, "deleted Deployment and Service are recreated");
    step_recreate(&env);

    env.step(9, "invalid specs are rejected at admission");
    step_invalid(&env);

    env.step(10, "an unpullable image makes the instance Degraded");
    step_degraded(&env);

    env.step(
        11,
        "deleting memcached-sample runs the finalizer and removes its children",
    );
    step_delete(&env);

    env.step(
        12,
        "production sample memcached-production (3 pods with the exporter sidecar) is admitted under the \
         restricted Pod Security Standard and matches the sample",
    );
    let production = step_production(&env);

    env.step(
        13,
        "exporter sidecar and metrics port follow spec.monitoring.exporter.enabled",
    );
    step_exporter_toggle(&env, &production);

    env.step(
        14,
        "PodDisruptionBudget follows size and highAvailability.podDisruptionBudget.enabled; delete memcached-production",
    );
    step_pdb_lifecycle(&env, &production);

    env.step(
        15,
        "auth Secret: missing -> SecretNotFound, created -> ready, rotated -> rollout; values never leak",
    );
    step_auth_secret(&env);

    env.step(
        16,
        "a managed flag in spec.memcached.extraArgs -> Degraded InvalidConfig, nothing applied",
    );
    step_invalid_config(&env);

    env.step(
        17,
        "ServiceMonitor created and removed, or ServiceMonitorUnavailable without its API",
    );
    step_service_monitor(&env, service_monitors_at_start);

    env.step(18, "TLS from a kubernetes.io/tls Secret (needs openssl)");
    step_tls(&env);

    eprintln!(
        "\n==> all steps passed [t+{}s]; step {CLEANUP_STEP} (cleanup) follows",
        env.started.elapsed().as_secs()
    );
}

fn step_sample(env: &E2e, op: &OpInfo) {
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
        &format!("Memcached {SAMPLE} to carry the finalizer {FINALIZER}"),
        secs(60),
        || {
            let mc = get_required(MC, ns, SAMPLE)?;
            let finalizers = &mc["metadata"]["finalizers"];
            let has = finalizers
                .as_array()
                .is_some_and(|f| f.iter().any(|x| x == FINALIZER));
            if has {
                Ok(())
            } else {
                Err(format!("metadata.finalizers = {}", compact(finalizers)))
            }
        },
    );

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

    env.wait(
        &format!("Memcached {SAMPLE} status: 1 ready pod, Available=True, Progressing=False, Degraded=False"),
        secs(180),
        || check_ready_status(ns, SAMPLE, 1),
    );

    // Printer columns (and the `mc` short name).
    let table = kubectl_ok(&["get", "mc", "-n", ns]);
    let mut lines = table.lines();
    let header: Vec<&str> = lines
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(
        header,
        ["NAME", "SIZE", "READY", "AVAILABLE", "AGE"],
        "`kubectl get mc` header is wrong; full output:\n{table}"
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
    eprintln!("    ok: `kubectl get mc` shows NAME SIZE READY AVAILABLE AGE");

    env.wait(
        &format!("a Normal event with reason Created regarding Memcached or Deployment {SAMPLE}"),
        secs(60),
        || {
            let events = list_events(ns)?;
            let found = events.iter().any(|e| {
                e.type_ == "Normal"
                    && e.reason == "Created"
                    && (e.kind == "Memcached" || e.kind == "Deployment")
                    && e.name == SAMPLE
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
}

fn step_leader_handover(env: &E2e, first: &OpInfo) -> OpInfo {
    let (holder, lease_seconds) = lease_holder().unwrap_or_else(|e| panic!("{e}"));
    assert!(
        holder.contains(&first.identity),
        "Lease holderIdentity {holder:?} should contain the first operator's POD_NAME {:?}",
        first.identity
    );
    eprintln!("    lease holder {holder:?}, leaseDurationSeconds {lease_seconds:?}");

    let second = env.start_operator("second");
    // The standby must serve its health probe: in a cluster, kubelet's liveness probe would otherwise
    // restart every non-leader replica.
    env.wait_http(&second, "/healthz", secs(60));

    env.hold(
        &format!(
            "Lease stays with the first operator ({}) while the second ({}) runs",
            first.identity, second.identity
        ),
        Duration::from_secs(20),
        || match lease_holder() {
            Ok((h, _)) if h.contains(&first.identity) && !h.contains(&second.identity) => Ok(()),
            Ok((h, _)) => Err(format!(
                "holderIdentity is {h:?}, expected the first operator's {:?}",
                first.identity
            )),
            Err(e) => {
                eprintln!("    (transient error reading the lease, ignored: {e})");
                Ok(())
            }
        },
    );

    let status = env.terminate(first, secs(15));
    assert!(
        status.success(),
        "the first operator exited with {status} after SIGTERM; a graceful shutdown must exit with 0 \
         (log: {})",
        first.log.display()
    );
    eprintln!("    ok: first operator exited with {status} after SIGTERM");

    // If the first operator released the lease on shutdown the second takes over at its next retry;
    // otherwise it has to wait for the lease to expire.
    let handover = secs(30).max(Duration::from_secs(
        u64::try_from(lease_seconds.unwrap_or(15)).unwrap_or(15) + 15,
    ));
    env.wait(
        &format!(
            "the second operator ({}) to become the Lease holder",
            second.identity
        ),
        handover,
        || holder_contains(&second.identity),
    );
    env.wait_http(&second, "/readyz", secs(60));
    env.wait(
        &format!("Memcached {SAMPLE} to stay ready under the new leader"),
        secs(60),
        || check_ready_status(&env.ns, SAMPLE, 1),
    );
    second
}

fn step_scale(env: &E2e, op: &OpInfo) {
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
fn deployment_generation(ns: &str) -> i64 {
    let dep = kubectl_json(&["get", "deployments.apps", SAMPLE, "-n", ns, "-o", "json"]);
    dep["metadata"]["generation"]
        .as_i64()
        .unwrap_or_else(|| panic!("Deployment {SAMPLE} has no metadata.generation"))
}

/// The Deployment's `field` must be back at `want`, and its generation must show that both the hand edit
/// and a revert happened (at least two spec changes since `before`).
fn reverted(
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

fn step_drift(env: &E2e) {
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

fn step_recreate(env: &E2e) {
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

fn step_invalid(env: &E2e) {
    let ns = env.ns.as_str();
    let cases = [
        ("bad-size-neg", "size: -1", "spec.size"),
        ("bad-size-big", "size: 1000", "spec.size"),
        (
            "bad-port-zero",
            "size: 1\n  containerPort: 0",
            "spec.containerPort",
        ),
        ("bad-size-string", "size: \"three\"", "spec.size"),
    ];
    let mut problems = Vec::new();
    for (name, spec, field) in cases {
        let yaml = format!(
            "apiVersion: {API_VERSION}\nkind: Memcached\nmetadata:\n  name: {name}\n  namespace: {ns}\nspec:\n  {spec}\n"
        );
        let out = apply_yaml(&yaml);
        let stderr = String::from_utf8_lossy(&out.stderr).trim().to_owned();
        if out.status.success() {
            problems.push(format!(
                "{name} ({spec:?}) was accepted, expected an admission error naming {field}; stdout: {}",
                String::from_utf8_lossy(&out.stdout).trim()
            ));
        } else if !stderr.contains(field) {
            problems.push(format!(
                "{name} ({spec:?}) was rejected, but stderr does not name {field}: {stderr}"
            ));
        } else {
            eprintln!("    ok: {name} rejected: {stderr}");
        }
    }
    for (name, _, _) in cases {
        match get_opt(MC, ns, name) {
            Ok(None) => {}
            Ok(Some(_)) => {
                problems.push(format!(
                    "Memcached {name} exists although it should have been rejected"
                ));
                let _ = kubectl(&["delete", MC, name, "-n", ns, "--wait=false"]);
            }
            Err(e) => problems.push(format!("cannot check whether {name} exists: {e}")),
        }
    }
    assert!(
        problems.is_empty(),
        "invalid Memcached specs were not handled as expected:\n  - {}",
        problems.join("\n  - ")
    );
}

fn step_degraded(env: &E2e) {
    let ns = env.ns.as_str();
    apply_yaml_ok(&format!(
        "apiVersion: {API_VERSION}\nkind: Memcached\nmetadata:\n  name: {BAD_IMAGE_NAME}\n  namespace: {ns}\n\
         spec:\n  size: 1\n  containerPort: 11211\n  image: {BAD_IMAGE}\n"
    ));
    env.wait(
        &format!("Deployment {BAD_IMAGE_NAME} to use the image {BAD_IMAGE} from spec.image"),
        secs(60),
        || {
            let dep = get_required("deployments.apps", ns, BAD_IMAGE_NAME)?;
            let (_, c) = memcached_container(&dep)?;
            expect_eq("memcached container image", &c["image"], &json!(BAD_IMAGE))
        },
    );
    let mc = env.wait(
        &format!(
            "Memcached {BAD_IMAGE_NAME}: Degraded=True with reason ImagePullFailed \
             (or ProgressDeadlineExceeded), Available=False"
        ),
        secs(180),
        || {
            let mc = get_required(MC, ns, BAD_IMAGE_NAME)?;
            let mut problems = Vec::new();
            match condition(&mc, "Degraded") {
                Some(c)
                    if c["status"] == "True"
                        && (c["reason"] == "ImagePullFailed"
                            || c["reason"] == "ProgressDeadlineExceeded") => {}
                Some(c) => problems.push(format!("Degraded condition is {}", compact(c))),
                None => problems.push("no Degraded condition".into()),
            }
            if condition_status(&mc, "Available") != Some("False") {
                problems.push(format!(
                    "Available condition is {}",
                    compact(condition(&mc, "Available").unwrap_or(&Value::Null))
                ));
            }
            result(problems, &mc["status"]).map(|()| mc)
        },
    );
    eprintln!(
        "    Degraded condition: {}",
        compact(condition(&mc, "Degraded").unwrap_or(&Value::Null))
    );

    kubectl_ok(&["delete", MC, BAD_IMAGE_NAME, "-n", ns, "--wait=false"]);
    env.wait(
        &format!("Memcached {BAD_IMAGE_NAME} to be deleted (finalizer removed)"),
        secs(60),
        || gone(MC, ns, BAD_IMAGE_NAME),
    );
}

fn step_delete(env: &E2e) {
    let ns = env.ns.as_str();
    let mc_uid = uid_of(MC, ns, SAMPLE);
    let dep_uid = uid_of("deployments.apps", ns, SAMPLE);
    let svc_uid = uid_of("services", ns, SAMPLE);

    kubectl_ok(&["delete", MC, SAMPLE, "-n", ns, "--wait=false"]);
    env.wait(
        &format!("Memcached {SAMPLE} to be gone (the operator removes its finalizer)"),
        secs(60),
        || gone(MC, ns, SAMPLE),
    );
    env.wait(
        &format!(
            "a Warning event with reason Deleting regarding Memcached {SAMPLE} (uid {mc_uid})"
        ),
        secs(30),
        || {
            let events = list_events(ns)?;
            let found = events.iter().any(|e| {
                e.type_ == "Warning"
                    && e.reason == "Deleting"
                    && e.kind == "Memcached"
                    && e.name == SAMPLE
                    && (e.uid.is_empty() || e.uid == mc_uid)
            });
            if found {
                Ok(())
            } else {
                Err(format!("events in {ns}: {}", summarize_events(&events)))
            }
        },
    );
    for (resource, kind, old_uid) in [
        ("deployments.apps", "Deployment", dep_uid),
        ("services", "Service", svc_uid),
    ] {
        env.wait(
            &format!("{kind} {SAMPLE} to be garbage-collected"),
            secs(120),
            || match get_opt(resource, ns, SAMPLE)? {
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
}

/// What the production sample asks for, read back from the applied Memcached (so the checks follow the sample).
struct Production {
    uid: String,
    size: i64,
    /// `spec.containerPort`: the pods' port, also the headless Service's.
    port: i64,
    /// `spec.service.port`, else `containerPort`: the client Service's port.
    service_port: i64,
    image: Option<String>,
    /// Pieces the memcached command line must contain, e.g. `-m 512`.
    args: Vec<String>,
    pre_stop: Value,
    grace_period: Value,
    resources: Value,
    service_annotations: Value,
    pdb_max_unavailable: Value,
}

impl Production {
    fn from_spec(mc: &Value) -> Self {
        let spec = &mc["spec"];
        let m = &spec["memcached"];
        let ha = &spec["highAvailability"];
        let need = |v: &Value, what: &str| -> Value {
            assert!(
                !v.is_null(),
                "{PRODUCTION_SAMPLE} no longer sets {what}, which step 12 checks; spec: {}",
                compact(spec)
            );
            v.clone()
        };
        let scalar = |v: &Value| match v {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        let mut args = vec![
            format!(
                "-m {}",
                scalar(&need(&m["maxMemoryMB"], "memcached.maxMemoryMB"))
            ),
            format!(
                "-c {}",
                scalar(&need(&m["maxConnections"], "memcached.maxConnections"))
            ),
            format!(
                "-I {}",
                scalar(&need(&m["maxItemSize"], "memcached.maxItemSize"))
            ),
            "-o modern".to_owned(),
        ];
        if !m["threads"].is_null() {
            args.push(format!("-t {}", scalar(&m["threads"])));
        }
        let extra: Vec<String> = need(&m["extraArgs"], "memcached.extraArgs")
            .as_array()
            .map(|a| a.iter().map(scalar).collect())
            .unwrap_or_default();
        args.push(extra.join(" "));
        let size = spec["size"].as_i64().unwrap_or(1);
        assert!(
            size >= 2,
            "{PRODUCTION_SAMPLE} should run at least 2 pods (it has a PodDisruptionBudget); spec.size is {size}"
        );
        let pre_stop = ha["preStopDelaySeconds"].as_i64().unwrap_or(10);
        let port = spec["containerPort"].as_i64().unwrap_or(PORT);
        Production {
            uid: str_at(mc, "/metadata/uid").to_owned(),
            size,
            port,
            service_port: spec["service"]["port"].as_i64().unwrap_or(port),
            image: spec["image"].as_str().map(str::to_owned),
            args,
            pre_stop: json!(["sleep", pre_stop.to_string()]),
            grace_period: json!(ha["terminationGracePeriodSeconds"].as_i64().unwrap_or(30)),
            resources: need(&spec["resources"], "resources"),
            service_annotations: need(&spec["service"]["annotations"], "service.annotations"),
            pdb_max_unavailable: match &ha["podDisruptionBudget"]["maxUnavailable"] {
                Value::Null => json!(1),
                v => v.clone(),
            },
        }
    }
}

fn step_production(env: &E2e) -> Production {
    let ns = env.ns.as_str();
    let path = Path::new(REPO_ROOT).join(PRODUCTION_SAMPLE);
    let path_arg = path.to_string_lossy().into_owned();
    let out = kubectl_ok(&["apply", "-n", ns, "-f", &path_arg]);
    eprint!("{}", indent(&out));
    let mc = kubectl_json(&["get", MC, PRODUCTION, "-n", ns, "-o", "json"]);
    let want = Production::from_spec(&mc);
    eprintln!(
        "    expecting from the sample: {} pods, memcached flags {:?}, preStop {}, grace {}s, resources {}",
        want.size,
        want.args,
        compact(&want.pre_stop),
        want.grace_period,
        compact(&want.resources)
    );

    env.wait(
        &format!("Deployment {PRODUCTION} to match the sample (strategy, flags, preStop, affinity, resources, exporter)"),
        secs(60),
        || {
            let dep = get_required("deployments.apps", ns, PRODUCTION)?;
            check_production_deployment(&dep, &want, true)
        },
    );
    env.wait(
        &format!("Service {PRODUCTION} (memcached and metrics ports, sample annotation) and {PRODUCTION}-headless"),
        secs(60),
        || {
            let svc = get_required("services", ns, PRODUCTION)?;
            check_client_service(&svc, &want, true)?;
            let headless = get_required("services", ns, &format!("{PRODUCTION}-headless"))?;
            check_headless_service(&headless, PRODUCTION, &want.uid, want.port)
        },
    );

    // The pods carry the exporter sidecar and must be admitted under the namespace's restricted standard:
    // a refusal would show as the Deployment's ReplicaFailure, reported as Degraded/ReplicaFailure.
    env.wait(
        &format!(
            "Memcached {PRODUCTION}: {} ready pods (admitted under Pod Security {POD_SECURITY_LEVEL}), Available=True",
            want.size
        ),
        secs(300),
        || {
            if let Some(mc) = get_opt(MC, ns, PRODUCTION)? {
                refuse_replica_failure(&mc);
            }
            check_ready_status(ns, PRODUCTION, want.size)
        },
    );
    let dep = kubectl_json(&[
        "get",
        "deployments.apps",
        PRODUCTION,
        "-n",
        ns,
        "-o",
        "json",
    ]);
    if let Some(c) = deployment_condition(&dep, "ReplicaFailure") {
        assert_ne!(
            c["status"],
            "True",
            "Deployment {PRODUCTION} reports ReplicaFailure (pods refused, e.g. by Pod Security admission): {}",
            compact(c)
        );
    }
    eprintln!("    ok: no ReplicaFailure; pods admitted under {POD_SECURITY_LEVEL}");

    env.wait(
        &format!(
            "PodDisruptionBudget {PRODUCTION} with maxUnavailable {} and a controller ownerReference",
            want.pdb_max_unavailable
        ),
        secs(60),
        || {
            let pdb = get_required(PDB, ns, PRODUCTION)?;
            check_pdb(&pdb, PRODUCTION, &want)
        },
    );
    let servers = env.wait(
        &format!(
            "Memcached {PRODUCTION} status.serverList: {} sorted <podIP>:{} entries of the ready pods",
            want.size, want.port
        ),
        secs(60),
        || check_server_list(ns, PRODUCTION, want.size, want.port),
    );
    eprintln!("    serverList: {servers:?}");
    want
}

fn step_exporter_toggle(env: &E2e, want: &Production) {
    let ns = env.ns.as_str();
    for enabled in [false, true] {
        let patch = json!({"spec": {"monitoring": {"exporter": {"enabled": enabled}}}}).to_string();
        kubectl_ok(&[
            "patch",
            MC,
            PRODUCTION,
            "-n",
            ns,
            "--type=merge",
            "-p",
            &patch,
        ]);
        let (containers, ports): (&[&str], &[&str]) = if enabled {
            (&[APP_NAME, EXPORTER_NAME], &[APP_NAME, METRICS_PORT_NAME])
        } else {
            (&[APP_NAME], &[APP_NAME])
        };
        env.wait(
            &format!(
                "exporter enabled={enabled}: pod template containers {containers:?}, Service {PRODUCTION} ports {ports:?}"
            ),
            secs(60),
            || {
                let dep = get_required("deployments.apps", ns, PRODUCTION)?;
                let svc = get_required("services", ns, PRODUCTION)?;
                let mut p = Vec::new();
                let have = names(&dep["spec"]["template"]["spec"]["containers"]);
                if have != containers {
                    p.push(format!("pod template containers are {have:?}"));
                }
                let have = names(&svc["spec"]["ports"]);
                if have != ports {
                    p.push(format!("Service ports are {have:?}"));
                }
                result(p, &json!({"containers": dep["spec"]["template"]["spec"]["containers"], "ports": svc["spec"]["ports"]}))
            },
        );
    }
    env.wait(
        &format!("Deployment {PRODUCTION} to match the sample again, exporter included"),
        secs(30),
        || {
            let dep = get_required("deployments.apps", ns, PRODUCTION)?;
            check_production_deployment(&dep, want, true)?;
            let svc = get_required("services", ns, PRODUCTION)?;
            check_client_service(&svc, want, true)
        },
    );
    env.wait(
        &format!(
            "Memcached {PRODUCTION} to finish rolling out: {} ready pods, Available=True, Progressing=False",
            want.size
        ),
        secs(300),
        || {
            if let Some(mc) = get_opt(MC, ns, PRODUCTION)? {
                refuse_replica_failure(&mc);
            }
            check_ready_status(ns, PRODUCTION, want.size)
        },
    );
}

fn step_pdb_lifecycle(env: &E2e, want: &Production) {
    let ns = env.ns.as_str();
    let target = format!("{MC}/{PRODUCTION}");

    kubectl_ok(&["scale", &target, "--replicas=1", "-n", ns]);
    env.wait(
        &format!("PodDisruptionBudget {PRODUCTION} to be deleted at size 1"),
        secs(60),
        || gone(PDB, ns, PRODUCTION),
    );
    env.wait(
        &format!(
            "a Normal event with reason Deleted regarding Memcached {PRODUCTION} (the budget)"
        ),
        secs(30),
        || {
            expect_event(ns, |e| {
                e.type_ == "Normal"
                    && e.reason == "Deleted"
                    && e.kind == "Memcached"
                    && e.name == PRODUCTION
                    && e.note.contains("PodDisruptionBudget")
            })
        },
    );

    kubectl_ok(&["scale", &target, "--replicas=2", "-n", ns]);
    env.wait(
        &format!("PodDisruptionBudget {PRODUCTION} to be back at size 2"),
        secs(60),
        || {
            let pdb = get_required(PDB, ns, PRODUCTION)?;
            check_pdb(&pdb, PRODUCTION, want)
        },
    );

    let patch = r#"{"spec":{"highAvailability":{"podDisruptionBudget":{"enabled":false}}}}"#;
    kubectl_ok(&[
        "patch",
        MC,
        PRODUCTION,
        "-n",
        ns,
        "--type=merge",
        "-p",
        patch,
    ]);
    env.wait(
        &format!(
            "PodDisruptionBudget {PRODUCTION} to be deleted with podDisruptionBudget.enabled=false"
        ),
        secs(60),
        || gone(PDB, ns, PRODUCTION),
    );
    env.hold(
        &format!("PodDisruptionBudget {PRODUCTION} stays deleted"),
        secs(5),
        || gone(PDB, ns, PRODUCTION),
    );

    delete_instance(env, PRODUCTION);
    let headless = format!("{PRODUCTION}-headless");
    for (resource, name) in [
        ("deployments.apps", PRODUCTION),
        ("services", PRODUCTION),
        ("services", headless.as_str()),
    ] {
        env.wait(
            &format!("{resource} {name} to be garbage-collected"),
            secs(120),
            || gone(resource, ns, name),
        );
    }
}

fn step_auth_secret(env: &E2e) {
    let ns = env.ns.as_str();
    let _ = kubectl(&[
        "delete",
        "secret",
        AUTH_SECRET,
        "-n",
        ns,
        "--ignore-not-found",
    ]);
    apply_yaml_ok(&format!(
        "apiVersion: {API_VERSION}\nkind: Memcached\nmetadata:\n  name: {AUTH_NAME}\n  namespace: {ns}\n\
         spec:\n  size: 1\n  security:\n    auth:\n      secretName: {AUTH_SECRET}\n"
    ));
    let mc = env.wait(
        &format!("Memcached {AUTH_NAME}: Degraded=True, reason SecretNotFound, naming Secret {AUTH_SECRET}"),
        secs(60),
        || {
            let mc = get_required(MC, ns, AUTH_NAME)?;
            expect_degraded(&mc, "SecretNotFound", AUTH_SECRET).map(|()| mc)
        },
    );
    eprintln!(
        "    Degraded condition: {}",
        compact(condition(&mc, "Degraded").unwrap_or(&Value::Null))
    );
    env.hold(
        &format!("no Deployment or Service {AUTH_NAME} is applied while the Secret is missing"),
        secs(5),
        || {
            gone("deployments.apps", ns, AUTH_NAME)?;
            gone("services", ns, AUTH_NAME)
        },
    );
    env.wait(
        &format!("a Warning event with reason SecretNotFound regarding Memcached {AUTH_NAME}"),
        secs(30),
        || {
            expect_event(ns, |e| {
                e.type_ == "Warning"
                    && e.reason == "SecretNotFound"
                    && e.kind == "Memcached"
                    && e.name == AUTH_NAME
            })
        },
    );

    let literal = format!("--from-literal=auth-file={AUTH_CREDENTIALS}");
    kubectl_ok(&[
        "create",
        "secret",
        "generic",
        AUTH_SECRET,
        &literal,
        "-n",
        ns,
    ]);
    env.wait(
        &format!(
            "Memcached {AUTH_NAME} to recover: Degraded=False once Secret {AUTH_SECRET} exists"
        ),
        secs(60),
        || {
            let mc = get_required(MC, ns, AUTH_NAME)?;
            match condition(&mc, "Degraded") {
                Some(c) if c["status"] == "False" => Ok(()),
                other => Err(format!(
                    "Degraded condition is {}",
                    compact(other.unwrap_or(&Value::Null))
                )),
            }
        },
    );
    env.wait(
        &format!("Memcached {AUTH_NAME} status: 1 ready pod, Available=True"),
        secs(180),
        || check_ready_status(ns, AUTH_NAME, 1),
    );
    let first_hash = env.wait(
        &format!(
            "Deployment {AUTH_NAME}: {SECRET_HASH_ANNOTATION} on the pod template, `{AUTH_FILE_ARG}`, Secret volume"
        ),
        secs(30),
        || {
            let dep = get_required("deployments.apps", ns, AUTH_NAME)?;
            check_auth_deployment(&dep)
        },
    );
    eprintln!("    {SECRET_HASH_ANNOTATION}: {first_hash}");

    // Rotate the credentials the way people do it: render the Secret again and apply it over the old one.
    let rotated = format!("--from-literal=auth-file={ROTATED_CREDENTIALS}");
    let yaml = kubectl_ok(&[
        "create",
        "secret",
        "generic",
        AUTH_SECRET,
        &rotated,
        "-n",
        ns,
        "--dry-run=client",
        "-o",
        "yaml",
    ]);
    apply_yaml_ok(&yaml);
    let second_hash = env.wait(
        &format!("the pod template's {SECRET_HASH_ANNOTATION} to change after the Secret rotation"),
        secs(60),
        || {
            let dep = get_required("deployments.apps", ns, AUTH_NAME)?;
            let hash = check_auth_deployment(&dep)?;
            if hash == first_hash {
                Err(format!("{SECRET_HASH_ANNOTATION} is still {hash}"))
            } else {
                Ok(hash)
            }
        },
    );
    eprintln!("    {SECRET_HASH_ANNOTATION}: {second_hash}");
    env.wait(
        &format!("the rollout to finish: 1 ready pod carrying the new hash {second_hash}"),
        secs(180),
        || {
            check_ready_status(ns, AUTH_NAME, 1)?;
            let pods = live_pods(ns, AUTH_NAME)?;
            let stale: Vec<String> = pods
                .iter()
                .filter(|p| {
                    p["metadata"]["annotations"][SECRET_HASH_ANNOTATION] != second_hash.as_str()
                })
                .map(|p| p["metadata"]["name"].as_str().unwrap_or("?").to_owned())
                .collect();
            if pods.is_empty() || !stale.is_empty() {
                Err(format!(
                    "pods without the new hash: {stale:?} (of {})",
                    pods.len()
                ))
            } else {
                Ok(())
            }
        },
    );

    check_no_leak(env, AUTH_NAME);
    delete_instance(env, AUTH_NAME);
}

/// Neither the credentials nor their base64 form may appear in events, in the instance (status included),
/// its Deployment, or the operator logs.
fn check_no_leak(env: &E2e, name: &str) {
    let ns = env.ns.as_str();
    let mut needles = Vec::new();
    for credentials in [AUTH_CREDENTIALS, ROTATED_CREDENTIALS] {
        let password = credentials.split_once(':').map_or(credentials, |(_, p)| p);
        needles.push(password.to_owned());
        needles.push(base64(credentials.as_bytes()));
    }
    let mut haystacks: Vec<(String, String)> = Vec::new();
    let events = list_events(ns).unwrap_or_else(|e| panic!("cannot list events: {e}"));
    for e in &events {
        haystacks.push((
            format!("event {} {} {}/{}", e.type_, e.reason, e.kind, e.name),
            format!("{} {}", e.reason, e.note),
        ));
    }
    for (resource, what) in [(MC, "Memcached"), ("deployments.apps", "Deployment")] {
        let obj = kubectl_json(&["get", resource, name, "-n", ns, "-o", "json"]);
        haystacks.push((format!("{what} {name}"), obj.to_string()));
    }
    for (label, path) in env.operator_logs() {
        let text = fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
        haystacks.push((
            format!("log of operator '{label}' ({})", path.display()),
            text,
        ));
    }
    let leaks: Vec<String> = haystacks
        .iter()
        .flat_map(|(what, text)| {
            needles
                .iter()
                .filter(|n| text.contains(n.as_str()))
                .map(move |n| format!("{what} contains {n:?}"))
        })
        .collect();
    assert!(
        leaks.is_empty(),
        "Secret values leaked:\n  - {}",
        leaks.join("\n  - ")
    );
    eprintln!(
        "    ok: no Secret value in {} events, the Memcached and Deployment, or {} operator log(s)",
        events.len(),
        env.operator_logs().len()
    );
}

fn step_invalid_config(env: &E2e) {
    let ns = env.ns.as_str();
    apply_yaml_ok(&format!(
        "apiVersion: {API_VERSION}\nkind: Memcached\nmetadata:\n  name: {BAD_CONFIG_NAME}\n  namespace: {ns}\n\
         spec:\n  size: 1\n  memcached:\n    extraArgs: [\"-m\", \"1\"]\n"
    ));
    let mc = env.wait(
        &format!(
            "Memcached {BAD_CONFIG_NAME}: Degraded=True, reason InvalidConfig, naming extraArgs[0]"
        ),
        secs(60),
        || {
            let mc = get_required(MC, ns, BAD_CONFIG_NAME)?;
            expect_degraded(&mc, "InvalidConfig", "extraArgs[0]").map(|()| mc)
        },
    );
    eprintln!(
        "    Degraded condition: {}",
        compact(condition(&mc, "Degraded").unwrap_or(&Value::Null))
    );
    env.hold(
        &format!("no Deployment {BAD_CONFIG_NAME} is applied for an invalid config"),
        secs(5),
        || gone("deployments.apps", ns, BAD_CONFIG_NAME),
    );
    env.wait(
        &format!("a Warning event with reason InvalidConfig regarding Memcached {BAD_CONFIG_NAME}"),
        secs(30),
        || {
            expect_event(ns, |e| {
                e.type_ == "Warning"
                    && e.reason == "InvalidConfig"
                    && e.kind == "Memcached"
                    && e.name == BAD_CONFIG_NAME
            })
        },
    );
    delete_instance(env, BAD_CONFIG_NAME);
}

fn step_service_monitor(env: &E2e, served_at_start: bool) {
    let ns = env.ns.as_str();
    let served = service_monitors_served();
    if served != served_at_start {
        eprintln!(
            "    SKIP: the ServiceMonitor API was {}served when the operator started and is {}served now; the \
             operator only looks at start, so neither outcome can be checked",
            if served_at_start { "" } else { "not " },
            if served { "" } else { "not " }
        );
        return;
    }
    apply_yaml_ok(&format!(
        "apiVersion: {API_VERSION}\nkind: Memcached\nmetadata:\n  name: {MONITOR_NAME}\n  namespace: {ns}\n\
         spec:\n  size: 1\n  monitoring:\n    exporter:\n      enabled: true\n    serviceMonitor:\n      \
         enabled: true\n      interval: 30s\n"
    ));
    let uid = uid_of(MC, ns, MONITOR_NAME);
    if served {
        eprintln!("    the cluster serves {SERVICE_MONITORS}");
        env.wait(
            &format!("ServiceMonitor {MONITOR_NAME} scraping the port named {METRICS_PORT_NAME}"),
            secs(60),
            || {
                let sm = get_required(SERVICE_MONITORS, ns, MONITOR_NAME)?;
                let mut p = Vec::new();
                push_err(
                    &mut p,
                    expect_eq(
                        "spec.endpoints[0].port",
                        &sm["spec"]["endpoints"][0]["port"],
                        &json!(METRICS_PORT_NAME),
                    ),
                );
                push_err(
                    &mut p,
                    expect_eq(
                        "spec.selector.matchLabels",
                        &sm["spec"]["selector"]["matchLabels"],
                        &selector_labels(MONITOR_NAME),
                    ),
                );
                push_err(&mut p, check_owner(&sm, MONITOR_NAME, &uid, true));
                result(p, &sm)
            },
        );
        let mc = kubectl_json(&["get", MC, MONITOR_NAME, "-n", ns, "-o", "json"]);
        if let Some(c) = condition(&mc, "Degraded") {
            assert_ne!(
                c["reason"],
                "ServiceMonitorUnavailable",
                "the API is served, yet Memcached {MONITOR_NAME} reports {}",
                compact(c)
            );
        }
        let patch = r#"{"spec":{"monitoring":{"serviceMonitor":{"enabled":false}}}}"#;
        kubectl_ok(&[
            "patch",
            MC,
            MONITOR_NAME,
            "-n",
            ns,
            "--type=merge",
            "-p",
            patch,
        ]);
        env.wait(
            &format!(
                "ServiceMonitor {MONITOR_NAME} to be deleted with serviceMonitor.enabled=false"
            ),
            secs(60),
            || gone(SERVICE_MONITORS, ns, MONITOR_NAME),
        );
    } else {
        eprintln!("    the cluster does not serve {SERVICE_MONITORS}");
        env.wait(
            &format!("Memcached {MONITOR_NAME}: Degraded=True, reason ServiceMonitorUnavailable"),
            secs(60),
            || {
                let mc = get_required(MC, ns, MONITOR_NAME)?;
                expect_degraded(&mc, "ServiceMonitorUnavailable", "ServiceMonitor")
            },
        );
        env.wait(
            &format!("Deployment {MONITOR_NAME} (with the exporter) and Service {MONITOR_NAME} (with the metrics port) to be applied anyway"),
            secs(60),
            || {
                let dep = get_required("deployments.apps", ns, MONITOR_NAME)?;
                let svc = get_required("services", ns, MONITOR_NAME)?;
                let mut p = Vec::new();
                let containers = names(&dep["spec"]["template"]["spec"]["containers"]);
                if containers != [APP_NAME, EXPORTER_NAME] {
                    p.push(format!("pod template containers are {containers:?}"));
                }
                let ports = names(&svc["spec"]["ports"]);
                if ports != [APP_NAME, METRICS_PORT_NAME] {
                    p.push(format!("Service ports are {ports:?}"));
                }
                push_err(&mut p, check_owner(&dep, MONITOR_NAME, &uid, true));
                result(p, &json!({"containers": containers, "ports": ports}))
            },
        );
    }
    delete_instance(env, MONITOR_NAME);
}

fn step_tls(env: &E2e) {
    let ns = env.ns.as_str();
    let openssl = run(
        "openssl",
        "openssl",
        &["version"],
        None,
        None,
        Duration::from_secs(10),
    );
    if !openssl.is_ok_and(|o| o.status.success()) {
        eprintln!(
            "    SKIP: openssl is not on PATH, so no certificate can be made for the TLS step"
        );
        return;
    }
    let dir = env.dir.join("tls");
    fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
    fs::write(
        dir.join("server.ext"),
        format!("subjectAltName=DNS:{TLS_NAME},DNS:{TLS_NAME}.{ns}.svc\n"),
    )
    .unwrap_or_else(|e| panic!("cannot write {}: {e}", dir.join("server.ext").display()));
    let commands: [&[&str]; 3] = [
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
            "-days",
            "2",
            "-subj",
            "/CN=memcached-e2e-ca",
        ],
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "tls.key",
            "-out",
            "tls.csr",
            "-subj",
            &format!("/CN={TLS_NAME}"),
        ],
        &[
            "x509",
            "-req",
            "-in",
            "tls.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-set_serial",
            "1",
            "-days",
            "2",
            "-extfile",
            "server.ext",
            "-out",
            "tls.crt",
        ],
    ];
    for args in commands {
        eprintln!("    $ openssl {}", shell_words(args));
        let out = run("openssl", "openssl", args, None, Some(&dir), secs(60))
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(
            out.status.success(),
            "`openssl {}` failed ({}): {}",
            shell_words(args),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let file = |key: &str| format!("--from-file={key}={}", dir.join(key).display());
    let (crt, key, ca) = (file("tls.crt"), file("tls.key"), file("ca.crt"));
    kubectl_ok(&[
        "create",
        "secret",
        "generic",
        TLS_SECRET,
        "--type=kubernetes.io/tls",
        &crt,
        &key,
        &ca,
        "-n",
        ns,
    ]);
    // The private keys are in the Secret now; the scratch dir keeps only logs.
    let _ = fs::remove_dir_all(&dir);

    apply_yaml_ok(&format!(
        "apiVersion: {API_VERSION}\nkind: Memcached\nmetadata:\n  name: {TLS_NAME}\n  namespace: {ns}\n\
         spec:\n  size: 1\n  security:\n    tls:\n      secretName: {TLS_SECRET}\n      clientAuth: false\n"
    ));
    env.wait(
        &format!("Deployment {TLS_NAME}: memcached runs with -Z and ssl_chain_cert=, the Secret mounted, a Secret hash"),
        secs(60),
        || {
            let dep = get_required("deployments.apps", ns, TLS_NAME)?;
            let (_, c) = memcached_container(&dep)?;
            let args = string_list(&c["args"]);
            let mut p = Vec::new();
            if !args.iter().any(|a| a == "-Z") {
                p.push(format!("memcached args {args:?} lack -Z"));
            }
            if !args.iter().any(|a| a.contains("ssl_chain_cert=")) {
                p.push(format!("memcached args {args:?} lack ssl_chain_cert="));
            }
            if args.iter().any(|a| a.contains("ssl_ca_cert=")) {
                p.push(format!("memcached args {args:?} ask for client certificates, but clientAuth is false"));
            }
            push_err(&mut p, check_secret_volume(&dep, TLS_SECRET));
            if dep["spec"]["template"]["metadata"]["annotations"][SECRET_HASH_ANNOTATION]
                .as_str()
                .is_none_or(str::is_empty)
            {
                p.push(format!("no {SECRET_HASH_ANNOTATION} on the pod template"));
            }
            result(p, &dep["spec"]["template"])
        },
    );
    env.wait(
        &format!("Memcached {TLS_NAME}: 1 ready pod (memcached started with TLS), Available=True"),
        secs(180),
        || check_ready_status(ns, TLS_NAME, 1),
    );
    let pods = live_pods(ns, TLS_NAME).unwrap_or_else(|e| panic!("{e}"));
    for pod in &pods {
        let restarts: i64 = pod["status"]["containerStatuses"]
            .as_array()
            .map(|cs| cs.iter().filter_map(|c| c["restartCount"].as_i64()).sum())
            .unwrap_or_default();
        assert_eq!(
            restarts,
            0,
            "pod {} restarted {restarts} times (memcached failing to load the certificate?): {}",
            pod["metadata"]["name"],
            compact(&pod["status"]["containerStatuses"])
        );
    }
    eprintln!("    ok: {} TLS pod(s) ready without restarts", pods.len());
    delete_instance(env, TLS_NAME);
}

/// Deletes a Memcached and waits until the operator has removed its finalizer.
fn delete_instance(env: &E2e, name: &str) {
    let ns = env.ns.as_str();
    kubectl_ok(&["delete", MC, name, "-n", ns, "--wait=false"]);
    env.wait(
        &format!("Memcached {name} to be deleted (finalizer removed)"),
        secs(60),
        || gone(MC, ns, name),
    );
}

// ---------------------------------------------------------------------------------------------------------
// Expectations on the operator's objects
// ---------------------------------------------------------------------------------------------------------

fn check_deployment(
    dep: &Value,
    name: &str,
    mc_uid: &str,
    size: i64,
    port: i64,
) -> Result<(), String> {
    let mut p = Vec::new();
    push_err(
        &mut p,
        expect_eq("spec.replicas", &dep["spec"]["replicas"], &json!(size)),
    );
    let selector = &dep["spec"]["selector"];
    push_err(
        &mut p,
        expect_eq(
            "spec.selector.matchLabels",
            &selector["matchLabels"],
            &selector_labels(name),
        ),
    );
    if selector["matchExpressions"]
        .as_array()
        .is_some_and(|e| !e.is_empty())
    {
        p.push(format!(
            "unexpected spec.selector.matchExpressions {}",
            compact(&selector["matchExpressions"])
        ));
    }
    push_err(
        &mut p,
        expect_labels(
            "metadata.labels",
            &dep["metadata"]["labels"],
            &common_labels(name),
        ),
    );
    let template = &dep["spec"]["template"];
    push_err(
        &mut p,
        expect_labels(
            "spec.template.metadata.labels",
            &template["metadata"]["labels"],
            &common_labels(name),
        ),
    );

    let pod = &template["spec"];
    let containers = pod["containers"].as_array().cloned().unwrap_or_default();
    if containers.len() != 1 || containers[0]["name"] != APP_NAME {
        p.push(format!(
            "expected exactly one container named memcached, got {:?}",
            containers
                .iter()
                .map(|c| c["name"].clone())
                .collect::<Vec<_>>()
        ));
    }
    match memcached_container(dep) {
        Err(e) => p.push(e),
        Ok((_, c)) => {
            let cmdline = ["command", "args"]
                .iter()
                .flat_map(|k| c[*k].as_array().cloned().unwrap_or_default())
                .map(|a| a.as_str().unwrap_or_default().to_owned())
                .collect::<Vec<_>>()
                .join(" ");
            for want in [
                format!("-p {port}"),
                "-m 64".to_owned(),
                "-o modern".to_owned(),
            ] {
                if !cmdline.contains(&want) {
                    p.push(format!("container command+args {cmdline:?} lacks {want:?}"));
                }
            }
            let ports = c["ports"].as_array().cloned().unwrap_or_default();
            if !ports
                .iter()
                .any(|x| x["name"] == APP_NAME && x["containerPort"] == port)
            {
                p.push(format!(
                    "no container port named memcached = {port}: {}",
                    compact(&c["ports"])
                ));
            }
            for probe in ["readinessProbe", "livenessProbe"] {
                if !c[probe]["tcpSocket"].is_object() {
                    p.push(format!(
                        "{probe} is not a tcpSocket probe: {}",
                        compact(&c[probe])
                    ));
                }
            }
            let sc = &c["securityContext"];
            push_err(
                &mut p,
                expect_eq(
                    "container allowPrivilegeEscalation",
                    &sc["allowPrivilegeEscalation"],
                    &json!(false),
                ),
            );
            push_err(
                &mut p,
                expect_eq(
                    "container readOnlyRootFilesystem",
                    &sc["readOnlyRootFilesystem"],
                    &json!(true),
                ),
            );
            push_err(
                &mut p,
                expect_eq(
                    "container capabilities.drop",
                    &sc["capabilities"]["drop"],
                    &json!(["ALL"]),
                ),
            );
        }
    }
    let psc = &pod["securityContext"];
    push_err(
        &mut p,
        expect_eq("pod runAsNonRoot", &psc["runAsNonRoot"], &json!(true)),
    );
    push_err(
        &mut p,
        expect_eq(
            "pod seccompProfile.type",
            &psc["seccompProfile"]["type"],
            &json!("RuntimeDefault"),
        ),
    );
    push_err(&mut p, check_owner(dep, name, mc_uid, true));
    result(p, dep)
}

fn check_service(svc: &Value, name: &str, mc_uid: &str, port: i64) -> Result<(), String> {
    let mut p = Vec::new();
    push_err(
        &mut p,
        expect_eq("spec.type", &svc["spec"]["type"], &json!("ClusterIP")),
    );
    let ports = svc["spec"]["ports"].as_array().cloned().unwrap_or_default();
    if !ports
        .iter()
        .any(|x| x["name"] == APP_NAME && x["port"] == port)
    {
        p.push(format!(
            "no service port named memcached = {port}: {}",
            compact(&svc["spec"]["ports"])
        ));
    }
    check_service_identity(&mut p, svc, name, mc_uid, false);
    result(p, svc)
}

/// The object must have a controller ownerReference to the Memcached (and, if `only`, no other owner).
fn check_owner(obj: &Value, name: &str, mc_uid: &str, only: bool) -> Result<(), String> {
    let refs = obj["metadata"]["ownerReferences"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    if only && refs.len() != 1 {
        return Err(format!(
            "expected exactly one ownerReference, got {}",
            compact(&obj["metadata"]["ownerReferences"])
        ));
    }
    let controllers: Vec<&Value> = refs.iter().filter(|r| r["controller"] == true).collect();
    match controllers.as_slice() {
        [r] if r["kind"] == "Memcached"
            && r["apiVersion"] == API_VERSION
            && r["name"] == name
            && r["uid"] == mc_uid =>
        {
            Ok(())
        }
        _ => Err(format!(
            "expected one controller ownerReference to Memcached {name} (uid {mc_uid}), got {}",
            compact(&obj["metadata"]["ownerReferences"])
        )),
    }
}

/// A settled instance: `size` ready pods listed in status, and Available=True, Progressing=False, Degraded=False.
fn check_ready_status(ns: &str, name: &str, size: i64) -> Result<(), String> {
    let mc = get_required(MC, ns, name)?;
    let status = &mc["status"];
    let generation = mc["metadata"]["generation"].as_i64();
    let mut p = Vec::new();
    if generation.is_none() || status["observedGeneration"].as_i64() != generation {
        p.push(format!(
            "status.observedGeneration {} != metadata.generation {}",
            status["observedGeneration"], mc["metadata"]["generation"]
        ));
    }
    push_err(
        &mut p,
        expect_eq("status.replicas", &status["replicas"], &json!(size)),
    );
    push_err(
        &mut p,
        expect_eq(
            "status.readyReplicas",
            &status["readyReplicas"],
            &json!(size),
        ),
    );

    let selector = status["selector"].as_str().unwrap_or_default();
    let got: BTreeSet<&str> = selector
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    let want_pairs = [
        format!("{NAME_KEY}={APP_NAME}"),
        format!("{INSTANCE_KEY}={name}"),
    ];
    let want: BTreeSet<&str> = want_pairs.iter().map(String::as_str).collect();
    if got != want {
        p.push(format!(
            "status.selector {selector:?} should select exactly {want_pairs:?}"
        ));
    }

    let nodes: Vec<String> = status["nodes"]
        .as_array()
        .map(|n| {
            n.iter()
                .map(|x| x.as_str().unwrap_or_default().to_owned())
                .collect()
        })
        .unwrap_or_default();
    if i64::try_from(nodes.len()).ok() != Some(size) {
        p.push(format!(
            "status.nodes has {} names, want {size}: {nodes:?}",
            nodes.len()
        ));
    } else if !nodes.windows(2).all(|w| w[0] < w[1]) {
        p.push(format!(
            "status.nodes is not sorted (or has duplicates): {nodes:?}"
        ));
    }

    for (ty, want) in [
        ("Available", "True"),
        ("Progressing", "False"),
        ("Degraded", "False"),
    ] {
        match condition(&mc, ty) {
            None => p.push(format!("condition {ty} is missing")),
            Some(c) if c["status"] != want => {
                p.push(format!("condition {ty} should be {want}: {}", compact(c)));
            }
            Some(_) => {}
        }
    }
    for c in status["conditions"].as_array().cloned().unwrap_or_default() {
        let ty = c["type"].as_str().unwrap_or("<no type>");
        if c["reason"].as_str().unwrap_or_default().is_empty() {
            p.push(format!("condition {ty} has no reason"));
        }
        if !c["message"].is_string() {
            p.push(format!("condition {ty} has no message"));
        }
        if c["lastTransitionTime"]
            .as_str()
            .unwrap_or_default()
            .is_empty()
        {
            p.push(format!("condition {ty} has no lastTransitionTime"));
        }
        if generation.is_none() || c["observedGeneration"].as_i64() != generation {
            p.push(format!(
                "condition {ty} observedGeneration {} != metadata.generation {}",
                c["observedGeneration"], mc["metadata"]["generation"]
            ));
        }
    }

    if p.is_empty() {
        // Only now (the rest is settled) check that status.nodes names real pods.
        let selector_arg = format!("{INSTANCE_KEY}={name},{NAME_KEY}={APP_NAME}");
        let pods = try_kubectl_json(&["get", "pods", "-n", ns, "-l", &selector_arg, "-o", "json"])?;
        let pod_items = items(&pods);
        let pod_names: BTreeSet<&str> = pod_items
            .iter()
            .filter_map(|x| x["metadata"]["name"].as_str())
            .collect();
        for n in &nodes {
            if !pod_names.contains(n.as_str()) {
                p.push(format!("status.nodes lists {n:?}, which is not a Pod of the instance (pods: {pod_names:?})"));
            }
        }
    }
    result(p, status)
}

fn memcached_container(dep: &Value) -> Result<(usize, &Value), String> {
    dep["spec"]["template"]["spec"]["containers"]
        .as_array()
        .and_then(|cs| cs.iter().enumerate().find(|(_, c)| c["name"] == APP_NAME))
        .ok_or_else(|| "the pod template has no container named memcached".to_owned())
}

fn labels(pairs: &[(&str, &str)]) -> Value {
    Value::Object(
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), Value::String((*v).to_owned())))
            .collect(),
    )
}

fn selector_labels(instance: &str) -> Value {
    labels(&[(NAME_KEY, APP_NAME), (INSTANCE_KEY, instance)])
}

fn common_labels(instance: &str) -> Value {
    labels(&[
        (NAME_KEY, APP_NAME),
        (INSTANCE_KEY, instance),
        (MANAGED_BY_KEY, MANAGER_NAME),
    ])
}

fn expect_eq(what: &str, actual: &Value, want: &Value) -> Result<(), String> {
    if actual == want {
        Ok(())
    } else {
        Err(format!(
            "{what} is {}, want {}",
            compact(actual),
            compact(want)
        ))
    }
}

/// `actual` must contain every label of `want` (more labels are fine).
fn expect_labels(what: &str, actual: &Value, want: &Value) -> Result<(), String> {
    let missing: Vec<String> = want
        .as_object()
        .map(|w| {
            w.iter()
                .filter(|(k, v)| actual.get(k.as_str()) != Some(*v))
                .map(|(k, v)| format!("{k}={v}"))
                .collect()
        })
        .unwrap_or_default();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{what} {} lacks {}",
            compact(actual),
            missing.join(", ")
        ))
    }
}

fn push_err(problems: &mut Vec<String>, check: Result<(), String>) {
    if let Err(e) = check {
        problems.push(e);
    }
}

/// `Ok` without problems, else an error listing them followed by the observed object.
fn result(problems: Vec<String>, observed: &Value) -> Result<(), String> {
    if problems.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{}\n    observed: {}",
            problems.join("; "),
            compact(observed)
        ))
    }
}

fn condition<'a>(obj: &'a Value, ty: &str) -> Option<&'a Value> {
    obj["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == ty)
}

fn condition_status<'a>(obj: &'a Value, ty: &str) -> Option<&'a str> {
    condition(obj, ty)?["status"].as_str()
}

/// The production instance's Deployment: rollout strategy, memcached flags, graceful stop, anti-affinity,
/// resources, restricted security contexts and, when `exporter`, the exporter sidecar.
fn check_production_deployment(
    dep: &Value,
    want: &Production,
    exporter: bool,
) -> Result<(), String> {
    let mut p = Vec::new();
    push_err(
        &mut p,
        expect_eq("spec.replicas", &dep["spec"]["replicas"], &json!(want.size)),
    );
    push_err(
        &mut p,
        expect_eq(
            "spec.selector.matchLabels",
            &dep["spec"]["selector"]["matchLabels"],
            &selector_labels(PRODUCTION),
        ),
    );
    push_err(
        &mut p,
        expect_labels(
            "metadata.labels",
            &dep["metadata"]["labels"],
            &common_labels(PRODUCTION),
        ),
    );
    let strategy = &dep["spec"]["strategy"];
    push_err(
        &mut p,
        expect_eq(
            "spec.strategy.type",
            &strategy["type"],
            &json!("RollingUpdate"),
        ),
    );
    push_err(
        &mut p,
        expect_eq(
            "spec.strategy.rollingUpdate",
            &strategy["rollingUpdate"],
            &json!({"maxUnavailable": 0, "maxSurge": 1}),
        ),
    );

    let pod = &dep["spec"]["template"]["spec"];
    let want_containers: &[&str] = if exporter {
        &[APP_NAME, EXPORTER_NAME]
    } else {
        &[APP_NAME]
    };
    let containers = names(&pod["containers"]);
    if containers != want_containers {
        p.push(format!(
            "pod template containers are {containers:?}, want {want_containers:?}"
        ));
    }
    match memcached_container(dep) {
        Err(e) => p.push(e),
        Ok((_, c)) => {
            if let Some(image) = &want.image {
                push_err(
                    &mut p,
                    expect_eq("memcached image", &c["image"], &json!(image)),
                );
            }
            let cmdline = command_line(c);
            for piece in
                std::iter::once(format!("-p {}", want.port)).chain(want.args.iter().cloned())
            {
                if !cmdline.contains(&piece) {
                    p.push(format!(
                        "memcached command line {cmdline:?} lacks {piece:?}"
                    ));
                }
            }
            push_err(
                &mut p,
                expect_eq(
                    "memcached lifecycle.preStop.exec.command",
                    &c["lifecycle"]["preStop"]["exec"]["command"],
                    &want.pre_stop,
                ),
            );
            push_err(
                &mut p,
                expect_eq("memcached resources", &c["resources"], &want.resources),
            );
            p.extend(check_restricted("memcached", c));
        }
    }
    if exporter {
        match named(&pod["containers"], EXPORTER_NAME) {
            None => p.push("no exporter container".into()),
            Some(c) => {
                let ports = c["ports"].as_array().cloned().unwrap_or_default();
                if !ports
                    .iter()
                    .any(|x| x["name"] == METRICS_PORT_NAME && x["containerPort"] == METRICS_PORT)
                {
                    p.push(format!(
                        "exporter has no port {METRICS_PORT_NAME} = {METRICS_PORT}: {}",
                        compact(&c["ports"])
                    ));
                }
                let address = format!("--memcached.address=localhost:{}", want.port);
                if !string_list(&c["args"]).contains(&address) {
                    p.push(format!(
                        "exporter args {} lack {address}",
                        compact(&c["args"])
                    ));
                }
                p.extend(check_restricted("exporter", c));
            }
        }
    }
    push_err(
        &mut p,
        expect_eq(
            "terminationGracePeriodSeconds",
            &pod["terminationGracePeriodSeconds"],
            &want.grace_period,
        ),
    );
    let psc = &pod["securityContext"];
    push_err(
        &mut p,
        expect_eq("pod runAsNonRoot", &psc["runAsNonRoot"], &json!(true)),
    );
    push_err(
        &mut p,
        expect_eq(
            "pod seccompProfile.type",
            &psc["seccompProfile"]["type"],
            &json!("RuntimeDefault"),
        ),
    );
    let preferred =
        &pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"];
    match preferred.as_array().map(Vec::as_slice) {
        Some([term]) => {
            let affinity_term = &term["podAffinityTerm"];
            push_err(
                &mut p,
                expect_eq(
                    "podAntiAffinity topologyKey",
                    &affinity_term["topologyKey"],
                    &json!(HOSTNAME_TOPOLOGY),
                ),
            );
            push_err(
                &mut p,
                expect_eq(
                    "podAntiAffinity labelSelector.matchLabels",
                    &affinity_term["labelSelector"]["matchLabels"],
                    &selector_labels(PRODUCTION),
                ),
            );
        }
        _ => p.push(format!(
            "expected one preferred podAntiAffinity term (antiAffinity: soft), got {}",
            compact(&pod["affinity"])
        )),
    }
    push_err(&mut p, check_owner(dep, PRODUCTION, &want.uid, true));
    result(p, dep)
}

/// The restricted-profile container security context.
fn check_restricted(container: &str, c: &Value) -> Vec<String> {
    let sc = &c["securityContext"];
    let mut p = Vec::new();
    for (field, value, want) in [
        (
            "allowPrivilegeEscalation",
            &sc["allowPrivilegeEscalation"],
            json!(false),
        ),
        (
            "readOnlyRootFilesystem",
            &sc["readOnlyRootFilesystem"],
            json!(true),
        ),
        ("runAsNonRoot", &sc["runAsNonRoot"], json!(true)),
        (
            "capabilities.drop",
            &sc["capabilities"]["drop"],
            json!(["ALL"]),
        ),
    ] {
        push_err(
            &mut p,
            expect_eq(&format!("{container} {field}"), value, &want),
        );
    }
    p
}

/// The client Service of the production instance: its ports (memcached, and metrics with the exporter)
/// and the sample's annotations.
fn check_client_service(svc: &Value, want: &Production, exporter: bool) -> Result<(), String> {
    let mut p = Vec::new();
    push_err(
        &mut p,
        check_service(svc, PRODUCTION, &want.uid, want.service_port),
    );
    let mut expected =
        vec![json!({"name": APP_NAME, "port": want.service_port, "targetPort": APP_NAME})];
    if exporter {
        expected.push(json!({"name": METRICS_PORT_NAME, "port": METRICS_PORT, "targetPort": METRICS_PORT_NAME}));
    }
    let ports: Vec<Value> = svc["spec"]["ports"]
        .as_array()
        .map(|ports| {
            ports
                .iter()
                .map(|x| json!({"name": x["name"], "port": x["port"], "targetPort": x["targetPort"]}))
                .collect()
        })
        .unwrap_or_default();
    push_err(
        &mut p,
        expect_eq("spec.ports", &json!(ports), &json!(expected)),
    );
    push_err(
        &mut p,
        expect_labels(
            "metadata.annotations",
            &svc["metadata"]["annotations"],
            &want.service_annotations,
        ),
    );
    result(p, svc)
}

/// What every Service of an instance carries: the pod selector, the common labels, the owner reference.
fn check_service_identity(
    p: &mut Vec<String>,
    svc: &Value,
    name: &str,
    mc_uid: &str,
    only_owner: bool,
) {
    push_err(
        p,
        expect_eq(
            "spec.selector",
            &svc["spec"]["selector"],
            &selector_labels(name),
        ),
    );
    push_err(
        p,
        expect_labels(
            "metadata.labels",
            &svc["metadata"]["labels"],
            &common_labels(name),
        ),
    );
    push_err(p, check_owner(svc, name, mc_uid, only_owner));
}

fn check_headless_service(svc: &Value, name: &str, mc_uid: &str, port: i64) -> Result<(), String> {
    let mut p = Vec::new();
    push_err(
        &mut p,
        expect_eq("spec.clusterIP", &svc["spec"]["clusterIP"], &json!("None")),
    );
    let ports = names(&svc["spec"]["ports"]);
    if ports != [APP_NAME] {
        p.push(format!(
            "headless Service ports are {ports:?}, want [memcached]"
        ));
    }
    push_err(
        &mut p,
        expect_eq(
            "spec.ports[0].port",
            &svc["spec"]["ports"][0]["port"],
            &json!(port),
        ),
    );
    check_service_identity(&mut p, svc, name, mc_uid, true);
    result(p, svc)
}

fn check_pdb(pdb: &Value, name: &str, want: &Production) -> Result<(), String> {
    let mut p = Vec::new();
    push_err(
        &mut p,
        expect_eq(
            "spec.maxUnavailable",
            &pdb["spec"]["maxUnavailable"],
            &want.pdb_max_unavailable,
        ),
    );
    if !pdb["spec"]["minAvailable"].is_null() {
        p.push(format!(
            "unexpected spec.minAvailable {}",
            pdb["spec"]["minAvailable"]
        ));
    }
    push_err(
        &mut p,
        expect_eq(
            "spec.selector.matchLabels",
            &pdb["spec"]["selector"]["matchLabels"],
            &selector_labels(name),
        ),
    );
    push_err(
        &mut p,
        expect_labels(
            "metadata.labels",
            &pdb["metadata"]["labels"],
            &common_labels(name),
        ),
    );
    push_err(&mut p, check_owner(pdb, name, &want.uid, true));
    result(p, pdb)
}

/// `status.serverList` must hold `size` sorted `<podIP>:<port>` entries, exactly those of the ready pods.
fn check_server_list(ns: &str, name: &str, size: i64, port: i64) -> Result<Vec<String>, String> {
    let mc = get_required(MC, ns, name)?;
    let list = string_list(&mc["status"]["serverList"]);
    let mut ready: Vec<String> = live_pods(ns, name)?
        .iter()
        .filter(|pod| pod_ready(pod))
        .filter_map(|pod| pod["status"]["podIP"].as_str().filter(|ip| !ip.is_empty()))
        .map(|ip| {
            if ip.contains(':') {
                format!("[{ip}]:{port}")
            } else {
                format!("{ip}:{port}")
            }
        })
        .collect();
    ready.sort();
    let mut p = Vec::new();
    if i64::try_from(list.len()).ok() != Some(size) {
        p.push(format!(
            "status.serverList has {} entries, want {size}: {list:?}",
            list.len()
        ));
    }
    if !list.windows(2).all(|w| w[0] < w[1]) {
        p.push(format!(
            "status.serverList is not sorted (or has duplicates): {list:?}"
        ));
    }
    if list != ready {
        p.push(format!(
            "status.serverList {list:?} != the ready pods' <podIP>:{port} {ready:?}"
        ));
    }
    if p.is_empty() {
        Ok(list)
    } else {
        Err(p.join("; "))
    }
}

/// The auth instance's Deployment: the Secret hash annotation (returned), `-Y`, and the Secret volume.
fn check_auth_deployment(dep: &Value) -> Result<String, String> {
    let mut p = Vec::new();
    let hash = dep["spec"]["template"]["metadata"]["annotations"][SECRET_HASH_ANNOTATION]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    if hash.len() != 64 || !hash.bytes().all(|b| b.is_ascii_hexdigit()) {
        p.push(format!(
            "pod template annotation {SECRET_HASH_ANNOTATION} is {hash:?}, want a SHA-256 in hex"
        ));
    }
    match memcached_container(dep) {
        Err(e) => p.push(e),
        Ok((_, c)) => {
            let cmdline = command_line(c);
            if !cmdline.contains(AUTH_FILE_ARG) {
                p.push(format!(
                    "memcached command line {cmdline:?} lacks {AUTH_FILE_ARG:?}"
                ));
            }
        }
    }
    push_err(&mut p, check_secret_volume(dep, AUTH_SECRET));
    result(p, &dep["spec"]["template"]).map(|()| hash)
}

/// The pod template mounts Secret `secret` read-only into the memcached container.
fn check_secret_volume(dep: &Value, secret: &str) -> Result<(), String> {
    let pod = &dep["spec"]["template"]["spec"];
    let volume = pod["volumes"]
        .as_array()
        .and_then(|vs| vs.iter().find(|v| v["secret"]["secretName"] == secret))
        .ok_or_else(|| format!("no volume of Secret {secret}: {}", compact(&pod["volumes"])))?;
    let (_, c) = memcached_container(dep)?;
    let mounted = c["volumeMounts"].as_array().is_some_and(|ms| {
        ms.iter()
            .any(|m| m["name"] == volume["name"] && m["readOnly"] == true)
    });
    if mounted {
        Ok(())
    } else {
        Err(format!(
            "the memcached container does not mount volume {} read-only: {}",
            volume["name"],
            compact(&c["volumeMounts"])
        ))
    }
}

/// `Degraded=True` with `reason`, and a message containing `mention`.
fn expect_degraded(mc: &Value, reason: &str, mention: &str) -> Result<(), String> {
    match condition(mc, "Degraded") {
        Some(c)
            if c["status"] == "True"
                && c["reason"] == reason
                && c["message"].as_str().is_some_and(|m| m.contains(mention)) =>
        {
            Ok(())
        }
        Some(c) => Err(format!(
            "Degraded condition is {}, want True/{reason} with a message mentioning {mention:?}",
            compact(c)
        )),
        None => Err(format!(
            "no Degraded condition; status {}",
            compact(&mc["status"])
        )),
    }
}

/// Fails the test at once when pods are refused (the Deployment's ReplicaFailure, e.g. Pod Security
/// admission): waiting longer cannot help.
fn refuse_replica_failure(mc: &Value) {
    if let Some(c) = condition(mc, "Degraded")
        && c["status"] == "True"
        && c["reason"] == "ReplicaFailure"
    {
        panic!(
            "Memcached {} is Degraded with reason ReplicaFailure: its pods are refused (in a namespace \
             enforcing Pod Security {POD_SECURITY_LEVEL}): {}",
            mc["metadata"]["name"],
            compact(c)
        );
    }
}

fn deployment_condition<'a>(dep: &'a Value, ty: &str) -> Option<&'a Value> {
    dep["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == ty)
}

/// The instance's pods that are not being deleted.
fn live_pods(ns: &str, name: &str) -> Result<Vec<Value>, String> {
    let selector = format!("{INSTANCE_KEY}={name},{NAME_KEY}={APP_NAME}");
    let pods = try_kubectl_json(&["get", "pods", "-n", ns, "-l", &selector, "-o", "json"])?;
    Ok(items(&pods)
        .into_iter()
        .filter(|pod| pod["metadata"]["deletionTimestamp"].is_null())
        .collect())
}

fn pod_ready(pod: &Value) -> bool {
    pod["status"]["conditions"].as_array().is_some_and(|cs| {
        cs.iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "True")
    })
}

/// `command` and `args` of a container, joined by spaces.
fn command_line(c: &Value) -> String {
    ["command", "args"]
        .iter()
        .flat_map(|k| string_list(&c[*k]))
        .collect::<Vec<_>>()
        .join(" ")
}

fn string_list(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .map(|x| x.as_str().unwrap_or_default().to_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// The `name`s of a list of containers, ports, ...
fn names(list: &Value) -> Vec<String> {
    list.as_array()
        .map(|a| {
            a.iter()
                .map(|x| x["name"].as_str().unwrap_or_default().to_owned())
                .collect()
        })
        .unwrap_or_default()
}

fn named<'a>(list: &'a Value, name: &str) -> Option<&'a Value> {
    list.as_array()?.iter().find(|x| x["name"] == name)
}

// ---------------------------------------------------------------------------------------------------------
// Events and the leader lease
// ---------------------------------------------------------------------------------------------------------

/// An event from either events.k8s.io/v1 (`regarding`) or core/v1 (`involvedObject`).
struct Event {
    type_: String,
    reason: String,
    kind: String,
    name: String,
    uid: String,
    note: String,
}

fn list_events(ns: &str) -> Result<Vec<Event>, String> {
    let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
    let mut events = Vec::new();
    let mut errors = Vec::new();
    match try_kubectl_json(&["get", "events.events.k8s.io", "-n", ns, "-o", "json"]) {
        Ok(list) => events.extend(items(&list).iter().map(|e| Event {
            type_: text(&e["type"]),
            reason: text(&e["reason"]),
            kind: text(&e["regarding"]["kind"]),
            name: text(&e["regarding"]["name"]),
            uid: text(&e["regarding"]["uid"]),
            note: text(&e["note"]),
        })),
        Err(e) => errors.push(e),
    }
    match try_kubectl_json(&["get", "events", "-n", ns, "-o", "json"]) {
        Ok(list) => events.extend(items(&list).iter().map(|e| Event {
            type_: text(&e["type"]),
            reason: text(&e["reason"]),
            kind: text(&e["involvedObject"]["kind"]),
            name: text(&e["involvedObject"]["name"]),
            uid: text(&e["involvedObject"]["uid"]),
            note: text(&e["message"]),
        })),
        Err(e) => errors.push(e),
    }
    if errors.len() == 2 {
        return Err(errors.join("; "));
    }
    Ok(events)
}

fn summarize_events(events: &[Event]) -> String {
    if events.is_empty() {
        return "<none>".into();
    }
    let seen: BTreeSet<String> = events
        .iter()
        .map(|e| {
            format!(
                "{} {} {}/{}: {}",
                e.type_,
                e.reason,
                e.kind,
                e.name,
                truncate(&e.note, 100)
            )
        })
        .collect();
    truncate(&seen.into_iter().collect::<Vec<_>>().join(" | "), 3000)
}

/// `spec.holderIdentity` (empty when unheld) and `spec.leaseDurationSeconds` of the leader Lease.
fn lease_holder() -> Result<(String, Option<i64>), String> {
    let lease = try_kubectl_json(&[
        "get",
        "leases.coordination.k8s.io",
        LEASE,
        "-n",
        OPERATOR_NS,
        "-o",
        "json",
    ])?;
    Ok((
        lease["spec"]["holderIdentity"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
        lease["spec"]["leaseDurationSeconds"].as_i64(),
    ))
}

fn holder_contains(identity: &str) -> Result<(), String> {
    let (holder, _) = lease_holder()?;
    if holder.contains(identity) {
        Ok(())
    } else {
        Err(format!(
            "spec.holderIdentity is {holder:?}, want it to contain {identity:?}"
        ))
    }
}

/// `Ok` once an event in `ns` matches `pred`; else the events seen.
fn expect_event(ns: &str, pred: impl Fn(&Event) -> bool) -> Result<(), String> {
    let events = list_events(ns)?;
    if events.iter().any(pred) {
        Ok(())
    } else {
        Err(format!("events in {ns}: {}", summarize_events(&events)))
    }
}

/// Whether the cluster serves the Prometheus Operator's ServiceMonitor (`kubectl api-resources`).
fn service_monitors_served() -> bool {
    let out = kubectl(&[
        "api-resources",
        "--api-group=monitoring.coreos.com",
        "-o",
        "name",
    ]);
    if !out.status.success() {
        // Discovery can fail for an unrelated group while still listing this one.
        eprintln!(
            "    (kubectl api-resources: {})",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .any(|l| l.trim() == SERVICE_MONITORS)
}

// ---------------------------------------------------------------------------------------------------------
// Test environment: setup, the operator processes, and cleanup
// ---------------------------------------------------------------------------------------------------------

/// One operator process started by the test.
struct Operator {
    info: OpInfo,
    child: Child,
    /// False once the test stops it on purpose, so its exit is not reported as a crash.
    expect_running: bool,
}

/// What the test needs to know about an operator process.
#[derive(Clone)]
struct OpInfo {
    index: usize,
    label: String,
    /// The POD_NAME given to it; the leader Lease's holderIdentity must contain it.
    identity: String,
    pid: u32,
    probe_port: u16,
    metrics_port: u16,
    log: PathBuf,
}

/// Shared state of the run; its `Drop` is the cleanup step, so it also runs after a failed assertion.
struct E2e {
    started: Instant,
    ns: String,
    dir: PathBuf,
    keep: bool,
    ns_created: bool,
    kubeconfig: Option<PathBuf>,
    /// The rendered install manifest (without the Deployment), once written.
    install_manifest: Option<PathBuf>,
    /// Install objects ("Kind/namespace/name") that existed before the test; they are left in place.
    /// `None` means this could not be determined, and then nothing is uninstalled.
    preexisting: Option<BTreeSet<String>>,
    operators: RefCell<Vec<Operator>>,
}

impl E2e {
    fn new() -> Self {
        let pid = std::process::id();
        let stamp = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or_default();
        let ns = format!("memcached-e2e-{pid}-{}", stamp % 1_000_000);
        let dir = std::env::temp_dir().join(format!("memcached-e2e-{pid}-{stamp}"));
        fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
        E2e {
            started: Instant::now(),
            ns,
            dir,
            keep: std::env::var("E2E_KEEP").is_ok_and(|v| v == "1"),
            ns_created: false,
            kubeconfig: None,
            install_manifest: None,
            preexisting: None,
            operators: RefCell::new(Vec::new()),
        }
    }

    fn step(&self, n: u32, title: &str) {
        eprintln!(
            "\n==> step {n}: {title}  [t+{}s]",
            self.started.elapsed().as_secs()
        );
    }

    /// Creates the test namespace, enforcing (and warning and auditing with) the `restricted` Pod Security
    /// Standard, so every pod the operator makes in it must meet that standard to be admitted.
    fn create_test_namespace(&mut self) {
        self.ns_created = true;
        let psa: String = ["enforce", "warn", "audit"]
            .iter()
            .map(|mode| {
                format!(
                    "    pod-security.kubernetes.io/{mode}: {POD_SECURITY_LEVEL}\n    \
                     pod-security.kubernetes.io/{mode}-version: latest\n"
                )
            })
            .collect();
        apply_yaml_ok(&format!(
            "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {}\n  labels:\n    app.kubernetes.io/created-by: {FIELD_MANAGER}\n{psa}",
            self.ns
        ));
    }

    /// The namespace carries the Pod Security labels, and the API server enforces them: a server-side dry run
    /// of a pod without any security context must be refused. Where it is not (Pod Security admission
    /// disabled), the later "admitted under restricted" checks prove nothing, which is reported loudly.
    fn check_pod_security(&self) {
        let ns = self.ns.as_str();
        let namespace = kubectl_json(&["get", "namespace", ns, "-o", "json"]);
        for mode in ["enforce", "warn", "audit"] {
            let key = format!("pod-security.kubernetes.io/{mode}");
            assert_eq!(
                namespace["metadata"]["labels"][&key],
                json!(POD_SECURITY_LEVEL),
                "namespace {ns} should be labelled {key}={POD_SECURITY_LEVEL}: {}",
                compact(&namespace["metadata"]["labels"])
            );
        }
        let probe = format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: e2e-psa-probe\n  namespace: {ns}\n\
             spec:\n  containers:\n  - name: probe\n    image: {BAD_IMAGE}\n"
        );
        let out = run_kubectl(&["apply", "--dry-run=server", "-f", "-"], Some(&probe));
        let stderr = String::from_utf8_lossy(&out.stderr).trim().to_owned();
        if out.status.success() {
            eprintln!(
                "    WARNING: a pod without a security context was admitted (server-side dry run) in {ns}: Pod \
                 Security admission does not enforce here, so steps 12 to 18 cannot show that the operator's \
                 pods meet the restricted standard"
            );
        } else if stderr.contains("PodSecurity") {
            eprintln!(
                "    ok: Pod Security admission refuses a non-compliant pod in {ns}: {}",
                truncate(&stderr, 300)
            );
        } else {
            panic!(
                "the server-side dry run of a non-compliant pod in {ns} failed, but not because of Pod \
                 Security admission: {stderr}"
            );
        }
    }

    /// Renders config/default, applies everything except Deployments, and waits for the CRD.
    fn install(&mut self) {
        let render = run(
            "kubectl",
            &kubectl_bin(),
            &["kustomize", "config/default"],
            None,
            Some(Path::new(REPO_ROOT)),
            secs(KUBECTL_TIMEOUT_SECS),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert!(
            render.status.success(),
            "`kubectl kustomize config/default` failed in {REPO_ROOT}:\n{}",
            String::from_utf8_lossy(&render.stderr)
        );
        let rendered = String::from_utf8_lossy(&render.stdout).into_owned();
        let mut kept = Vec::new();
        let mut kinds = Vec::new();
        for doc in split_yaml_documents(&rendered) {
            let kind = top_level_kind(&doc).unwrap_or_default();
            if kind == "Deployment" {
                eprintln!(
                    "    not applying the operator Deployment (the operator runs as a local process)"
                );
                continue;
            }
            kinds.push(kind);
            kept.push(doc);
        }
        for needed in [
            "Namespace",
            "CustomResourceDefinition",
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
            "Role",
            "RoleBinding",
        ] {
            assert!(
                kinds.iter().any(|k| k == needed),
                "`kubectl kustomize config/default` rendered no {needed} (kinds: {kinds:?})"
            );
        }
        eprintln!("    applying {} objects: {}", kinds.len(), kinds.join(", "));
        let manifest = kept.iter().map(|d| format!("---\n{d}")).collect::<String>();
        let path = self.dir.join("install.yaml");
        fs::write(&path, &manifest)
            .unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
        let path_arg = path.to_string_lossy().into_owned();

        // Remember what exists already, so that cleanup removes only what this test created.
        self.preexisting = match try_kubectl_json(&[
            "get",
            "-f",
            &path_arg,
            "--ignore-not-found",
            "-o",
            "json",
        ]) {
            Ok(v) => Some(items(&v).iter().map(object_key).collect()),
            Err(e) => {
                eprintln!(
                    "    WARNING: cannot tell which install objects exist already ({e}); they will not be uninstalled"
                );
                None
            }
        };
        if let Some(pre) = self.preexisting.as_ref().filter(|p| !p.is_empty()) {
            eprintln!("    already present (left in place on cleanup): {pre:?}");
        }
        self.install_manifest = Some(path);

        let out = run_kubectl(
            &[
                "apply",
                "--server-side",
                "--force-conflicts",
                "--field-manager",
                FIELD_MANAGER,
                "-f",
                "-",
            ],
            Some(&manifest),
        );
        assert!(
            out.status.success(),
            "applying the install manifest failed:\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        eprint!("{}", indent(&String::from_utf8_lossy(&out.stdout)));

        kubectl_ok(&[
            "wait",
            "--for=condition=Established",
            &format!("crd/{CRD}"),
            &format!("--timeout={}s", secs(60).as_secs()),
        ]);
        let ns = self.ns.clone();
        self.wait(
            "kubectl to discover the memcacheds resource",
            secs(30),
            || try_kubectl(&["get", MC, "-n", &ns]).map(drop),
        );
    }

    /// Sanity check of the RBAC the operator will run with (cluster admins may impersonate).
    fn check_rbac(&self) {
        let ns = self.ns.as_str();
        let checks: [(&[&str], bool, bool); 11] = [
            (&["create", "deployments.apps", "-n", ns], true, true),
            (&["delete", "namespaces"], false, true),
            // Secrets are read (for their hash), never written.
            (&["get", "secrets", "-n", ns], true, true),
            (&["watch", "secrets", "-n", ns], true, true),
            (&["create", "secrets", "-n", ns], false, true),
            (&["delete", PDB, "-n", ns], true, true),
            (&["create", SERVICE_MONITORS, "-n", ns], true, false),
            (&["create", "services", "-n", ns], true, false),
            (&["watch", MC, "-n", ns], true, false),
            (
                &["patch", MC, "--subresource=status", "-n", ns],
                true,
                false,
            ),
            (
                &["update", "leases.coordination.k8s.io", "-n", OPERATOR_NS],
                true,
                false,
            ),
        ];
        let who = format!("--as=system:serviceaccount:{OPERATOR_NS}:{SERVICE_ACCOUNT}");
        for (args, want, hard) in checks {
            let mut full = vec!["auth", "can-i", who.as_str()];
            full.extend_from_slice(args);
            let out = kubectl(&full);
            let answer = String::from_utf8_lossy(&out.stdout).trim().to_owned();
            let allowed = if answer.starts_with("yes") {
                true
            } else if answer.starts_with("no") {
                false
            } else {
                panic!(
                    "`kubectl {}` gave no answer (is impersonation allowed?): {}",
                    shell_words(&full),
                    String::from_utf8_lossy(&out.stderr)
                );
            };
            let verdict = if allowed == want {
                "ok"
            } else if hard {
                "FAIL"
            } else {
                "WARN"
            };
            eprintln!(
                "    {verdict}: can-i {} -> {answer} (want {})",
                args.join(" "),
                if want { "yes" } else { "no" }
            );
            assert!(
                !hard || allowed == want,
                "ServiceAccount {OPERATOR_NS}/{SERVICE_ACCOUNT}: `can-i {}` is {answer:?}, want {}",
                args.join(" "),
                if want { "yes" } else { "no" }
            );
        }
    }

    /// Writes a kubeconfig for the current cluster that authenticates as the operator's ServiceAccount.
    fn write_operator_kubeconfig(&mut self) {
        let with_duration = kubectl(&[
            "create",
            "token",
            SERVICE_ACCOUNT,
            "-n",
            OPERATOR_NS,
            "--duration=2h",
        ]);
        let token = if with_duration.status.success() {
            String::from_utf8_lossy(&with_duration.stdout)
                .trim()
                .to_owned()
        } else {
            eprintln!(
                "    `kubectl create token --duration=2h` failed ({}); retrying without --duration",
                String::from_utf8_lossy(&with_duration.stderr).trim()
            );
            kubectl_ok(&["create", "token", SERVICE_ACCOUNT, "-n", OPERATOR_NS])
                .trim()
                .to_owned()
        };
        assert!(!token.is_empty(), "`kubectl create token` printed no token");

        let config = kubectl_json(&["config", "view", "--minify", "--flatten", "-o", "json"]);
        let cluster = &config["clusters"][0]["cluster"];
        let server = cluster["server"]
            .as_str()
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| {
                panic!(
                    "current kubeconfig context has no cluster server: {}",
                    compact(&config["clusters"])
                )
            });
        let mut cluster_yaml = format!("    server: {}\n", yaml_str(server));
        if let Some(data) = cluster["certificate-authority-data"].as_str() {
            cluster_yaml += &format!("    certificate-authority-data: {}\n", yaml_str(data));
        } else if let Some(file) = cluster["certificate-authority"].as_str() {
            cluster_yaml += &format!(
                "    certificate-authority: {}\n",
                yaml_str(&absolute_ca_path(file))
            );
        }
        if cluster["insecure-skip-tls-verify"] == true {
            cluster_yaml += "    insecure-skip-tls-verify: true\n";
        }
        for key in ["tls-server-name", "proxy-url"] {
            if let Some(v) = cluster[key].as_str() {
                cluster_yaml += &format!("    {key}: {}\n", yaml_str(v));
            }
        }
        let kubeconfig = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: e2e\n  cluster:\n{cluster_yaml}\
             users:\n- name: {SERVICE_ACCOUNT}\n  user:\n    token: {}\n\
             contexts:\n- name: e2e\n  context:\n    cluster: e2e\n    user: {SERVICE_ACCOUNT}\n    namespace: {}\n\
             current-context: e2e\n",
            yaml_str(&token),
            yaml_str(&self.ns)
        );
        let path = self.dir.join("operator.kubeconfig");
        self.kubeconfig = Some(path.clone());
        write_private(&path, &kubeconfig);
        eprintln!(
            "    operator kubeconfig (ServiceAccount token for {server}): {}",
            path.display()
        );
    }

    /// Starts `memcached-operator run` as a local process with the ServiceAccount kubeconfig.
    fn start_operator(&self, label: &str) -> OpInfo {
        let kubeconfig = self
            .kubeconfig
            .clone()
            .expect("operator kubeconfig is written first");
        let identity = format!("e2e-{}-{label}", std::process::id());
        let (probe_port, metrics_port) = two_free_ports();
        let metrics = format!("127.0.0.1:{metrics_port}");
        let probe = format!("127.0.0.1:{probe_port}");
        let args = [
            "run",
            "--namespace",
            &self.ns,
            "--leader-elect",
            "--leader-election-namespace",
            OPERATOR_NS,
            "--metrics-bind-address",
            &metrics,
            "--health-probe-bind-address",
            &probe,
            "--log-level",
            "debug",
        ];
        let log = self.dir.join(format!("operator-{label}.log"));
        let mut file = fs::File::create(&log)
            .unwrap_or_else(|e| panic!("cannot create {}: {e}", log.display()));
        let _ = writeln!(
            file,
            "# e2e: KUBECONFIG={} POD_NAME={identity} {OPERATOR_BIN} {}",
            kubeconfig.display(),
            shell_words(&args)
        );
        let stderr = file
            .try_clone()
            .unwrap_or_else(|e| panic!("cannot reopen {}: {e}", log.display()));
        let child = Command::new(OPERATOR_BIN)
            .args(args)
            .env("KUBECONFIG", &kubeconfig)
            .env("POD_NAME", &identity)
            .env("POD_NAMESPACE", OPERATOR_NS)
            .stdin(Stdio::null())
            .stdout(file)
            .stderr(stderr)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {OPERATOR_BIN}: {e}"));
        let mut operators = self.operators.borrow_mut();
        let info = OpInfo {
            index: operators.len(),
            label: label.to_owned(),
            identity,
            pid: child.id(),
            probe_port,
            metrics_port,
            log,
        };
        eprintln!(
            "    started operator '{label}' pid {} POD_NAME={} probes {probe} metrics {metrics}, log {}",
            info.pid,
            info.identity,
            info.log.display()
        );
        operators.push(Operator {
            info: info.clone(),
            child,
            expect_running: true,
        });
        info
    }

    /// Label and log file of every operator started so far.
    fn operator_logs(&self) -> Vec<(String, PathBuf)> {
        self.operators
            .borrow()
            .iter()
            .map(|o| (o.info.label.clone(), o.info.log.clone()))
            .collect()
    }

    /// Panics right away if an operator that should be running has exited.
    fn assert_operators_alive(&self) {
        let mut crashed = None;
        for op in self
            .operators
            .borrow_mut()
            .iter_mut()
            .filter(|o| o.expect_running)
        {
            if let Ok(Some(status)) = op.child.try_wait() {
                op.expect_running = false;
                crashed = Some(format!(
                    "operator '{}' (pid {}) exited unexpectedly with {status}; log: {}",
                    op.info.label,
                    op.info.pid,
                    op.info.log.display()
                ));
                break;
            }
        }
        if let Some(message) = crashed {
            panic!("{message}");
        }
    }

    /// `wait_for`, failing fast when an operator process dies meanwhile.
    fn wait<T>(
        &self,
        desc: &str,
        timeout: Duration,
        mut check: impl FnMut() -> Result<T, String>,
    ) -> T {
        wait_for(desc, timeout, || {
            self.assert_operators_alive();
            check()
        })
    }

    /// `hold_for`, failing fast when an operator process dies meanwhile.
    fn hold(&self, desc: &str, duration: Duration, mut check: impl FnMut() -> Result<(), String>) {
        hold_for(desc, duration, || {
            self.assert_operators_alive();
            check()
        })
    }

    fn wait_http(&self, op: &OpInfo, path: &str, timeout: Duration) {
        self.wait(
            &format!(
                "GET http://127.0.0.1:{}{path} of operator '{}' to return 200",
                port_for(op, path),
                op.label
            ),
            timeout,
            || match http_get(port_for(op, path), path)? {
                (200, _) => Ok(()),
                (code, body) => Err(format!("HTTP {code}: {}", truncate(&body, 500))),
            },
        );
    }

    /// Sends SIGTERM and waits for the process to exit; returns its exit status.
    fn terminate(&self, op: &OpInfo, timeout: Duration) -> ExitStatus {
        self.operators.borrow_mut()[op.index].expect_running = false;
        eprintln!("    $ kill -TERM {}  (operator '{}')", op.pid, op.label);
        let out = run(
            "kill",
            "kill",
            &["-TERM", &op.pid.to_string()],
            None,
            None,
            Duration::from_secs(10),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert!(
            out.status.success(),
            "kill -TERM {} failed: {}",
            op.pid,
            String::from_utf8_lossy(&out.stderr)
        );
        wait_for(
            &format!(
                "operator '{}' (pid {}) to exit after SIGTERM",
                op.label, op.pid
            ),
            timeout,
            || match self.operators.borrow_mut()[op.index].child.try_wait() {
                Ok(Some(status)) => Ok(status),
                Ok(None) => Err("still running".into()),
                Err(e) => Err(format!("cannot query the process: {e}")),
            },
        )
    }

    // --- cleanup -----------------------------------------------------------------------------------------

    fn dump_diagnostics(&mut self) {
        for op in self.operators.get_mut().iter() {
            eprintln!(
                "\n---- last 200 lines of operator '{}' log ({}) ----",
                op.info.label,
                op.info.log.display()
            );
            match fs::read_to_string(&op.info.log) {
                Ok(text) => {
                    let lines: Vec<&str> = text.lines().collect();
                    for line in &lines[lines.len().saturating_sub(200)..] {
                        eprintln!("{line}");
                    }
                }
                Err(e) => eprintln!("(cannot read: {e})"),
            }
        }
        let all = format!("all,{MC},{PDB},events");
        let lease = format!("leases.coordination.k8s.io/{LEASE}");
        let commands: [&[&str]; 3] = [
            &["get", &all, "-n", &self.ns, "-o", "wide"],
            &["get", MC, "-n", &self.ns, "-o", "yaml"],
            &["get", &lease, "-n", OPERATOR_NS, "-o", "yaml"],
        ];
        for args in commands {
            eprintln!("\n---- kubectl {} ----", shell_words(args));
            match quiet_kubectl(args, None) {
                Some(out) => eprint!(
                    "{}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                ),
                None => eprintln!("(kubectl could not be run)"),
            }
        }
        eprintln!("---- end of diagnostics ----\n");
    }

    fn any_operator_running(&mut self) -> bool {
        self.operators
            .get_mut()
            .iter_mut()
            .any(|o| matches!(o.child.try_wait(), Ok(None)))
    }

    fn remaining_memcacheds(&self) -> Option<Vec<String>> {
        let out = quiet_kubectl(&["get", MC, "-n", &self.ns, "-o", "name"], None)?;
        out.status.success().then(|| {
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .map(str::to_owned)
                .collect()
        })
    }

    /// Deletes the test's Memcached objects while an operator still runs, so their finalizers are removed.
    fn delete_memcacheds(&mut self) {
        if !self.ns_created || self.install_manifest.is_none() {
            return;
        }
        match self.remaining_memcacheds() {
            Some(names) if !names.is_empty() => {
                if !self.any_operator_running() {
                    eprintln!("    no operator running; finalizers of {names:?} will be stripped");
                    return;
                }
                eprintln!(
                    "    deleting remaining Memcached objects {names:?} while the operator runs"
                );
                let _ = quiet_kubectl(
                    &["delete", MC, "--all", "-n", &self.ns, "--wait=false"],
                    None,
                );
                let deadline = Instant::now() + secs(60);
                while Instant::now() < deadline
                    && self.remaining_memcacheds().is_some_and(|n| !n.is_empty())
                {
                    thread::sleep(POLL);
                }
            }
            _ => {}
        }
    }

    fn stop_operators(&mut self) {
        for op in self.operators.get_mut().iter_mut() {
            if !matches!(op.child.try_wait(), Ok(None)) {
                continue;
            }
            let _ = run(
                "kill",
                "kill",
                &["-TERM", &op.info.pid.to_string()],
                None,
                None,
                Duration::from_secs(10),
            );
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline && matches!(op.child.try_wait(), Ok(None)) {
                thread::sleep(Duration::from_millis(200));
            }
            if matches!(op.child.try_wait(), Ok(None)) {
                eprintln!(
                    "    operator '{}' ignored SIGTERM for 10s; killing it",
                    op.info.label
                );
                let _ = op.child.kill();
            }
            match op.child.wait() {
                Ok(status) => eprintln!(
                    "    operator '{}' (pid {}) stopped: {status}",
                    op.info.label, op.info.pid
                ),
                Err(e) => eprintln!(
                    "    operator '{}' (pid {}): {e}",
                    op.info.label, op.info.pid
                ),
            }
        }
    }

    fn strip_finalizers(&self) {
        for name in self.remaining_memcacheds().unwrap_or_default() {
            eprintln!("    removing finalizers of {name}");
            let _ = quiet_kubectl(
                &[
                    "patch",
                    &name,
                    "-n",
                    &self.ns,
                    "--type=merge",
                    "-p",
                    r#"{"metadata":{"finalizers":null}}"#,
                ],
                None,
            );
        }
    }

    /// Deletes the install objects that did not exist before the test.
    fn uninstall(&self) {
        let (Some(manifest), Some(pre)) = (&self.install_manifest, &self.preexisting) else {
            return;
        };
        let path = manifest.to_string_lossy().into_owned();
        let Some(out) = quiet_kubectl(
            &["get", "-f", &path, "--ignore-not-found", "-o", "json"],
            None,
        ) else {
            return;
        };
        let present: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        let created: Vec<Value> = items(&present)
            .iter()
            .filter(|o| !pre.contains(&object_key(o)))
            .map(|o| {
                let mut metadata = json!({"name": o["metadata"]["name"]});
                if let Some(ns) = o["metadata"]["namespace"].as_str() {
                    metadata["namespace"] = json!(ns);
                }
                json!({"apiVersion": o["apiVersion"], "kind": o["kind"], "metadata": metadata})
            })
            .collect();
        if created.is_empty() {
            return;
        }
        let names: Vec<String> = created.iter().map(object_key).collect();
        eprintln!("    uninstalling {names:?}");
        let list = json!({"apiVersion": "v1", "kind": "List", "items": created}).to_string();
        let out = quiet_kubectl(
            &["delete", "-f", "-", "--ignore-not-found", "--wait=false"],
            Some(&list),
        );
        if let Some(out) = out.filter(|o| !o.status.success()) {
            eprintln!(
                "    uninstall failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}

impl Drop for E2e {
    /// The last step, cleanup. Runs after success and after a failure (panic); must not panic itself.
    /// Every Memcached left in the test namespace (whichever step created it) is deleted while an operator
    /// still runs, so its finalizer is removed; the Secrets the test created go with the namespace.
    fn drop(&mut self) {
        let failed = thread::panicking();
        eprintln!(
            "\n==> step {CLEANUP_STEP}: cleanup{}  [t+{}s]",
            if failed {
                " after a FAILURE (diagnostics first)"
            } else {
                ""
            },
            self.started.elapsed().as_secs()
        );
        if failed {
            self.dump_diagnostics();
        }
        if !self.keep {
            self.delete_memcacheds();
        }
        self.stop_operators();
        if let Some(path) = &self.kubeconfig {
            let _ = fs::remove_file(path); // holds a ServiceAccount token
        }
        if self.keep {
            eprintln!(
                "    E2E_KEEP=1: keeping namespace {ns} and the installed objects. Clean up later with:\n      \
                 kubectl get {MC} -n {ns} -o name | xargs -r -n1 kubectl patch -n {ns} --type=merge -p '{{\"metadata\":{{\"finalizers\":null}}}}'\n      \
                 kubectl delete namespace {ns}\n      kubectl kustomize {REPO_ROOT}/config/default | kubectl delete -f - --ignore-not-found",
                ns = self.ns
            );
        } else {
            self.strip_finalizers();
            if self.ns_created {
                let _ = quiet_kubectl(
                    &[
                        "delete",
                        "namespace",
                        &self.ns,
                        "--wait=false",
                        "--ignore-not-found",
                    ],
                    None,
                );
            }
            self.uninstall();
        }
        eprintln!(
            "    operator logs and manifests are in {}",
            self.dir.display()
        );
    }
}

/// Checks that cannot wait until after setup: tools, server version, and no competing in-cluster operator.
fn preflight() {
    let version = kubectl_json(&["version", "-o", "json"]);
    let minor = |v: &Value| -> u32 {
        v["minor"]
            .as_str()
            .unwrap_or_default()
            .chars()
            .take_while(char::is_ascii_digit)
            .collect::<String>()
            .parse()
            .unwrap_or(0)
    };
    let server = &version["serverVersion"];
    eprintln!(
        "kubectl {} against API server {}",
        version["clientVersion"]["gitVersion"]
            .as_str()
            .unwrap_or("?"),
        server["gitVersion"].as_str().unwrap_or("?")
    );
    assert!(
        server["major"] == "1" && minor(server) >= 24,
        "the e2e test needs a Kubernetes API server v1.24 or newer, got {}",
        compact(server)
    );
    assert!(
        minor(&version["clientVersion"]) >= 24,
        "the e2e test needs kubectl v1.24 or newer (for `kubectl create token`), got {}",
        compact(&version["clientVersion"])
    );

    let can = kubectl(&[
        "auth",
        "can-i",
        "create",
        "customresourcedefinitions.apiextensions.k8s.io",
    ]);
    assert!(
        String::from_utf8_lossy(&can.stdout)
            .trim()
            .starts_with("yes"),
        "the kubeconfig user must be allowed to install CRDs and RBAC (cluster-admin); `kubectl auth can-i create crd` says {:?}",
        String::from_utf8_lossy(&can.stdout).trim()
    );

    let deployments = kubectl_json(&["get", "deployments.apps", "-n", OPERATOR_NS, "-o", "json"]);
    let deployment_items = items(&deployments);
    let running: Vec<&str> = deployment_items
        .iter()
        .filter(|d| d["spec"]["replicas"].as_i64().unwrap_or(1) > 0)
        .filter_map(|d| d["metadata"]["name"].as_str())
        .collect();
    assert!(
        running.is_empty(),
        "Deployment(s) {running:?} run in {OPERATOR_NS}; an in-cluster operator would compete with the test's \
         operator for the leader Lease. Scale it to 0 (kubectl scale deployment --all --replicas=0 -n {OPERATOR_NS}) \
         or use a clean cluster."
    );

    let help = run(
        "memcached-operator",
        OPERATOR_BIN,
        &["run", "--help"],
        None,
        None,
        Duration::from_secs(30),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let help_text =
        String::from_utf8_lossy(&help.stdout).into_owned() + &String::from_utf8_lossy(&help.stderr);
    assert!(
        help.status.success(),
        "`memcached-operator run --help` failed:\n{help_text}"
    );
    for flag in [
        "--namespace",
        "--leader-elect",
        "--leader-election-namespace",
        "--metrics-bind-address",
        "--health-probe-bind-address",
        "--log-level",
    ] {
        assert!(
            help_text.contains(flag),
            "`memcached-operator run --help` does not list {flag}, which the e2e test passes:\n{help_text}"
        );
    }
}

// ---------------------------------------------------------------------------------------------------------
// kubectl and process helpers
// ---------------------------------------------------------------------------------------------------------

fn e2e_enabled() -> bool {
    std::env::var("MEMCACHED_E2E").is_ok_and(|v| v == "1")
        && std::env::var("KUBECONFIG").is_ok_and(|v| !v.trim().is_empty())
}

/// A timeout, multiplied by `E2E_TIMEOUT_SCALE` (at least 1) for slow clusters.
fn secs(n: u64) -> Duration {
    let scale = std::env::var("E2E_TIMEOUT_SCALE")
        .ok()
        .and_then(|s| s.trim().parse::<f64>().ok())
        .filter(|f| f.is_finite() && *f >= 1.0)
        .unwrap_or(1.0);
    Duration::from_secs_f64(n as f64 * scale)
}

fn kubectl_bin() -> String {
    std::env::var("KUBECTL")
        .ok()
        .filter(|s| !s.trim().is_empty())
        .unwrap_or_else(|| "kubectl".to_owned())
}

/// Runs a program with an optional stdin and working directory, killing it after `timeout`.
fn run(
    name: &str,
    program: &str,
    args: &[&str],
    stdin: Option<&str>,
    dir: Option<&Path>,
    timeout: Duration,
) -> Result<Output, String> {
    let mut cmd = Command::new(program);
    cmd.args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(dir) = dir {
        cmd.current_dir(dir);
    }
    let mut child = cmd.spawn().map_err(|e| {
        format!("cannot run `{name}` ({program}): {e}; is it installed and on PATH?")
    })?;
    let writer = match (stdin, child.stdin.take()) {
        (Some(data), Some(mut pipe)) => {
            let data = data.to_owned();
            Some(thread::spawn(move || {
                let _ = pipe.write_all(data.as_bytes());
            }))
        }
        _ => None,
    };
    let stdout = drain(child.stdout.take());
    let stderr = drain(child.stderr.take());
    let deadline = Instant::now() + timeout;
    let mut timed_out = false;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() >= deadline => {
                timed_out = true;
                let _ = child.kill();
                break child
                    .wait()
                    .map_err(|e| format!("waiting for `{name} {}`: {e}", shell_words(args)))?;
            }
            Ok(None) => thread::sleep(Duration::from_millis(20)),
            Err(e) => return Err(format!("waiting for `{name} {}`: {e}", shell_words(args))),
        }
    };
    if let Some(writer) = writer {
        let _ = writer.join();
    }
    let stdout = stdout.join().unwrap_or_default();
    let mut stderr = stderr.join().unwrap_or_default();
    if timed_out {
        stderr.extend_from_slice(format!("\n[e2e] killed after {}s", timeout.as_secs()).as_bytes());
    }
    Ok(Output {
        status,
        stdout,
        stderr,
    })
}

fn drain<R: Read + Send + 'static>(pipe: Option<R>) -> thread::JoinHandle<Vec<u8>> {
    thread::spawn(move || {
        let mut buf = Vec::new();
        if let Some(mut pipe) = pipe {
            let _ = pipe.read_to_end(&mut buf);
        }
        buf
    })
}

fn run_kubectl(args: &[&str], stdin: Option<&str>) -> Output {
    run(
        "kubectl",
        &kubectl_bin(),
        args,
        stdin,
        None,
        secs(KUBECTL_TIMEOUT_SECS),
    )
    .unwrap_or_else(|e| panic!("{e}"))
}

/// kubectl that never panics (for cleanup code).
fn quiet_kubectl(args: &[&str], stdin: Option<&str>) -> Option<Output> {
    match run(
        "kubectl",
        &kubectl_bin(),
        args,
        stdin,
        None,
        secs(KUBECTL_TIMEOUT_SECS),
    ) {
        Ok(out) => Some(out),
        Err(e) => {
            eprintln!("    {e}");
            None
        }
    }
}

/// Runs kubectl (silently) and returns its output, whatever the exit status.
fn kubectl(args: &[&str]) -> Output {
    run_kubectl(args, None)
}

fn describe_failure(args: &[&str], out: &Output) -> String {
    format!(
        "`kubectl {}` failed ({}): {}{}",
        shell_words(args),
        out.status,
        String::from_utf8_lossy(&out.stderr).trim(),
        String::from_utf8_lossy(&out.stdout).trim()
    )
}

/// stdout of a successful kubectl run, or a description of the failure.
fn try_kubectl(args: &[&str]) -> Result<String, String> {
    let out = kubectl(args);
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(describe_failure(args, &out))
    }
}

/// Echoes and runs a kubectl command that must succeed; returns its stdout.
fn kubectl_ok(args: &[&str]) -> String {
    eprintln!("    $ kubectl {}", shell_words(args));
    try_kubectl(args).unwrap_or_else(|e| panic!("{e}"))
}

fn try_kubectl_json(args: &[&str]) -> Result<Value, String> {
    let text = try_kubectl(args)?;
    if text.trim().is_empty() {
        return Ok(Value::Null);
    }
    serde_json::from_str(&text).map_err(|e| {
        format!(
            "`kubectl {}` printed invalid JSON ({e}): {}",
            shell_words(args),
            truncate(&text, 500)
        )
    })
}

fn kubectl_json(args: &[&str]) -> Value {
    try_kubectl_json(args).unwrap_or_else(|e| panic!("{e}"))
}

/// `kubectl apply -f -` with the YAML on stdin; the caller checks the outcome.
fn apply_yaml(yaml: &str) -> Output {
    run_kubectl(&["apply", "-f", "-"], Some(yaml))
}

fn apply_yaml_ok(yaml: &str) {
    eprintln!("    $ kubectl apply -f - <<EOF\n{}    EOF", indent(yaml));
    let out = apply_yaml(yaml);
    assert!(
        out.status.success(),
        "kubectl apply failed: {}\n{yaml}",
        String::from_utf8_lossy(&out.stderr)
    );
    eprint!("{}", indent(&String::from_utf8_lossy(&out.stdout)));
}

/// The object, `None` if it does not exist, or an error if kubectl failed otherwise.
fn get_opt(resource: &str, ns: &str, name: &str) -> Result<Option<Value>, String> {
    let v = try_kubectl_json(&[
        "get",
        resource,
        name,
        "-n",
        ns,
        "--ignore-not-found",
        "-o",
        "json",
    ])?;
    Ok(if v.is_null() { None } else { Some(v) })
}

fn get_required(resource: &str, ns: &str, name: &str) -> Result<Value, String> {
    get_opt(resource, ns, name)?.ok_or_else(|| format!("{resource} {ns}/{name} not found"))
}

fn gone(resource: &str, ns: &str, name: &str) -> Result<(), String> {
    match get_opt(resource, ns, name)? {
        None => Ok(()),
        Some(o) => Err(format!(
            "still exists: deletionTimestamp {}, finalizers {}",
            o["metadata"]["deletionTimestamp"],
            compact(&o["metadata"]["finalizers"])
        )),
    }
}

fn uid_of(resource: &str, ns: &str, name: &str) -> String {
    let obj = kubectl_json(&["get", resource, name, "-n", ns, "-o", "json"]);
    str_at(&obj, "/metadata/uid").to_owned()
}

fn str_at<'a>(v: &'a Value, pointer: &str) -> &'a str {
    v.pointer(pointer)
        .and_then(Value::as_str)
        .unwrap_or_else(|| panic!("{pointer} missing in {}", compact(v)))
}

/// The items of a List (or the object itself when kubectl printed a single object).
fn items(v: &Value) -> Vec<Value> {
    match v {
        Value::Null => Vec::new(),
        _ if v["kind"] == "List" || v["items"].is_array() => {
            v["items"].as_array().cloned().unwrap_or_default()
        }
        _ => vec![v.clone()],
    }
}

/// "Kind/namespace/name" of an object.
fn object_key(o: &Value) -> String {
    format!(
        "{}/{}/{}",
        o["kind"].as_str().unwrap_or_default(),
        o["metadata"]["namespace"].as_str().unwrap_or_default(),
        o["metadata"]["name"].as_str().unwrap_or_default()
    )
}

/// Splits multi-document YAML (as printed by kustomize) at `---` lines, dropping empty documents.
fn split_yaml_documents(text: &str) -> Vec<String> {
    let mut docs = Vec::new();
    let mut current = String::new();
    for line in text.lines() {
        if line.trim_end() == "---" {
            docs.push(std::mem::take(&mut current));
        } else {
            current.push_str(line);
            current.push('\n');
        }
    }
    docs.push(current);
    docs.retain(|d| {
        d.lines()
            .any(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
    });
    docs
}

/// The value of the unindented `kind:` line of a YAML document.
fn top_level_kind(doc: &str) -> Option<String> {
    doc.lines()
        .find_map(|l| l.strip_prefix("kind:"))
        .map(|k| k.trim().trim_matches(|c| c == '"' || c == '\'').to_owned())
}

/// A YAML double-quoted scalar (JSON string syntax is valid YAML).
fn yaml_str(s: &str) -> String {
    Value::String(s.to_owned()).to_string()
}

/// `certificate-authority` paths are relative to the kubeconfig file they come from.
fn absolute_ca_path(file: &str) -> String {
    let path = Path::new(file);
    if path.is_absolute() {
        return file.to_owned();
    }
    let kubeconfig = std::env::var("KUBECONFIG").unwrap_or_default();
    let first = std::env::split_paths(&kubeconfig)
        .next()
        .unwrap_or_default();
    first
        .parent()
        .map(|dir| dir.join(path))
        .unwrap_or_else(|| path.to_path_buf())
        .to_string_lossy()
        .into_owned()
}

/// Writes a file readable by the owner only (it holds a token).
fn write_private(path: &Path, content: &str) {
    let mut options = fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    let mut file = options
        .open(path)
        .unwrap_or_else(|e| panic!("cannot create {}: {e}", path.display()));
    file.write_all(content.as_bytes())
        .unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
}

fn shell_words(args: &[&str]) -> String {
    args.iter()
        .map(|a| {
            if !a.is_empty()
                && a.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_./:=,@%+".contains(c))
            {
                (*a).to_owned()
            } else {
                format!("'{}'", a.replace('\'', r"'\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn indent(text: &str) -> String {
    text.lines().map(|l| format!("      {l}\n")).collect()
}

fn truncate(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        s.to_owned()
    } else {
        format!("{}...", s.chars().take(max).collect::<String>())
    }
}

fn compact(v: &Value) -> String {
    truncate(&v.to_string(), 2000)
}

/// Standard base64 with padding, as Secret `data` holds values (to look for leaked values in that form too).
fn base64(data: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let byte = |i: usize| u32::from(chunk.get(i).copied().unwrap_or(0));
        let group = (byte(0) << 16) | (byte(1) << 8) | byte(2);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(
                    ALPHABET[((group >> (18 - 6 * i)) & 63) as usize],
                ));
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[test]
fn base64_matches_secret_data_encoding() {
    assert_eq!(base64(b""), "");
    assert_eq!(base64(b"a"), "YQ==");
    assert_eq!(base64(b"ab"), "YWI=");
    assert_eq!(base64(b"abc"), "YWJj");
    assert_eq!(base64(AUTH_CREDENTIALS.as_bytes()), "YXBwOnMzY3JldA==");
}

// ---------------------------------------------------------------------------------------------------------
// Polling
// ---------------------------------------------------------------------------------------------------------

/// Polls `check` every second until it returns `Ok` or `timeout` passes; then panics with `desc` and the last
/// error (which should describe what was observed).
fn wait_for<T>(desc: &str, timeout: Duration, mut check: impl FnMut() -> Result<T, String>) -> T {
    let start = Instant::now();
    let mut last_report = start;
    let mut attempts = 0u32;
    eprintln!("    waiting up to {}s for {desc}", timeout.as_secs());
    loop {
        attempts += 1;
        let last = match check() {
            Ok(value) => {
                eprintln!("    ok after {:.1}s: {desc}", start.elapsed().as_secs_f64());
                return value;
            }
            Err(e) => e,
        };
        if start.elapsed() >= timeout {
            panic!(
                "timed out after {}s ({attempts} checks) waiting for {desc}\n    last observed: {last}",
                timeout.as_secs()
            );
        }
        if last_report.elapsed() >= Duration::from_secs(20) {
            last_report = Instant::now();
            eprintln!(
                "    ...still waiting ({}s) for {desc}: {}",
                start.elapsed().as_secs(),
                truncate(&last, 400)
            );
        }
        thread::sleep(POLL);
    }
}

/// Checks every second for `duration` that `check` keeps returning `Ok`; panics on the first `Err`.
fn hold_for(desc: &str, duration: Duration, mut check: impl FnMut() -> Result<(), String>) {
    let start = Instant::now();
    eprintln!("    checking for {}s that {desc}", duration.as_secs());
    loop {
        if let Err(e) = check() {
            panic!(
                "expected for {}s, but broken after {:.1}s: {desc}\n    observed: {e}",
                duration.as_secs(),
                start.elapsed().as_secs_f64()
            );
        }
        if start.elapsed() >= duration {
            eprintln!("    ok: held for {}s: {desc}", duration.as_secs());
            return;
        }
        thread::sleep(POLL);
    }
}

// ---------------------------------------------------------------------------------------------------------
// HTTP
// ---------------------------------------------------------------------------------------------------------

fn port_for(op: &OpInfo, path: &str) -> u16 {
    if path == "/metrics" {
        op.metrics_port
    } else {
        op.probe_port
    }
}

fn metrics_with_operator_families(port: u16) -> Result<(), String> {
    match http_get(port, "/metrics")? {
        (200, body) if body.contains("memcached_operator_") => Ok(()),
        (200, body) => Err(format!(
            "no memcached_operator_ metric in: {}",
            truncate(&body, 1500)
        )),
        (code, body) => Err(format!("HTTP {code}: {}", truncate(&body, 500))),
    }
}

/// Two distinct free TCP ports on 127.0.0.1 (bound together, then released).
fn two_free_ports() -> (u16, u16) {
    let bind = || {
        TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .unwrap_or_else(|e| panic!("cannot bind 127.0.0.1:0: {e}"))
    };
    let (a, b) = (bind(), bind());
    let port = |l: &TcpListener| {
        l.local_addr()
            .map(|a| a.port())
            .unwrap_or_else(|e| panic!("local_addr: {e}"))
    };
    (port(&a), port(&b))
}

/// A minimal HTTP/1.1 GET against 127.0.0.1; returns the status code and the (de-chunked) body.
fn http_get(port: u16, path: &str) -> Result<(u16, String), String> {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let fail = |what: &str, e: std::io::Error| format!("GET http://{addr}{path}: {what}: {e}");
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2))
        .map_err(|e| fail("connect", e))?;
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(|e| fail("set timeout", e))?;
    stream
        .set_write_timeout(Some(Duration::from_secs(5)))
        .map_err(|e| fail("set timeout", e))?;
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUser-Agent: memcached-operator-e2e\r\nAccept: */*\r\nConnection: close\r\n\r\n"
    );
    stream
        .write_all(request.as_bytes())
        .map_err(|e| fail("send", e))?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).map_err(|e| fail("read", e))?;

    let head_end = find(&raw, b"\r\n\r\n").ok_or_else(|| {
        format!(
            "GET http://{addr}{path}: incomplete response: {}",
            String::from_utf8_lossy(&raw)
        )
    })?;
    let head = String::from_utf8_lossy(&raw[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let mut parts = status_line.split_whitespace();
    let code = match (parts.next(), parts.next().map(str::parse::<u16>)) {
        (Some(version), Some(Ok(code))) if version.starts_with("HTTP/") => code,
        _ => {
            return Err(format!(
                "GET http://{addr}{path}: bad status line {status_line:?}"
            ));
        }
    };
    let chunked = lines.any(|l| {
        l.split_once(':').is_some_and(|(k, v)| {
            k.trim().eq_ignore_ascii_case("transfer-encoding")
                && v.to_ascii_lowercase().contains("chunked")
        })
    });
    let body = &raw[head_end + 4..];
    let body = if chunked {
        dechunk(body).map_err(|e| format!("GET http://{addr}{path}: {e}"))?
    } else {
        body.to_vec()
    };
    Ok((code, String::from_utf8_lossy(&body).into_owned()))
}

fn dechunk(mut data: &[u8]) -> Result<Vec<u8>, String> {
    let mut body = Vec::new();
    loop {
        let eol = find(data, b"\r\n").ok_or("truncated chunked body")?;
        let size_line = String::from_utf8_lossy(&data[..eol]).into_owned();
        let size_hex = size_line.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(size_hex, 16)
            .map_err(|e| format!("bad chunk size {size_line:?}: {e}"))?;
        data = &data[eol + 2..];
        if size == 0 {
            return Ok(body);
        }
        if data.len() < size {
            return Err("truncated chunk".into());
        }
        body.extend_from_slice(&data[..size]);
        data = data.get(size + 2..).unwrap_or_default();
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}
