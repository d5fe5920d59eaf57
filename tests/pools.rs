//! Cache-aware pools against a mocked API server: the StatefulSet workload, the published server list
//! (`<name>-servers`), the drain of a scale-down and the deletion-cost marks, request by request.

mod common;

use std::time::Duration;

use common::mock::*;

fn statefulset_pool(size: i32) -> Memcached {
    with_spec(size, json!({"workload": "StatefulSet"}))
}

/// A pod of the instance.
fn server_pod(name: &str, ip: &str, ready: bool, created: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": NS, "creationTimestamp": created, "labels": {
            "app.kubernetes.io/name": "memcached", "app.kubernetes.io/instance": NAME,
            "app.kubernetes.io/managed-by": "memcached-operator"}},
        "status": {"phase": "Running", "podIP": ip,
                   "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]}
    }))
    .unwrap()
}

fn marked(mut pod: Pod) -> Pod {
    pod.metadata.annotations = Some(
        [(
            "controller.kubernetes.io/pod-deletion-cost".to_owned(),
            "-1000".to_owned(),
        )]
        .into(),
    );
    pod
}

fn pod_path(name: &str) -> String {
    format!("{PODS}/{name}")
}

/// A stored StatefulSet whose controller reports every replica ready and updated.
fn settled_statefulset(applied: &Value) -> StatefulSet {
    let mut obj = as_stored(applied);
    let n = obj["spec"]["replicas"].as_i64().unwrap();
    obj["status"] = json!({"observedGeneration": 1, "replicas": n, "readyReplicas": n,
                           "updatedReplicas": n, "availableReplicas": n, "currentReplicas": n});
    serde_json::from_value(obj).unwrap()
}

fn status_of(seen: &Seen) -> MemcachedStatus {
    serde_json::from_value(seen.body["status"].clone()).unwrap()
}

fn with_status(mut mc: Memcached, status: MemcachedStatus) -> Memcached {
    mc.status = Some(status);
    mc
}

/// Reconciles `mc` after its pods changed: exactly the server list and the status are written. The list
/// goes into the cache (created when the cluster has none yet); returns its `servers` file and the new
/// status.
async fn republish(cluster: &mut Cluster, mc: Memcached) -> (String, MemcachedStatus) {
    let write = expect(Method::PATCH, *CONFIG_MAPS);
    let write = if cluster.has_config_map() {
        write.apply()
    } else {
        write.create()
    };
    let run = run(
        cluster,
        mc,
        vec![write, expect(Method::PATCH, STATUS).apply()],
    )
    .await;
    assert!(run.result.is_ok(), "{:?}", run.result);
    cluster.child::<ConfigMap>(serde_json::from_value(as_stored(&run.seen[0].body)).unwrap());
    let servers = run.seen[0].body["data"]["servers"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    (servers, status_of(&run.seen[1]))
}

/// Creates a StatefulSet instance of `size` with ready pods and a settled status; returns that status.
async fn settled_statefulset_instance(cluster: &mut Cluster, size: i32) -> MemcachedStatus {
    let seen = create_as(cluster, statefulset_pool(size), *STATEFULSETS).await;
    cluster.child::<StatefulSet>(settled_statefulset(&seen[0].body));
    cluster.child::<Service>(serde_json::from_value(as_stored(&seen[1].body)).unwrap());
    for i in 0..size {
        let pod = server_pod(
            &format!("cache-{i}"),
            &format!("10.0.0.{}", i + 1),
            true,
            "2023-11-14T22:13:20Z",
        );
        cluster.pod(pod);
    }
    // The pods are ready: the list is created with them, and the status says so.
    republish(cluster, statefulset_pool(size)).await.1
}

#[tokio::test]
async fn statefulset_mode_applies_the_pool_shape_and_then_nothing() {
    let mut cluster = Cluster::new();
    let status = settled_statefulset_instance(&mut cluster, 3).await;

    let sts = cluster
        .stores
        .children
        .statefulsets
        .state()
        .first()
        .cloned()
        .unwrap();
    let spec = sts.spec.as_ref().unwrap();
    assert_eq!(spec.replicas, Some(3));
    assert_eq!(spec.service_name.as_deref(), Some("cache-headless"));
    assert_eq!(spec.pod_management_policy.as_deref(), Some("Parallel"));
    assert_eq!(spec.min_ready_seconds, None, "no warmup: not sent");
    assert!(
        cluster.stores.children.deployments.state().is_empty(),
        "no Deployment in StatefulSet mode"
    );

    assert_eq!(
        status.server_list,
        [
            "cache-0.cache-headless.default.svc:11211",
            "cache-1.cache-headless.default.svc:11211",
            "cache-2.cache-headless.default.svc:11211"
        ]
    );
    assert_eq!(status.servers[1].pod.as_deref(), Some("cache-1"));
    let cm = cluster
        .stores
        .children
        .config_maps
        .state()
        .first()
        .cloned()
        .unwrap();
    assert_eq!(
        cm.data.as_ref().unwrap()["servers"],
        "cache-0.cache-headless.default.svc:11211\ncache-1.cache-headless.default.svc:11211\n\
         cache-2.cache-headless.default.svc:11211\n"
    );

    // Settled: no request at all, whatever the workload.
    let mc = with_status(statefulset_pool(3), status);
    let quiet = run(&mut cluster, mc, vec![]).await;
    assert_eq!(
        quiet.result.unwrap(),
        Action::requeue(Duration::from_secs(300))
    );
}

#[tokio::test]
async fn the_server_list_is_written_once_per_change_and_never_when_unchanged() {
    let mut cluster = Cluster::new();
    let (deployment, service, _) = create(&mut cluster, 2).await;
    cluster.child::<Deployment>(settled(&deployment));
    cluster.child::<Service>(serde_json::from_value(as_stored(&service)).unwrap());
    cluster.pod(server_pod(
        "cache-a",
        "10.0.0.1",
        true,
        "2023-11-14T22:13:20Z",
    ));
    cluster.pod(server_pod(
        "cache-b",
        "10.0.0.2",
        true,
        "2023-11-14T22:13:21Z",
    ));

    let (servers, status) = republish(&mut cluster, memcached(2)).await;
    assert_eq!(servers, "10.0.0.1:11211\n10.0.0.2:11211\n");
    assert_eq!(status.server_list, ["10.0.0.1:11211", "10.0.0.2:11211"]);

    let settled = with_status(memcached(2), status);
    let quiet = run(&mut cluster, settled.clone(), vec![]).await;
    quiet.result.unwrap();

    // cache-a is replaced: slot 0 goes to the new pod but keeps publishing the old address until the new
    // pod is ready; slot 1 does not move.
    let mut old = server_pod("cache-a", "10.0.0.1", true, "2023-11-14T22:13:20Z");
    old.metadata.deletion_timestamp = Some(Time(Timestamp::from_second(NOW).unwrap()));
    cluster.pod(old.clone());
    cluster.pod(server_pod(
        "cache-c",
        "10.0.0.3",
        false,
        "2023-11-14T22:20:00Z",
    ));
    let (servers, status) = republish(&mut cluster, settled).await;
    assert_eq!(
        servers, "10.0.0.1:11211\n10.0.0.2:11211\n",
        "the address flips only when the replacement is ready"
    );
    assert_eq!(status.servers[0].pod.as_deref(), Some("cache-c"));
    assert!(!status.servers[0].ready);
    assert_eq!(status.servers[1].pod.as_deref(), Some("cache-b"));

    cluster.remove_pod(old);
    cluster.pod(server_pod(
        "cache-c",
        "10.0.0.3",
        true,
        "2023-11-14T22:20:00Z",
    ));
    let (servers, _) = republish(&mut cluster, with_status(memcached(2), status)).await;
    assert_eq!(
        servers, "10.0.0.3:11211\n10.0.0.2:11211\n",
        "slot 0 now points at its new server, slot 1 unchanged, order kept"
    );
}

#[tokio::test]
async fn a_drain_publishes_first_and_shrinks_only_after_drain_seconds() {
    let mut cluster = Cluster::new();
    let status = settled_statefulset_instance(&mut cluster, 3).await;

    let started = start_drain(
        &mut cluster,
        with_status(statefulset_pool(2), status),
        vec![],
    )
    .await;
    assert_eq!(
        started.seen[0].body["data"]["servers"],
        "cache-0.cache-headless.default.svc:11211\ncache-1.cache-headless.default.svc:11211\n",
        "slot 2 leaves the list before its pod goes"
    );
    assert_eq!(started.seen[1].body["reason"], "Draining");
    let body = &started.seen[2].body;
    assert_eq!(condition(body, "Progressing")["reason"], "Draining");
    assert_eq!(
        body["status"]["drain"],
        json!({"fromSize": 3, "toSize": 2, "startedAt": "2023-11-14T22:13:20Z"})
    );
    cluster.child::<ConfigMap>(serde_json::from_value(as_stored(&started.seen[0].body)).unwrap());
    let draining = with_status(statefulset_pool(2), status_of(&started.seen[2]));

    // 10 s later (a restarted operator included: each run is a fresh context): nothing to write.
    let waiting = run_at(&mut cluster, draining.clone(), vec![], NOW + 10).await;
    assert_eq!(
        waiting.result.unwrap(),
        Action::requeue(Duration::from_secs(20))
    );

    // Due: the StatefulSet shrinks (removing the highest ordinal), and the drain record goes.
    let done = finish_drain_to_two(&mut cluster, draining, *STATEFULSETS).await;
    assert_eq!(done.seen[1].body["reason"], "Drained");
    assert_eq!(
        done.seen[2].body["note"],
        "Scaled StatefulSet cache from 3 to 2 replicas"
    );
    assert!(done.seen[3].body["status"].get("drain").is_none());
}

/// The reconcile 30 s into a drain from 3 to 2: the workload at `workload` shrinks to 2, the drain ends
/// (Drained, right after the workload), the children's changes are recorded (Scaled), the status drops
/// the drain record.
async fn finish_drain_to_two(cluster: &mut Cluster, draining: Memcached, workload: &str) -> Run {
    let done = run_at(
        cluster,
        draining,
        vec![
            expect(Method::PATCH, workload).apply(),
            event(),
            event(),
            expect(Method::PATCH, STATUS).apply(),
        ],
        NOW + 30,
    )
    .await;
    assert!(done.result.is_ok(), "{:?}", done.result);
    assert_eq!(done.seen[0].body["spec"]["replicas"], 2);
    assert_eq!(done.seen[1].body["reason"], "Drained");
    assert_eq!(
        done.seen[1].body["note"],
        "Drained: removing 1 servers after the drain (3 to 2)"
    );
    let kind = done.seen[0].body["kind"].as_str().unwrap_or_default();
    assert_eq!(done.seen[2].body["reason"], "Scaled");
    assert_eq!(
        done.seen[2].body["note"],
        format!("Scaled {kind} cache from 3 to 2 replicas")
    );
    assert!(done.seen[3].body["status"].get("drain").is_none());
    done
}

/// A settled Deployment instance of three slotted pods (a, b, c in slot order); returns its status.
async fn settled_deployment_instance(cluster: &mut Cluster) -> MemcachedStatus {
    let (deployment, service, _) = create(cluster, 3).await;
    cluster.child::<Deployment>(settled(&deployment));
    cluster.child::<Service>(serde_json::from_value(as_stored(&service)).unwrap());
    for (name, ip) in [
        ("cache-a", "10.0.0.1"),
        ("cache-b", "10.0.0.2"),
        ("cache-c", "10.0.0.3"),
    ] {
        cluster.pod(server_pod(name, ip, true, "2023-11-14T22:13:20Z"));
    }
    republish(cluster, memcached(3)).await.1
}

/// Reconciles `mc` (a settled instance of 3 scaled to 2): `marks` (the pod patches expected first), then
/// the shrunk list, the Draining event and the status; the drain waits its 30 s.
async fn start_drain(cluster: &mut Cluster, mc: Memcached, marks: Vec<Exchange>) -> Run {
    let mut script = marks;
    script.extend([
        expect(Method::PATCH, *CONFIG_MAPS).apply(),
        event(),
        expect(Method::PATCH, STATUS).apply(),
    ]);
    let started = run(cluster, mc, script).await;
    assert_eq!(
        started.result.as_ref().ok(),
        Some(&Action::requeue(Duration::from_secs(30)))
    );
    started
}

/// Scales the settled Deployment instance from 3 to 2: cache-c is marked, the list shrinks, the drain
/// starts.
async fn start_drain_to_two(cluster: &mut Cluster, status: MemcachedStatus) -> Run {
    let mark = expect(Method::PATCH, &pod_path("cache-c")).apply();
    start_drain(cluster, with_status(memcached(2), status), vec![mark]).await
}

#[tokio::test]
async fn pod_deletion_cost_is_set_on_exactly_the_drained_pods() {
    let mut cluster = Cluster::new();
    let status = settled_deployment_instance(&mut cluster).await;

    let started = start_drain_to_two(&mut cluster, status).await;
    assert_eq!(
        started.seen[0].body,
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "cache-c",
               "annotations": {"controller.kubernetes.io/pod-deletion-cost": "-1000"}}}),
        "only the annotation, by server-side apply"
    );
    cluster.child::<ConfigMap>(serde_json::from_value(as_stored(&started.seen[1].body)).unwrap());
    let draining = with_status(memcached(2), status_of(&started.seen[3]));

    // Due, but the pod cache does not show the mark yet: it is asked for again, nothing shrinks.
    let unseen = run_at(
        &mut cluster,
        draining.clone(),
        vec![expect(Method::PATCH, &pod_path("cache-c")).apply()],
        NOW + 30,
    )
    .await;
    unseen.result.unwrap();

    // The mark shows: the Deployment shrinks, and the ReplicaSet removes the marked pod.
    cluster.pod(marked(server_pod(
        "cache-c",
        "10.0.0.3",
        true,
        "2023-11-14T22:13:20Z",
    )));
    finish_drain_to_two(&mut cluster, draining, *DEPLOYMENTS).await;
}

#[tokio::test]
async fn scaling_back_up_during_a_drain_cancels_it_and_clears_the_mark() {
    let mut cluster = Cluster::new();
    let status = settled_deployment_instance(&mut cluster).await;
    let started = start_drain_to_two(&mut cluster, status).await;
    cluster.child::<ConfigMap>(serde_json::from_value(as_stored(&started.seen[1].body)).unwrap());
    cluster.pod(marked(server_pod(
        "cache-c",
        "10.0.0.3",
        true,
        "2023-11-14T22:13:20Z",
    )));

    let cancelled = run_at(
        &mut cluster,
        with_status(memcached(3), status_of(&started.seen[3])),
        vec![
            event(),
            expect(Method::PATCH, &pod_path("cache-c")).apply(),
            expect(Method::PATCH, *CONFIG_MAPS).apply(),
            expect(Method::PATCH, STATUS).apply(),
        ],
        NOW + 10,
    )
    .await;
    assert_eq!(
        cancelled.result.unwrap(),
        Action::requeue(Duration::from_secs(300))
    );
    assert_eq!(cancelled.seen[0].body["reason"], "DrainCancelled");
    assert_eq!(
        cancelled.seen[1].body,
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "cache-c"}}),
        "the operator's annotation is dropped by applying without it"
    );
    assert_eq!(
        cancelled.seen[2].body["data"]["servers"],
        "10.0.0.1:11211\n10.0.0.2:11211\n10.0.0.3:11211\n",
        "slot 2 is back with the same server"
    );
    let status = &cancelled.seen[3].body["status"];
    assert!(status.get("drain").is_none());
    assert_eq!(
        condition(&cancelled.seen[3].body, "Progressing")["reason"],
        "Complete"
    );
}

#[tokio::test]
async fn a_changed_workload_is_degraded_and_nothing_is_applied() {
    let mut cluster = Cluster::new();
    let (deployment, _, _) = create(&mut cluster, 1).await;
    cluster.child::<Deployment>(settled(&deployment));
    let run = run(
        &mut cluster,
        statefulset_pool(1),
        vec![expect(Method::PATCH, STATUS).apply(), event()],
    )
    .await;
    assert_eq!(
        run.result.unwrap(),
        Action::requeue(Duration::from_secs(300))
    );
    assert_degraded(&run.seen[0].body, "WorkloadChanged", "spec.workload");
    assert_eq!(
        condition(&run.seen[0].body, "Available")["status"],
        "True",
        "the status describes the Deployment that still runs"
    );
    assert_eq!(run.seen[1].body["reason"], "WorkloadChanged");
}

#[tokio::test]
async fn a_pod_gone_before_its_mark_does_not_fail_the_reconcile() {
    let mut cluster = Cluster::new();
    let status = settled_deployment_instance(&mut cluster).await;
    // The apply of the mark would create the pod the cache still shows: without `create` on pods the
    // server refuses it, and a read confirms the pod is gone.
    let refused = vec![
        expect(Method::PATCH, &pod_path("cache-c"))
            .apply()
            .fail(403, "Forbidden"),
        expect(Method::GET, &pod_path("cache-c")).fail(404, "NotFound"),
    ];
    let run = start_drain(&mut cluster, with_status(memcached(2), status), refused).await;
    assert_eq!(
        condition(&run.seen[4].body, "Degraded")["status"],
        "False",
        "a vanished pod is no problem to report"
    );
}

#[tokio::test]
async fn a_refused_mark_on_a_pod_that_exists_is_an_error() {
    let mut cluster = Cluster::new();
    let status = settled_deployment_instance(&mut cluster).await;
    let pod = server_pod("cache-c", "10.0.0.3", true, "2023-11-14T22:13:20Z");
    let run = run(
        &mut cluster,
        with_status(memcached(2), status),
        vec![
            expect(Method::PATCH, &pod_path("cache-c"))
                .apply()
                .fail(403, "Forbidden"),
            expect(Method::GET, &pod_path("cache-c"))
                .reply(StatusCode::OK, serde_json::to_value(pod).unwrap()),
            expect(Method::PATCH, STATUS).apply(),
            event(),
            event(),
        ],
    )
    .await;
    let error = run.result.unwrap_err();
    assert_eq!(error.kind(), "apply");
    assert_degraded(&run.seen[2].body, "ApplyRejected", "Pod cache-c");
}

/// Once it exists, the server list is kept current whatever it holds: scaled to zero (a drain of 0 s),
/// it is written empty, not left listing servers that are gone.
#[tokio::test]
async fn an_existing_server_list_is_emptied_when_no_server_is_left() {
    let mut cluster = Cluster::new();
    let status = settled_statefulset_instance(&mut cluster, 3).await;
    let mut mc = with_spec(
        0,
        json!({"workload": "StatefulSet", "scaling": {"drainSeconds": 0}}),
    );
    mc.status = Some(status);
    let run = run(
        &mut cluster,
        mc,
        vec![
            expect(Method::PATCH, *CONFIG_MAPS).apply(),
            event(),
            expect(Method::PATCH, *STATEFULSETS).apply(),
            event(),
            expect(Method::DELETE, *PDBS).reply(
                StatusCode::OK,
                json!({"kind": "Status", "apiVersion": "v1", "status": "Success"}),
            ),
            event(),
            event(),
            expect(Method::PATCH, STATUS).apply(),
        ],
    )
    .await;
    assert!(run.result.is_ok(), "{:?}", run.result);
    assert_eq!(run.seen[0].body["data"]["servers"], "");
    assert_eq!(run.seen[0].body["data"]["servers.json"], "[]\n");
    assert_eq!(run.seen[2].body["spec"]["replicas"], 0);
    let reasons: Vec<&Value> = run
        .seen
        .iter()
        .filter(|s| s.method == Method::POST)
        .map(|s| &s.body["reason"])
        .collect();
    assert_eq!(reasons, ["Draining", "Drained", "Scaled", "Deleted"]);
}
