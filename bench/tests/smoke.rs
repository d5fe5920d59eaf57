//! The benchmark works end to end at a small N: the operator converges against the fake and every figure
//! is reported. No timing is asserted; `make bench` is for measuring.
//!
//! It runs the debug operator binary, which `cargo test --workspace` builds for the operator's own
//! integration tests (a release build would take minutes): `cargo test -p bench` alone needs
//! `cargo build --bin memcached-operator` first.

use std::path::PathBuf;
use std::time::Duration;

use bench::Options;

/// `target/debug/memcached-operator`, next to the directory of this test binary (`target/debug/deps`).
fn debug_operator() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("the test binary is in target/<profile>/deps");
    let binary = profile_dir.join("memcached-operator");
    assert!(
        binary.exists(),
        "{} is missing: run `cargo build --bin memcached-operator` (cargo test --workspace builds it)",
        binary.display()
    );
    binary
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_run_converges_and_reports_every_figure() {
    let options = Options {
        operator: debug_operator(),
        operator_args: vec![],
        operator_env: vec![],
        instances: 5,
        latency: Duration::from_millis(5),
        pod_start: Duration::from_millis(200),
        settle: Duration::from_secs(2),
        timeout: Duration::from_secs(60),
    };
    let report = bench::run(&options).await.unwrap();

    assert_eq!(report.instances, 5);
    assert!(report.children_seconds > 0.0);
    assert!(report.available_seconds >= report.children_seconds);
    assert!(report.requests_per_instance > 0.0);
    assert_eq!(
        report.requests_total,
        report.requests.values().sum::<usize>()
    );
    for needed in [
        "apply deployments",
        "apply services",
        "apply configmaps",
        "apply memcacheds/status",
        "create events",
    ] {
        assert!(
            report.requests.contains_key(needed),
            "{needed} is missing from {:?}",
            report.requests
        );
    }
    // Instances carry no finalizer: the instances themselves are never written.
    assert!(
        !report.requests.contains_key("patch-json memcacheds"),
        "{:?}",
        report.requests
    );
    assert!(report.refused.is_empty(), "refused: {:?}", report.refused);
    assert!(report.cpu_total_seconds > 0.0 && report.peak_rss_mib > 1.0);
    assert_eq!(report.settle_seconds, 2);
    let table = report.table();
    assert!(table.contains("all Available") && table.contains("writes when settled"));
}
