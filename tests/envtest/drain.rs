//! A scale-down drains and then finishes: the removed servers leave the published list, their pods go
//! after `drainSeconds`, and the instance settles (`Progressing=False`, `Available` with the new count)
//! with no further writes. On a real v1.28 server a Deployment scale-down 4 -> 3 stayed `Progressing`
//! ("waiting for the Deployment controller to observe the new spec") and the operator re-applied the
//! Deployment once a second for as long as it ran.

use std::time::{Duration, Instant};

use serde_json::json;

use crate::Scenario;
use crate::instances::{
    apply, conditions, ready_pods, wait_settled, wait_summarised, writes_during,
};

const DRAIN: u64 = 5;

async fn drains_and_settles(workload: &str) {
    let name = format!("drain-{}", workload.to_lowercase());
    let Some(s) = Scenario::start(&name).await else {
        return;
    };
    let spec = |size: i32| {
        json!({
            "size": size, "workload": workload,
            "scaling": {"drainSeconds": DRAIN},
            "highAvailability": {"preStopDelaySeconds": 1, "terminationGracePeriodSeconds": 5}
        })
    };
    apply(&s, "cache", spec(4)).await;
    wait_settled(&s, "cache", Duration::from_secs(90)).await;
    // The first statistics summary is written now, not in the window that counts writes below.
    wait_summarised(&s, "cache", Duration::from_secs(60)).await;
    s.step("settled at 4; scaling to 3");
    let started = Instant::now();
    apply(&s, "cache", spec(3)).await;
    let mc = wait_settled(&s, "cache", Duration::from_secs(DRAIN + 30)).await;
    let took = started.elapsed();
    let status = mc.status.clone().unwrap_or_default();
    s.step(&format!(
        "{workload}: settled at 3 after {:.1} s (drain {DRAIN} s): {}",
        took.as_secs_f64(),
        conditions(&mc)
    ));
    assert!(
        took >= Duration::from_secs(DRAIN),
        "the drain was not waited for"
    );
    assert_eq!(status.server_list.len(), 3, "three servers published");
    assert!(
        status.drain.is_none(),
        "the drain is over: {:?}",
        status.drain
    );
    assert_eq!(ready_pods(&s, "cache").await.len(), 3, "three ready pods");
    let writes = writes_during(&s, Duration::from_secs(10)).await;
    assert_eq!(
        writes.total(),
        0,
        "writes after the scale-down settled:\n{writes}"
    );
}

#[tokio::test]
async fn a_deployment_scale_down_drains_and_settles() {
    drains_and_settles("Deployment").await;
}

#[tokio::test]
async fn a_statefulset_scale_down_drains_and_settles() {
    drains_and_settles("StatefulSet").await;
}
