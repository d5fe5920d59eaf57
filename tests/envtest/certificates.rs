//! A rotated TLS certificate reaches the running servers in place: no pod restarted, no Deployment
//! change, the servers present the new certificate, one `CertificatesReloaded` event says so. Against
//! real memcached servers (the stand-in kubelet writes a changed Secret into running pods' volumes, as a
//! kubelet does); skipped (and said so) where memcached is not installed.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::events::v1::Event;
use kube::api::ListParams;
use kube::{Api, ResourceExt};
use memcached_operator::telemetry::client::{
    CertificateDigest, Credentials, ServerNames, Target, read,
};
use serde_json::json;

use crate::instances::{apply, pods, wait_settled};
use crate::secrets::{auth_secret, client_tls, reissue_tls_secret, tls_secrets};
use crate::{Scenario, wait_for};

#[tokio::test]
async fn a_rotated_certificate_is_reloaded_without_restarting_a_pod() {
    let Some(s) = Scenario::start_with_memcached(
        "certificate-rotation",
        &["--stats-interval", "1s", "--stats-status-interval", "1s"],
    )
    .await
    else {
        return;
    };
    let ns = s.namespace.clone();
    let names = vec![format!("rot.{ns}.svc"), format!("*.rot-headless.{ns}.svc")];
    let ca = tls_secrets(&s, "rot-tls", names.clone(), Some("rot-client")).await;
    auth_secret(&s, "rot-auth", "auth-file", "app:s3cret\n").await;
    let security = json!({
        "tls": {"secretName": "rot-tls", "clientAuth": true, "clientSecretName": "rot-client"},
        "auth": {"secretName": "rot-auth"}
    });
    apply(&s, "rot", json!({"size": 2, "security": security})).await;
    wait_settled(&s, "rot", Duration::from_secs(60)).await;
    let deployments: Api<Deployment> = Api::namespaced(s.client.clone(), &ns);
    let before = deployments.get("rot").await.expect("the Deployment");
    let selector = ListParams::default().labels("app.kubernetes.io/instance=rot");
    let uids = |list: Vec<k8s_openapi::api::core::v1::Pod>| {
        let mut uids: Vec<String> = list.iter().filter_map(|p| p.uid()).collect();
        uids.sort();
        uids
    };
    let pods_before = uids(pods(&s).list(&selector).await.expect("pods").items);
    assert_eq!(pods_before.len(), 2);

    s.step("rotating the certificate of Secret rot-tls (same CA, new key)");
    let new_pem = reissue_tls_secret(&s, "rot-tls", names, &ca).await;
    let new = CertificateDigest::of_pem_leaf(new_pem.as_bytes()).expect("a certificate");
    let events: Api<Event> = Api::namespaced(s.client.clone(), &ns);
    let event = wait_for(
        "a CertificatesReloaded event for rot",
        Duration::from_secs(60),
        || {
            let events = events.clone();
            async move {
                let list = events
                    .list(&ListParams::default())
                    .await
                    .map_err(|e| e.to_string())?;
                list.items
                    .into_iter()
                    .find(|e| {
                        e.reason.as_deref() == Some("CertificatesReloaded")
                            && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("rot")
                    })
                    .ok_or_else(|| "not yet".to_owned())
            }
        },
    )
    .await;
    s.step(&format!(
        "event: {}",
        event.note.clone().unwrap_or_default()
    ));

    // Every server presents the new certificate, to a client that checks it as the operator does.
    let running = pods(&s).list(&selector).await.expect("pods").items;
    assert_eq!(uids(running.clone()), pods_before, "no pod was replaced");
    // Mutual TLS: a client certificate is needed; the operator's own is in rot-client.
    let tls = client_tls(&s, "rot-client", &ca).await;
    for pod in &running {
        let ip = pod
            .status
            .as_ref()
            .and_then(|st| st.pod_ip.clone())
            .expect("a pod IP");
        let target = Target {
            address: SocketAddr::new(ip.parse().expect("an IP"), 11211),
            tls: Some(tls.clone()),
            names: ServerNames::for_pod("rot", &ns, &pod.name_any(), "cluster.local"),
            credentials: Some(Arc::new(
                Credentials::from_auth_file(b"app:s3cret\n").expect("credentials"),
            )),
            certificate: None,
            still_the_pod: None,
        };
        let reading = read(&target, Duration::from_secs(5)).await.expect("stats");
        let shown = reading.certificate.expect("over TLS");
        assert_eq!(
            shown.digest,
            new,
            "{} presents the new certificate",
            pod.name_any()
        );
    }
    let after = deployments.get("rot").await.expect("the Deployment");
    assert_eq!(
        after.metadata.generation, before.metadata.generation,
        "the Deployment was not changed"
    );
    s.step("both servers present the new certificate; no pod restarted, Deployment unchanged");
}
