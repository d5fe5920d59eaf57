//! Objects of a child's name that are not the operator's: left alone, and the instance says whose they are.

use super::*;

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

/// A ServiceMonitor of the instance's name that is not the operator's (seen by its foreign watch, as
/// every kind of the table) is left alone: the instance says whose it is, and nothing is applied to it
/// (an unforced apply would have taken it over, owner reference and all, and garbage collection would
/// delete it with the instance).
#[tokio::test]
async fn a_foreign_service_monitor_of_the_same_name_is_not_taken_over() {
    let mut cluster = Cluster::with_crds();
    let mc = with_spec(
        1,
        json!({"monitoring": {"exporter": {"enabled": true},
                                               "serviceMonitor": {"enabled": true}}}),
    );
    cluster.foreign_service_monitor(NAME);
    let mut script = created_children(*DEPLOYMENTS, 1);
    script.pop();
    script.extend([
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
