//! A settled operator writes nothing: not the children, not the status, not an event. On a real API
//! server every value the server drops, defaults or canonicalises must compare equal to what the operator
//! applied, or each reconcile writes again (a `minReadySeconds: 0` the server never returns re-applied the
//! Deployment on every reconcile, 108 writes a minute at 300 instances).
//!
//! The operator runs with a 5 s safety requeue, so the 20 s window holds several full reconciles of every
//! instance: each compares everything it owns with the server's copy.

use std::time::Duration;

use serde_json::json;

use crate::instances::{apply, wait_settled, wait_summarised, writes_during};
use crate::secrets::{auth_secret, tls_secret};
use crate::{Scenario, wait_for};

/// Runs with this safety requeue: several reconciles of every instance within the window.
pub const FAST_REQUEUE: &[&str] = &["--requeue-interval", "5s"];
const WINDOW: Duration = Duration::from_secs(20);

async fn assert_no_writes(s: &Scenario, what: &str) {
    let writes = writes_during(s, WINDOW).await;
    s.step(&format!(
        "{what}: operator writes in {} s settled: {}",
        WINDOW.as_secs(),
        writes.total()
    ));
    assert_eq!(
        writes.total(),
        0,
        "{what}: a settled operator wrote within {WINDOW:?} (each write is a mismatch between what it \
         applies and what the server returns, or a status that is not stable):\n{writes}\n\
         operator log: {}",
        s.operator.log().display()
    );
}

#[tokio::test]
async fn the_default_sample_settles_with_no_writes() {
    let Some(s) = Scenario::start_with("settled-default", FAST_REQUEUE).await else {
        return;
    };
    apply(&s, "sample", json!({"size": 1, "containerPort": 11211})).await;
    wait_settled(&s, "sample", Duration::from_secs(60)).await;
    wait_summarised(&s, "sample", Duration::from_secs(60)).await;
    s.step("settled");
    assert_no_writes(&s, "default sample").await;
}

#[tokio::test]
async fn a_statefulset_pool_with_a_warmup_settles_with_no_writes() {
    let Some(s) = Scenario::start_with("settled-pool", FAST_REQUEUE).await else {
        return;
    };
    apply(
        &s,
        "pool",
        json!({
            "size": 3, "workload": "StatefulSet",
            "memcached": {"maxMemoryMB": 64},
            "scaling": {"drainSeconds": 5},
            "rollout": {"warmupSeconds": 2}
        }),
    )
    .await;
    wait_settled(&s, "pool", Duration::from_secs(90)).await;
    wait_summarised(&s, "pool", Duration::from_secs(60)).await;
    s.step("settled");
    assert_no_writes(&s, "StatefulSet pool").await;
}

/// StatefulSet, exporter, PodDisruptionBudget, NetworkPolicy, HorizontalPodAutoscaler, TLS with client
/// certificates, auth: every child kind the operator writes and both Secret kinds it reads. (No
/// ServiceMonitor: the control plane has no Prometheus Operator CRDs.)
#[tokio::test]
async fn every_optional_feature_settles_with_no_writes() {
    let Some(s) = Scenario::start_with("settled-features", FAST_REQUEUE).await else {
        return;
    };
    tls_secret(&s, "memcached-tls", "secure").await;
    auth_secret(&s, "memcached-auth", "auth-file", "app:s3cret\n").await;
    apply(
        &s,
        "secure",
        json!({
            "size": 3,
            "workload": "StatefulSet",
            "memcached": {"maxMemoryMB": 64, "threads": 2, "verbosity": 1,
                          "extraArgs": ["-o", "lru_crawler,lru_maintainer"]},
            "rollout": {"warmupSeconds": 1},
            "highAvailability": {
                "antiAffinity": "soft",
                "podDisruptionBudget": {"enabled": true, "minAvailable": 2},
                "preStopDelaySeconds": 2, "terminationGracePeriodSeconds": 10
            },
            "service": {"annotations": {"example.com/owner": "platform-team"}},
            "security": {
                "tls": {"secretName": "memcached-tls", "clientAuth": true},
                "auth": {"secretName": "memcached-auth", "key": "auth-file"},
                "networkPolicy": {
                    "enabled": true,
                    "allowedClients": [
                        {"podSelector": {"matchLabels": {"app": "web"}}},
                        {"ipBlock": {"cidr": "10.20.0.0/16", "except": ["10.20.99.0/24"]}}
                    ]
                }
            },
            "monitoring": {"exporter": {"enabled": true}},
            "autoscaling": {"enabled": true, "minSize": 3, "maxSize": 6,
                            "targetCPUUtilizationPercentage": 70}
        }),
    )
    .await;
    let mc = wait_settled(&s, "secure", Duration::from_secs(120)).await;
    wait_summarised(&s, "secure", Duration::from_secs(60)).await;
    s.step(&format!(
        "settled: {} servers published",
        mc.status.as_ref().map_or(0, |st| st.server_list.len())
    ));
    // The HorizontalPodAutoscaler's controller writes its own status once it has looked (no metrics
    // here); that is not the operator's write, but let it happen before the window opens.
    wait_for(
        "the autoscaler to exist",
        Duration::from_secs(30),
        || async { k8s_openapi_hpa(&s).await },
    )
    .await;
    assert_no_writes(&s, "every optional feature").await;
}

async fn k8s_openapi_hpa(s: &Scenario) -> Result<(), String> {
    use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
    kube::Api::<HorizontalPodAutoscaler>::namespaced(s.client.clone(), &s.namespace)
        .get("secure")
        .await
        .map(|_| ())
        .map_err(|e| e.to_string())
}
