//! The reconciler against a mocked API server: every request it makes, in order, per scenario.
//!
//! The stores stand in for the watch caches: each test puts in them what a real cluster would have, runs
//! one reconcile, and the mock checks the requests (method, path, body) and answers them. When the
//! reconcile returns, the mock asserts nothing else was sent.

mod common;

use std::time::Duration;

use common::mock::*;

/// An instance of size 1 that `kubectl delete` has marked for deletion; something still holds it (the
/// scenarios add the finalizer that does).
fn being_deleted() -> Memcached {
    let mut mc = memcached(1);
    mc.metadata.deletion_timestamp = Some(Time(Timestamp::from_second(NOW).unwrap()));
    mc
}

// ---------------------------------------------------------------------------------------------------
// Scenarios.

/// A new instance carries no finalizer and gets none: its first reconcile creates its children, and the
/// instance itself is never patched.
#[tokio::test]
async fn a_new_instance_gets_its_children_without_a_finalizer() {
    let mut cluster = Cluster::new();
    let mut script = created_children(*DEPLOYMENTS, 1);
    script.push(expect(Method::PATCH, STATUS).apply());
    let run = run(&mut cluster, memcached(1), script).await;
    assert_eq!(
        run.result.unwrap(),
        Action::requeue(Duration::from_secs(300))
    );
    let paths: Vec<&str> = run.seen.iter().map(|s| s.path.as_str()).collect();
    assert_eq!(
        paths,
        [*DEPLOYMENTS, *SERVICES, *HEADLESS, EVENTS, STATUS],
        "the children, one event and (written at once in these scenarios) the status; no finalizer, and \
         no server list before a server is ready"
    );
    let event = &run.seen[3].body;
    assert_eq!(event["reason"], "Created");
    assert_eq!(
        event["note"],
        "Created Deployment cache with 1 replicas, Service cache, Service cache-headless"
    );
    let owner = &run.seen[0].body["metadata"]["ownerReferences"][0];
    assert_eq!(
        (owner["kind"].as_str(), owner["uid"].as_str()),
        (Some("Memcached"), Some("uid-1"))
    );
    let status = &run.seen[4].body;
    assert_eq!(status["status"]["observedGeneration"], 1);
    assert_eq!(condition(status, "Degraded")["status"], "False");
}

/// An instance created by an earlier build still carries its finalizer: one JSON patch removes it (testing
/// that it is still where it was seen), and the same reconcile goes on with the instance as patched.
#[tokio::test]
async fn a_legacy_instance_loses_its_finalizer_then_reconciles_as_usual() {
    let mut cluster = Cluster::new();
    let mut patched = serde_json::to_value(memcached(1)).unwrap();
    patched["metadata"]["resourceVersion"] = json!("2");
    let mut script = vec![expect(Method::PATCH, MEMCACHED).reply(StatusCode::OK, patched)];
    script.extend(created_children(*DEPLOYMENTS, 1));
    script.push(expect(Method::PATCH, STATUS).apply());
    let run = run(&mut cluster, with_legacy_finalizer(memcached(1)), script).await;
    assert_eq!(
        run.result.unwrap(),
        Action::requeue(Duration::from_secs(300))
    );
    assert_eq!(
        run.seen[0].body,
        json!([
            {"op": "test", "path": "/metadata/finalizers/0", "value": FINALIZER},
            {"op": "remove", "path": "/metadata/finalizers/0"},
        ]),
        "a JSON patch that tests the finalizer is still there, then removes it"
    );
    let patches = run.seen.iter().filter(|s| s.path == MEMCACHED).count();
    assert_eq!(patches, 1, "the instance is patched once: {:#?}", run.seen);
}

/// A settled instance of an earlier build: the finalizer's removal is the only request.
#[tokio::test]
async fn a_settled_legacy_instance_sends_only_the_finalizer_removal() {
    let mut cluster = Cluster::new();
    let (deployment, service, _) = create(&mut cluster, 1).await;
    cluster.child::<Deployment>(settled(&deployment));
    cluster.child::<Service>(serde_json::from_value(as_stored(&service)).unwrap());
    let settle = run(
        &mut cluster,
        memcached(1),
        vec![expect(Method::PATCH, STATUS).apply()],
    )
    .await;
    let mut mc = memcached(1);
    mc.status = Some(serde_json::from_value(settle.seen[0].body["status"].clone()).unwrap());
    let mut patched = serde_json::to_value(&mc).unwrap();
    patched["metadata"]["resourceVersion"] = json!("2");
    let run = run(
        &mut cluster,
        with_legacy_finalizer(mc),
        vec![expect(Method::PATCH, MEMCACHED).reply(StatusCode::OK, patched)],
    )
    .await;
    run.result.unwrap();
    assert_eq!(run.seen.len(), 1, "{:#?}", run.seen);
}

#[tokio::test]
async fn create_applies_deployment_service_and_status() {
    let mut cluster = Cluster::new();
    let (deployment, service, status) = create(&mut cluster, 1).await;

    assert_eq!(deployment["apiVersion"], "apps/v1");
    assert_eq!(deployment["kind"], "Deployment");
    assert_eq!(deployment["spec"]["replicas"], 1);
    let owner = &deployment["metadata"]["ownerReferences"][0];
    assert_eq!(
        (
            owner["kind"].as_str(),
            owner["uid"].as_str(),
            owner["controller"].as_bool()
        ),
        (Some("Memcached"), Some("uid-1"), Some(true))
    );
    assert!(deployment["metadata"]["annotations"]["cache.example.com/desired-hash"].is_string());
    assert!(
        deployment.get("status").is_none(),
        "status is never applied"
    );
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(
        container["args"],
        json!(["-p", "11211", "-m", "64", "-o", "modern"])
    );
    assert_eq!(container["image"], "memcached:1.6-alpine");

    assert_eq!(service["kind"], "Service");
    assert_eq!(service["spec"]["ports"][0]["port"], 11211);

    assert_eq!(status["apiVersion"], "cache.example.com/v1alpha1");
    assert_eq!(status["kind"], "Memcached");
    assert_eq!(status["status"]["observedGeneration"], 1);
    assert_eq!(
        status["status"]["selector"],
        "app.kubernetes.io/instance=cache,app.kubernetes.io/name=memcached"
    );
    assert_eq!(condition(&status, "Available")["status"], "False");
    assert_eq!(condition(&status, "Progressing")["status"], "True");
    assert_eq!(condition(&status, "Degraded")["status"], "False");
    assert_eq!(
        condition(&status, "Degraded")["lastTransitionTime"],
        "2023-11-14T22:13:20Z"
    );
}

#[tokio::test]
async fn unchanged_instance_makes_no_request_at_all() {
    let mut cluster = Cluster::new();
    let (deployment, service, _) = create(&mut cluster, 2).await;

    // The cluster catches up: children exist with server defaults, pods are ready.
    cluster.child::<Deployment>(settled(&deployment));
    cluster.child::<Service>(serde_json::from_value(as_stored(&service)).unwrap());
    cluster.pod(ready_pod("cache-7d9f-b"));
    cluster.pod(ready_pod("cache-7d9f-a"));

    // One reconcile records the settled status ...
    let run1 = run(
        &mut cluster,
        memcached(2),
        vec![expect(Method::PATCH, STATUS).apply()],
    )
    .await;
    run1.result.unwrap();
    let status: MemcachedStatus =
        serde_json::from_value(run1.seen[0].body["status"].clone()).unwrap();
    assert_eq!(status.ready_replicas, 2);
    assert_eq!(status.nodes, ["cache-7d9f-a", "cache-7d9f-b"]);
    assert_eq!(condition(&run1.seen[0].body, "Available")["status"], "True");
    assert_eq!(
        condition(&run1.seen[0].body, "Progressing")["reason"],
        "Complete"
    );

    // ... and from then on a reconcile writes nothing: no apply, no status, no event.
    let mut mc = memcached(2);
    mc.status = Some(status);
    let run2 = run(&mut cluster, mc.clone(), vec![]).await;
    assert_eq!(
        run2.result.unwrap(),
        Action::requeue(Duration::from_secs(300))
    );
    assert!(run2.seen.is_empty());
    assert!(
        run2.metrics
            .encode()
            .contains("memcached_operator_reconcile_total{result=\"success\"} 1")
    );
    let run3 = run(&mut cluster, mc, vec![]).await;
    assert!(run3.result.is_ok() && run3.seen.is_empty());
}

#[tokio::test]
async fn scaling_applies_the_deployment_and_adds_a_budget() {
    let mut cluster = Cluster::new();
    let (deployment, service, _) = create(&mut cluster, 1).await;
    cluster.child::<Deployment>(settled(&deployment));
    cluster.child::<Service>(serde_json::from_value(as_stored(&service)).unwrap());

    let run = run(
        &mut cluster,
        memcached(3),
        vec![
            expect(Method::PATCH, *DEPLOYMENTS).apply(),
            expect(Method::PATCH, *PDBS).create(),
            event(),
            event(),
            expect(Method::PATCH, STATUS).apply(),
        ],
    )
    .await;
    run.result.unwrap();
    assert_eq!(run.seen[0].body["spec"]["replicas"], 3);
    assert_eq!(run.seen[1].body["spec"]["maxUnavailable"], 1);
    // One event per kind of change, after the applies: Created before Scaled.
    assert_eq!(run.seen[2].body["reason"], "Created");
    assert_eq!(
        run.seen[2].body["note"],
        "Created PodDisruptionBudget cache"
    );
    assert_eq!(run.seen[3].body["reason"], "Scaled");
    assert_eq!(
        run.seen[3].body["note"],
        "Scaled Deployment cache from 1 to 3 replicas"
    );
}

#[tokio::test]
async fn drift_is_put_back_and_deleted_children_come_back() {
    let mut cluster = Cluster::new();
    let (deployment, _service, _) = create(&mut cluster, 3).await;

    // Someone scaled the Deployment by hand and changed its image; the Service was deleted.
    let mut drifted = settled(&deployment);
    drifted.spec.as_mut().unwrap().replicas = Some(1);
    let pod = drifted
        .spec
        .as_mut()
        .unwrap()
        .template
        .spec
        .as_mut()
        .unwrap();
    pod.containers[0].image = Some("memcached:evil".into());
    cluster.child::<Deployment>(drifted);

    let run = run(
        &mut cluster,
        memcached(3),
        vec![
            expect(Method::PATCH, *DEPLOYMENTS).apply(),
            expect(Method::PATCH, *SERVICES).create(),
            event(),
            event(),
            expect(Method::PATCH, STATUS).apply(),
        ],
    )
    .await;
    run.result.unwrap();
    let applied = &run.seen[0].body;
    assert_eq!(applied["spec"]["replicas"], 3);
    assert_eq!(
        applied["spec"]["template"]["spec"]["containers"][0]["image"],
        "memcached:1.6-alpine"
    );
    assert_eq!(run.seen[1].body["kind"], "Service");
    assert_eq!(run.seen[2].body["note"], "Created Service cache");
    assert_eq!(
        run.seen[3].body["note"],
        "Scaled Deployment cache from 1 to 3 replicas"
    );
}

#[tokio::test]
async fn template_drift_without_replica_change_is_an_update() {
    let mut cluster = Cluster::new();
    let (deployment, service, _) = create(&mut cluster, 1).await;
    let mut drifted = settled(&deployment);
    let pod = drifted
        .spec
        .as_mut()
        .unwrap()
        .template
        .spec
        .as_mut()
        .unwrap();
    pod.containers[0].args = Some(vec!["-m".into(), "1024".into()]);
    cluster.child::<Deployment>(drifted);
    cluster.child::<Service>(serde_json::from_value(as_stored(&service)).unwrap());

    let run = run(
        &mut cluster,
        memcached(1),
        vec![
            expect(Method::PATCH, *DEPLOYMENTS).apply(),
            event(),
            expect(Method::PATCH, STATUS).apply(),
        ],
    )
    .await;
    run.result.unwrap();
    assert_eq!(run.seen[1].body["reason"], "Updated");
}

/// An instance of an earlier build deleted before the current operator saw it: the finalizer's removal
/// is all there is to do (no event, no status, nothing applied); garbage collection removes the children.
#[tokio::test]
async fn a_legacy_instance_being_deleted_gets_only_the_finalizer_removal() {
    let mut cluster = Cluster::new();
    let run = run(
        &mut cluster,
        with_legacy_finalizer(being_deleted()),
        vec![expect(Method::PATCH, MEMCACHED).reply(
            StatusCode::OK,
            serde_json::to_value(being_deleted()).unwrap(),
        )],
    )
    .await;
    assert_eq!(run.result.unwrap(), Action::await_change());
    assert_eq!(
        run.seen[0].body,
        json!([
            {"op": "test", "path": "/metadata/finalizers/0", "value": FINALIZER},
            {"op": "remove", "path": "/metadata/finalizers/0"},
        ])
    );
    assert_eq!(run.seen.len(), 1, "{:#?}", run.seen);
}

/// An instance being deleted without the legacy finalizer (held by someone else's): nothing to do.
#[tokio::test]
async fn an_instance_being_deleted_needs_no_request() {
    let mut cluster = Cluster::new();
    let mut mc = being_deleted();
    mc.metadata.finalizers = Some(vec!["example.com/someone-else".into()]);
    let run = run(&mut cluster, mc, vec![]).await;
    assert_eq!(run.result.unwrap(), Action::await_change());
    assert!(run.seen.is_empty());
}

/// After a leader hand-over the new leader may remove the finalizer of an instance that the old one already
/// let go: the API server answers 404, which means the work is done, not that it failed.
#[tokio::test]
async fn finalizer_removal_on_an_instance_already_gone_is_success() {
    let mut cluster = Cluster::new();
    let run = run(
        &mut cluster,
        with_legacy_finalizer(being_deleted()),
        vec![expect(Method::PATCH, MEMCACHED).fail(404, "NotFound")],
    )
    .await;
    assert_eq!(run.result.unwrap(), Action::await_change());
    assert_eq!(
        run.seen.len(),
        1,
        "no ReconcileFailed event after the 404: {:#?}",
        run.seen
    );
    let text = run.metrics.encode();
    assert!(
        text.contains("memcached_operator_reconcile_total{result=\"success\"} 1"),
        "{text}"
    );
    assert!(!text.contains("kind=\"finalizer\""), "{text}");
}

/// Any other failure to remove the finalizer is still a failure, retried with backoff.
#[tokio::test]
async fn finalizer_removal_failing_otherwise_is_retried() {
    let mut cluster = Cluster::new();
    let run = run(
        &mut cluster,
        with_legacy_finalizer(memcached(1)),
        vec![
            expect(Method::PATCH, MEMCACHED).fail(500, "InternalError"),
            event(),
        ],
    )
    .await;
    assert_eq!(run.result.unwrap_err().kind(), "finalizer");
    assert_eq!(run.seen[1].body["reason"], "ReconcileFailed");
    assert_eq!(
        run.seen.len(),
        2,
        "nothing applied before it: {:#?}",
        run.seen
    );
}

#[tokio::test]
async fn transient_api_errors_are_retried_with_growing_backoff() {
    for (code, reason) in [(500, "InternalError"), (409, "Conflict")] {
        let mut cluster = Cluster::new();
        let run = run(
            &mut cluster,
            memcached(1),
            vec![
                expect(Method::PATCH, *DEPLOYMENTS)
                    .create()
                    .fail(code, reason),
                event(),
            ],
        )
        .await;
        let error = run.result.unwrap_err();
        assert_eq!(error.kind(), "apply");
        assert!(
            error.problem().is_none(),
            "a {code} is not reported as Degraded"
        );
        assert_eq!(run.seen[1].body["reason"], "ReconcileFailed");
        assert_eq!(run.seen[1].body["type"], "Warning");
        assert!(
            run.metrics
                .encode()
                .contains("memcached_operator_reconcile_errors_total{kind=\"apply\"} 1")
        );
    }
}

/// A child that fails midway: what was changed before it is still recorded, in one event, before the failure.
#[tokio::test]
async fn changes_made_before_a_failing_child_are_recorded_before_the_failure() {
    let mut cluster = Cluster::new();
    let run = run(
        &mut cluster,
        memcached(1),
        vec![
            expect(Method::PATCH, *DEPLOYMENTS).create(),
            expect(Method::PATCH, *SERVICES)
                .create()
                .fail(500, "InternalError"),
            event(),
            event(),
        ],
    )
    .await;
    assert_eq!(run.result.unwrap_err().kind(), "apply");
    assert_eq!(run.seen[2].body["reason"], "Created");
    assert_eq!(
        run.seen[2].body["note"],
        "Created Deployment cache with 1 replicas"
    );
    assert_eq!(run.seen[3].body["reason"], "ReconcileFailed");
    assert_eq!(run.seen[3].body["type"], "Warning");
}

/// A context over `cluster`'s caches whose client is never answered: for what happens without requests.
fn offline_context(cluster: &Cluster) -> Arc<Context> {
    let (service, _handle) = mock::pair::<Request<Body>, Response<Body>>();
    Arc::new(Context::new(
        Client::new(service, NS),
        Settings::default(),
        cluster.stores.clone(),
        Arc::new(Metrics::default()),
        None,
        Arc::new(|| Time(Timestamp::from_second(NOW).unwrap())),
    ))
}

#[tokio::test]
async fn error_policy_backs_off_per_object_and_resets_on_success() {
    let mut cluster = Cluster::new();
    let ctx = offline_context(&cluster);
    let mc = Arc::new(memcached(1));
    let mut other = memcached(1);
    other.metadata.name = Some("other".into());
    // Both are in the instance cache: a failure of an instance that is gone is not counted (see below).
    for instance in [mc.as_ref(), &other] {
        cluster
            .memcacheds
            .apply_watcher_event(&watcher::Event::Apply(instance.clone()));
    }
    let err = Error::Malformed("test".into());
    let delays: Vec<Duration> = (0..6)
        .map(|_| requeue_of(error_policy(mc.clone(), &err, ctx.clone())))
        .collect();
    // Jitter keeps each delay within [ceiling/2, ceiling] of 1, 2, 4, 8, 16, 32 seconds.
    for (i, d) in delays.iter().enumerate() {
        let ceiling = Duration::from_secs(1 << i);
        assert!(*d <= ceiling && *d >= ceiling / 2, "attempt {i}: {d:?}");
    }
    assert!(requeue_of(error_policy(Arc::new(other), &err, ctx.clone())) <= Duration::from_secs(1));

    // A successful reconcile (no writes needed) resets the count.
    ctx.backoff
        .reset(&kube::runtime::reflector::ObjectRef::from_obj(mc.as_ref()));
    assert!(requeue_of(error_policy(mc, &err, ctx)) <= Duration::from_secs(1));
    cluster.pods.apply_watcher_event(&watcher::Event::InitDone);
}

/// No reconcile follows a deletion, so nothing would reset the failures of an instance deleted while it
/// was failing: the watch that sees the deletion makes the context forget it, and a failure counted after
/// the instance left the cache is dropped at once.
#[tokio::test]
async fn a_deleted_instance_leaves_nothing_behind_in_memory() {
    let mut cluster = Cluster::new();
    let ctx = offline_context(&cluster);
    let mc = memcached(1);
    let key = kube::runtime::reflector::ObjectRef::from_obj(&mc);
    let err = Error::Malformed("test".into());
    cluster
        .memcacheds
        .apply_watcher_event(&watcher::Event::Apply(mc.clone()));
    for _ in 0..3 {
        error_policy(Arc::new(mc.clone()), &err, ctx.clone());
    }
    ctx.pace.wrote(NS, NAME);
    let mut written = mc.clone();
    written.metadata.resource_version = Some("5".into());
    ctx.writer
        .written
        .remember(Arc::new(Compact::encode(&written).unwrap()), &());
    // What was kept of a Secret only this instance names (here, the served auth file it wrote).
    let served = (NS.to_owned(), format!("{NAME}-auth-file"));
    let named = std::collections::BTreeSet::from([served.clone()]);
    ctx.secrets.cache().name(&(NS.into(), NAME.into()), named);
    ctx.secrets
        .wrote_served(NS, &served.1, "3".into(), "hash".into());
    assert_eq!(ctx.backoff.failures(&key), 3);
    assert_eq!(ctx.writer.written.len(), 1);
    assert!(ctx.secrets.cache().holds(NS, &served.1));

    // The watch sees the deletion: the cache drops the instance, then the context forgets it.
    let mut deleted = mc.clone();
    deleted.metadata.resource_version = Some("6".into());
    cluster
        .memcacheds
        .apply_watcher_event(&watcher::Event::Delete(deleted.clone()));
    ctx.forget(&deleted);
    assert_eq!(ctx.backoff.failures(&key), 0);
    assert!(ctx.writer.written.is_empty());
    assert!(ctx.secrets.cache().is_empty(), "its Secrets go with it");
    let status = MemcachedStatus {
        replicas: 1,
        ..MemcachedStatus::default()
    };
    assert_eq!(
        ctx.pace.hold(NS, NAME, None, &status),
        None,
        "no first-status wait or gap left"
    );

    // A reconcile that was under way fails after the deletion: its failure is not kept either.
    error_policy(Arc::new(mc), &err, ctx.clone());
    assert_eq!(ctx.backoff.failures(&key), 0);
}

fn requeue_of(action: Action) -> Duration {
    // Action has no accessor; its Debug form is stable: `Action { requeue_after: Some(1.5s) }`.
    let text = format!("{action:?}");
    let secs = text
        .split("Some(")
        .nth(1)
        .and_then(|s| s.split(')').next())
        .unwrap_or_else(|| panic!("no requeue in {text}"));
    if let Some(ms) = secs.strip_suffix("ms") {
        Duration::from_secs_f64(ms.parse::<f64>().unwrap() / 1000.0)
    } else {
        Duration::from_secs_f64(secs.trim_end_matches('s').parse().unwrap())
    }
}

#[tokio::test]
async fn rejected_apply_is_reported_as_degraded() {
    let mut cluster = Cluster::new();
    let run = run(
        &mut cluster,
        memcached(1),
        vec![
            expect(Method::PATCH, *DEPLOYMENTS)
                .create()
                .fail(422, "Invalid"),
            expect(Method::PATCH, STATUS).apply(),
            event(),
            event(),
        ],
    )
    .await;
    assert!(run.result.is_err());
    assert_degraded(&run.seen[1].body, "ApplyRejected", "mock says Invalid");
    assert_eq!(run.seen[2].body["reason"], "ApplyRejected");
    assert_eq!(run.seen[3].body["reason"], "ReconcileFailed");
}

#[tokio::test]
async fn names_that_cannot_be_realised_are_degraded_without_retrying() {
    let mut cluster = Cluster::new();
    let mut mc = memcached(1);
    mc.metadata.name = Some("1cache".into());
    let status_path =
        "/apis/cache.example.com/v1alpha1/namespaces/default/memcacheds/1cache/status";
    let run = run(
        &mut cluster,
        mc.clone(),
        vec![expect(Method::PATCH, status_path).apply(), event()],
    )
    .await;
    assert_eq!(
        run.result.unwrap(),
        Action::requeue(Duration::from_secs(300))
    );
    let degraded = condition(&run.seen[0].body, "Degraded");
    assert_eq!(degraded["reason"], "InvalidName");
    assert_eq!(
        run.seen[0].body["status"]["selector"],
        "app.kubernetes.io/instance=1cache,app.kubernetes.io/name=memcached"
    );
    assert_eq!(run.seen[1].body["reason"], "InvalidName");

    // Recorded once: the next reconcile finds the same status and sends nothing.
    mc.status = Some(serde_json::from_value(run.seen[0].body["status"].clone()).unwrap());
    let again = run_named(&mut cluster, mc).await;
    assert!(again.is_empty());
}

async fn run_named(cluster: &mut Cluster, mc: Memcached) -> Vec<Seen> {
    run(cluster, mc, vec![]).await.seen
}

#[tokio::test]
async fn children_controlled_by_another_owner_are_left_alone() {
    let mut cluster = Cluster::new();
    let (deployment, _, _) = create(&mut cluster, 1).await;
    let mut foreign = settled(&deployment);
    foreign.metadata.owner_references.as_mut().unwrap()[0].uid = "old-uid".into();
    cluster.child::<Deployment>(foreign);
    let run = run(
        &mut cluster,
        memcached(1),
        vec![expect(Method::PATCH, STATUS).apply(), event(), event()],
    )
    .await;
    assert_eq!(run.result.unwrap_err().kind(), "foreign_owner");
    assert_eq!(
        condition(&run.seen[0].body, "Degraded")["reason"],
        "OwnershipConflict"
    );
}

/// A Deployment of the instance's name that is not the operator's (no `managed-by` label) is not taken
/// over: nothing is applied, the instance is Degraded, and it is created once that Deployment is gone.
#[tokio::test]
async fn a_same_named_deployment_the_operator_does_not_manage_is_left_alone() {
    let mut cluster = Cluster::new();
    cluster.foreign_deployment(NAME, true);
    let refused = run(
        &mut cluster,
        memcached(1),
        vec![expect(Method::PATCH, STATUS).apply(), event(), event()],
    )
    .await;
    let error = refused.result.unwrap_err();
    assert_eq!(error.kind(), "not_managed");
    let degraded = condition(&refused.seen[0].body, "Degraded");
    assert_eq!(degraded["status"], "True");
    assert_eq!(degraded["reason"], "OwnershipConflict");
    let message = degraded["message"].as_str().unwrap();
    assert!(
        message.contains("Deployment cache exists and is not managed by this operator")
            && message.contains("left untouched"),
        "{message}"
    );
    let reasons: Vec<_> = refused.seen[1..]
        .iter()
        .map(|s| &s.body["reason"])
        .collect();
    assert_eq!(
        reasons,
        ["OwnershipConflict", "ReconcileFailed"],
        "{:#?}",
        refused.seen
    );

    cluster.foreign_deployment(NAME, false);
    let created = run(
        &mut cluster,
        memcached(1),
        created_children(*DEPLOYMENTS, 1)
            .into_iter()
            .chain([expect(Method::PATCH, STATUS).apply()])
            .collect(),
    )
    .await;
    created.result.unwrap();
}

/// The same for the server list: a `<name>-servers` ConfigMap of someone else's stops the instance before
/// anything is written, even its workload.
#[tokio::test]
async fn a_same_named_server_list_the_operator_does_not_manage_is_left_alone() {
    let mut cluster = Cluster::new();
    cluster.foreign_config_map("cache-servers");
    let refused = run(
        &mut cluster,
        memcached(1),
        vec![expect(Method::PATCH, STATUS).apply(), event(), event()],
    )
    .await;
    assert_eq!(refused.result.unwrap_err().kind(), "not_managed");
    let degraded = condition(&refused.seen[0].body, "Degraded");
    assert!(
        degraded["message"]
            .as_str()
            .unwrap()
            .starts_with("ConfigMap cache-servers exists"),
        "{degraded}"
    );
}

#[tokio::test]
async fn pod_trouble_shows_in_status() {
    let mut cluster = Cluster::new();
    let (deployment, service, _) = create(&mut cluster, 1).await;
    let mut stuck = settled(&deployment);
    stuck.status.as_mut().unwrap().ready_replicas = Some(0);
    cluster.child::<Deployment>(stuck);
    cluster.child::<Service>(serde_json::from_value(as_stored(&service)).unwrap());
    let mut pod = ready_pod("cache-x");
    pod.status = Some(
        serde_json::from_value(json!({"containerStatuses": [{"name": "memcached", "image": "memcached:nope",
            "imageID": "", "ready": false, "restartCount": 0,
            "state": {"waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling image"}}}]}))
        .unwrap(),
    );
    cluster.pod(pod);
    let run = run(
        &mut cluster,
        memcached(1),
        vec![expect(Method::PATCH, STATUS).apply(), event()],
    )
    .await;
    run.result.unwrap();
    let degraded = condition(&run.seen[0].body, "Degraded");
    assert_eq!(degraded["reason"], "ImagePullFailed");
    assert_eq!(run.seen[1].body["type"], "Warning");
    assert_eq!(run.seen[1].body["reason"], "ImagePullFailed");
}

#[test]
fn memcached_test_object_is_namespaced() {
    assert_eq!(Memcached::kind(&()), "Memcached");
    assert_eq!(memcached(1).meta().namespace.as_deref(), Some(NS));
}

// ---------------------------------------------------------------------------------------------------
// Production features: Secrets, PodDisruptionBudget, exporter, ServiceMonitor, NetworkPolicy, autoscaler.

const TLS_SECRET: &str = "/api/v1/namespaces/default/secrets/cache-tls";
const AUTH_SECRET: &str = "/api/v1/namespaces/default/secrets/cache-auth";
const SERVED_AUTH: &str = "/api/v1/namespaces/default/secrets/cache-auth-file";

/// The apply of the auth file the servers load, answered at `version`.
fn served_auth(version: &str) -> Exchange {
    expect(Method::PATCH, SERVED_AUTH).reply(
        StatusCode::OK,
        secret("cache-auth-file", version, json!({"auth-file": "eA=="})),
    )
}

/// Every optional feature on.
fn full(size: i32) -> Memcached {
    with_spec(
        size,
        json!({
            "memcached": {"maxMemoryMB": 256, "threads": 8, "extraArgs": ["-o", "lru_crawler"]},
            "highAvailability": {"antiAffinity": "hard"},
            "service": {"type": "ClusterIP", "annotations": {"a": "b"}},
            "security": {"tls": {"secretName": "cache-tls", "clientAuth": true},
                         "auth": {"secretName": "cache-auth"},
                         "networkPolicy": {"enabled": true,
                                           "allowedClients": [{"podSelector": {"matchLabels": {"app": "web"}}}],
                                           "monitoringNamespaceSelector": {}}},
            "monitoring": {"exporter": {"enabled": true},
                           "serviceMonitor": {"enabled": true, "interval": "30s"}},
            "autoscaling": {"enabled": true, "minSize": 1, "maxSize": 6,
                            "targetCPUUtilizationPercentage": 75}
        }),
    )
}

fn secret(name: &str, version: &str, data: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Secret",
           "metadata": {"name": name, "namespace": NS, "resourceVersion": version}, "data": data})
}

fn tls_secret(version: &str) -> Value {
    // base64 of "crt", "key", "ca"
    secret(
        "cache-tls",
        version,
        json!({"tls.crt": "Y3J0", "tls.key": "a2V5", "ca.crt": "Y2E="}),
    )
}

fn auth_secret(version: &str, content_b64: &str) -> Value {
    secret("cache-auth", version, json!({"auth-file": content_b64}))
}

fn secret_hash(deployment: &Value) -> String {
    deployment["spec"]["template"]["metadata"]["annotations"]["cache.example.com/secret-hash"]
        .as_str()
        .expect("the pod template carries the secret hash")
        .to_owned()
}

/// Creates `full(size)` in a cluster that has its Secrets, puts every applied child into the caches, and
/// returns the Deployment as applied.
async fn create_full(cluster: &mut Cluster, size: i32) -> Value {
    cluster.secret("cache-tls", "1");
    cluster.secret("cache-auth", "1");
    let mut script = vec![
        expect(Method::GET, TLS_SECRET).reply(StatusCode::OK, tls_secret("1")),
        expect(Method::GET, AUTH_SECRET).reply(StatusCode::OK, auth_secret("1", "dTpwCg==")),
        // The auth file the servers load, before the workload whose pods load it.
        served_auth("s1"),
    ];
    // The optional children follow the ones every instance has, before the one event naming them all.
    let mut children = created_children(*DEPLOYMENTS, size);
    let at = children.len() - 1;
    children.splice(
        at..at,
        [
            expect(Method::PATCH, *NETWORK_POLICIES).create(),
            expect(Method::PATCH, *AUTOSCALERS).create(),
            // No foreign watch for ServiceMonitors: the name is read once before one is created.
            expect(Method::GET, SERVICE_MONITORS).fail(404, "NotFound"),
            expect(Method::PATCH, SERVICE_MONITORS).create(),
        ],
    );
    script.extend(children);
    script.push(expect(Method::PATCH, STATUS).apply());
    let run = run(cluster, full(size), script).await;
    run.result.unwrap();
    cluster.served_auth("s1");
    let served = &run.seen[2];
    assert_eq!(served.path, SERVED_AUTH);
    let file = served.body["data"]["auth-file"].as_str().unwrap();
    assert!(
        !file.is_empty() && served.body["metadata"]["ownerReferences"][0]["uid"] == "uid-1",
        "{served:?}"
    );
    let seen = &run.seen[3..];
    cluster.child::<Deployment>(settled(&seen[0].body));
    cluster.child::<Service>(serde_json::from_value(as_stored(&seen[1].body)).unwrap());
    cluster.child::<Service>(serde_json::from_value(as_stored(&seen[2].body)).unwrap());
    let mut i = 3;
    let mut budget = "";
    if size > 1 {
        cluster.child::<PodDisruptionBudget>(
            serde_json::from_value(as_stored(&seen[i].body)).unwrap(),
        );
        budget = ", PodDisruptionBudget cache";
        i += 1;
    }
    cluster.child::<NetworkPolicy>(serde_json::from_value(as_stored(&seen[i].body)).unwrap());
    cluster.child::<HorizontalPodAutoscaler>(
        serde_json::from_value(as_stored(&seen[i + 1].body)).unwrap(),
    );
    assert_eq!(
        seen[i + 2].method,
        Method::GET,
        "the ServiceMonitor's name, read"
    );
    cluster.service_monitor(serde_json::from_value(as_stored(&seen[i + 3].body)).unwrap());
    let event = &seen[i + 4].body;
    assert_eq!(event["reason"], "Created");
    assert_eq!(
        event["note"],
        format!(
            "Created Deployment cache with {size} replicas, Service cache, Service cache-headless{budget}, \
             NetworkPolicy cache, HorizontalPodAutoscaler cache, ServiceMonitor cache"
        )
    );
    seen[0].body.clone()
}

/// A ServiceMonitor of the instance's name that is not the operator's is left alone: the instance says
/// whose it is, and nothing is applied to it (an unforced apply would have taken it over, owner reference
/// and all, and garbage collection would delete it with the instance).
#[tokio::test]
async fn a_foreign_service_monitor_of_the_same_name_is_not_taken_over() {
    let mut cluster = Cluster::with_service_monitors();
    let mc = with_spec(
        1,
        json!({"monitoring": {"exporter": {"enabled": true},
                                               "serviceMonitor": {"enabled": true}}}),
    );
    let theirs = json!({"apiVersion": "monitoring.coreos.com/v1", "kind": "ServiceMonitor",
        "metadata": {"name": "cache", "namespace": NS, "labels": {"team": "web"}}});
    let mut script = created_children(*DEPLOYMENTS, 1);
    script.pop();
    script.extend([
        expect(Method::GET, SERVICE_MONITORS).reply(StatusCode::OK, theirs),
        event(),
        expect(Method::PATCH, STATUS).apply(),
        event(),
        event(),
    ]);
    let run = run(&mut cluster, mc, script).await;
    let error = run.result.unwrap_err();
    assert!(
        error
            .to_string()
            .contains("ServiceMonitor cache exists and is not managed"),
        "{error}"
    );
    assert!(
        !run.seen
            .iter()
            .any(|s| s.method == Method::PATCH && s.path.contains("servicemonitors")),
        "nothing is applied to it"
    );
}

/// Reconciles `mc` once more to record the settled status and returns the instance with that status.
async fn settle_status(cluster: &mut Cluster, mut mc: Memcached) -> Memcached {
    let run = run(
        cluster,
        mc.clone(),
        vec![expect(Method::PATCH, STATUS).apply()],
    )
    .await;
    run.result.unwrap();
    mc.status = Some(serde_json::from_value(run.seen[0].body["status"].clone()).unwrap());
    mc
}

#[tokio::test]
async fn every_feature_on_applies_each_child_then_settles_with_no_request() {
    let mut cluster = Cluster::with_service_monitors();
    let deployment = create_full(&mut cluster, 3).await;

    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(
        pod["containers"].as_array().unwrap().len(),
        2,
        "memcached and the exporter"
    );
    assert!(
        pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            .is_array()
    );
    assert_eq!(secret_hash(&deployment).len(), 64);
    let args = pod["containers"][0]["args"].to_string();
    assert!(
        args.contains("-Z") && args.contains("ssl_verify_mode=2") && args.contains("lru_crawler"),
        "{args}"
    );

    // Once the status is recorded, nothing is sent: no apply, no Secret read, no status, no event.
    let mc = settle_status(&mut cluster, full(3)).await;
    let quiet = run(&mut cluster, mc.clone(), vec![]).await;
    assert!(quiet.result.is_ok() && quiet.seen.is_empty());
    let again = run(&mut cluster, mc, vec![]).await;
    assert!(again.result.is_ok() && again.seen.is_empty());
}

#[tokio::test]
async fn a_changed_secret_rolls_the_pods() {
    let mut cluster = Cluster::with_service_monitors();
    let before = create_full(&mut cluster, 1).await;
    let mc = settle_status(&mut cluster, full(1)).await;

    // A new version with the same content: read once, nothing rolls.
    cluster.secret("cache-auth", "2");
    let same = run(
        &mut cluster,
        mc.clone(),
        vec![expect(Method::GET, AUTH_SECRET).reply(StatusCode::OK, auth_secret("2", "dTpwCg=="))],
    )
    .await;
    same.result.unwrap();

    // New content: the pod template's hash changes, which rolls the pods.
    cluster.secret("cache-auth", "3");
    let rotated = run(
        &mut cluster,
        mc,
        vec![
            expect(Method::GET, AUTH_SECRET).reply(StatusCode::OK, auth_secret("3", "dTpxCg==")),
            // The new file goes to the Secret the new pods load, before they are made.
            served_auth("s2"),
            expect(Method::PATCH, *DEPLOYMENTS).apply(),
            event(),
            expect(Method::PATCH, STATUS).apply(),
        ],
    )
    .await;
    rotated.result.unwrap();
    assert_ne!(secret_hash(&rotated.seen[2].body), secret_hash(&before));
    assert_eq!(rotated.seen[3].body["reason"], "Updated");
    assert_eq!(
        rotated.seen[3].body["note"],
        "Updated Deployment cache to match the spec"
    );
    let logged = format!("{:?}", rotated.seen);
    assert!(
        !logged.contains("u:q"),
        "secret values never leave the reconciler"
    );
}

/// An instance with auth only, its Secret holding `content_b64`.
fn auth_only() -> Memcached {
    with_spec(
        1,
        json!({"security": {"auth": {"secretName": "cache-auth"}}}),
    )
}

/// Creates `auth_only()` with the auth file `content_b64` and returns what was seen; `key` is the script of
/// the digest key's read (empty when the operator holds it already).
async fn create_auth_only(
    cluster: &mut Cluster,
    content_b64: &str,
    key: Vec<Exchange>,
) -> Vec<Seen> {
    cluster.secret("cache-auth", "1");
    let mut script =
        vec![expect(Method::GET, AUTH_SECRET).reply(StatusCode::OK, auth_secret("1", content_b64))];
    script.extend(key);
    script.push(served_auth("s1"));
    script.extend(created_children(*DEPLOYMENTS, 1));
    // Auth without TLS: a warning that credentials travel in the clear.
    script.push(event());
    script.push(expect(Method::PATCH, STATUS).apply());
    let run = run(cluster, auth_only(), script).await;
    run.result.unwrap();
    cluster.served_auth("s1");
    let warned = run.seen.iter().rev().nth(1).unwrap();
    assert_eq!(warned.body["reason"], "CredentialsInClear");
    assert_eq!(warned.body["type"], "Warning");
    run.seen
}

/// Someone who may read Deployments but not Secrets (the built-in `view` role) knows the spec, the
/// algorithm and a dictionary, and tries each word against the hash in the pod template: the unkeyed
/// digest of the Secrets (what the annotation was before it was keyed) and the keyed one under keys that
/// could be guessed. None matches, the right password included.
#[tokio::test]
async fn a_dictionary_finds_nothing_in_the_pod_templates_secret_hash() {
    use memcached_operator::resources::secrets::{
        KeyDigest, Owner, TlsReload, digest, keyed, referenced,
    };
    let owner = Owner {
        namespace: NS,
        uid: "uid-1",
    };
    let mut cluster = Cluster::new();
    // base64 of "app:pw42\n"
    let seen = create_auth_only(&mut cluster, "YXBwOnB3NDIK", vec![]).await;
    let annotation = secret_hash(&seen[2].body);
    let spec = auth_only().spec;
    let refs = referenced(&spec);
    let mut words: Vec<String> = (0..1000).map(|n| format!("app:pw{n}\n")).collect();
    words.extend(["app:password\n", "app:app\n", "memcached:memcached\n"].map(String::from));
    let guessed_keys: [&[u8]; 3] = [b"", &[0; 32], b"memcached-operator"];
    let mut tried = 0;
    for word in &words {
        let contents = [(
            "cache-auth".to_owned(),
            Some([("auth-file".to_owned(), KeyDigest::of(word.as_bytes()))].into()),
        )]
        .into();
        let unkeyed = digest(NS, &refs, &contents, TlsReload::Rollout("test"))
            .unwrap()
            .unwrap();
        assert_ne!(annotation, unkeyed, "{word:?} found by the unkeyed digest");
        for key in guessed_keys {
            assert_ne!(
                annotation,
                keyed(key, &owner, &unkeyed),
                "{word:?} found under a guessed key"
            );
        }
        tried += 1;
    }
    assert_eq!(tried, 1003);
    // The operator's own key gives it, so a change of the Secret still changes the template.
    let contents = [(
        "cache-auth".to_owned(),
        Some([("auth-file".to_owned(), KeyDigest::of(b"app:pw42\n"))].into()),
    )]
    .into();
    let unkeyed = digest(NS, &refs, &contents, TlsReload::Rollout("test"))
        .unwrap()
        .unwrap();
    assert_eq!(annotation, keyed(TEST_DIGEST_KEY, &owner, &unkeyed));
}

/// The digest key is read or made once per process: the first operator makes it (a GET that finds
/// nothing, a create), the next reconciles of that process ask for nothing, and a restarted process reads
/// the same key, so the restart rolls no pod.
#[tokio::test]
async fn the_digest_key_is_made_once_and_a_restart_keeps_the_hash() {
    const KEY: &str = "/api/v1/namespaces/ops/secrets/memcached-operator-digest-key";
    let location = KeyLocation {
        namespace: "ops".into(),
        name: "memcached-operator-digest-key".into(),
    };
    let mut cluster = Cluster::new();
    cluster.digest_key = DigestKey::new(location.clone());
    let made = vec![
        expect(Method::GET, KEY).fail(404, "NotFound"),
        expect(Method::POST, "/api/v1/namespaces/ops/secrets"),
    ];
    let first = create_auth_only(&mut cluster, "YXBwOnB3NDIK", made).await;
    let key_secret = first[2].body.clone();
    assert_eq!(key_secret["metadata"]["namespace"], "ops");
    let key_b64 = key_secret["data"]["key"].as_str().expect("the key");
    assert!(key_b64.len() >= 44, "32 bytes or more: {key_b64}");
    let hash = secret_hash(&first[4].body);

    // The same process: nothing more to read.
    let mut again = Cluster::new();
    again.digest_key = cluster.digest_key.clone();
    let second = create_auth_only(&mut again, "YXBwOnB3NDIK", vec![]).await;
    assert_eq!(secret_hash(&second[2].body), hash);

    // A restarted process reads the key the first one made: the same hash.
    let mut restarted = Cluster::new();
    restarted.digest_key = DigestKey::new(location);
    let read = vec![expect(Method::GET, KEY).reply(StatusCode::OK, key_secret)];
    let third = create_auth_only(&mut restarted, "YXBwOnB3NDIK", read).await;
    assert_eq!(secret_hash(&third[3].body), hash);
}

/// Without the right to create the key, an instance using Secrets says so and names the RBAC it lacks;
/// nothing is applied.
#[tokio::test]
async fn a_digest_key_the_operator_may_not_make_is_degraded_and_names_it() {
    const KEY: &str = "/api/v1/namespaces/ops/secrets/memcached-operator-digest-key";
    let mut cluster = Cluster::new();
    cluster.digest_key = DigestKey::new(KeyLocation {
        namespace: "ops".into(),
        name: "memcached-operator-digest-key".into(),
    });
    cluster.secret("cache-auth", "1");
    let run = run(
        &mut cluster,
        auth_only(),
        vec![
            expect(Method::GET, AUTH_SECRET)
                .reply(StatusCode::OK, auth_secret("1", "YXBwOnB3NDIK")),
            expect(Method::GET, KEY).fail(404, "NotFound"),
            expect(Method::POST, "/api/v1/namespaces/ops/secrets").fail(403, "Forbidden"),
            expect(Method::PATCH, STATUS).apply(),
            event(),
            event(),
        ],
    )
    .await;
    assert!(run.result.is_err());
    let degraded = condition(&run.seen[3].body, "Degraded");
    assert_eq!(degraded["reason"], "DigestKeyUnavailable");
    let message = degraded["message"].as_str().unwrap();
    assert!(
        message.contains("ops/memcached-operator-digest-key"),
        "{message}"
    );
    assert!(message.contains("create on Secrets"), "{message}");
    let reasons: Vec<_> = run.seen[4..]
        .iter()
        .map(|e| e.body["reason"].clone())
        .collect();
    assert_eq!(
        reasons,
        [json!("DigestKeyUnavailable"), json!("ReconcileFailed")]
    );
}

/// A running instance whose auth Secret is rotated to a file memcached would misread (no final newline:
/// memcached 1.6.18 drops the password's last character) keeps its pods: nothing is rolled, the instance
/// is Degraded, and the message says what is wrong without quoting the file.
#[tokio::test]
async fn an_auth_file_memcached_would_misread_is_not_rolled_out() {
    let mut cluster = Cluster::with_service_monitors();
    create_full(&mut cluster, 1).await;
    let mc = settle_status(&mut cluster, full(1)).await;

    cluster.secret("cache-auth", "2");
    // base64("u:q"), no newline
    let refused = run(
        &mut cluster,
        mc,
        vec![
            expect(Method::GET, AUTH_SECRET).reply(StatusCode::OK, auth_secret("2", "dTpx")),
            expect(Method::PATCH, STATUS).apply(),
            event(),
        ],
    )
    .await;
    refused.result.unwrap();
    assert_degraded(
        &refused.seen[1].body,
        "SecretInvalid",
        "the auth file in key \"auth-file\" of Secret default/cache-auth named by \
         spec.security.auth.secretName does not end with a newline",
    );
    assert_eq!(refused.seen[2].body["reason"], "SecretInvalid");
    assert!(!format!("{:?}", refused.seen).contains("u:q"));
}

#[tokio::test]
async fn a_missing_secret_is_degraded_until_it_appears() {
    let mut cluster = Cluster::new();
    let mc = with_spec(1, json!({"security": {"tls": {"secretName": "cache-tls"}}}));
    let missing = run(
        &mut cluster,
        mc.clone(),
        vec![expect(Method::PATCH, STATUS).apply(), event()],
    )
    .await;
    assert_eq!(
        missing.result.unwrap(),
        Action::requeue(Duration::from_secs(300))
    );
    assert_degraded(&missing.seen[0].body, "SecretNotFound", "default/cache-tls");
    assert_eq!(missing.seen[1].body["reason"], "SecretNotFound");

    // A Secret without the key needed is named too.
    cluster.secret("cache-tls", "1");
    let mut recorded = mc.clone();
    recorded.status = Some(serde_json::from_value(missing.seen[0].body["status"].clone()).unwrap());
    let invalid = run(
        &mut cluster,
        recorded.clone(),
        vec![
            expect(Method::GET, TLS_SECRET).reply(
                StatusCode::OK,
                secret("cache-tls", "1", json!({"tls.crt": "Y3J0"})),
            ),
            expect(Method::PATCH, STATUS).apply(),
            event(),
        ],
    )
    .await;
    invalid.result.unwrap();
    assert_degraded(&invalid.seen[1].body, "SecretInvalid", "\"tls.key\"");

    // The Secret is fixed (the watch triggers this reconcile): the instance comes up.
    cluster.secret("cache-tls", "2");
    let recovered = run(
        &mut cluster,
        recorded,
        [
            vec![expect(Method::GET, TLS_SECRET).reply(StatusCode::OK, tls_secret("2"))],
            created_children(*DEPLOYMENTS, 1),
            vec![expect(Method::PATCH, STATUS).apply()],
        ]
        .into_iter()
        .flatten()
        .collect(),
    )
    .await;
    recovered.result.unwrap();
    assert_eq!(
        condition(&recovered.seen[5].body, "Degraded")["status"],
        "False"
    );
}

#[tokio::test]
async fn the_budget_goes_when_size_drops_to_one_or_it_is_disabled() {
    for (size, spec) in [
        (1, json!({})),
        (
            3,
            json!({"highAvailability": {"podDisruptionBudget": {"enabled": false}}}),
        ),
    ] {
        let mut cluster = Cluster::new();
        let (deployment, service, _) = create(&mut cluster, 3).await;
        cluster.child::<Deployment>(settled(&deployment));
        cluster.child::<Service>(serde_json::from_value(as_stored(&service)).unwrap());
        let mut script = vec![];
        if size != 3 {
            script.push(expect(Method::PATCH, *DEPLOYMENTS).apply());
        }
        script.push(expect(Method::DELETE, *PDBS).reply(
            StatusCode::OK,
            json!({"kind": "Status", "status": "Success"}),
        ));
        // After the children: Scaled (when the size changed), then Deleted.
        if size != 3 {
            script.push(event());
        }
        script.extend([event(), expect(Method::PATCH, STATUS).apply()]);
        let run = run(&mut cluster, with_spec(size, spec), script).await;
        run.result.unwrap();
        let events: Vec<(&Value, &Value)> = run
            .seen
            .iter()
            .filter(|s| s.method == Method::POST)
            .map(|s| (&s.body["reason"], &s.body["note"]))
            .collect();
        let deleted = (
            &json!("Deleted"),
            &json!("Deleted PodDisruptionBudget cache: the spec no longer wants it"),
        );
        if size != 3 {
            let scaled = (
                &json!("Scaled"),
                &json!("Scaled Deployment cache from 3 to 1 replicas"),
            );
            assert_eq!(events, [scaled, deleted]);
        } else {
            assert_eq!(events, [deleted]);
        }
    }
}

#[tokio::test]
async fn the_exporter_is_added_and_removed_with_its_service_port() {
    let mut cluster = Cluster::new();
    let (deployment, service, _) = create(&mut cluster, 1).await;
    cluster.child::<Deployment>(settled(&deployment));
    cluster.child::<Service>(serde_json::from_value(as_stored(&service)).unwrap());

    let on = run(
        &mut cluster,
        with_spec(1, json!({"monitoring": {"exporter": {"enabled": true}}})),
        vec![
            expect(Method::PATCH, *DEPLOYMENTS).apply(),
            expect(Method::PATCH, *SERVICES).apply(),
            event(),
            expect(Method::PATCH, STATUS).apply(),
        ],
    )
    .await;
    on.result.unwrap();
    let containers = &on.seen[0].body["spec"]["template"]["spec"]["containers"];
    assert_eq!(containers[1]["name"], "exporter");
    assert_eq!(on.seen[1].body["spec"]["ports"][1]["port"], 9150);
    let updated = "Updated Deployment cache, Service cache to match the spec";
    assert_eq!(on.seen[2].body["reason"], "Updated");
    assert_eq!(on.seen[2].body["note"], updated);
    cluster.child::<Deployment>(settled(&on.seen[0].body));
    cluster.child::<Service>(serde_json::from_value(as_stored(&on.seen[1].body)).unwrap());

    let off = run(
        &mut cluster,
        memcached(1),
        vec![
            expect(Method::PATCH, *DEPLOYMENTS).apply(),
            expect(Method::PATCH, *SERVICES).apply(),
            event(),
            expect(Method::PATCH, STATUS).apply(),
        ],
    )
    .await;
    off.result.unwrap();
    assert_eq!(off.seen[2].body["note"], updated);
    let containers = off.seen[0].body["spec"]["template"]["spec"]["containers"]
        .as_array()
        .unwrap()
        .len();
    assert_eq!(
        containers, 1,
        "server-side apply drops the sidecar the operator no longer sets"
    );
    assert_eq!(
        off.seen[1].body["spec"]["ports"].as_array().unwrap().len(),
        1
    );
}

#[tokio::test]
async fn a_service_monitor_without_its_api_is_a_condition_not_an_error_loop() {
    let mut cluster = Cluster::new();
    let mc = with_spec(
        1,
        json!({"monitoring": {"exporter": {"enabled": true}, "serviceMonitor": {"enabled": true}}}),
    );
    let run = run(
        &mut cluster,
        mc,
        [
            created_children(*DEPLOYMENTS, 1),
            vec![expect(Method::PATCH, STATUS).apply(), event()],
        ]
        .into_iter()
        .flatten()
        .collect(),
    )
    .await;
    assert_eq!(
        run.result.unwrap(),
        Action::requeue(Duration::from_secs(300))
    );
    assert_degraded(
        &run.seen[4].body,
        "ServiceMonitorUnavailable",
        "monitoring.coreos.com/v1",
    );
}

#[tokio::test]
async fn the_service_monitor_is_removed_when_turned_off() {
    let mut cluster = Cluster::with_service_monitors();
    create_full(&mut cluster, 1).await;
    let mut mc = full(1);
    mc.spec.monitoring.as_mut().unwrap().service_monitor = None;
    let run = run(
        &mut cluster,
        mc,
        vec![
            expect(Method::DELETE, SERVICE_MONITORS).reply(
                StatusCode::OK,
                json!({"kind": "Status", "status": "Success"}),
            ),
            event(),
            expect(Method::PATCH, STATUS).apply(),
        ],
    )
    .await;
    run.result.unwrap();
    assert_eq!(
        run.seen[1].body["note"],
        "Deleted ServiceMonitor cache: the spec no longer wants it"
    );
}

#[tokio::test]
async fn invalid_config_is_degraded_and_nothing_is_applied() {
    let mut cluster = Cluster::new();
    let mc = with_spec(1, json!({"memcached": {"extraArgs": ["-m", "4096"]}}));
    let run = run(
        &mut cluster,
        mc,
        vec![expect(Method::PATCH, STATUS).apply(), event()],
    )
    .await;
    assert_eq!(
        run.result.unwrap(),
        Action::requeue(Duration::from_secs(300))
    );
    assert_degraded(&run.seen[0].body, "InvalidConfig", "extraArgs[0]");
}

/// A managed option smuggled past a server without the CRD's CEL rule (bundled, attached, abbreviated or
/// inside `-o`) is caught by the operator's own walk: Degraded, and no Deployment written.
#[tokio::test]
async fn a_smuggled_managed_option_is_degraded_and_nothing_is_applied() {
    for (args, named) in [
        (
            json!(["-o", "lru_crawler", "-Cp", "1"]),
            "extraArgs[2] \"-Cp\" sets -p/--port",
        ),
        (json!(["-ossl_verify_mode=0"]), "sub-option ssl_verify_mode"),
        (json!(["--udp=11211"]), "sets -U/--udp-port"),
    ] {
        let mut cluster = Cluster::new();
        let mc = with_spec(1, json!({"memcached": {"extraArgs": args}}));
        let run = run(
            &mut cluster,
            mc,
            vec![expect(Method::PATCH, STATUS).apply(), event()],
        )
        .await;
        assert_eq!(
            run.result.unwrap(),
            Action::requeue(Duration::from_secs(300))
        );
        assert_degraded(&run.seen[0].body, "InvalidConfig", named);
    }
}

#[tokio::test]
async fn a_request_without_answer_is_retried_quietly() {
    // The API server went away mid-reconcile: no ReconcileFailed event (it could not be published
    // either), no Degraded status; the error goes to the retry, and the outage is reported once elsewhere.
    let mut cluster = Cluster::new();
    let run = run(
        &mut cluster,
        memcached(1),
        vec![expect(Method::PATCH, *DEPLOYMENTS).create().unanswered()],
    )
    .await;
    let error = run.result.unwrap_err();
    assert!(error.unanswered(), "{error}");
    assert_eq!(run.seen.len(), 1);
    assert!(
        run.metrics
            .encode()
            .contains("memcached_operator_reconcile_errors_total{kind=\"apply\"} 1"),
        "still counted: {}",
        run.metrics.encode()
    );
}

/// The auth file the servers load is the operator's: one of that name it does not own is left alone and
/// nothing is applied; turning auth off deletes the operator's.
#[tokio::test]
async fn the_served_auth_file_is_the_operators_own() {
    let mut cluster = Cluster::new();
    create_auth_only(&mut cluster, "YXBwOnB3NDIK", vec![]).await;

    // Auth turned off: the operator's copy goes, before the pods that no longer load it.
    let mut off = auth_only();
    off.spec.security = None;
    let mut script = vec![expect(Method::DELETE, SERVED_AUTH).reply(StatusCode::OK, json!({}))];
    script.extend(created_children(*DEPLOYMENTS, 1));
    script.push(expect(Method::PATCH, STATUS).apply());
    let removed = run(&mut cluster, off, script).await;
    removed.result.unwrap();

    // Someone else's Secret of that name: not written over, and the instance is not applied.
    let mut foreign = Cluster::new();
    foreign.secret("cache-auth-file", "9");
    foreign.secret("cache-auth", "1");
    let refused = run(
        &mut foreign,
        auth_only(),
        vec![
            expect(Method::GET, AUTH_SECRET)
                .reply(StatusCode::OK, auth_secret("1", "YXBwOnB3NDIK")),
            expect(Method::PATCH, STATUS).apply(),
            event(),
            event(),
        ],
    )
    .await;
    assert!(refused.result.is_err());
    assert!(
        refused.seen.iter().all(|s| s.path != SERVED_AUTH),
        "{:?}",
        refused.seen
    );
    let degraded = condition(&refused.seen[1].body, "Degraded");
    assert!(
        degraded["message"]
            .as_str()
            .unwrap()
            .contains("cache-auth-file"),
        "{degraded}"
    );
}
