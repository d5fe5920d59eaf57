//! The Secrets an instance uses: their hash in the pod template (keyed, so it gives nothing away), a
//! rotation that rolls the pods, and a Secret missing or unusable.

use super::*;

#[tokio::test]
async fn a_changed_secret_rolls_the_pods() {
    let mut cluster = Cluster::with_crds();
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
    let mut cluster = Cluster::with_crds();
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
