//! Leader election against another replica's Lease: a standby waits and takes over once the Lease
//! expires, or within seconds once the other replica releases it, and stops on SIGTERM without touching
//! it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use axum::http::Method;
use fake_apiserver::Fake;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};

use crate::checks::{assert_no_unexpected_requests, of, only_lease_requests, sample};
use crate::cluster::paths::{DEPLOYMENT, EVENTS, LEASE};
use crate::cluster::{self, change_lease, lease, lease_holder};
use crate::harness::{
    IDENTITY, Operator, WAIT, http_get, is_ok, settled, start_run, stop_and_check_release,
};
use memcached_operator::manager::leader::RETRY_PERIOD;

/// Another replica's Lease, renewed now: held for `seconds` from now.
pub fn lease_held_by(holder: &str, seconds: u64, transitions: i32) -> Value {
    json!({
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": "memcached-operator.cache.example.com", "namespace": "op-system",
            "uid": "uid-lease", "resourceVersion": "1", "creationTimestamp": "2024-01-01T00:00:00Z"
        },
        "spec": {
            "holderIdentity": holder,
            "leaseDurationSeconds": seconds,
            "acquireTime": now(),
            "renewTime": now(),
            "leaseTransitions": transitions
        }
    })
}

pub fn now() -> Value {
    serde_json::to_value(MicroTime(Timestamp::now())).unwrap()
}

/// Plays the other replica: renews its Lease in the fake every 500 ms until `stop` is set.
pub fn keep_renewing(fake: &Arc<Fake>, stop: &Arc<AtomicBool>) {
    let (fake, stop) = (fake.clone(), stop.clone());
    tokio::spawn(async move {
        while !stop.load(Ordering::Acquire) {
            change_lease(&fake, |lease| lease["spec"]["renewTime"] = now());
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standby_waits_then_takes_over_an_expired_lease() {
    // Another replica holds the Lease (5 s, renewed every 500 ms) and has changed hands 3 times.
    let fake = cluster::start(Some(lease_held_by("other-replica", 5, 3))).await;
    let stop_renewing = Arc::new(AtomicBool::new(false));
    keep_renewing(&fake, &stop_renewing);
    let (_scratch, mut op, metrics, probes) = start_run(&fake, "takeover");

    // As a standby: healthy, ready (it must not hold up a rollout), not leading, and not watching.
    op.wait_until("/readyz answers 200 as a standby", WAIT, || {
        is_ok(&probes, "/readyz")
    })
    .await;
    op.wait_until("/metrics reports a standby", WAIT, || {
        let metrics = metrics.clone();
        async move {
            http_get(&metrics, "/metrics")
                .await
                .is_some_and(|(code, text)| {
                    code == 200 && sample(&text, "memcached_operator_leader") == Some(0.0)
                })
        }
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(lease_holder(&fake).as_deref(), Some("other-replica"));
    assert!(only_lease_requests(&fake), "{}", fake.log());
    assert!(
        fake.requests().iter().all(|r| r.method == Method::GET),
        "a standby only reads the live Lease of another replica:\n{}",
        fake.log()
    );

    // The other replica dies: its Lease expires, this one takes it over and reconciles.
    stop_renewing.store(true, Ordering::Release);
    // Acquiring is an apply (holder, times) then a patch counting the transition.
    op.wait_until(
        "the Lease is taken over by smoke-1, as its 4th transition",
        WAIT,
        || {
            let lease = lease(&fake).unwrap_or_default();
            async move {
                lease["spec"]["holderIdentity"] == IDENTITY
                    && lease["spec"]["leaseTransitions"] == 4
            }
        },
    )
    .await;
    op.wait_until("the takeover is followed by a reconcile", WAIT, || {
        let requests = fake.requests();
        async move {
            !of(&requests, &Method::PATCH, *DEPLOYMENT).is_empty()
                && !of(&requests, &Method::POST, EVENTS).is_empty()
        }
    })
    .await;
    op.wait_until("/metrics reports the leader", WAIT, || {
        let metrics = metrics.clone();
        async move {
            http_get(&metrics, "/metrics")
                .await
                .is_some_and(|(code, text)| {
                    code == 200 && sample(&text, "memcached_operator_leader") == Some(1.0)
                })
        }
    })
    .await;

    stop_and_check_release(&mut op, &fake).await;
    assert_no_unexpected_requests(&fake);
}

/// The other replica releases its Lease as this operator and kube-lease-manager do on a graceful stop:
/// holder, times and duration removed, the transition count kept. Returns when it was released.
pub fn release(fake: &Fake) -> Instant {
    change_lease(fake, |lease| {
        for field in [
            "holderIdentity",
            "acquireTime",
            "renewTime",
            "leaseDurationSeconds",
        ] {
            lease["spec"].as_object_mut().unwrap().remove(field);
        }
    });
    Instant::now()
}

/// Waits until `op` reports itself as a standby: ready, and not leading.
async fn is_standby(op: &mut Operator, metrics: &str, probes: &str) {
    op.wait_until("/readyz answers 200 as a standby", WAIT, || {
        is_ok(probes, "/readyz")
    })
    .await;
    op.wait_until("/metrics reports a standby", WAIT, || async move {
        http_get(metrics, "/metrics")
            .await
            .is_some_and(|(code, text)| {
                code == 200 && sample(&text, "memcached_operator_leader") == Some(0.0)
            })
    })
    .await;
}

/// A graceful hand-over: the leader releases the Lease when it stops, and the standby takes it at its next
/// look, within [`RETRY_PERIOD`], instead of when the lease it last saw would have expired (up to a whole
/// lease duration later: 30 s here). The bound is what the standby's reads guarantee, with a wide margin
/// for a loaded machine; the expiry it must not wait for is three times further away.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standby_takes_over_a_released_lease_at_its_next_look() {
    const LEASE_SECONDS: u64 = 30;
    let bound = RETRY_PERIOD + Duration::from_secs(8);
    assert!(bound * 3 <= Duration::from_secs(LEASE_SECONDS));

    let fake = cluster::start(Some(lease_held_by("other-replica", LEASE_SECONDS, 3))).await;
    let stop_renewing = Arc::new(AtomicBool::new(false));
    keep_renewing(&fake, &stop_renewing);
    let (_scratch, mut op, metrics, probes) = start_run(&fake, "handover");
    is_standby(&mut op, &metrics, &probes).await;

    // Several looks at a Lease that is held and renewed: none of them touches it.
    let standby_since = Instant::now();
    tokio::time::sleep(RETRY_PERIOD * 2 + Duration::from_millis(500)).await;
    assert_eq!(lease_holder(&fake).as_deref(), Some("other-replica"));
    assert!(
        fake.requests().iter().all(|r| r.is(&Method::GET, LEASE)),
        "a standby only reads a Lease that another replica holds:\n{}",
        fake.log()
    );
    let looks = fake
        .requests()
        .iter()
        .filter(|r| r.at >= standby_since)
        .count();
    let watched = standby_since.elapsed();
    assert!(
        looks as f64 <= watched.as_secs_f64() / RETRY_PERIOD.as_secs_f64() + 2.0,
        "{looks} reads of the Lease in {watched:?}: a standby looks every {RETRY_PERIOD:?}"
    );

    // The other replica stops gracefully: no more renewals (the renewer's last one done), then the release.
    stop_renewing.store(true, Ordering::Release);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let released_at = release(&fake);

    op.wait_until(
        "the released Lease is taken over by smoke-1, as its 4th transition",
        Duration::from_secs(LEASE_SECONDS + 15),
        || {
            let lease = lease(&fake).unwrap_or_default();
            async move {
                lease["spec"]["holderIdentity"] == IDENTITY
                    && lease["spec"]["leaseTransitions"] == 4
            }
        },
    )
    .await;
    let requests = fake.requests();
    let first_write = requests
        .iter()
        .find(|r| r.at >= released_at && r.method != Method::GET)
        .expect("the writes that took the Lease over");
    let took = first_write.at - released_at;
    eprintln!("the standby wrote the released Lease {took:?} after the release");
    assert!(
        took <= bound,
        "the standby took the released Lease {took:?} after the release ({}), not within {bound:?}",
        first_write.line()
    );

    op.wait_until("the takeover is followed by a reconcile", WAIT, || {
        let requests = fake.requests();
        async move { !of(&requests, &Method::PATCH, *DEPLOYMENT).is_empty() }
    })
    .await;
    // The reconciles the start triggered are over: what follows SIGTERM is the release alone.
    settled(&fake, Duration::from_millis(1500)).await;
    stop_and_check_release(&mut op, &fake).await;
    assert_no_unexpected_requests(&fake);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standby_stops_on_sigterm_without_touching_the_lease() {
    let fake = cluster::start(Some(lease_held_by("other-replica", 15, 1))).await;
    let stop_renewing = Arc::new(AtomicBool::new(false));
    keep_renewing(&fake, &stop_renewing);
    let (_scratch, mut op, metrics, probes) = start_run(&fake, "standby");

    op.wait_until("/readyz answers 200 as a standby", WAIT, || {
        is_ok(&probes, "/readyz")
    })
    .await;
    op.wait_until("/metrics reports a standby", WAIT, || {
        let metrics = metrics.clone();
        async move {
            http_get(&metrics, "/metrics")
                .await
                .is_some_and(|(code, text)| {
                    code == 200 && sample(&text, "memcached_operator_leader") == Some(0.0)
                })
        }
    })
    .await;

    op.sigterm();
    let exit = op.wait_exit(Duration::from_secs(15)).await;
    let Some(exit) = exit else {
        panic!("the standby did not exit within 15 s of SIGTERM");
    };
    assert_eq!(exit.code(), Some(0), "exit status {exit}");
    stop_renewing.store(true, Ordering::Release);
    let stderr = op.stderr();
    assert!(
        stderr.contains("stopped before becoming leader"),
        "{stderr}"
    );
    assert_eq!(lease_holder(&fake).as_deref(), Some("other-replica"));
    assert!(
        fake.requests().iter().all(|r| r.is(&Method::GET, LEASE)),
        "a standby reads the Lease and nothing else, and never writes it:\n{}",
        fake.log()
    );
    assert_no_unexpected_requests(&fake);
}
