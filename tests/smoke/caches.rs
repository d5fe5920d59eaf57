//! Caches that fill in any order reconcile the same; caches that never fill hold reconciles back but
//! not shutdown.

use std::time::Duration;

use axum::http::Method;

use crate::checks::{bodies, lines, of, writes};
use crate::cluster::paths::{
    CHILDREN, CONFIGMAPS, DEPLOYMENT, DEPLOYMENTS, EVENTS, MEMCACHEDS, PDBS, PODS, SECRETS,
    SERVER_LIST, SERVICES, STATUS,
};
use crate::cluster::world::{World, memcached_named};
use crate::cluster::{self, lease_holder};
use crate::harness::{IDENTITY, WAIT, http_get, run_once, start_run, stop_and_check_release};
use crate::reconcile::ready_pod_of;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn caches_may_sync_in_any_order() {
    // The instances' list arrives after the others. /readyz must still turn ready: it used to wait for
    // the Memcached cache next to the controller, and a cache wakes only its latest waiter.
    let world = World {
        slow_lists: vec![(MEMCACHEDS, Duration::from_millis(1500))],
        ..World::default()
    };
    let requests = run_once(world, "slow-instances").await;
    assert_eq!(of(&requests, &Method::PATCH, *DEPLOYMENT).len(), 1);
    // No pod is ready: no server list yet, and one first status (`Creating`).
    assert!(of(&requests, &Method::PATCH, *SERVER_LIST).is_empty());
    assert_eq!(of(&requests, &Method::PATCH, STATUS).len(), 1);

    // The children's and pods' lists arrive last, and there are more instances than reconcile slots
    // (4): each reconcile waits for those caches, every one of them then goes ahead, once. Each instance
    // has its two pods ready, so its server list is created too, once the pods' list is in.
    let names: Vec<String> = (1..=6).map(|i| format!("mc-{i}")).collect();
    // Every kind of child, the pods and the Secrets.
    let slow: Vec<&str> = CHILDREN.iter().copied().chain([PODS, SECRETS]).collect();
    let world = World {
        memcacheds: names
            .iter()
            .map(|name| memcached_named(name, &format!("uid-{name}")))
            .collect(),
        pods: names
            .iter()
            .zip(1..)
            .flat_map(|(name, i)| {
                [
                    ready_pod_of(name, &format!("{name}-a"), &format!("127.0.{i}.1")),
                    ready_pod_of(name, &format!("{name}-b"), &format!("127.0.{i}.2")),
                ]
            })
            .collect(),
        slow_lists: slow
            .iter()
            .map(|&path| (path, Duration::from_millis(1500)))
            .collect(),
        ..World::default()
    };
    let requests = run_once(world, "slow-children").await;
    let listed = |path| {
        let list = requests
            .iter()
            .find(|r| r.is(&Method::GET, path) && !r.is_watch())
            .unwrap_or_else(|| panic!("no list of {path}"));
        list.at + Duration::from_millis(1500)
    };
    let synced = slow.iter().copied().map(listed).max().unwrap();
    for name in &names {
        for path in [
            format!("{}/{name}", *DEPLOYMENTS),
            format!("{}/{name}", *SERVICES),
            format!("{}/{name}-headless", *SERVICES),
            format!("{}/{name}", *PDBS),
            format!("{}/{name}-servers", *CONFIGMAPS),
        ] {
            let patches = of(&requests, &Method::PATCH, &path);
            let (all, written) = (lines(&requests), bodies(&patches));
            assert_eq!(patches.len(), 1, "{path}:\n{all}\nwritten:\n{written}");
            assert!(
                patches[0].at >= synced,
                "{path} was written before the caches were filled:\n{}",
                lines(&requests)
            );
        }
        // The first status at once, after the caches were filled, and once: the fake runs no Deployment
        // controller, so nothing moves the instance on within the run, and the status read back through
        // the watch is the one written.
        let statuses = of(
            &requests,
            &Method::PATCH,
            &format!("{MEMCACHEDS}/{name}/status"),
        );
        assert_eq!(statuses.len(), 1, "{name}:\n{}", lines(&requests));
        assert!(statuses[0].at >= synced, "{name}:\n{}", lines(&requests));
        // One event for the creation, naming every child.
        let events: Vec<_> = requests
            .iter()
            .filter(|r| r.is(&Method::POST, EVENTS) && r.body["regarding"]["name"] == name.as_str())
            .collect();
        assert_eq!(events.len(), 1, "{name}:\n{}", lines(&requests));
        assert_eq!(events[0].body["reason"], "Created", "{}", events[0].body);
        assert_eq!(
            events[0].body["note"],
            format!(
                "Created Deployment {name} with 2 replicas, Service {name}, Service {name}-headless, \
                 PodDisruptionBudget {name}"
            ),
            "{}",
            events[0].body
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn caches_that_never_sync_hold_reconciles_but_not_shutdown() {
    // The pods' list never comes back (within the test): the leader must not reconcile on the partial
    // caches, must not report ready, and must still stop promptly and release the Lease on SIGTERM.
    let world = World {
        slow_lists: vec![(PODS, Duration::from_secs(120))],
        ..World::default()
    };
    let fake = cluster::start_with(world, None).await;
    let (_scratch, mut op, _metrics, probes) = start_run(&fake, "never-synced");
    op.wait_until("the Lease is held by smoke-1", WAIT, || {
        let holder = lease_holder(&fake);
        async move { holder.as_deref() == Some(IDENTITY) }
    })
    .await;
    op.wait_until("the pods' list is requested", WAIT, || {
        let requests = fake.requests();
        async move { !of(&requests, &Method::GET, PODS).is_empty() }
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (code, body) = http_get(&probes, "/readyz").await.expect("/readyz answers");
    assert_eq!(code, 503, "{body}");
    let requests = fake.requests();
    assert!(writes(&requests).is_empty(), "{}", lines(&requests));

    stop_and_check_release(&mut op, &fake).await;
}
