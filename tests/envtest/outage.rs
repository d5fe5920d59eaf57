//! Through an API-server restart: once the server is back, a new instance is Available within 5 s of its
//! pod being ready (on a v1.28 server it took 50 s, and later 14 s after a restart whose authorizer was
//! not warm yet). This scenario restarts the API server, so it runs on a control plane of its own.
//!
//! A restarted API server answers 403 to every request of the operator until its RBAC authorizer has
//! synced its informers; on 2 cores it usually has before the operator's watches come back, so the
//! scenario makes that window certain and longer: the operator's ClusterRoleBinding is deleted before the
//! restart, the restarted server refuses the operator's relists (403) until it is bound again, and the new
//! instance is created right after that.

use std::time::{Duration, Instant};

use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use serde_json::json;

use crate::instances::{apply, memcacheds, ready_pods, settled, wait_settled};
use crate::{Scenario, wait_for};

/// The binding of the operator's ClusterRole (`config/rbac/role_binding.yaml`, prefixed).
const BINDING: &str = "memcached-operator-manager-rolebinding";

#[tokio::test]
async fn after_an_api_server_restart_a_new_instance_is_available_within_5s_of_its_pod() {
    let Some(s) = Scenario::start_isolated("outage", &[]).await else {
        return;
    };
    apply(&s, "before", json!({"size": 1})).await;
    wait_settled(&s, "before", Duration::from_secs(60)).await;
    s.step("settled; unbinding the operator's role and restarting the API server");
    let bindings: Api<ClusterRoleBinding> = Api::all(s.client.clone());
    let mut binding = bindings.get(BINDING).await.expect("the operator's binding");
    bindings
        .delete(BINDING, &DeleteParams::default())
        .await
        .expect("unbound");
    let mark = s.control_plane().audit().mark().expect("audit mark");
    let down = s
        .control_plane()
        .restart_apiserver()
        .await
        .expect("the API server restarts");
    s.step(&format!(
        "API server back after {:.1} s",
        down.as_secs_f64()
    ));
    let refused = wait_for(
        "the restarted API server to refuse the operator's relists",
        Duration::from_secs(30),
        || async {
            let refused = refused_since(&s, &mark);
            if refused.is_empty() {
                Err("none yet".to_owned())
            } else {
                Ok(refused)
            }
        },
    )
    .await;
    s.step(&format!("refused (403): {}", refused.join(", ")));
    binding.metadata.resource_version = None;
    binding.metadata.uid = None;
    let rebinding = s.control_plane().audit().mark().expect("audit mark");
    bindings
        .create(&PostParams::default(), &binding)
        .await
        .expect("bound again");
    let bound = Instant::now();
    s.step("the operator's role is bound again");

    apply(&s, "after", json!({"size": 1})).await;
    let created = Instant::now();
    let api = memcacheds(&s);
    let available = wait_for(
        "the new instance to settle",
        Duration::from_secs(120),
        || async {
            let mc = api.get("after").await.map_err(|e| e.to_string())?;
            if settled(&mc) {
                Ok(Instant::now())
            } else {
                Err(crate::instances::conditions(&mc))
            }
        },
    );
    // Watch for the pod's readiness while waiting for the instance (with the same limit).
    let pod_watch = async {
        while created.elapsed() < Duration::from_secs(120) {
            if !ready_pods(&s, "after").await.is_empty() {
                return Some(Instant::now());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        None
    };
    let (available, ready) = tokio::join!(available, pod_watch);
    let ready = ready.expect("the new instance's pod became ready within 120 s");
    let lag = available.saturating_duration_since(ready);
    s.step(&format!(
        "pod ready {:.2} s after creation ({:.2} s after the role was bound again), instance Available \
         {:.2} s after that",
        ready.duration_since(created).as_secs_f64(),
        ready.duration_since(bound).as_secs_f64(),
        lag.as_secs_f64()
    ));
    let (first, spread, summary) = resumed_since(&s, &rebinding);
    s.step(&format!(
        "first request granted {first:.2} s after the role was bound again; every watched kind's within \
         {spread:.2} s of it: {summary}"
    ));
    assert!(
        lag <= Duration::from_secs(5),
        "the instance became Available {lag:?} after its pod was ready (limit 5 s)"
    );
    assert!(
        spread <= 1.0,
        "the watches resumed over {spread:.2} s after the first granted request: {summary}"
    );
}

/// When the operator's watches resumed after `mark`: the first request granted (seconds after `mark`),
/// the seconds from it to the last kind's first granted list or watch, and each kind's.
fn resumed_since(s: &Scenario, mark: &envtest::Mark) -> (f64, f64, String) {
    let events = s
        .control_plane()
        .audit()
        .read_since(mark)
        .expect("the audit log");
    let since = |e: &envtest::AuditEvent| e.received.duration_since(mark.at()).as_secs_f64();
    let granted: Vec<_> = events
        .iter()
        .filter(|e| e.user == s.credentials.user && e.code == 200)
        .collect();
    let first = granted
        .iter()
        .map(|e| since(e))
        .fold(f64::INFINITY, f64::min);
    let mut kinds: std::collections::BTreeMap<&str, f64> = std::collections::BTreeMap::new();
    for e in granted
        .iter()
        .filter(|e| e.verb == "watch" || e.verb == "list")
    {
        let at = kinds.entry(e.resource.as_str()).or_insert(f64::INFINITY);
        *at = at.min(since(e));
    }
    let last = kinds.values().copied().fold(first, f64::max);
    let summary = kinds
        .iter()
        .map(|(kind, at)| format!("{kind} +{at:.2}"))
        .collect::<Vec<_>>()
        .join(", ");
    (first, last - first, summary)
}

/// The operator's requests refused (403) since `mark`, as `verb resource`.
fn refused_since(s: &Scenario, mark: &envtest::Mark) -> Vec<String> {
    let events = s
        .control_plane()
        .audit()
        .read_since(mark)
        .expect("the audit log");
    let mut refused: Vec<String> = events
        .into_iter()
        .filter(|e| e.user == s.credentials.user && e.code == 403)
        .map(|e| format!("{} {}", e.verb, e.resource))
        .collect();
    refused.dedup();
    refused
}
