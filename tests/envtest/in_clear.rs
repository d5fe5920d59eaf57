//! Auth without TLS on the real control plane, with real memcached: what the operator says and keeps to
//! itself. The instance comes up and, as its spec allows (`allowPlaintextStats`), is read with the
//! operator's own entry of the auth file the pods load (its credential goes to the pods the addresses
//! were read for); a Warning event `CredentialsInClear` says that they travel in the clear; the pod template's
//! Secret hash is keyed with the operator's own key, which it made once in its own namespace; and the auth
//! file is mounted by `subPath`, so a running pod keeps the file it started with.

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::events::v1::Event;
use kube::Api;
use kube::api::ListParams;
use serde_json::json;

use crate::instances::{apply, memcacheds, wait_settled};
use crate::secrets::auth_secret;
use crate::{Scenario, wait_for};

#[tokio::test]
async fn auth_without_tls_is_said_read_with_care_and_keyed() {
    let Some(s) = Scenario::start_with_memcached(
        "in-clear",
        &["--stats-interval", "1s", "--stats-status-interval", "1s"],
    )
    .await
    else {
        return;
    };
    auth_secret(&s, "auth", "auth-file", "app:pw42\n").await;
    apply(
        &s,
        "plain",
        json!({"size": 2, "security": {"auth": {"secretName": "auth", "allowPlaintextStats": true}}}),
    )
    .await;
    wait_settled(&s, "plain", Duration::from_secs(90)).await;

    s.step("the servers are read with the credentials, over plain TCP, from the pods they were read for");
    let api = memcacheds(&s);
    wait_for("2 servers read", Duration::from_secs(30), || async {
        let mc = api.get("plain").await.map_err(|e| e.to_string())?;
        let stats = mc.status.and_then(|st| st.stats).ok_or("no stats yet")?;
        (stats.servers_read == 2)
            .then_some(())
            .ok_or(format!("{stats:?}"))
    })
    .await;

    s.step("the pods load the operator's copy: the user's entry and the operator's own, owned by the instance");
    let secrets: Api<Secret> = Api::namespaced(s.client.clone(), &s.namespace);
    let served = secrets
        .get("plain-auth-file")
        .await
        .expect("the served auth file");
    let file = String::from_utf8(served.data.expect("data")["auth-file"].0.clone()).unwrap();
    let lines: Vec<&str> = file.lines().collect();
    assert_eq!(lines.len(), 2, "{} lines", lines.len());
    assert_eq!(lines[0], "app:pw42");
    assert!(lines[1].starts_with("memcached-operator:"));
    let owner = &served.metadata.owner_references.expect("owned")[0];
    assert_eq!(
        (owner.kind.as_str(), owner.controller),
        ("Memcached", Some(true))
    );

    s.step("a Warning event says the credentials travel in the clear");
    let events: Api<Event> = Api::namespaced(s.client.clone(), &s.namespace);
    let warned = wait_for("CredentialsInClear", Duration::from_secs(20), || async {
        let list = events
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?;
        list.items
            .into_iter()
            .find(|e| e.reason.as_deref() == Some("CredentialsInClear"))
            .ok_or_else(|| "not yet".to_owned())
    })
    .await;
    assert_eq!(warned.type_.as_deref(), Some("Warning"));
    assert!(
        warned
            .note
            .unwrap_or_default()
            .contains("spec.security.tls")
    );

    s.step(
        "the digest key lives in the operator's namespace; the template's hash is keyed with it",
    );
    let keys: Api<Secret> = Api::namespaced(s.client.clone(), &s.credentials.namespace);
    let key = keys
        .get("memcached-operator-digest-key")
        .await
        .expect("the operator made its digest key");
    let bytes = &key.data.expect("data")["key"].0;
    assert!(bytes.len() >= 32);
    let uid = memcacheds(&s)
        .get("plain")
        .await
        .expect("the instance")
        .metadata
        .uid
        .expect("a uid");
    let deployments: Api<Deployment> = Api::namespaced(s.client.clone(), &s.namespace);
    let template = deployments
        .get("plain")
        .await
        .expect("the Deployment")
        .spec
        .expect("spec")
        .template;
    let annotations = template
        .metadata
        .expect("metadata")
        .annotations
        .expect("annotations");
    let hash = &annotations["cache.example.com/secret-hash"];
    let spec = memcached_operator::api::MemcachedSpec {
        security: Some(Box::new(memcached_operator::api::Security {
            auth: Some(memcached_operator::api::AuthConfig {
                secret_name: "auth".into(),
                ..Default::default()
            }),
            ..Default::default()
        })),
        ..Default::default()
    };
    use memcached_operator::resources::secrets::{
        KeyDigest, Owner, TlsReload, digest, keyed, referenced,
    };
    let contents = [(
        "auth".to_owned(),
        Some([("auth-file".to_owned(), KeyDigest::of(b"app:pw42\n"))].into()),
    )]
    .into();
    let unkeyed = digest(
        &s.namespace,
        &referenced(&spec),
        &contents,
        TlsReload::Rollout("-"),
    )
    .unwrap()
    .unwrap();
    assert_ne!(
        hash, &unkeyed,
        "the password is not testable against the template"
    );
    assert_eq!(
        hash,
        &keyed(
            bytes,
            &Owner {
                namespace: &s.namespace,
                uid: &uid,
            },
            &unkeyed
        ),
        "keyed with the operator's key"
    );

    s.step("the auth file is bound by subPath");
    let container = &template.spec.expect("pod spec").containers[0];
    let mount = container
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| m.name == "auth")
        .expect("the auth mount");
    assert_eq!(mount.sub_path.as_deref(), Some("auth-file"));
}
