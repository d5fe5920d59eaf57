//! A stop that comes: on SIGTERM the operator exits 0 within 2 s, whatever it was doing. Started before
//! its CRD is installed (on a control plane of its own, since the CRD is cluster-scoped), it used to
//! answer "shutdown requested; finishing in-flight reconciles" and then wait for a first list of instances
//! that never came, until killed. Also checked: a standby waiting for the Lease, a leader in the middle
//! of reconciles, and a leader with nothing to do.

use std::path::Path;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use kube::api::DeleteParams;
use serde_json::json;

use crate::instances::{apply, wait_settled};
use crate::{OPERATOR_BIN, Scenario, wait_for};

const CRD: &str = "memcacheds.cache.example.com";
const LEASE_NAMESPACE: &str = "memcached-operator-system";
/// The longest a stop may take.
const PROMPT: Duration = Duration::from_secs(2);

/// SIGTERM to `operator`; fails unless it exits 0 within [`PROMPT`] (it is killed after 10 s otherwise).
/// Says how long it took.
fn stop_promptly(operator: &mut envtest::Operator, state: &str) -> String {
    let sent = Instant::now();
    let status = operator.stop();
    let took = sent.elapsed();
    assert!(
        took <= PROMPT,
        "{state}: the operator took {took:?} to exit after SIGTERM (limit {PROMPT:?}); the end of its log:\n{}",
        operator.log_tail(20)
    );
    assert_eq!(
        status.and_then(|s| s.code()),
        Some(0),
        "{state}: exit status {status:?}"
    );
    format!(
        "{state}: exited 0 {:.3} s after SIGTERM",
        took.as_secs_f64()
    )
}

#[tokio::test]
async fn started_without_the_crd_the_operator_exits_within_2s_of_sigterm() {
    let Some(mut s) = Scenario::start_isolated("shutdown-no-crd", &[]).await else {
        return;
    };
    s.operator.stop();
    let crds: Api<CustomResourceDefinition> = Api::all(s.client.clone());
    crds.delete(CRD, &DeleteParams::default())
        .await
        .expect("deleting the CRD");
    wait_for("the CRD to be gone", Duration::from_secs(60), || async {
        match crds.get_opt(CRD).await {
            Ok(None) => Ok(()),
            Ok(Some(_)) => Err("still there".to_owned()),
            Err(e) => Err(e.to_string()),
        }
    })
    .await;
    let log = s.control_plane().dir().join("operator-no-crd.log");
    let ns = s.namespace.clone();
    let mut operator = envtest::Operator::start(
        Path::new(OPERATOR_BIN),
        &s.credentials.kubeconfig,
        &["--namespace", &ns],
        &log,
    )
    .expect("the operator starts");
    wait_for(
        "the operator to say the CRD is missing",
        Duration::from_secs(30),
        || async {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            match text.lines().any(|l| l.contains(CRD)) {
                true => Ok(()),
                false => Err(operator_tail(&text)),
            }
        },
    )
    .await;
    s.step("started without the CRD, and says so");
    s.step(&stop_promptly(&mut operator, "without the CRD"));
}

fn operator_tail(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(5)..].join("\n")
}

#[tokio::test]
async fn a_standby_a_reconciling_leader_and_an_idle_leader_exit_within_2s_of_sigterm() {
    let id = format!("shutdown-{}", std::process::id());
    let args = [
        "--leader-elect",
        "--leader-election-namespace",
        LEASE_NAMESPACE,
        "--leader-election-id",
        &id,
    ];
    let Some(mut s) = Scenario::start_with("shutdown", &args).await else {
        return;
    };
    let leases: Api<Lease> = Api::namespaced(s.client.clone(), LEASE_NAMESPACE);
    wait_for("the operator to lead", Duration::from_secs(30), || async {
        let lease = leases.get(&id).await.map_err(|e| e.to_string())?;
        match lease.spec.and_then(|s| s.holder_identity) {
            Some(holder) if !holder.is_empty() => Ok(()),
            other => Err(format!("holder {other:?}")),
        }
    })
    .await;

    let ns = s.namespace.clone();
    let log = s
        .control_plane()
        .dir()
        .join(format!("operator-{ns}-standby.log"));
    let all_args = [&["--namespace", ns.as_str()][..], &args[..]].concat();
    let mut standby = envtest::Operator::start_with_env(
        Path::new(OPERATOR_BIN),
        &s.credentials.kubeconfig,
        &all_args,
        &[("POD_NAME", "standby")],
        &log,
    )
    .expect("the standby starts");
    standby
        .wait_ready(Duration::from_secs(30))
        .await
        .expect("the standby is ready");
    s.step(&stop_promptly(&mut standby, "a standby"));

    // Reconciles in flight: a burst of new instances, and SIGTERM as they are being reconciled.
    for i in 0..8 {
        apply(&s, &format!("burst-{i}"), json!({"size": 1})).await;
    }
    let stopped = stop_promptly(&mut s.operator, "a leader in the middle of reconciles");
    s.step(&stopped);

    s.restart_operator().await;
    apply(&s, "idle", json!({"size": 1})).await;
    wait_settled(&s, "idle", Duration::from_secs(60)).await;
    let stopped = stop_promptly(&mut s.operator, "an idle leader");
    s.step(&stopped);
}
