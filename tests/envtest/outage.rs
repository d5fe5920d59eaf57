//! Through an API-server restart: once the server is back, a new instance is Available within 5 s of its
//! pod being ready (on a v1.28 server it took 50 s). This scenario restarts the API server, so it runs on
//! a control plane of its own.

use std::time::{Duration, Instant};

use serde_json::json;

use crate::instances::{apply, memcacheds, ready_pods, settled, wait_settled};
use crate::{Scenario, wait_for};

#[tokio::test]
async fn after_an_api_server_restart_a_new_instance_is_available_within_5s_of_its_pod() {
    let Some(s) = Scenario::start_isolated("outage", &[]).await else {
        return;
    };
    apply(&s, "before", json!({"size": 1})).await;
    wait_settled(&s, "before", Duration::from_secs(60)).await;
    s.step("settled; restarting the API server");
    let down = s
        .control_plane()
        .restart_apiserver()
        .await
        .expect("the API server restarts");
    s.step(&format!(
        "API server back after {:.1} s",
        down.as_secs_f64()
    ));

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
        "pod ready {:.2} s after creation, instance Available {:.2} s after that",
        ready.duration_since(created).as_secs_f64(),
        lag.as_secs_f64()
    ));
    assert!(
        lag <= Duration::from_secs(5),
        "the instance became Available {lag:?} after its pod was ready (limit 5 s)"
    );
}
