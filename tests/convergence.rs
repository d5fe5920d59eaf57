//! What converging costs in requests, across the reconciles of one operator process (one context):
//! the finalizer and the children in one pass, no second write of anything the watch has not brought
//! back yet (read-your-writes), and status changes that only move counts paced (issue #9).

mod common;

use common::mock::*;

/// A child as the API server stores it after the apply (a resource version the caches have not seen).
fn stored(body: &Value) -> Value {
    as_stored(body)
}

/// The instance as the API server stores it after a status apply: the whole object, a newer version.
fn stored_status(body: &Value) -> Value {
    let mut mc = serde_json::to_value(memcached(1)).unwrap();
    mc["metadata"]["resourceVersion"] = json!("11");
    mc["status"] = body["status"].clone();
    mc
}

/// The reconcile asked to run again when the pace is over, not at the safety requeue.
fn assert_runs_again_soon(action: &Action) {
    let pace = Settings::default().status_pace;
    let later = (1..=pace.as_millis() as u64)
        .map(|ms| Action::requeue(Duration::from_millis(ms)))
        .collect::<Vec<_>>();
    // The wait is what is left of the pace: at most the pace, and a reconcile takes well under 100 ms.
    assert!(
        later[later.len().saturating_sub(100)..].contains(action),
        "runs again within the pace ({pace:?}): {action:?}"
    );
}

/// The create path, every answer an object as stored.
fn creation() -> Vec<Exchange> {
    vec![
        expect(Method::PATCH, CONFIG_MAPS).apply().answer(stored),
        expect(Method::PATCH, DEPLOYMENTS).apply().answer(stored),
        expect(Method::PATCH, SERVICES).apply().answer(stored),
        expect(Method::PATCH, HEADLESS).apply().answer(stored),
        event(),
    ]
}

#[tokio::test]
async fn a_reconcile_before_the_watches_catch_up_writes_nothing_again() {
    let mut cluster = Cluster::new();
    let mut script = creation();
    script.push(expect(Method::PATCH, STATUS).apply().answer(stored_status));
    let session = Session::start(&cluster, settings(), script, NOW);
    session.reconcile(&mut cluster, memcached(1)).await.unwrap();
    // Another watch event triggers the instance while every cache is still as it was: the instance
    // without its status, no children. Nothing is applied again, no event, no status.
    let again = session.reconcile(&mut cluster, memcached(1)).await.unwrap();
    assert_eq!(again, Action::requeue(Duration::from_secs(300)));
    let seen = session.finish().await;
    assert_eq!(seen.len(), 6, "one creation, nothing more: {seen:#?}");
}

#[tokio::test]
async fn a_child_deleted_for_good_is_not_deleted_twice_while_the_cache_still_shows_it() {
    let mut cluster = Cluster::new();
    let (deployment, service, _) = create(&mut cluster, 2).await;
    cluster.deployment(settled(&deployment));
    cluster.service(serde_json::from_value(as_stored(&service)).unwrap());
    let mut mc = with_spec(
        2,
        json!({"highAvailability": {"podDisruptionBudget": {"enabled": false}}}),
    );
    mc.metadata.generation = Some(2);
    let script = vec![
        expect(Method::DELETE, PDBS),
        event(),
        expect(Method::PATCH, STATUS).apply().answer(|body| {
            let mut mc = serde_json::to_value(memcached(2)).unwrap();
            mc["metadata"]["resourceVersion"] = json!("12");
            mc["metadata"]["generation"] = json!(2);
            mc["spec"]["highAvailability"] = json!({"podDisruptionBudget": {"enabled": false}});
            mc["status"] = body["status"].clone();
            mc
        }),
    ];
    let session = Session::start(&cluster, settings(), script, NOW);
    session.reconcile(&mut cluster, mc.clone()).await.unwrap();
    // The PodDisruptionBudget cache has not seen the deletion yet.
    session.reconcile(&mut cluster, mc).await.unwrap();
    let seen = session.finish().await;
    assert_eq!(
        seen[1].body["note"],
        "Deleted PodDisruptionBudget cache: the spec no longer wants it"
    );
    assert_eq!(seen.len(), 3, "{seen:#?}");
}

#[tokio::test]
async fn with_pacing_the_first_status_waits_for_the_pods_to_show_up() {
    let mut cluster = Cluster::new();
    // The default pace: the children are created at once, the status that only says "nothing runs yet"
    // is held back for the pace, and the reconcile asks to run again then.
    let session = Session::start(&cluster, Settings::default(), creation(), NOW);
    let action = session.reconcile(&mut cluster, memcached(1)).await.unwrap();
    let seen = session.finish().await;
    assert_eq!(
        seen.len(),
        5,
        "children and their event, no status: {seen:#?}"
    );
    assert_runs_again_soon(&action);
}

#[tokio::test]
async fn with_pacing_a_published_server_is_written_at_once() {
    let mut cluster = Cluster::new();
    let (deployment, service, status) = create(&mut cluster, 1).await;
    cluster.service(serde_json::from_value(as_stored(&service)).unwrap());
    let mut mc = memcached(1);
    mc.status = Some(serde_json::from_value(status["status"].clone()).unwrap());
    cluster.deployment(settled(&deployment));
    let mut pod = ready_pod("cache-7d9f-a");
    pod.status.as_mut().unwrap().pod_ip = Some("127.0.0.1".into());
    cluster.pod(pod);

    // The workload was just scaled by this process (pace running), yet the server that became ready is
    // published, and its status written, at once.
    let session = Session::start(
        &cluster,
        Settings::default(),
        vec![
            expect(Method::PATCH, CONFIG_MAPS).apply(),
            expect(Method::PATCH, STATUS).apply(),
        ],
        NOW,
    );
    session.ctx.pace.wrote(NS, NAME);
    session.reconcile(&mut cluster, mc).await.unwrap();
    let seen = session.finish().await;
    assert_eq!(seen[0].body["data"]["servers"], "127.0.0.1:11211\n");
    assert_eq!(
        seen[1].body["status"]["serverList"],
        json!(["127.0.0.1:11211"])
    );
}

#[tokio::test]
async fn with_pacing_a_count_that_moves_within_the_pace_waits() {
    let mut cluster = Cluster::new();
    let (deployment, service, status) = create(&mut cluster, 2).await;
    cluster.service(serde_json::from_value(as_stored(&service)).unwrap());
    let mut mc = memcached(2);
    mc.status = Some(serde_json::from_value(status["status"].clone()).unwrap());
    // The Deployment's controller has counted one pod (not ready): only counts move.
    let mut counted = settled(&deployment);
    let counts = counted.status.as_mut().unwrap();
    counts.ready_replicas = Some(0);
    counts.available_replicas = Some(0);
    counts.replicas = Some(1);
    cluster.deployment(counted);

    let session = Session::start(&cluster, Settings::default(), vec![], NOW);
    session.ctx.pace.wrote(NS, NAME);
    let action = session.reconcile(&mut cluster, mc.clone()).await.unwrap();
    assert!(session.finish().await.is_empty());
    assert_runs_again_soon(&action);

    // Without a recent write the same change is written at once.
    let session = Session::start(
        &cluster,
        Settings::default(),
        vec![expect(Method::PATCH, STATUS).apply()],
        NOW,
    );
    session.reconcile(&mut cluster, mc).await.unwrap();
    let seen = session.finish().await;
    assert_eq!(seen[0].body["status"]["replicas"], 1);
}

#[tokio::test]
async fn a_child_deleted_right_after_it_was_applied_comes_back_at_once() {
    let mut cluster = Cluster::new();
    let mut script = creation();
    script.push(expect(Method::PATCH, STATUS).apply().answer(stored_status));
    // Someone deletes the Deployment before the operator's cache has even seen it; the watch delivers the
    // deletion, and the reconcile it triggers applies the Deployment again.
    script.extend([
        expect(Method::PATCH, DEPLOYMENTS).apply().answer(stored),
        event(),
    ]);
    let session = Session::start(&cluster, settings(), script, NOW);
    session.reconcile(&mut cluster, memcached(1)).await.unwrap();
    let mut deleted: Deployment = serde_json::from_value(json!({"metadata": {
        "name": NAME, "namespace": NS, "resourceVersion": "13"}}))
    .unwrap();
    session.ctx.written.observe_deleted(&deleted, &());
    session.reconcile(&mut cluster, memcached(1)).await.unwrap();
    let seen = session.finish().await;
    assert_eq!(seen.len(), 8, "{seen:#?}");
    assert_eq!(
        seen[7].body["note"],
        "Created Deployment cache with 1 replicas"
    );

    // The deletion of an older version (seen after the operator wrote a newer one) changes nothing.
    deleted.metadata.resource_version = Some("9".into());
    let written = memcached_operator::controller::Written::default();
    let applied = json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": NAME, "namespace": NS}, "spec": {"replicas": 1}});
    written.remember(Arc::new(settled(&applied)), &());
    written.observe_deleted(&deleted, &());
    assert_eq!(written.len(), 1);
}
