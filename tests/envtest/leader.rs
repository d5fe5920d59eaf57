//! A graceful leader hand-over on a real API server: the leader releases its Lease when it gets SIGTERM,
//! and the standby takes over within 3 s (on a v1.28 server it took 10.3 s: the standby looked again only
//! when the lease it had seen would have expired).

use std::path::Path;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use serde_json::json;

use crate::instances::{apply, wait_settled};
use crate::{OPERATOR_BIN, Scenario, wait_for};

const LEASE_NAMESPACE: &str = "memcached-operator-system";

fn holder(lease: &Lease) -> Option<String> {
    lease
        .spec
        .as_ref()?
        .holder_identity
        .clone()
        .filter(|h| !h.is_empty())
}

#[tokio::test]
async fn a_graceful_hand_over_takes_under_3s() {
    let id = format!("leader-{}", std::process::id());
    let args = [
        "--leader-elect",
        "--leader-election-namespace",
        LEASE_NAMESPACE,
        "--leader-election-id",
        &id,
    ];
    let Some(mut s) = Scenario::start_with("leader", &args).await else {
        return;
    };
    let leases: Api<Lease> = Api::namespaced(s.client.clone(), LEASE_NAMESPACE);
    let first = wait_for(
        "the first operator to lead",
        Duration::from_secs(30),
        || async {
            let lease = leases.get(&id).await.map_err(|e| e.to_string())?;
            holder(&lease).ok_or_else(|| "no holder".to_owned())
        },
    )
    .await;
    s.step(&format!("{first} leads"));

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
    // Let the standby see the held Lease and settle into waiting.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let lease = leases.get(&id).await.expect("the Lease");
    assert_eq!(
        holder(&lease).as_deref(),
        Some(first.as_str()),
        "the standby waits"
    );

    let sent = Instant::now();
    s.operator.stop();
    let stopped = sent.elapsed();
    let taken = wait_for(
        "the standby to take over",
        Duration::from_secs(30),
        || async {
            let lease = leases.get(&id).await.map_err(|e| e.to_string())?;
            match holder(&lease) {
                Some(h) if h == "standby" => Ok(Instant::now()),
                other => Err(format!("holder {other:?}")),
            }
        },
    )
    .await;
    let hand_over = taken.duration_since(sent);
    s.step(&format!(
        "SIGTERM to the leader: it exited after {:.2} s, the standby led {:.2} s after the signal",
        stopped.as_secs_f64(),
        hand_over.as_secs_f64()
    ));
    assert!(
        hand_over <= Duration::from_secs(3),
        "the graceful hand-over took {hand_over:?} (limit 3 s)"
    );

    // The new leader reconciles.
    apply(&s, "cache", json!({"size": 1})).await;
    wait_settled(&s, "cache", Duration::from_secs(60)).await;
    s.step("the new leader reconciled a new instance");
    standby.stop();
}
