//! An instance that references an auth Secret: the Secret is read once and only its hash is written.

use axum::http::Method;
use serde_json::json;

use crate::checks::{assert_no_unexpected_requests, lines, of, writes};
use crate::cluster;
use crate::cluster::paths::{DEPLOYMENT, EVENTS, SECRETS};
use crate::cluster::world::{World, memcached};
use std::time::Duration;

use crate::harness::{WAIT, settled, start_run, stop_and_check_release};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secret_referencing_instance_reads_the_secret_once_and_hashes_it() {
    // base64("app:pw\n") = "YXBwOnB3Cg=="
    let mut instance = memcached();
    instance["spec"]["security"] = json!({"auth": {"secretName": "creds"}});
    let world = World {
        memcacheds: vec![instance],
        secrets: vec![json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "creds", "namespace": "default", "resourceVersion": "5", "uid": "uid-creds",
                         "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{\"data\":{\"auth-file\":\"YXBwOnB3Cg==\"}}"}},
            "type": "Opaque",
            "data": {"auth-file": "YXBwOnB3Cg=="}
        })],
        ..World::default()
    };
    let fake = cluster::start_with(world, None).await;
    let (_scratch, mut op, _metrics, _probes) = start_run(&fake, "secret");
    op.wait_until(
        "the Deployment is applied and the creation recorded",
        WAIT,
        || {
            let requests = fake.requests();
            async move {
                !of(&requests, &Method::PATCH, *DEPLOYMENT).is_empty()
                    && !of(&requests, &Method::POST, EVENTS).is_empty()
            }
        },
    )
    .await;
    settled(&fake, Duration::from_secs(1)).await;
    stop_and_check_release(&mut op, &fake).await;
    let requests = fake.requests();

    // Read once (its version did not change), by name; the list was metadata-only.
    let secret_path = format!("{SECRETS}/creds");
    assert_eq!(
        of(&requests, &Method::GET, &secret_path).len(),
        1,
        "{}",
        lines(&requests)
    );
    let deployment = &of(&requests, &Method::PATCH, *DEPLOYMENT)[0].body;
    let template = &deployment["spec"]["template"];
    let hash = template["metadata"]["annotations"]["cache.example.com/secret-hash"]
        .as_str()
        .unwrap_or_default();
    assert!(
        hash.len() == 64 && hash.chars().all(|c| c.is_ascii_hexdigit()),
        "{deployment}"
    );
    let args = template["spec"]["containers"][0]["args"].to_string();
    assert!(
        args.contains("\"-Y\",\"/etc/memcached/auth/auth-file\""),
        "{args}"
    );

    // The value never leaves: not in the log (at debug level), not in anything written.
    let stderr = op.stderr();
    for secret in ["app:pw", "YXBwOnB3Cg=="] {
        assert!(
            !stderr.contains(secret),
            "the log contains {secret}:\n{stderr}"
        );
        for req in writes(&requests) {
            assert!(
                !req.body.to_string().contains(secret),
                "{} contains {secret}",
                req.line()
            );
        }
    }
    assert_no_unexpected_requests(&fake);
}
