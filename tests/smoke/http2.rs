//! The operator over TLS, as it reaches a real API server: the fake offers HTTP/2 and HTTP/1.1 by ALPN
//! ([`cluster::start_tls`]). The operator must negotiate HTTP/2, so that every request and watch of one kube
//! client shares one connection instead of holding a connection each (its clients: the writes', the
//! watches' and the Lease's), and must come back on a new connection, with its watches, when the API server
//! drops them all, or when the connection goes silent without a reset (found by the transport's HTTP/2
//! keep-alive pings).
//!
//! Each test checks the operator's work first (reconciles, recovery), over whichever protocol it spoke,
//! and the protocol last, so that a failure says which of the two went wrong.

use std::time::{Duration, Instant};

use axum::http::{Method, Version};
use fake_apiserver::{Connections, Fake, Req};
use memcached_operator::manager::transport::{KEEP_ALIVE_INTERVAL, KEEP_ALIVE_TIMEOUT};

use crate::checks::{assert_created, assert_no_unexpected_requests, of, sample};
use crate::cluster::paths::{DEPLOYMENT, DEPLOYMENTS, MEMCACHEDS};
use crate::cluster::world::{World, memcached_named};
use crate::cluster::{self, add_memcached};
use crate::harness::{
    http_get, is_ok, leads_and_creates_the_children, settled, start_run, stop_and_check_release,
};
use crate::outage::{RESUME, applied_within, started};

/// How long after the keep-alive closed a silent connection the new instance may take to be reconciled:
/// the watch's retry backoff (at most 3 s), a new connection, the resumed watch and the reconcile, with
/// a wide margin for a loaded machine. Without the pings the watches would hang for good, so the
/// margin does not weaken the test.
const AFTER_KEEP_ALIVE: Duration = Duration::from_secs(30);

/// The operator's kube clients: the one that writes, the watches' (apart, see `manager::watch_client`)
/// and, with leader election, the Lease's. Each holds one HTTP/2 connection once started.
const CLIENTS: usize = 3;

/// Every request came in over HTTP/2, and every connection since `before` negotiated it: none over
/// HTTP/1.1, and at least one new one. Returns how many new ones.
fn assert_http2_only(fake: &Fake, before: Connections) -> usize {
    let connections = fake.connections();
    let not_http2: Vec<String> = fake
        .requests()
        .iter()
        .filter(|r| r.version != Version::HTTP_2)
        .map(|r| format!("{} ({:?})", r.line(), r.version))
        .collect();
    assert!(
        not_http2.is_empty(),
        "every request over HTTP/2; the operator's connections: {connections}; not over HTTP/2:\n{}",
        not_http2.join("\n")
    );
    assert_eq!(connections.http1, before.http1, "{connections}");
    let new = connections.http2 - before.http2;
    assert!(
        new >= 1,
        "a new HTTP/2 connection (before: {before}; now: {connections})"
    );
    new
}

/// [`assert_http2_only`] for a start: the operator's requests begin one at a time (the Lease, discovery),
/// so each kube client opens one connection, which every later request and watch shares.
fn assert_one_http2_connection_per_client(fake: &Fake) {
    let new = assert_http2_only(fake, Connections::default());
    assert!(
        new <= CLIENTS,
        "one HTTP/2 connection per kube client: {new} ({})",
        fake.connections()
    );
}

/// [`assert_http2_only`] after the connections broke: every watch then starts again at about the same
/// time, and how many new connections that opens is a matter of timing, not a promise. The pool cannot
/// know that a connection still negotiating its protocol (ALPN) will be HTTP/2 and shareable, so every
/// request that starts meanwhile opens one of its own: one new connection on an idle machine, a few
/// when TLS handshakes are slow. Once one is up, every later request shares it. What does not depend on
/// timing is the protocol, which this checks.
fn assert_back_on_http2(fake: &Fake, before: Connections) {
    let new = assert_http2_only(fake, before);
    eprintln!(
        "{new} new HTTP/2 connection(s) after the old ones broke ({})",
        fake.connections()
    );
}

/// Whether, since `since`, the Memcacheds were listed again and then watched from that list.
fn watching_again(requests: &[Req], since: Instant) -> bool {
    let after = || {
        requests
            .iter()
            .filter(move |r| r.at >= since && r.path == MEMCACHEDS)
    };
    after()
        .find(|r| !r.is_watch())
        .is_some_and(|list| after().any(|r| r.is_watch() && r.seq > list.seq))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_tls_the_operator_speaks_http2_on_one_connection_per_client() {
    let fake = cluster::start_tls(World::default(), None).await;
    let (_scratch, mut op, metrics, probes) = start_run(&fake, "http2");
    leads_and_creates_the_children(&mut op, &fake, &probes).await;
    settled(&fake, Duration::from_millis(1500)).await;
    // The operator's own count of its answers by protocol says the same as the fake's.
    let (code, text) = http_get(&metrics, "/metrics")
        .await
        .expect("/metrics answers");
    assert_eq!(code, 200, "{text}");
    let over = |protocol: &str| {
        sample(
            &text,
            &format!("memcached_operator_kube_responses_total{{protocol=\"{protocol}\"}}"),
        )
    };
    assert!(over("HTTP/2").is_some_and(|n| n >= 1.0), "{text}");
    assert_eq!(over("HTTP/1.1"), None, "{text}");
    stop_and_check_release(&mut op, &fake).await;
    assert_no_unexpected_requests(&fake);
    let requests = fake.requests();
    let deployments = of(&requests, &Method::PATCH, *DEPLOYMENT);
    assert_eq!(deployments.len(), 1, "{deployments:#?}");
    assert_created(deployments[0], "Deployment");

    // The watches, the reconcile, the Lease and its release at shutdown: all on HTTP/2, one connection
    // per client.
    assert_one_http2_connection_per_client(&fake);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_http2_the_operator_recovers_when_the_api_server_drops_every_connection() {
    let fake = cluster::start_tls(World::default(), None).await;
    let (_scratch, mut op, _metrics, probes) = started(&fake, "http2-restart").await;
    let before = fake.connections();

    // Every request and watch shared the dropped connections: they all fail at once.
    let restarted_at = Instant::now();
    fake.restart().expect("a TLS fake restarts");
    // Created right after the restart: the resumed watch gets a 410, re-lists and finds it.
    add_memcached(&fake, memcached_named("fresh", "uid-2"));

    let took = applied_within(&fake, &mut op, "fresh", restarted_at).await;
    assert!(
        took < RESUME,
        "the new instance was reconciled {took:?} after the connections were dropped"
    );
    op.wait_until("/readyz answers 200 after the restart", RESUME, || {
        is_ok(&probes, "/readyz")
    })
    .await;
    // That the watch is back, not how fast: how soon the operator resumes is asserted above by the new
    // instance's reconcile, so the bound here is a liveness one. (This failed now and then while the fake
    // could still send the new instance over the old server's watch in the moment its connection was
    // cut: the operator then resumed from a valid version and never re-listed. The fake's watches now
    // send nothing after a restart.)
    op.wait_until(
        "the Memcached watch re-listed after its 410 and open again",
        Duration::from_secs(30),
        || {
            let watching = watching_again(&fake.requests(), restarted_at);
            async move { watching }
        },
    )
    .await;

    // It came back on HTTP/2, none over HTTP/1.1.
    assert_back_on_http2(&fake, before);
}

/// The node behind the operator's one HTTP/2 connection vanishes without a reset: every watch and request
/// on it hangs, and a new instance is only seen once the keep-alive pings have found the connection dead
/// (no PONG within [`KEEP_ALIVE_TIMEOUT`] of a ping sent [`KEEP_ALIVE_INTERVAL`] after the last frame),
/// closed it and the watches have resumed on a new one. Without the pings nothing would end the watches:
/// kube sets no read timeout (only a 295 s write timeout, and writes to a silent peer still succeed), and
/// a request's own timeout (65 s) ends that request alone, not the connection, nor a watch once started.
/// The new instance would never be reconciled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_http2_a_silent_dead_connection_is_found_by_keep_alive_pings() {
    let fake = cluster::start_tls(World::default(), None).await;
    let (_scratch, mut op, _metrics, probes) = started(&fake, "http2-vanish").await;
    // Quiet first, so that the operator had read every answer before the freeze.
    settled(&fake, Duration::from_millis(1500)).await;
    let before = fake.connections();

    // The watches and everything else shared the connection that goes silent: nothing fails, nothing
    // arrives. Only the pings can tell.
    let vanished_at = Instant::now();
    fake.vanish().expect("a TLS fake vanishes");
    // The last request answered for sure (the fake answers at once; a second is ample) before the
    // freeze: the operator read its answer later, so the pings cannot have found the connection dead
    // before `quiet_since + KEEP_ALIVE_INTERVAL + KEEP_ALIVE_TIMEOUT`.
    let quiet_since = fake
        .requests()
        .iter()
        .rev()
        .map(|r| r.at)
        .find(|&at| at + Duration::from_secs(1) <= vanished_at)
        .expect("the start-up requests");
    // Watches deliver events only when they start: this one waits for the resumed Memcached watch.
    add_memcached(&fake, memcached_named("fresh", "uid-2"));

    let found_by = KEEP_ALIVE_INTERVAL + KEEP_ALIVE_TIMEOUT;
    let deadline = found_by + AFTER_KEEP_ALIVE;
    op.wait_until(
        "the Deployment of fresh, over a new connection",
        deadline,
        || {
            let applied = !of(
                &fake.requests(),
                &Method::PATCH,
                &format!("{}/fresh", *DEPLOYMENTS),
            )
            .is_empty();
            async move { applied }
        },
    )
    .await;
    let took = vanished_at.elapsed();
    let requests = fake.requests();
    let first_after = requests
        .iter()
        .find(|r| r.at >= vanished_at)
        .expect("requests after the freeze");
    eprintln!(
        "fresh: Deployment applied {took:?} after the connection went silent; the first request on a \
         new connection came {:?} after it, {:?} after the last answered request",
        first_after.at - vanished_at,
        first_after.at - quiet_since,
    );
    // Nothing got through before the keep-alive gave up on the silent connection: the first request
    // the fake saw afterwards came on the new one, no earlier than the pings allow.
    assert!(
        first_after.at >= quiet_since + found_by,
        "a request came {:?} after the operator went quiet, before a ping could have failed: {}",
        first_after.at - quiet_since,
        first_after.line()
    );
    assert!(
        took <= deadline,
        "the new instance was reconciled {took:?} after the connection went silent"
    );
    op.wait_until("/readyz answers 200 on the new connection", RESUME, || {
        is_ok(&probes, "/readyz")
    })
    .await;

    // The new server serves the same store: the Memcached watch resumed from its resource version,
    // without a re-list.
    let after: Vec<&Req> = requests.iter().filter(|r| r.at >= vanished_at).collect();
    assert!(
        after
            .iter()
            .any(|r| r.path == MEMCACHEDS && r.is_watch() && r.param("resourceVersion").is_some()),
        "the Memcached watch resumed"
    );
    assert!(
        !after.iter().any(|r| r.path == MEMCACHEDS && !r.is_watch()),
        "a watch from a valid resource version resumes without a list"
    );

    // On a new HTTP/2 connection, none over HTTP/1.1.
    assert_back_on_http2(&fake, before);
}
