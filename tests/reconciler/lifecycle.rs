//! An instance's life as usual: its first reconcile creates the children, a settled one sends nothing,
//! and a change of size or drift from the spec is applied back.

use super::*;

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

#[test]
fn memcached_test_object_is_namespaced() {
    assert_eq!(Memcached::kind(&()), "Memcached");
    assert_eq!(memcached(1).meta().namespace.as_deref(), Some(NS));
}
