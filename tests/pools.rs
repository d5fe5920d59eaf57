//! Cache-aware pools against a mocked API server: the StatefulSet workload, the published server list
//! (`<name>-servers`), the drain of a scale-down and the deletion-cost marks, request by request.

mod common;

use std::time::Duration;

use common::mock::*;

/// `memcached(size)` with `spec` merged in.
fn pool(size: i32, spec: Value) -> Memcached {
    let mut mc = memcached(size);
    let mut merged = serde_json::to_value(&mc.spec).unwrap();
    for (k, v) in spec.as_object().unwrap() {
        merged[k] = v.clone();
    }
    mc.spec = serde_json::from_value(merged).unwrap();
    mc
}

fn statefulset_pool(size: i32) -> Memcached {
    pool(size, json!({"workload": "StatefulSet"}))
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

/// Creates a StatefulSet instance of `size` with ready pods and a settled status; returns that status.
async fn settled_statefulset_instance(cluster: &mut Cluster, size: i32) -> MemcachedStatus {
    let mut script = vec![
        expect(Method::PATCH, CONFIG_MAPS).apply(),
        event(),
        expect(Method::PATCH, STATEFULSETS).apply(),
        event(),
        expect(Method::PATCH, SERVICES).apply(),
        event(),
        expect(Method::PATCH, HEADLESS).apply(),
        event(),
    ];
    if size > 1 {
        script.extend([expect(Method::PATCH, PDBS).apply(), event()]);
    }
    script.push(expect(Method::PATCH, STATUS).apply());
    let created = run(cluster, statefulset_pool(size), script).await;
    created.result.unwrap();
    let seen = created.seen;
    assert_eq!(
        seen[3].body["note"],
        format!("Created StatefulSet cache with {size} replicas")
    );
    cluster.config_map(serde_json::from_value(as_stored(&seen[0].body)).unwrap());
    cluster.statefulset(settled_statefulset(&seen[2].body));
    cluster.service(serde_json::from_value(as_stored(&seen[4].body)).unwrap());
    cluster.service(serde_json::from_value(as_stored(&seen[6].body)).unwrap());
    if size > 1 {
        cluster.pdb(serde_json::from_value(as_stored(&seen[8].body)).unwrap());
    }
    for i in 0..size {
        let pod = server_pod(
            &format!("cache-{i}"),
            &format!("10.0.0.{}", i + 1),
            true,
            "2023-11-14T22:13:20Z",
        );
        cluster.pod(pod);
    }
    // The pods are ready: the list and the status say so.
    let ready = run(
        cluster,
        statefulset_pool(size),
        vec![
            expect(Method::PATCH, CONFIG_MAPS).apply(),
            expect(Method::PATCH, STATUS).apply(),
        ],
    )
    .await;
    ready.result.unwrap();
    cluster.config_map(serde_json::from_value(as_stored(&ready.seen[0].body)).unwrap());
    status_of(&ready.seen[1])
}

#[tokio::test]
async fn statefulset_mode_applies_the_pool_shape_and_then_nothing() {
    let mut cluster = Cluster::new();
    let status = settled_statefulset_instance(&mut cluster, 3).await;

    let sts = cluster
        .stores
        .statefulsets
        .state()
        .first()
        .cloned()
        .unwrap();
    let spec = sts.spec.as_ref().unwrap();
    assert_eq!(spec.replicas, Some(3));
    assert_eq!(spec.service_name.as_deref(), Some("cache-headless"));
    assert_eq!(spec.pod_management_policy.as_deref(), Some("Parallel"));
    assert_eq!(spec.min_ready_seconds, Some(0));
    assert!(
        cluster.stores.deployments.state().is_empty(),
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
    let cm = cluster.stores.config_maps.state().first().cloned().unwrap();
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
    cluster.deployment(settled(&deployment));
    cluster.service(serde_json::from_value(as_stored(&service)).unwrap());
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

    let ready = run(
        &mut cluster,
        memcached(2),
        vec![
            expect(Method::PATCH, CONFIG_MAPS).apply(),
            expect(Method::PATCH, STATUS).apply(),
        ],
    )
    .await;
    ready.result.unwrap();
    assert_eq!(
        ready.seen[0].body["data"]["servers"],
        "10.0.0.1:11211\n10.0.0.2:11211\n"
    );
    cluster.config_map(serde_json::from_value(as_stored(&ready.seen[0].body)).unwrap());
    let status = status_of(&ready.seen[1]);
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
    let replacing = run(
        &mut cluster,
        settled,
        vec![
            expect(Method::PATCH, CONFIG_MAPS).apply(),
            expect(Method::PATCH, STATUS).apply(),
        ],
    )
    .await;
    replacing.result.unwrap();
    assert_eq!(
        replacing.seen[0].body["data"]["servers"], "10.0.0.1:11211\n10.0.0.2:11211\n",
        "the address flips only when the replacement is ready"
    );
    cluster.config_map(serde_json::from_value(as_stored(&replacing.seen[0].body)).unwrap());
    let status = status_of(&replacing.seen[1]);
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
    let replaced = run(
        &mut cluster,
        with_status(memcached(2), status),
        vec![
            expect(Method::PATCH, CONFIG_MAPS).apply(),
            expect(Method::PATCH, STATUS).apply(),
        ],
    )
    .await;
    replaced.result.unwrap();
    assert_eq!(
        replaced.seen[0].body["data"]["servers"], "10.0.0.3:11211\n10.0.0.2:11211\n",
        "slot 0 now points at its new server, slot 1 unchanged, order kept"
    );
}

#[tokio::test]
async fn a_drain_publishes_first_and_shrinks_only_after_drain_seconds() {
    let mut cluster = Cluster::new();
    let status = settled_statefulset_instance(&mut cluster, 3).await;

    let started = run(
        &mut cluster,
        with_status(statefulset_pool(2), status),
        vec![
            expect(Method::PATCH, CONFIG_MAPS).apply(),
            event(),
            expect(Method::PATCH, STATUS).apply(),
        ],
    )
    .await;
    assert_eq!(
        started.result.unwrap(),
        Action::requeue(Duration::from_secs(30))
    );
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
    cluster.config_map(serde_json::from_value(as_stored(&started.seen[0].body)).unwrap());
    let draining = with_status(statefulset_pool(2), status_of(&started.seen[2]));

    // 10 s later (a restarted operator included: each run is a fresh context): nothing to write.
    let waiting = run_at(&mut cluster, draining.clone(), vec![], NOW + 10).await;
    assert_eq!(
        waiting.result.unwrap(),
        Action::requeue(Duration::from_secs(20))
    );

    // Due: the StatefulSet shrinks (removing the highest ordinal), and the drain record goes.
    let done = run_at(
        &mut cluster,
        draining,
        vec![
            expect(Method::PATCH, STATEFULSETS).apply(),
            event(),
            event(),
            expect(Method::PATCH, STATUS).apply(),
        ],
        NOW + 30,
    )
    .await;
    done.result.unwrap();
    assert_eq!(done.seen[0].body["spec"]["replicas"], 2);
    assert_eq!(
        done.seen[1].body["note"],
        "Scaled StatefulSet cache from 3 to 2 replicas"
    );
    assert_eq!(done.seen[2].body["reason"], "Drained");
    assert!(done.seen[3].body["status"].get("drain").is_none());
}

/// A settled Deployment instance of three slotted pods (a, b, c in slot order); returns its status.
async fn settled_deployment_instance(cluster: &mut Cluster) -> MemcachedStatus {
    let (deployment, service, _) = create(cluster, 3).await;
    cluster.deployment(settled(&deployment));
    cluster.service(serde_json::from_value(as_stored(&service)).unwrap());
    for (name, ip) in [
        ("cache-a", "10.0.0.1"),
        ("cache-b", "10.0.0.2"),
        ("cache-c", "10.0.0.3"),
    ] {
        cluster.pod(server_pod(name, ip, true, "2023-11-14T22:13:20Z"));
    }
    let ready = run(
        cluster,
        memcached(3),
        vec![
            expect(Method::PATCH, CONFIG_MAPS).apply(),
            expect(Method::PATCH, STATUS).apply(),
        ],
    )
    .await;
    ready.result.unwrap();
    cluster.config_map(serde_json::from_value(as_stored(&ready.seen[0].body)).unwrap());
    status_of(&ready.seen[1])
}

#[tokio::test]
async fn pod_deletion_cost_is_set_on_exactly_the_drained_pods() {
    let mut cluster = Cluster::new();
    let status = settled_deployment_instance(&mut cluster).await;

    let started = run(
        &mut cluster,
        with_status(memcached(2), status),
        vec![
            expect(Method::PATCH, &pod_path("cache-c")).apply(),
            expect(Method::PATCH, CONFIG_MAPS).apply(),
            event(),
            expect(Method::PATCH, STATUS).apply(),
        ],
    )
    .await;
    started.result.unwrap();
    assert_eq!(
        started.seen[0].body,
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "cache-c",
               "annotations": {"controller.kubernetes.io/pod-deletion-cost": "-1000"}}}),
        "only the annotation, by server-side apply"
    );
    cluster.config_map(serde_json::from_value(as_stored(&started.seen[1].body)).unwrap());
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
    let done = run_at(
        &mut cluster,
        draining,
        vec![
            expect(Method::PATCH, DEPLOYMENTS).apply(),
            event(),
            event(),
            expect(Method::PATCH, STATUS).apply(),
        ],
        NOW + 30,
    )
    .await;
    done.result.unwrap();
    assert_eq!(done.seen[0].body["spec"]["replicas"], 2);
    assert_eq!(done.seen[2].body["reason"], "Drained");
}

#[tokio::test]
async fn scaling_back_up_during_a_drain_cancels_it_and_clears_the_mark() {
    let mut cluster = Cluster::new();
    let status = settled_deployment_instance(&mut cluster).await;
    let started = run(
        &mut cluster,
        with_status(memcached(2), status),
        vec![
            expect(Method::PATCH, &pod_path("cache-c")).apply(),
            expect(Method::PATCH, CONFIG_MAPS).apply(),
            event(),
            expect(Method::PATCH, STATUS).apply(),
        ],
    )
    .await;
    started.result.unwrap();
    cluster.config_map(serde_json::from_value(as_stored(&started.seen[1].body)).unwrap());
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
            expect(Method::PATCH, CONFIG_MAPS).apply(),
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
    cluster.deployment(settled(&deployment));
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
    assert_eq!(run.seen[1].body["reason"], "WorkloadChanged");
}
