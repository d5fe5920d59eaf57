//! The instance with every optional feature on, the instance with auth only, their Secrets, and the
//! reconciles that create them.

use super::*;

pub(crate) const TLS_SECRET: &str = "/api/v1/namespaces/default/secrets/cache-tls";

pub(crate) const AUTH_SECRET: &str = "/api/v1/namespaces/default/secrets/cache-auth";

pub(crate) const SERVED_AUTH: &str = "/api/v1/namespaces/default/secrets/cache-auth-file";

/// The apply of the auth file the servers load, answered at `version`.
pub(crate) fn served_auth(version: &str) -> Exchange {
    expect(Method::PATCH, SERVED_AUTH).reply(
        StatusCode::OK,
        secret("cache-auth-file", version, json!({"auth-file": "eA=="})),
    )
}

/// Every optional feature on.
pub(crate) fn full(size: i32) -> Memcached {
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

pub(crate) fn secret(name: &str, version: &str, data: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Secret",
           "metadata": {"name": name, "namespace": NS, "resourceVersion": version}, "data": data})
}

pub(crate) fn tls_secret(version: &str) -> Value {
    // base64 of "crt", "key", "ca"
    secret(
        "cache-tls",
        version,
        json!({"tls.crt": "Y3J0", "tls.key": "a2V5", "ca.crt": "Y2E="}),
    )
}

pub(crate) fn auth_secret(version: &str, content_b64: &str) -> Value {
    secret("cache-auth", version, json!({"auth-file": content_b64}))
}

pub(crate) fn secret_hash(deployment: &Value) -> String {
    deployment["spec"]["template"]["metadata"]["annotations"]["cache.example.com/secret-hash"]
        .as_str()
        .expect("the pod template carries the secret hash")
        .to_owned()
}

/// Creates `full(size)` in a cluster that has its Secrets, puts every applied child into the caches, and
/// returns the Deployment as applied.
pub(crate) async fn create_full(cluster: &mut Cluster, size: i32) -> Value {
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
            expect(Method::PATCH, *SERVICE_MONITORS).create(),
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
    cluster.child::<ServiceMonitor>(serde_json::from_value(as_stored(&seen[i + 2].body)).unwrap());
    let event = &seen[i + 3].body;
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

/// Reconciles `mc` once more to record the settled status and returns the instance with that status.
pub(crate) async fn settle_status(cluster: &mut Cluster, mut mc: Memcached) -> Memcached {
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

/// An instance with auth only, its Secret holding `content_b64`.
pub(crate) fn auth_only() -> Memcached {
    with_spec(
        1,
        json!({"security": {"auth": {"secretName": "cache-auth"}}}),
    )
}

/// Creates `auth_only()` with the auth file `content_b64` and returns what was seen; `key` is the script of
/// the digest key's read (empty when the operator holds it already).
pub(crate) async fn create_auth_only(
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
