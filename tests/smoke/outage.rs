//! API-server outages: the fake goes away (connections refused, watches cut) and comes back on the same
//! address, either restarted (old resource versions expired: 410, re-list) or after a network blip (the
//! watches resume where they were). The operator must resume within 5 s of the server answering, pick
//! up what changed meanwhile, keep `/healthz` alive and `/readyz` honest, report the outage once rather
//! than per watch, and, leading, step down when the Lease cannot be renewed in time.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::http::Method;
use fake_apiserver::Fake;

use crate::checks::{of, sample};
use crate::cluster::paths::{DEPLOYMENTS, MEMCACHEDS};
use crate::cluster::world::memcached_named;
use crate::cluster::{self, add_memcached, lease_holder};
use crate::harness::{IDENTITY, Operator, Scratch, WAIT, http_get, is_ok, start_run, start_with};

/// The promise: watches resume and new work is reconciled within this long of the server answering.
pub const RESUME: Duration = Duration::from_secs(5);

/// The operator without leader election (as in the reported outage), logging at info level so that
/// warning noise shows, once it has reconciled the first instance and is ready.
pub async fn started(fake: &Arc<Fake>, name: &str) -> (Scratch, Operator, String, String) {
    let (scratch, mut op, metrics, probes) = start_with(fake, name, &[]);
    op.wait_until("the first instance reconciled", WAIT, || {
        let applied = deployment_applied(fake, "cache");
        async move { applied }
    })
    .await;
    op.wait_until("/readyz answers 200", WAIT, || is_ok(&probes, "/readyz"))
        .await;
    (scratch, op, metrics, probes)
}

fn deployment_applied(fake: &Fake, instance: &str) -> bool {
    !of(
        &fake.requests(),
        &Method::PATCH,
        &format!("{}/{instance}", *DEPLOYMENTS),
    )
    .is_empty()
}

async fn metric(metrics: &str, name: &str) -> Option<f64> {
    let (_, text) = http_get(metrics, "/metrics").await?;
    sample(&text, name)
}

/// Lines of the operator's log at warning level or above.
fn warnings(stderr: &str) -> Vec<&str> {
    stderr
        .lines()
        .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
        .collect()
}

/// Takes the operator through an outage of `outage`: ready before, not ready (but alive) during it.
async fn outage_of(fake: &Fake, op: &mut Operator, metrics: &str, probes: &str, outage: Duration) {
    let down = Instant::now();
    fake.outage().expect("the fake has a door");
    op.wait_until("/readyz answers 503 during the outage", RESUME, || async {
        matches!(http_get(probes, "/readyz").await, Some((503, _)))
    })
    .await;
    assert!(is_ok(probes, "/healthz").await, "alive during the outage");
    assert_eq!(
        metric(metrics, "memcached_operator_api_available").await,
        Some(0.0)
    );
    tokio::time::sleep(outage.saturating_sub(down.elapsed())).await;
}

/// Waits for the operator to apply `instance`'s Deployment and returns how long after `since` it did.
pub async fn applied_within(
    fake: &Fake,
    op: &mut Operator,
    instance: &str,
    since: Instant,
) -> Duration {
    op.wait_until(&format!("the Deployment of {instance}"), WAIT, || {
        let applied = deployment_applied(fake, instance);
        async move { applied }
    })
    .await;
    let took = since.elapsed();
    eprintln!("{instance}: Deployment applied {took:?} after the API server came back");
    took
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_api_server_is_resumed_within_seconds_and_new_work_reconciled() {
    let fake = cluster::start(None).await;
    let (_scratch, mut op, metrics, probes) = started(&fake, "outage-restart").await;

    outage_of(&fake, &mut op, &metrics, &probes, Duration::from_secs(8)).await;
    let back_at = Instant::now();
    fake.back(true).expect("the door opens again");
    // Created right after the server came back.
    add_memcached(&fake, memcached_named("fresh", "uid-2"));

    let took = applied_within(&fake, &mut op, "fresh", back_at).await;
    assert!(
        took < RESUME,
        "the new instance was reconciled {took:?} after the server came back"
    );
    op.wait_until("/readyz answers 200 again", RESUME, || {
        is_ok(&probes, "/readyz")
    })
    .await;
    assert_eq!(
        metric(&metrics, "memcached_operator_api_available").await,
        Some(1.0)
    );

    // The expired watch was re-listed (after a 410 answer), not retried on the old version.
    let requests = fake.requests();
    let after: Vec<_> = requests.iter().filter(|r| r.at >= back_at).collect();
    assert!(
        after
            .iter()
            .any(|r| r.path == MEMCACHEDS && r.is_watch() && r.param("resourceVersion").is_some()),
        "the watch was resumed first"
    );
    assert!(
        after.iter().any(|r| r.path == MEMCACHEDS && !r.is_watch()),
        "then re-listed after the 410"
    );
    let expired = metric(
        &metrics,
        "memcached_operator_watch_errors_total{resource=\"memcacheds\",reason=\"expired\"}",
    )
    .await;
    assert_eq!(expired, Some(1.0), "one expiry of the Memcached watch");

    // One warning for the outage, one line for its end: no warning per watch, per retry or per expiry.
    let stderr = op.stderr();
    let warned = warnings(&stderr);
    assert_eq!(warned.len(), 1, "warnings: {warned:#?}");
    assert!(
        warned[0].contains("the API server does not answer"),
        "{stderr}"
    );
    assert_eq!(
        stderr.matches("the API server answers again").count(),
        1,
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_network_blip_the_watches_resume_and_deliver_what_changed() {
    let fake = cluster::start(None).await;
    let (_scratch, mut op, metrics, probes) = started(&fake, "outage-blip").await;

    outage_of(&fake, &mut op, &metrics, &probes, Duration::from_secs(3)).await;
    // Created while the operator could not watch: the resumed watch delivers it.
    add_memcached(&fake, memcached_named("during", "uid-3"));
    let back_at = Instant::now();
    fake.back(false).expect("the door opens again");

    let took = applied_within(&fake, &mut op, "during", back_at).await;
    assert!(
        took < RESUME,
        "reconciled {took:?} after the server came back"
    );
    let relisted = fake
        .requests()
        .iter()
        .any(|r| r.at >= back_at && r.path == MEMCACHEDS && !r.is_watch());
    assert!(
        !relisted,
        "a watch that did not expire resumes without a list"
    );
    op.wait_until("/readyz answers 200 again", RESUME, || {
        is_ok(&probes, "/readyz")
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_that_cannot_renew_steps_down_and_its_restart_takes_over() {
    let fake = cluster::start(None).await;
    let (_scratch, mut op, _metrics, probes) = start_run(&fake, "outage-leader");
    op.wait_until("the Lease is held by smoke-1", WAIT, || {
        let holder = lease_holder(&fake);
        async move { holder.as_deref() == Some(IDENTITY) }
    })
    .await;
    // The Lease names it as soon as its write lands, a moment before the operator has read that back and
    // leads (a standby that loses the server keeps waiting, rightly): only a leader reconciles.
    op.wait_until("the leader reconciled the first instance", WAIT, || {
        let applied = deployment_applied(&fake, "cache");
        async move { applied }
    })
    .await;
    op.wait_until("/readyz answers 200", WAIT, || is_ok(&probes, "/readyz"))
        .await;

    // An outage longer than the 15 s Lease: the leader must stop before the Lease could pass to another
    // replica (it renews every 5 s and gives up 12 s after its last renewal).
    let down = Instant::now();
    fake.outage().expect("the fake has a door");
    let exit = op.wait_exit(Duration::from_secs(20)).await;
    let took = down.elapsed();
    let Some(exit) = exit else {
        panic!("the leader did not exit during a 20 s outage");
    };
    assert_ne!(
        exit.code(),
        Some(0),
        "a lost lease is a failure exit: {exit}"
    );
    assert!(
        took <= Duration::from_secs(15),
        "exited {took:?} into the outage, after the Lease could have expired"
    );
    let stderr = op.stderr();
    assert!(
        stderr.contains("could not renew the leader lease in time"),
        "{stderr}"
    );
    assert!(
        stderr.contains("lost the leader lease; exiting"),
        "{stderr}"
    );

    // The kubelet restarts it; once the server is back it leads again and reconciles.
    fake.back(true).expect("the door opens again");
    let restarted_at = Instant::now();
    let (_scratch2, mut op2, _metrics2, probes2) = start_run(&fake, "outage-leader-restart");
    op2.wait_until("/readyz answers 200 after the restart", WAIT, || {
        is_ok(&probes2, "/readyz")
    })
    .await;
    assert_eq!(lease_holder(&fake).as_deref(), Some(IDENTITY));
    let applies_after = of(
        &fake.requests(),
        &Method::PATCH,
        &format!("{}/cache", *DEPLOYMENTS),
    )
    .into_iter()
    .filter(|r| r.at >= restarted_at)
    .count();
    // Its caches are empty of children here (the fake does not store applies), so it applies again.
    assert!(applies_after <= 1, "{applies_after}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn started_during_an_outage_it_waits_for_the_api_server() {
    let fake = cluster::start(None).await;
    fake.outage().expect("the fake has a door");
    let (_scratch, mut op, _metrics, probes) = start_run(&fake, "outage-start");
    op.wait_until(
        "/healthz answers 200 before the server is there",
        WAIT,
        || is_ok(&probes, "/healthz"),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(op.poll_exit().is_none(), "it waits instead of exiting");

    let back_at = Instant::now();
    fake.back(false).expect("the door opens again");
    op.wait_until("the Lease is held by smoke-1", WAIT, || {
        let holder = lease_holder(&fake);
        async move { holder.as_deref() == Some(IDENTITY) }
    })
    .await;
    let took = applied_within(&fake, &mut op, "cache", back_at).await;
    assert!(took < RESUME, "reconciled {took:?} after the server came");
}
