//! NetworkPolicy and HorizontalPodAutoscaler children against the scripted API server: created, updated,
//! put back, removed, and never fighting the autoscaler over `spec.size`; and the CEL rules of
//! `spec.security.networkPolicy` and `spec.autoscaling` agreeing with the operator's own checks.

mod common;
use common::mock::*;

/// Two pods, the exporter, a policy admitting `app=web` and Prometheus' namespace, an autoscaler on CPU.
fn isolated(size: i32) -> Memcached {
    with_spec(
        size,
        json!({
            "security": {"networkPolicy": {
                "enabled": true,
                "allowedClients": [{"podSelector": {"matchLabels": {"app": "web"}}}],
                "monitoringNamespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}
            }},
            "monitoring": {"exporter": {"enabled": true}},
            "autoscaling": {"enabled": true, "minSize": 2, "maxSize": 6,
                            "targetCPUUtilizationPercentage": 75}
        }),
    )
}

fn deleted() -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "status": "Success"})
}

/// Creates `isolated(2)`, checks the requests and the one `Created` event, puts every child into the
/// caches, and returns the NetworkPolicy and autoscaler as applied.
async fn create(cluster: &mut Cluster) -> (Value, Value) {
    // The policy and the autoscaler follow the children every instance has, before the event naming all.
    let mut script = created_children(*DEPLOYMENTS, 2);
    let at = script.len() - 1;
    script.splice(
        at..at,
        [
            expect(Method::PATCH, *NETWORK_POLICIES).create(),
            expect(Method::PATCH, *AUTOSCALERS).create(),
        ],
    );
    script.push(expect(Method::PATCH, STATUS).apply());
    let run = run(cluster, isolated(2), script).await;
    run.result.unwrap();
    let seen = run.seen;
    assert_eq!(seen[6].body["reason"], "Created");
    assert_eq!(
        seen[6].body["note"],
        "Created Deployment cache with 2 replicas, Service cache, Service cache-headless, \
         PodDisruptionBudget cache, NetworkPolicy cache, HorizontalPodAutoscaler cache"
    );
    cluster.child::<Deployment>(settled(&seen[0].body));
    for i in [1, 2] {
        cluster.child::<Service>(serde_json::from_value(as_stored(&seen[i].body)).unwrap());
    }
    cluster.child::<PodDisruptionBudget>(serde_json::from_value(as_stored(&seen[3].body)).unwrap());
    cluster.child::<NetworkPolicy>(serde_json::from_value(as_stored(&seen[4].body)).unwrap());
    cluster.child::<HorizontalPodAutoscaler>(
        serde_json::from_value(as_stored(&seen[5].body)).unwrap(),
    );
    (seen[4].body.clone(), seen[5].body.clone())
}

#[tokio::test]
async fn both_are_created_owned_and_labelled() {
    let mut cluster = Cluster::new();
    let (policy, hpa) = create(&mut cluster).await;
    for child in [&policy, &hpa] {
        let meta = &child["metadata"];
        assert_eq!(meta["name"], "cache");
        assert_eq!(
            meta["labels"]["app.kubernetes.io/managed-by"],
            "memcached-operator"
        );
        assert_eq!(meta["ownerReferences"][0]["uid"], "uid-1");
        assert_eq!(meta["ownerReferences"][0]["controller"], true);
        assert!(meta["annotations"]["cache.example.com/desired-hash"].is_string());
    }
    assert_eq!(policy["apiVersion"], "networking.k8s.io/v1");
    assert_eq!(policy["spec"]["policyTypes"], json!(["Ingress"]));
    assert_eq!(
        policy["spec"]["ingress"],
        json!([
            {"from": [{"podSelector": {"matchLabels": {"app": "web"}}}],
             "ports": [{"port": 11211, "protocol": "TCP"}]},
            {"from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}],
             "ports": [{"port": 9150, "protocol": "TCP"}]}
        ])
    );
    assert_eq!(hpa["apiVersion"], "autoscaling/v2");
    assert_eq!(
        hpa["spec"]["scaleTargetRef"],
        json!({"apiVersion": "cache.example.com/v1alpha1", "kind": "Memcached", "name": "cache"})
    );
    assert_eq!(
        (&hpa["spec"]["minReplicas"], &hpa["spec"]["maxReplicas"]),
        (&json!(2), &json!(6))
    );
}

#[tokio::test]
async fn a_changed_setting_updates_only_its_child() {
    let mut cluster = Cluster::new();
    create(&mut cluster).await;

    let mut mc = isolated(2);
    mc.spec.autoscaling.as_mut().unwrap().max_size = 10;
    let updated = run(
        &mut cluster,
        mc,
        vec![
            expect(Method::PATCH, *AUTOSCALERS).apply(),
            event(),
            expect(Method::PATCH, STATUS).apply(),
        ],
    )
    .await;
    updated.result.unwrap();
    assert_eq!(updated.seen[0].body["spec"]["maxReplicas"], 10);
    assert_eq!(
        updated.seen[1].body["note"],
        "Updated HorizontalPodAutoscaler cache to match the spec"
    );

    // Turning the exporter off closes its port in the policy (and drops the sidecar).
    let mut mc = isolated(2);
    mc.spec.monitoring = None;
    let run = run(
        &mut cluster,
        mc,
        vec![
            expect(Method::PATCH, *DEPLOYMENTS).apply(),
            expect(Method::PATCH, *SERVICES).apply(),
            expect(Method::PATCH, *NETWORK_POLICIES).apply(),
            event(),
            expect(Method::PATCH, STATUS).apply(),
        ],
    )
    .await;
    run.result.unwrap();
    let ingress = run.seen[2].body["spec"]["ingress"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(ingress.len(), 1, "{ingress:?}");
    assert_eq!(
        run.seen[3].body["note"],
        "Updated Deployment cache, Service cache, NetworkPolicy cache to match the spec"
    );
}

#[tokio::test]
async fn hand_edits_are_put_back() {
    let mut cluster = Cluster::new();
    let (policy, hpa) = create(&mut cluster).await;

    // Someone opened the policy to everyone and raised the autoscaler's ceiling.
    let mut opened = as_stored(&policy);
    opened["spec"]["ingress"][0]["from"] = json!([{"namespaceSelector": {}}]);
    cluster.child::<NetworkPolicy>(serde_json::from_value::<NetworkPolicy>(opened).unwrap());
    let mut raised = as_stored(&hpa);
    raised["spec"]["maxReplicas"] = json!(64);
    cluster.child::<HorizontalPodAutoscaler>(
        serde_json::from_value::<HorizontalPodAutoscaler>(raised).unwrap(),
    );

    let run = run(
        &mut cluster,
        isolated(2),
        vec![
            expect(Method::PATCH, *NETWORK_POLICIES).apply(),
            expect(Method::PATCH, *AUTOSCALERS).apply(),
            event(),
            expect(Method::PATCH, STATUS).apply(),
        ],
    )
    .await;
    run.result.unwrap();
    assert_eq!(run.seen[0].body["spec"], policy["spec"]);
    assert_eq!(run.seen[1].body["spec"]["maxReplicas"], 6);
    assert_eq!(
        run.seen[2].body["note"],
        "Updated NetworkPolicy cache, HorizontalPodAutoscaler cache to match the spec"
    );
}

#[tokio::test]
async fn turned_off_both_are_deleted_once() {
    let mut cluster = Cluster::new();
    let (policy, hpa) = create(&mut cluster).await;

    let mut mc = isolated(2);
    mc.spec.security = None;
    mc.spec.autoscaling.as_mut().unwrap().enabled = false;
    let run1 = run(
        &mut cluster,
        mc.clone(),
        vec![
            expect(Method::DELETE, *NETWORK_POLICIES).reply(StatusCode::OK, deleted()),
            // Already gone (deleted by hand meanwhile): that counts as deleted too.
            expect(Method::DELETE, *AUTOSCALERS).fail(404, "NotFound"),
            event(),
            expect(Method::PATCH, STATUS).apply(),
        ],
    )
    .await;
    run1.result.unwrap();
    assert_eq!(run1.seen[2].body["reason"], "Deleted");
    assert_eq!(
        run1.seen[2].body["note"],
        "Deleted NetworkPolicy cache, HorizontalPodAutoscaler cache: the spec no longer wants them"
    );

    // The watches report them gone: nothing more is deleted.
    let gone = |v: &Value| as_stored(v);
    cluster.remove_child::<NetworkPolicy>(serde_json::from_value(gone(&policy)).unwrap());
    cluster.remove_child::<HorizontalPodAutoscaler>(serde_json::from_value(gone(&hpa)).unwrap());
    let run2 = run(
        &mut cluster,
        mc,
        vec![expect(Method::PATCH, STATUS).apply()],
    )
    .await;
    run2.result.unwrap();
}

#[tokio::test]
async fn the_autoscaler_owns_the_size_and_the_operator_follows() {
    let mut cluster = Cluster::new();
    create(&mut cluster).await;

    // The autoscaler set spec.size to 5 through the scale subresource: the operator scales the
    // Deployment, leaves the autoscaler alone, and never writes the Memcached's spec (the script would
    // refuse a PATCH of the Memcached itself).
    let run1 = run(
        &mut cluster,
        isolated(5),
        vec![
            expect(Method::PATCH, *DEPLOYMENTS).apply(),
            event(),
            expect(Method::PATCH, STATUS).apply(),
        ],
    )
    .await;
    run1.result.unwrap();
    assert_eq!(run1.seen[0].body["spec"]["replicas"], 5);
    assert_eq!(run1.seen[1].body["reason"], "Scaled");
    assert_eq!(
        run1.seen[1].body["note"],
        "Scaled Deployment cache from 2 to 5 replicas"
    );

    // A size outside [minSize, maxSize] (a `kubectl scale` to 9) is not clamped by the operator: the
    // autoscaler brings it back within its next sync, and the operator follows again.
    cluster.child::<Deployment>(settled(&run1.seen[0].body));
    let run2 = run(
        &mut cluster,
        isolated(9),
        vec![
            expect(Method::PATCH, *DEPLOYMENTS).apply(),
            event(),
            expect(Method::PATCH, STATUS).apply(),
        ],
    )
    .await;
    run2.result.unwrap();
    assert_eq!(run2.seen[0].body["spec"]["replicas"], 9);
    assert_eq!(
        run2.seen[1].body["note"],
        "Scaled Deployment cache from 5 to 9 replicas"
    );
}

#[tokio::test]
async fn a_settled_isolated_instance_sends_nothing() {
    let mut cluster = Cluster::new();
    create(&mut cluster).await;
    cluster.pod(ready_pod("cache-a"));
    cluster.pod(ready_pod("cache-b"));
    let settle = run(
        &mut cluster,
        isolated(2),
        vec![expect(Method::PATCH, STATUS).apply()],
    )
    .await;
    settle.result.unwrap();
    let mut mc = isolated(2);
    mc.status = Some(serde_json::from_value(settle.seen[0].body["status"].clone()).unwrap());
    let quiet = run(&mut cluster, mc, vec![]).await;
    assert!(quiet.result.is_ok() && quiet.seen.is_empty());
}

/// What a 1.25+ API server rejects at admission (CEL) and what the operator reports as InvalidConfig
/// agree on every spec here.
#[test]
fn cel_rules_agree_with_the_operator_checks() {
    use kube::core::cel::Validator;
    use memcached_operator::resources::validate::validate as operator_check;
    let crd = serde_json::to_value(memcached_operator::manifests::crd()).unwrap();
    let schema = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
    let policy = |clients: Value| json!({"security": {"networkPolicy": {"enabled": true, "allowedClients": clients}}});
    let block = json!({"cidr": "10.0.0.0/8"});
    let cases = [
        (policy(json!([])), true),
        (policy(json!([{"podSelector": {}}])), true),
        (
            policy(json!([{"namespaceSelector": {}, "podSelector": {"matchLabels": {"a": "b"}}}])),
            true,
        ),
        (policy(json!([{"ipBlock": block}])), true),
        (policy(json!([{}])), false),
        (
            policy(json!([{"ipBlock": block, "podSelector": {}}])),
            false,
        ),
        (
            policy(json!([{"ipBlock": block, "namespaceSelector": {}}])),
            false,
        ),
        (
            json!({"security": {"networkPolicy": {"allowedClients": [{}]}}}),
            false,
        ),
        (
            json!({"autoscaling": {"enabled": true, "maxSize": 3, "targetCPUUtilizationPercentage": 50}}),
            true,
        ),
        (
            json!({"autoscaling": {"enabled": true, "maxSize": 3, "targetMemoryUtilizationPercentage": 50}}),
            true,
        ),
        (
            json!({"autoscaling": {"enabled": true, "maxSize": 3}}),
            false,
        ),
        (
            json!({"autoscaling": {"enabled": false, "maxSize": 3}}),
            true,
        ),
        (json!({"autoscaling": {"maxSize": 3}}), true),
        (
            json!({"autoscaling": {"enabled": true, "minSize": 4, "maxSize": 3, "targetCPUUtilizationPercentage": 50}}),
            false,
        ),
        (json!({"autoscaling": {"minSize": 4, "maxSize": 3}}), false),
        (
            json!({"autoscaling": {"enabled": true, "minSize": 3, "maxSize": 3, "targetCPUUtilizationPercentage": 50}}),
            true,
        ),
    ];
    for (spec, valid) in cases {
        let object = json!({"apiVersion": "cache.example.com/v1alpha1", "kind": "Memcached",
                            "metadata": {"name": "x", "namespace": "ns"}, "spec": spec});
        let cel = Validator::new().validate(schema, &object, None);
        assert_eq!(cel.is_ok(), valid, "CEL on {spec}: {cel:?}");
        let mc: Memcached = serde_json::from_value(object).unwrap();
        let operator = operator_check(&mc.spec);
        assert_eq!(operator.is_ok(), valid, "operator on {spec}: {operator:?}");
    }
}
