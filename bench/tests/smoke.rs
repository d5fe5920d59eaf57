//! The benchmark works end to end at a small N, over TLS and over plain HTTP (`--plain-http`): the operator
//! converges against the fake and every figure is reported. No timing is asserted; `make bench` is for
//! measuring. Nor is the protocol asserted over TLS: the smoke tests (`tests/smoke/http2.rs`) check
//! which one the operator speaks; here the connections are only counted.
//!
//! `--real` runs too where a control plane's binaries are (`$KUBEBUILDER_ASSETS`, as the envtest tier finds
//! them), and is skipped with the envtest tier's skip line where they are not.
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

/// 5 instances, pods ready after 0.2 s, 2 s of settled window: a few seconds in all.
fn small_run(tls: bool) -> Options {
    Options {
        operator: debug_operator(),
        operator_args: vec![],
        operator_env: vec![],
        instances: 5,
        latency: Duration::from_millis(5),
        pod_start: Duration::from_millis(200),
        settle: Duration::from_secs(2),
        timeout: Duration::from_secs(60),
        tls,
        record: None,
    }
}

/// `--record DIR`: the operator's `/metrics` is scraped every second from its readiness to the end of the
/// settled window, each scrape a JSON line with the text as sent, and the moments of the run are marked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recorded_run_writes_a_scrape_a_second_and_its_marks() {
    let dir = std::env::temp_dir().join(format!("bench-record-{}", std::process::id()));
    let options = Options {
        record: Some(dir.clone()),
        ..small_run(false)
    };
    let report = bench::run(&options).await.unwrap();

    let samples = std::fs::read_to_string(dir.join("convergence.jsonl")).unwrap();
    let scrapes: Vec<serde_json::Value> = samples
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    // Readiness to the end of the window: the convergence, the grace and the settled window.
    let seconds = report.available_seconds + 2.0 + 2.0;
    assert!(
        scrapes.len() as f64 >= seconds.floor(),
        "{} scrapes over {seconds:.1} s",
        scrapes.len()
    );
    let last = scrapes.last().unwrap();
    let text = last["text"].as_str().unwrap();
    assert!(
        text.contains("memcached_operator_reconcile_total{result=\"success\"}"),
        "{text}"
    );
    let times: Vec<u64> = scrapes
        .iter()
        .map(|s| s["at_ms"].as_u64().unwrap())
        .collect();
    // A scrape a second, and a last one when the recording ends.
    let (last, every_second) = times.split_last().unwrap();
    assert!(
        every_second.windows(2).all(|w| w[1] >= w[0] + 900),
        "{times:?}"
    );
    assert!(every_second.iter().all(|t| t <= last), "{times:?}");

    let marks: Vec<serde_json::Value> =
        serde_json::from_str(&std::fs::read_to_string(dir.join("convergence.marks.json")).unwrap())
            .unwrap();
    let labels: Vec<&str> = marks.iter().map(|m| m["label"].as_str().unwrap()).collect();
    assert_eq!(labels, ["5 instances created", "all Available"]);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_run_converges_and_reports_every_figure() {
    let report = bench::run(&small_run(false)).await.unwrap();

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
    // Over plain HTTP, every connection is HTTP/1.1, and there was at least the one of the lists.
    let connections = report.connections.expect("the fake counts connections");
    assert!(!connections.tls && connections.http2 == 0);
    assert!(connections.http1 >= 1, "{connections:?}");
    assert!(table.contains("fake API server"), "{table}");
    assert!(table.contains("HTTP/1.1 (plain HTTP)"), "{table}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_run_over_tls_converges_and_counts_the_connections_by_protocol() {
    let report = bench::run(&small_run(true)).await.unwrap();

    assert!(report.available_seconds >= report.children_seconds);
    assert!(
        report.requests.contains_key("apply deployments"),
        "{:?}",
        report.requests
    );
    assert!(report.refused.is_empty(), "refused: {:?}", report.refused);
    let connections = report.connections.expect("the fake counts connections");
    assert!(connections.tls, "{connections:?}");
    assert!(
        connections.http2 + connections.http1 >= 1,
        "the operator's connections were counted: {connections:?}"
    );
    let table = report.table();
    assert!(
        table.contains("(TLS)") && table.contains("TLS\n"),
        "{table}"
    );
    let json = serde_json::to_value(&report).unwrap();
    assert_eq!(json["connections"]["tls"], true, "{json}");
    assert!(json["connections"]["http2"].is_u64(), "{json}");
    assert!(json["connections"]["http1"].is_u64(), "{json}");
}

/// `--real` at 3 instances with `--restart-settled`: the operator converges on a real API server, its
/// requests are counted from the audit log, and a restarted operator is measured.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_real_run_converges_and_counts_from_the_audit_log() {
    if envtest::assets().is_none() {
        envtest::skip("bench --real");
        return;
    }
    let options = Options {
        instances: 3,
        ..small_run(true)
    };
    let real = bench::real::RealOptions {
        config_dir: PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../config"),
        restart_settled: true,
        creates_in_flight: bench::real::CREATES_IN_FLIGHT,
    };
    let report = bench::real::run(&options, &real).await.unwrap();

    assert!(
        report.server.starts_with("real kube-apiserver v"),
        "{}",
        report.server
    );
    let pods_ready = report
        .pods_ready_seconds
        .expect("the pods' readiness is timed");
    assert!(report.available_seconds >= report.children_seconds);
    assert!(pods_ready > 0.0 && pods_ready <= report.available_seconds + 1.0);
    for needed in [
        "patch deployments",
        "patch services",
        "patch memcacheds/status",
    ] {
        assert!(
            report.requests.contains_key(needed),
            "{needed} is missing from {:?}",
            report.requests
        );
    }
    assert_eq!(
        report.requests_total,
        report.requests.values().sum::<usize>()
    );
    assert!(report.connections.is_none(), "no connection counter there");
    let responses = report
        .responses_by_protocol
        .as_ref()
        .expect("the operator's metric");
    assert!(responses.values().sum::<u64>() > 0, "{responses:?}");
    assert!(
        report
            .control_plane_cpu_seconds
            .contains_key("kube-apiserver")
    );
    let restart = report.restart.as_ref().expect("--restart-settled");
    assert!(
        restart.requests.keys().any(|k| k.starts_with("list ")),
        "the new operator's start-up lists are counted: {:?}",
        restart.requests
    );
    let table = report.table();
    assert!(
        table.contains("pods ready") && table.contains("Available / pods ready"),
        "{table}"
    );
    assert!(table.contains("--restart-settled"), "{table}");
}
