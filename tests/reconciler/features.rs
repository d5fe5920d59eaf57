//! The optional children (PodDisruptionBudget, exporter, ServiceMonitor, NetworkPolicy, autoscaler): added
//! with their feature, removed with it.

use super::*;

#[tokio::test]
async fn every_feature_on_applies_each_child_then_settles_with_no_request() {
    let mut cluster = Cluster::with_crds();
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
    let mut cluster = Cluster::with_crds();
    create_full(&mut cluster, 1).await;
    let mut mc = full(1);
    mc.spec.monitoring.as_mut().unwrap().service_monitor = None;
    let run = run(
        &mut cluster,
        mc,
        vec![
            expect(Method::DELETE, *SERVICE_MONITORS).reply(
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
