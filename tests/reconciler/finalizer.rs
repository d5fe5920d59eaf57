//! The finalizer of earlier builds: removed once, with the instance as patched, and the instances being
//! deleted that need nothing else.

use super::*;

/// An instance of size 1 that `kubectl delete` has marked for deletion; something still holds it (the
/// scenarios add the finalizer that does).
fn being_deleted() -> Memcached {
    let mut mc = memcached(1);
    mc.metadata.deletion_timestamp = Some(Time(Timestamp::from_second(NOW).unwrap()));
    mc
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
