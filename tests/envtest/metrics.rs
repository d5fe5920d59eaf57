//! `/metrics` over HTTPS behind the real API server's TokenReview and SubjectAccessReview: the operator,
//! under its own ServiceAccount (so `metrics-auth-role` of `config/rbac` is what lets it ask), refuses a
//! scrape without a token (401), refuses a ServiceAccount not bound to `metrics-reader` (403), serves one
//! that is (200), and asks the API server nothing for the same token's next scrapes.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName};
use tokio_rustls::rustls::{ClientConfig, RootCertStore};

use crate::{Scenario, wait_for};

/// `GET /metrics` over TLS to 127.0.0.1:`port`, trusting only `ca` (for `localhost`): the status code and
/// the whole response, or why there is none.
async fn scrape(
    port: u16,
    ca: &CertificateDer<'static>,
    token: Option<&str>,
) -> Result<(u16, String), String> {
    let mut roots = RootCertStore::empty();
    roots.add(ca.clone()).map_err(|e| e.to_string())?;
    let config = ClientConfig::builder_with_provider(Arc::new(
        tokio_rustls::rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| e.to_string())?
    .with_root_certificates(roots)
    .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .map_err(|e| e.to_string())?;
    let name = ServerName::try_from("localhost").map_err(|e| e.to_string())?;
    let mut tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .map_err(|e| format!("TLS: {e}"))?;
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    let request =
        format!("GET /metrics HTTP/1.1\r\nHost: localhost\r\n{auth}Connection: close\r\n\r\n");
    tls.write_all(request.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let mut response = Vec::new();
    let _ = tls.read_to_end(&mut response).await;
    let text = String::from_utf8_lossy(&response).into_owned();
    let code = text
        .get(9..12)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("no status line: {text:?}"))?;
    Ok((code, text))
}

/// A certificate for `localhost` in `dir`, as `--metrics-cert-dir` reads it.
fn certificate(dir: &Path) -> CertificateDer<'static> {
    std::fs::create_dir_all(dir).unwrap();
    let generated = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    std::fs::write(dir.join("tls.crt"), generated.cert.pem()).unwrap();
    std::fs::write(dir.join("tls.key"), generated.signing_key.serialize_pem()).unwrap();
    generated.cert.der().clone()
}

#[tokio::test]
async fn metrics_need_a_token_allowed_to_read_them() {
    let dir = std::env::temp_dir().join(format!("envtest-metrics-cert-{}", std::process::id()));
    let ca = certificate(&dir);
    let cert_dir = format!("--metrics-cert-dir={}", dir.display());
    // On a control plane of its own: the operator's reviews are cluster-scoped writes of the shared
    // ServiceAccount, which the other scenarios' write counts would see.
    let Some(s) = Scenario::start_isolated("metrics", &["--metrics-secure=true", &cert_dir]).await
    else {
        let _ = std::fs::remove_dir_all(&dir);
        return;
    };
    let port = s.operator.metrics_port().expect("a metrics port chosen");

    // Two ServiceAccounts; only `scraper` is bound to metrics-reader (by a binding of this scenario's own).
    let accounts: Api<ServiceAccount> = Api::namespaced(s.client.clone(), &s.namespace);
    for name in ["scraper", "stranger"] {
        let account: ServiceAccount =
            serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
        accounts
            .create(&PostParams::default(), &account)
            .await
            .unwrap_or_else(|e| panic!("creating ServiceAccount {name}: {e}"));
    }
    let binding_name = format!("{}-metrics-reader", s.namespace);
    let binding: ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": {"name": binding_name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": "memcached-operator-metrics-reader"},
        "subjects": [{"kind": "ServiceAccount", "name": "scraper", "namespace": s.namespace}],
    }))
    .unwrap();
    let bindings: Api<ClusterRoleBinding> = Api::all(s.client.clone());
    bindings
        .create(&PostParams::default(), &binding)
        .await
        .expect("binding metrics-reader");
    let token = |name: &'static str| {
        let (client, namespace) = (s.client.clone(), s.namespace.clone());
        async move {
            envtest::install::service_account_token(&client, &namespace, name)
                .await
                .unwrap_or_else(|e| panic!("{e:#}"))
        }
    };
    let (scraper, stranger) = (token("scraper").await, token("stranger").await);

    let (code, text) = wait_for(
        "the HTTPS metrics endpoint",
        Duration::from_secs(30),
        || scrape(port, &ca, None),
    )
    .await;
    assert_eq!(code, 401, "{text}");
    assert!(!text.contains("memcached_operator_"), "{text}");
    let (code, text) = scrape(port, &ca, Some("not-a-token")).await.unwrap();
    assert_eq!(code, 401, "{text}");
    s.step("without a valid token: 401");

    let (code, text) = scrape(port, &ca, Some(&stranger)).await.unwrap();
    assert_eq!(code, 403, "{text}");
    assert!(!text.contains("memcached_operator_"), "{text}");
    s.step("a ServiceAccount without metrics-reader: 403");

    let (code, text) = scrape(port, &ca, Some(&scraper)).await.unwrap();
    assert_eq!(code, 200, "{text}");
    assert!(text.contains("memcached_operator_leader"), "{text}");
    s.step("a ServiceAccount bound to metrics-reader: 200");

    // The next scrapes with the same tokens are answered from the cache: no review reaches the server.
    let mark = s.control_plane().audit().mark().expect("audit mark");
    for _ in 0..3 {
        assert_eq!(scrape(port, &ca, Some(&scraper)).await.unwrap().0, 200);
        assert_eq!(scrape(port, &ca, Some(&stranger)).await.unwrap().0, 403);
    }
    let reviews: Vec<_> = s
        .control_plane()
        .audit()
        .read_since(&mark)
        .expect("the audit log")
        .into_iter()
        .filter(|e| {
            e.user == s.credentials.user
                && (e.resource == "tokenreviews" || e.resource == "subjectaccessreviews")
        })
        .collect();
    assert!(
        reviews.is_empty(),
        "reviews for cached tokens: {:?}",
        reviews
            .iter()
            .map(|e| (&e.verb, &e.resource))
            .collect::<Vec<_>>()
    );
    // And the first ones were the operator's own, allowed by metrics-auth-role.
    let asked: Vec<_> = s
        .control_plane()
        .audit()
        .read_since(&s.operator_mark)
        .expect("the audit log")
        .into_iter()
        .filter(|e| e.user == s.credentials.user && e.resource == "tokenreviews")
        .map(|e| e.code)
        .collect();
    assert!(
        !asked.is_empty() && asked.iter().all(|c| *c == 201),
        "{asked:?}"
    );
    s.step("the same tokens again: answered from the cache, no review sent");

    bindings
        .delete(&binding_name, &DeleteParams::default())
        .await
        .expect("removing the binding");
    let _ = std::fs::remove_dir_all(&dir);
}
