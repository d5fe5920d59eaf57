//! A first run that leads, reconciles and shuts down cleanly; restarts against instances already
//! settled, which write nothing; and instances an earlier build left with its finalizer.

use std::time::{Duration, Instant};

use axum::http::Method;
use serde_json::{Value, json};

use crate::checks::{
    MANAGED, SELECTOR, UNMANAGED, assert_created, assert_no_unexpected_requests, conditions, lines,
    of, sample, writes,
};
use crate::cluster::paths::{
    APPLY, CHILDREN, DEPLOYMENT, EVENTS, HEADLESS, INSTANCE, JSON_PATCH, LEASE, LEASES, MEMCACHEDS,
    MONITORING, PDB, PODS, SECRETS, SERVER_LIST, SERVICE, SERVICE_MONITORS, STATEFULSETS, STATUS,
};
use crate::cluster::world::{LEGACY_FINALIZER, World, memcached, with_legacy_finalizer};
use crate::cluster::{self, lease};
use crate::harness::{
    IDENTITY, TOKEN, WAIT, http_get, is_ok, leads_and_creates_the_children, run_once, settled,
    start_run, stop_and_check_release,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_reconciles_leads_and_shuts_down_cleanly() {
    let started = Instant::now();
    let fake = cluster::start(None).await;
    let (_scratch, mut op, metrics, probes) = start_run(&fake, "run");

    // Probes come up, and readiness follows leadership and the caches.
    op.wait_until("/healthz answers 200", WAIT, || is_ok(&probes, "/healthz"))
        .await;
    op.wait_until("/readyz answers 200", WAIT, || is_ok(&probes, "/readyz"))
        .await;

    // Leader election, then one reconcile: the children applied, and one event naming them; readiness
    // now means "leader with synced caches".
    leads_and_creates_the_children(&mut op, &fake, &probes).await;
    // Whatever the reconciles triggered by the initial lists would send.
    settled(&fake, Duration::from_millis(1500)).await;

    let requests = fake.requests();

    // Every request is authenticated with the kubeconfig's token.
    for req in &requests {
        assert_eq!(
            req.authorization.as_deref(),
            Some(format!("Bearer {TOKEN}").as_str()),
            "{}",
            req.line()
        );
    }

    // Lists and watches: the watched namespace only; children and pods by the managed-by label only, and
    // for each kind the operator creates by name, the objects without it (metadata only: same-named
    // objects it must not take over). Secrets are named by users, so that watch is not label-scoped (and
    // is metadata-only).
    let children = CHILDREN
        .iter()
        .map(|&path| (path, &[Some(MANAGED), Some(UNMANAGED)][..]));
    let others = [
        (MEMCACHEDS, &[None][..]),
        (PODS, &[Some(MANAGED)]),
        (SECRETS, &[None]),
    ];
    for (path, selectors) in others.into_iter().chain(children) {
        for &selector in selectors {
            let gets: Vec<_> = of(&requests, &Method::GET, path)
                .into_iter()
                .filter(|r| r.param("labelSelector") == selector)
                .collect();
            let lists: Vec<_> = gets.iter().filter(|r| !r.is_watch()).collect();
            assert_eq!(
                lists.len(),
                1,
                "one list of {path} by {selector:?}; got {}",
                lines(&requests)
            );
            assert!(
                gets.iter().any(|r| r.is_watch()),
                "a watch of {path} by {selector:?} follows its list; got {gets:#?}"
            );
        }
        let mut all = of(&requests, &Method::GET, path);
        // The start-up probe of an optional kind (may the operator list it at all?), and of the first
        // required kind (does the API server grant the operator anything?): one list of one object, no
        // selector.
        let before = all.len();
        all.retain(|r| !(r.param("limit") == Some("1") && r.param("labelSelector").is_none()));
        let probes = before - all.len();
        assert!(
            probes <= 1,
            "at most one permission probe of {path}; got {probes}"
        );
        for req in &all {
            assert!(
                selectors.contains(&req.param("labelSelector")),
                "{}",
                req.line()
            );
        }
        if selectors.contains(&Some(MANAGED)) {
            assert!(
                all.iter().any(|r| r
                    .raw_query
                    .contains("labelSelector=app.kubernetes.io%2Fmanaged-by%3Dmemcached-operator")),
                "the selector is URL-encoded: {}",
                lines(&requests)
            );
        }
        if selectors.contains(&Some(UNMANAGED)) {
            let foreign = all
                .iter()
                .find(|r| r.param("labelSelector") == Some(UNMANAGED))
                .map(|r| r.accept.as_deref().unwrap_or_default().to_owned());
            assert!(
                foreign.is_some_and(|accept| accept.contains("as=PartialObjectMetadata")),
                "the unmanaged objects of {path} are watched as metadata only"
            );
        }
    }

    // The Deployment: server-side applied, 2 replicas, memcached on the spec's port, controlled by the
    // instance.
    let deployments = of(&requests, &Method::PATCH, *DEPLOYMENT);
    assert_eq!(deployments.len(), 1, "{deployments:#?}");
    assert_created(deployments[0], "Deployment");
    let deployment = &deployments[0].body;
    assert_eq!(deployment["apiVersion"], "apps/v1");
    assert_eq!(deployment["spec"]["replicas"], 2, "{deployment}");
    let args: Vec<&str> = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    assert!(
        args.windows(2).any(|w| w == ["-p", "11211"]),
        "container args {args:?}"
    );

    let services = of(&requests, &Method::PATCH, *SERVICE);
    assert_eq!(services.len(), 1, "{services:#?}");
    assert_created(services[0], "Service");
    let service = &services[0].body;
    assert_eq!(service["spec"]["ports"][0]["port"], 11211, "{service}");
    let headless = of(&requests, &Method::PATCH, *HEADLESS);
    assert_eq!(headless.len(), 1, "{headless:#?}");
    assert_created(headless[0], "Service");
    assert_eq!(headless[0].body["spec"]["clusterIP"], "None");
    let pdbs = of(&requests, &Method::PATCH, *PDB);
    assert_eq!(pdbs.len(), 1, "a budget for 2 pods: {pdbs:#?}");
    assert_created(pdbs[0], "PodDisruptionBudget");
    // No server is ready yet: nothing to publish, so no server list yet.
    let lists = of(&requests, &Method::PATCH, *SERVER_LIST);
    assert!(lists.is_empty(), "{lists:#?}");
    // A Deployment instance has no StatefulSet.
    assert!(
        requests
            .iter()
            .all(|r| r.method == Method::GET || !r.path.starts_with(*STATEFULSETS)),
        "{}",
        fake.log()
    );
    // The cluster does not serve ServiceMonitors: discovered once, never listed.
    assert_eq!(of(&requests, &Method::GET, MONITORING).len(), 1);
    assert!(of(&requests, &Method::GET, SERVICE_MONITORS).is_empty());

    // Events: one for the creation, naming every child in the order applied, about the instance,
    // reported by this replica.
    let events = of(&requests, &Method::POST, EVENTS);
    assert_eq!(events.len(), 1, "{events:#?}");
    let body = &events[0].body;
    assert_eq!(body["reason"], "Created", "{body}");
    assert_eq!(body["type"], "Normal", "{body}");
    assert_eq!(body["regarding"]["kind"], "Memcached", "{body}");
    assert_eq!(body["regarding"]["name"], "cache", "{body}");
    assert_eq!(body["regarding"]["uid"], "uid-1", "{body}");
    assert_eq!(body["reportingController"], "memcached-operator", "{body}");
    assert_eq!(body["reportingInstance"], IDENTITY, "{body}");
    assert_eq!(
        body["note"],
        "Created Deployment cache with 2 replicas, Service cache, Service cache-headless, \
         PodDisruptionBudget cache",
        "{body}"
    );

    // The instance is written once: no finalizer, and its first status at once (`Creating`), although no
    // pod is ready yet.
    let writes: Vec<_> = requests
        .iter()
        .filter(|r| r.method != Method::GET && r.path.starts_with(MEMCACHEDS))
        .collect();
    assert_eq!(writes.len(), 1, "{}", fake.log());
    assert!(writes[0].path.ends_with("/status"), "{}", fake.log());

    // The Lease: created once, then acquired with an apply and a strategic-merge patch.
    assert_eq!(of(&requests, &Method::POST, LEASES).len(), 1);
    let lease = lease(&fake).unwrap();
    assert_eq!(lease["spec"]["holderIdentity"], IDENTITY, "{lease}");
    assert_eq!(lease["spec"]["leaseDurationSeconds"], 15, "{lease}");
    assert!(lease["spec"]["renewTime"].is_string(), "{lease}");
    let lease_patches = of(&requests, &Method::PATCH, LEASE);
    assert!(
        lease_patches
            .iter()
            .any(|r| r.content_type.as_deref() == Some(APPLY)
                && r.body["spec"]["holderIdentity"] == IDENTITY),
        "{lease_patches:#?}"
    );

    // Metrics.
    let (code, text) = http_get(&metrics, "/metrics")
        .await
        .expect("/metrics answers");
    assert_eq!(code, 200, "{text}");
    // (`sample` reads the value line, not the HELP text, which also starts with the metric name.)
    assert_eq!(
        sample(&text, "memcached_operator_leader"),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        sample(&text, "memcached_operator_managed_instances"),
        Some(1.0),
        "{text}"
    );
    for metric in [
        "memcached_operator_reconcile_total{result=\"success\"}",
        "memcached_operator_kube_requests_total{verb=\"patch\",code=\"200\"}",
        // A plain http:// server is spoken to over HTTP/1.1 (HTTP/2 is negotiated over TLS only).
        "memcached_operator_kube_responses_total{protocol=\"HTTP/1.1\"}",
    ] {
        assert!(
            sample(&text, metric).is_some_and(|n| n >= 1.0),
            "missing {metric:?} in\n{text}"
        );
    }
    assert_eq!(
        sample(
            &text,
            "memcached_operator_reconcile_total{result=\"error\"}"
        ),
        None,
        "{text}"
    );

    // SIGTERM: a clean exit that releases the Lease.
    stop_and_check_release(&mut op, &fake).await;
    assert_no_unexpected_requests(&fake);
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "took {:?}",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_against_a_settled_instance_writes_nothing() {
    // What a restart or a leader hand-over looks like to the operator. Reconciles used to start as soon
    // as the Memcached cache was filled, often before the others: the existing Deployment and Service
    // were taken for missing ones, applied again with "Created" events, and the status was written
    // without the pods.

    // 1. First start: the operator creates the children; keep what it applied.
    let first = run_once(World::default(), "settle-1").await;
    let applied = |path| {
        let patches = of(&first, &Method::PATCH, path);
        assert_eq!(patches.len(), 1, "{patches:#?}");
        patches[0].body.clone()
    };
    let mut deployment = stored(&applied(*DEPLOYMENT), "uid-deployment");
    deployment["spec"]["progressDeadlineSeconds"] = json!(600);
    deployment["status"] = json!({"observedGeneration": 1, "replicas": 2, "readyReplicas": 2,
                                  "updatedReplicas": 2, "availableReplicas": 2});
    let service = stored(&applied(*SERVICE), "uid-service");
    let headless = stored(&applied(*HEADLESS), "uid-headless");
    let pdb = stored(&applied(*PDB), "uid-pdb");
    assert!(
        of(&first, &Method::PATCH, *SERVER_LIST).is_empty(),
        "no server list before a server is ready:\n{}",
        lines(&first)
    );
    assert_eq!(
        of(&first, &Method::PATCH, STATUS).len(),
        1,
        "the first status at once:\n{}",
        lines(&first)
    );
    let mut world = World {
        children: vec![deployment, service, headless, pdb],
        pods: vec![
            ready_pod("cache-7d4b9c8f6d-a1b2c", "127.0.0.1"),
            ready_pod("cache-7d4b9c8f6d-d3e4f", "127.0.0.2"),
        ],
        ..World::default()
    };

    // 2. The children exist and the pods are ready: the server list is created with both servers, and the
    //    first status is written, once each: the fake's watches bring both back, and what the operator
    //    reads back is what it wrote. Nothing else (the list is not worth an event).
    let second = run_once(world.clone(), "settle-2").await;
    let written = writes(&second);
    let lists: Vec<_> = written
        .iter()
        .filter(|r| r.is(&Method::PATCH, *SERVER_LIST))
        .collect();
    let statuses: Vec<_> = written
        .iter()
        .filter(|r| r.is(&Method::PATCH, STATUS))
        .collect();
    assert!(
        statuses.len() == 1
            && lists.len() == 1
            && written
                .iter()
                .all(|r| r.is(&Method::PATCH, STATUS) || r.is(&Method::PATCH, *SERVER_LIST)),
        "{written:#?}\n{}",
        lines(&second)
    );
    assert_created(lists[0], "ConfigMap");
    let published = &lists[lists.len() - 1].body;
    assert_eq!(
        published["data"]["servers"], "127.0.0.1:11211\n127.0.0.2:11211\n",
        "{published}"
    );
    world.children.push(stored(published, "uid-servers"));
    // Status: server-side applied through the subresource, with the three conditions and the selector.
    let first_status = statuses[0];
    assert_eq!(
        first_status.content_type.as_deref(),
        Some(APPLY),
        "{}",
        first_status.line()
    );
    assert_eq!(
        first_status.param("fieldManager"),
        Some("memcached-operator")
    );
    assert_eq!(first_status.param("force"), Some("true"));
    let status = statuses[statuses.len() - 1].body["status"].clone();
    let mut types = conditions(&status);
    types.sort();
    assert_eq!(types, ["Available", "Degraded", "Progressing"], "{status}");
    assert_eq!(status["selector"], SELECTOR, "{status}");
    assert_eq!(status["observedGeneration"], 1, "{status}");
    assert_eq!(status["readyReplicas"], 2, "{status}");
    assert_eq!(
        status["nodes"],
        json!(["cache-7d4b9c8f6d-a1b2c", "cache-7d4b9c8f6d-d3e4f"]),
        "{status}"
    );
    world.memcacheds[0]["status"] = status;

    // 3. Everything settled: a restart writes nothing at all.
    let third = run_once(world.clone(), "settle-3").await;
    assert!(
        writes(&third).is_empty(),
        "{:#?}\n{}",
        writes(&third),
        lines(&third)
    );

    // 4. Same, when the children's lists arrive after the instance's (a large cluster, a busy API
    //    server): the reconcile must not act on caches that do not hold their initial lists yet.
    world.slow_lists = CHILDREN
        .iter()
        .copied()
        .chain([PODS, SECRETS])
        .map(|path| (path, Duration::from_millis(1500)))
        .collect();
    let fourth = run_once(world, "settle-4").await;
    assert!(
        writes(&fourth).is_empty(),
        "{:#?}\n{}",
        writes(&fourth),
        lines(&fourth)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_of_an_earlier_build_loses_its_finalizer_and_is_reconciled() {
    let world = World {
        memcacheds: vec![with_legacy_finalizer(memcached())],
        ..World::default()
    };
    let requests = run_once(world, "legacy").await;
    let patches = of(&requests, &Method::PATCH, INSTANCE);
    assert_eq!(patches.len(), 1, "{}", lines(&requests));
    assert_eq!(patches[0].content_type.as_deref(), Some(JSON_PATCH));
    assert_eq!(
        patches[0].body,
        json!([{"op": "test", "path": "/metadata/finalizers/0", "value": LEGACY_FINALIZER},
               {"op": "remove", "path": "/metadata/finalizers/0"}])
    );
    // The same reconcile goes on: the children follow the patch.
    let deployments = of(&requests, &Method::PATCH, *DEPLOYMENT);
    assert_eq!(deployments.len(), 1, "{}", lines(&requests));
    assert!(deployments[0].seq > patches[0].seq, "{}", lines(&requests));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_instance_of_an_earlier_build_only_loses_its_finalizer() {
    let mut instance = with_legacy_finalizer(memcached());
    instance["metadata"]["deletionTimestamp"] = json!("2024-01-02T00:00:00Z");
    let world = World {
        memcacheds: vec![instance],
        ..World::default()
    };
    let requests = run_once(world, "legacy-deleted").await;
    let written = writes(&requests);
    assert_eq!(written.len(), 1, "{}", lines(&requests));
    assert!(
        written[0].is(&Method::PATCH, INSTANCE),
        "{}",
        written[0].line()
    );
}

pub fn stored(applied: &Value, uid: &str) -> Value {
    let mut obj = applied.clone();
    obj["metadata"]["uid"] = json!(uid);
    obj["metadata"]["resourceVersion"] = json!("5");
    obj["metadata"]["generation"] = json!(1);
    obj["metadata"]["creationTimestamp"] = json!("2024-01-01T00:00:00Z");
    obj
}

pub fn ready_pod(name: &str, ip: &str) -> Value {
    ready_pod_of("cache", name, ip)
}

/// A ready pod of `instance` at `ip`.
pub fn ready_pod_of(instance: &str, name: &str, ip: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}"),
            "resourceVersion": "5", "labels": {
            "app.kubernetes.io/name": "memcached", "app.kubernetes.io/instance": instance,
            "app.kubernetes.io/managed-by": "memcached-operator"}},
        "spec": {"containers": [{"name": "memcached", "image": "memcached:1.6-alpine"}]},
        "status": {"phase": "Running", "podIP": ip,
                   "conditions": [{"type": "Ready", "status": "True"}]}
    })
}
