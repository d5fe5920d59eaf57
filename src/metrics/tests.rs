use super::*;
use crate::observe::ObserveLayer;
use http::{Method, Request, Response};
use tower::{Layer, Service, ServiceExt};

use crate::telemetry::stats::Stats;

fn condition(type_: &str, status: &str) -> Condition {
    Condition {
        type_: type_.to_owned(),
        status: status.to_owned(),
        last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
        ),
        message: String::new(),
        observed_generation: None,
        reason: "AsExpected".to_owned(),
    }
}

#[test]
fn conditions_follow_the_status_and_go_with_the_instance() {
    let metrics = Metrics::default();
    let series = |condition: &str, value: u8| {
        format!(
            "memcached_operator_instance_condition{{namespace=\"ns\",memcached=\"cache\",condition=\"{condition}\"}} {value}"
        )
    };
    metrics.set_conditions(
        "ns",
        "cache",
        &[
            condition("Available", "False"),
            condition("Degraded", "True"),
        ],
    );
    let text = metrics.encode();
    for line in [
        series("Available", 0),
        series("Progressing", 0),
        series("Degraded", 1),
    ] {
        assert!(text.contains(&line), "missing {line:?} in\n{text}");
    }
    metrics.set_conditions("ns", "cache", &[condition("Available", "True")]);
    let text = metrics.encode();
    for line in [series("Available", 1), series("Degraded", 0)] {
        assert!(text.contains(&line), "missing {line:?} in\n{text}");
    }
    assert!(
        !text.contains("condition=\"ProxyAvailable\""),
        "no proxy, no series:\n{text}"
    );
    let with_proxy = [
        condition("Available", "True"),
        condition("ProxyAvailable", "False"),
    ];
    metrics.set_conditions("ns", "cache", &with_proxy);
    assert!(metrics.encode().contains(&series("ProxyAvailable", 0)));
    let with_proxy = [
        condition("Available", "True"),
        condition("ProxyAvailable", "True"),
    ];
    metrics.set_conditions("ns", "cache", &with_proxy);
    assert!(metrics.encode().contains(&series("ProxyAvailable", 1)));
    metrics.set_conditions("ns", "cache", &[condition("Available", "True")]);
    let text = metrics.encode();
    assert!(
        !text.contains("condition=\"ProxyAvailable\""),
        "proxy turned off:\n{text}"
    );
    metrics.set_conditions("ns", "cache", &with_proxy);
    metrics.set_conditions("ns", "other", &[]);
    metrics.forget_instance("ns", "cache");
    let text = metrics.encode();
    assert!(!text.contains("memcached=\"cache\""), "{text}");
    assert!(text.contains("memcached=\"other\""), "{text}");
}

#[tokio::test]
async fn layer_counts_requests_and_encodes_every_metric() {
    let metrics = Arc::new(Metrics::default());
    send_requests_through_the_layer(&metrics).await;
    record_one_of_each(&metrics);
    let text = metrics.encode();
    assert_eq!(text.matches("# EOF").count(), 1, "{text}");
    assert!(text.ends_with("# EOF\n"), "{text}");
    for line in EXPECTED_SAMPLES {
        assert!(text.contains(line), "missing {line:?} in\n{text}");
    }
    assert_every_series_is_listed(&text);
}

/// One PATCH answered 409 over HTTP/1.1, then two GETs answered over HTTP/2.
async fn send_requests_through_the_layer(metrics: &Arc<Metrics>) {
    let inner = tower::service_fn(|_req: Request<()>| async {
        Ok::<_, tower::BoxError>(Response::builder().status(409).body(()).unwrap())
    });
    let mut svc = ObserveLayer::new(metrics.clone()).layer(inner);
    let req = Request::builder()
        .method(Method::PATCH)
        .uri("/x")
        .body(())
        .unwrap();
    svc.ready().await.unwrap().call(req).await.unwrap();
    let over_http2 = tower::service_fn(|_req: Request<()>| async {
        let response = Response::builder().version(Version::HTTP_2).body(());
        Ok::<_, tower::BoxError>(response.unwrap())
    });
    let mut svc = ObserveLayer::new(metrics.clone()).layer(over_http2);
    for _ in 0..2 {
        let req = Request::builder().uri("/y").body(()).unwrap();
        svc.ready().await.unwrap().call(req).await.unwrap();
    }
}

/// Touches every family, so each one has a sample to encode.
fn record_one_of_each(metrics: &Metrics) {
    metrics.reconciled(None);
    metrics.reconciled(Some("apply"));
    metrics.set_leader(true);
    metrics.set_instances(2);
    metrics.set_fleet_rollout(1, 1);
    metrics.set_api_available(true);
    metrics.set_conditions("ns", "cache", &[]);
    metrics.watch_error("pods", "expired");
    let (objects, bytes) = metrics.cache_gauges("pods");
    objects.set(3);
    bytes.set(700);
    drop(metrics.reconcile_timer());
    let stopped = crate::handover::Failure {
        error: crate::handover::CopyError::Timeout(std::time::Duration::from_secs(1)),
        progress: crate::handover::Snapshot::default(),
    };
    metrics.handovers().record("ns", "cache", &Err(stopped));
    record_operand_samples(&metrics.operand());
}

/// The operand registry's: a read that timed out, certificates, one server down, one up, one proxy.
fn record_operand_samples(operand: &OperandMetrics) {
    operand.count_read("timeout");
    operand.count_refresh("ok");
    operand.count_reloads(2);
    operand.set_instance(
        ("ns".into(), "cache".into()),
        [("cache-a".to_owned(), None)].into(),
    );
    operand.set_instance(
        ("ns".into(), "read".into()),
        [("read-a".to_owned(), Some(Stats::default()))].into(),
    );
    let proxy = crate::telemetry::proxy::ProxySample {
        counters: crate::telemetry::proxy::ProxyCounters::default(),
        backends: vec![crate::telemetry::proxy::Backend {
            slot: 0,
            address: "10.0.0.1:11211".to_owned(),
            down: false,
        }],
        access: [(
            "orders".to_owned(),
            crate::telemetry::proxy::AccessCounters::default(),
        )]
        .into(),
    };
    operand.set_proxies(
        ("ns".into(), "read".into()),
        [("read-proxy-a".to_owned(), Some(proxy))].into(),
    );
}

/// What [`send_requests_through_the_layer`] and [`record_one_of_each`] leave in the exposition.
const EXPECTED_SAMPLES: &[&str] = &[
    "memcached_up{namespace=\"ns\",memcached=\"cache\",pod=\"cache-a\"} 0",
    "memcached_operator_stats_reads_total{result=\"timeout\"} 1",
    "memcached_operator_certificate_refreshes_total{answer=\"ok\"} 1",
    "memcached_operator_certificate_reloads_total 2",
    "memcached_operator_kube_requests_total{verb=\"patch\",code=\"409\"} 1",
    "memcached_operator_kube_requests_total{verb=\"get\",code=\"200\"} 2",
    "memcached_operator_kube_responses_total{protocol=\"HTTP/1.1\"} 1",
    "memcached_operator_kube_responses_total{protocol=\"HTTP/2\"} 2",
    "memcached_operator_reconcile_total{result=\"success\"} 1",
    "memcached_operator_reconcile_total{result=\"error\"} 1",
    "memcached_operator_reconcile_errors_total{kind=\"apply\"} 1",
    "memcached_operator_leader 1",
    "memcached_operator_managed_instances 2",
    "memcached_operator_api_available 1",
    "memcached_operator_watch_errors_total{resource=\"pods\",reason=\"expired\"} 1",
    "memcached_operator_reconcile_duration_seconds_count 1",
    "memcached_operator_cache_objects{resource=\"pods\"} 3",
    "memcached_operator_cache_bytes{resource=\"pods\"} 700",
];

/// The sample names in `text` are exactly [`exported_series`].
fn assert_every_series_is_listed(text: &str) {
    let mut encoded: Vec<&str> = text
        .lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| line.split(['{', ' ']).next())
        .collect();
    encoded.sort_unstable();
    encoded.dedup();
    let mut listed = exported_series();
    listed.sort_unstable();
    assert_eq!(
        encoded, listed,
        "exported_series() must list exactly what the registry encodes"
    );
}
