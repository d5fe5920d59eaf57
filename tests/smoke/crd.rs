//! Started before its CRD is installed: the operator names the missing `Memcached` CRD and how to install
//! it, in one warning (repeated at most once a minute) and in `/readyz`'s answer, keeps trying, and starts
//! by itself once the CRD is there. Told to stop meanwhile, it exits at once.

use std::time::{Duration, Instant};

use axum::http::Method;
use fake_apiserver::Fake;

use crate::checks::of;
use crate::cluster;
use crate::cluster::paths::{DEPLOYMENT, MEMCACHEDS, MONITORING};
use crate::harness::{Operator, WAIT, http_get, is_ok, start_with};

/// The line that names the missing CRD (in the log and on `/readyz`).
const MISSING: &str = "the Memcached CRD (memcacheds.cache.example.com) is not installed; install it \
                       with `make install` or `kubectl apply --server-side -k config/crd`";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_crd_is_named_once_and_on_readyz_until_it_is_installed() {
    let fake = cluster::start(None).await;
    fake.set_crd_missing(true);
    let (_scratch, mut op, _metrics, probes) = start_with(&fake, "crd-missing", &[]);

    op.wait_until("/readyz names the missing CRD", WAIT, || async {
        http_get(&probes, "/readyz")
            .await
            .is_some_and(|(code, body)| code == 503 && body == MISSING)
    })
    .await;
    // The operator keeps listing (every few seconds at most) while it waits; the CRD stays missing for a
    // while, long enough for many retries.
    let missing_since = Instant::now();
    let lists_before = memcached_lists(&fake);
    tokio::time::sleep(Duration::from_secs(8)).await;
    let lists = memcached_lists(&fake) - lists_before;
    assert!(
        lists >= 2,
        "{lists} lists of Memcacheds in {:?}: it keeps trying",
        missing_since.elapsed()
    );
    assert!(is_ok(&probes, "/healthz").await, "alive while it waits");
    let stderr = op.stderr();
    let warnings: Vec<&str> = stderr.lines().filter(|l| l.contains(" WARN ")).collect();
    assert_eq!(
        warnings.len(),
        1,
        "one warning for {lists} failed lists, not one per list: {warnings:#?}"
    );
    assert!(warnings[0].contains(MISSING), "{}", warnings[0]);

    // The CRD is installed: the operator starts by itself.
    let installed_at = Instant::now();
    fake.set_crd_missing(false);
    op.wait_until("the instance reconciled", WAIT, || {
        let requests = fake.requests();
        async move { !of(&requests, &Method::PATCH, *DEPLOYMENT).is_empty() }
    })
    .await;
    eprintln!(
        "reconciled {:?} after the CRD was installed",
        installed_at.elapsed()
    );
    op.wait_until("/readyz answers 200", WAIT, || is_ok(&probes, "/readyz"))
        .await;
    let stderr = op.stderr();
    assert!(
        stderr.contains("the Memcached CRD is installed now; starting"),
        "{stderr}"
    );
    assert_eq!(
        stderr.lines().filter(|l| l.contains(" WARN ")).count(),
        1,
        "{stderr}"
    );
    // Nothing but the Memcached lists was refused (and the discovery of ServiceMonitors, not served here).
    let refused: Vec<String> = fake
        .requests()
        .iter()
        .filter(|r| {
            let expected = r.status == 404 && (r.path == MEMCACHEDS || r.path == MONITORING);
            !(200..300).contains(&r.status) && !expected
        })
        .map(|r| r.line())
        .collect();
    assert!(refused.is_empty(), "{refused:#?}");
}

fn memcached_lists(fake: &Fake) -> usize {
    of(&fake.requests(), &Method::GET, MEMCACHEDS)
        .iter()
        .filter(|r| !r.is_watch())
        .count()
}

/// SIGTERM while the CRD is missing, with and without leader election: the operator exits 0 within 2 s.
/// (It used to answer "shutdown requested; finishing in-flight reconciles" and wait for a first list of
/// instances that never came, until a second signal or SIGKILL.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_while_the_crd_is_missing_exits_within_2s() {
    let leader_election = ["--leader-elect", "--leader-election-namespace", "op-system"];
    for (name, args) in [
        ("crd-stop", &[][..]),
        ("crd-stop-leader", &leader_election[..]),
    ] {
        let fake = cluster::start(None).await;
        fake.set_crd_missing(true);
        let (_scratch, mut op, _metrics, probes) = start_with(&fake, name, args);
        op.wait_until("/readyz names the missing CRD", WAIT, || async {
            http_get(&probes, "/readyz")
                .await
                .is_some_and(|(code, body)| code == 503 && body == MISSING)
        })
        .await;
        let stopped = stop_timed(&mut op).await;
        eprintln!("{name}: exited {stopped:?} after SIGTERM");
    }
}

/// SIGTERM; how long the exit took. Fails unless the operator exits 0 within 2 s.
async fn stop_timed(op: &mut Operator) -> Duration {
    let sent = Instant::now();
    op.sigterm();
    let exit = op.wait_exit(Duration::from_secs(2)).await;
    let took = sent.elapsed();
    let Some(exit) = exit else {
        panic!("still running 2 s after SIGTERM:\n{}", op.stderr());
    };
    assert_eq!(exit.code(), Some(0), "exit status {exit}:\n{}", op.stderr());
    took
}
