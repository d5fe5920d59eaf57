//! Bad configuration fails fast, before the operator touches the cluster.

use crate::cluster;
use crate::harness::{Operator, Scratch, WAIT};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_fails_fast_on_bad_configuration() {
    // A kubeconfig that does not exist: no client, no server, a message that says why.
    let scratch = Scratch::new("no-kubeconfig");
    let missing = scratch.0.join("missing.yaml");
    let mut op = Operator::spawn(
        &scratch,
        None,
        &[
            "run",
            "--metrics-bind-address",
            "0",
            "--health-probe-bind-address",
            "0",
        ],
        &[("KUBECONFIG", missing.to_str().unwrap())],
    );
    let exit = op.wait_exit(WAIT).await.expect("exits by itself");
    assert_eq!(exit.code(), Some(1), "exit status {exit}");
    let stderr = op.stderr();
    assert!(stderr.contains("Kubernetes configuration"), "{stderr}");
    drop(op);

    // Leader election (no subcommand: `run` is the default) without a namespace for the Lease.
    // The endpoints are disabled through the environment so nothing binds the default ports.
    let fake = cluster::start(None).await;
    let scratch = Scratch::new("no-namespace");
    let kubeconfig = scratch.kubeconfig(&fake);
    let mut op = Operator::spawn(
        &scratch,
        Some(fake.clone()),
        &["--leader-elect"],
        &[
            ("KUBECONFIG", kubeconfig.to_str().unwrap()),
            ("POD_NAMESPACE", ""),
            ("METRICS_BIND_ADDRESS", "0"),
            ("HEALTH_PROBE_BIND_ADDRESS", "0"),
        ],
    );
    let exit = op.wait_exit(WAIT).await.expect("exits by itself");
    assert_eq!(exit.code(), Some(1), "exit status {exit}");
    let stderr = op.stderr();
    assert!(stderr.contains("POD_NAMESPACE"), "{stderr}");
    assert_eq!(
        fake.count(),
        0,
        "nothing is sent before the configuration is complete:\n{}",
        fake.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_http_metrics_are_refused_off_loopback() {
    // Unauthenticated metrics on every interface would show every tenant's names to the whole network.
    let fake = cluster::start(None).await;
    let scratch = Scratch::new("plain-metrics");
    let kubeconfig = scratch.kubeconfig(&fake);
    let mut op = Operator::spawn(
        &scratch,
        Some(fake.clone()),
        &[
            "run",
            "--metrics-secure=false",
            "--metrics-bind-address",
            ":0",
            "--health-probe-bind-address",
            "0",
        ],
        &[("KUBECONFIG", kubeconfig.to_str().unwrap())],
    );
    let exit = op.wait_exit(WAIT).await.expect("exits by itself");
    assert_eq!(exit.code(), Some(1), "exit status {exit}");
    let stderr = op.stderr();
    assert!(stderr.contains("loopback"), "{stderr}");
    assert_eq!(
        fake.count(),
        0,
        "refused before any request:\n{}",
        fake.log()
    );
}
