//! `/metrics` behind TokenReview and SubjectAccessReview, against a scripted API server: who gets 401, 403
//! and 200, that answers are cached per token, that scrapes beyond the concurrency limit get 503, and that
//! the endpoint answers over HTTPS with a certificate from a directory.

use std::sync::Arc;

use axum::Router;
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use kube::Client;
use memcached_operator::manager::http::metrics;
use memcached_operator::manager::https;
use memcached_operator::manager::metrics_auth::{Authorizer, Gate, MAX_CONCURRENT_SCRAPES};
use memcached_operator::metrics::Metrics;
use serde_json::json;
use tower::ServiceExt;

mod common;

use common::scripted::{self, Api};

/// Tokens the scripted API server knows: `reader-token` is `system:serviceaccount:monitoring:prometheus`,
/// allowed; `other-token` is `system:serviceaccount:default:other`, authenticated but not allowed; any
/// other token is not authenticated.
const READER: &str = "reader-token";
const OTHER: &str = "other-token";
const PROMETHEUS: &str = "system:serviceaccount:monitoring:prometheus";

/// The scripted API server: answers TokenReviews and SubjectAccessReviews as [`READER`] and [`OTHER`]
/// say, and records their bodies.
fn api() -> (Client, Api) {
    let user = |name: &str, uid: &str| {
        json!({
            "username": name,
            "uid": uid,
            "groups": ["system:serviceaccounts", "system:authenticated"],
            "extra": {"authentication.kubernetes.io/pod-name": ["p"]},
        })
    };
    let users = vec![
        (READER, user(PROMETHEUS, "uid-1")),
        (OTHER, user("system:serviceaccount:default:other", "uid-2")),
    ];
    Api::start(
        vec![],
        vec![
            scripted::token_reviews(users),
            scripted::access_reviews(vec![PROMETHEUS]),
        ],
    )
}

fn secured(client: Client) -> Router {
    metrics(
        Arc::new(Metrics::default()),
        Gate::new(Some(Arc::new(Authorizer::new(client)))),
    )
}

async fn scrape(router: &Router, token: Option<&str>) -> (StatusCode, String) {
    let mut request = Request::get("/metrics");
    if let Some(token) = token {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    let response = router
        .clone()
        .oneshot(request.body(axum::body::Body::empty()).unwrap())
        .await
        .unwrap();
    let status = response.status();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

#[tokio::test]
async fn no_token_is_401_without_asking_the_api_server() {
    let (client, api) = api();
    let router = secured(client);
    let (status, _) = scrape(&router, None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(api.count(), 0);
}

#[tokio::test]
async fn a_token_the_token_review_rejects_is_401() {
    let (client, api) = api();
    let router = secured(client);
    let (status, body) = scrape(&router, Some("forged")).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    assert_eq!(api.bodies("tokenreviews").len(), 1);
    assert!(
        api.bodies("subjectaccessreviews").is_empty(),
        "no one to authorize"
    );
    assert!(!body.contains("memcached_operator"), "{body}");
}

#[tokio::test]
async fn an_authenticated_user_without_the_right_is_403() {
    let (client, api) = api();
    let router = secured(client);
    let (status, body) = scrape(&router, Some(OTHER)).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert!(!body.contains("memcached_operator"), "{body}");
    let reviews = api.bodies("subjectaccessreviews");
    assert_eq!(reviews.len(), 1);
    // The user exactly as the TokenReview named it, asked about the non-resource URL.
    let spec = &reviews[0]["spec"];
    assert_eq!(spec["user"], "system:serviceaccount:default:other");
    assert_eq!(spec["uid"], "uid-2");
    assert_eq!(
        spec["groups"],
        json!(["system:serviceaccounts", "system:authenticated"])
    );
    assert_eq!(
        spec["extra"],
        json!({"authentication.kubernetes.io/pod-name": ["p"]})
    );
    assert_eq!(
        spec["nonResourceAttributes"],
        json!({"path": "/metrics", "verb": "get"})
    );
}

#[tokio::test]
async fn an_allowed_token_reads_the_metrics() {
    let (client, api) = api();
    let router = secured(client);
    let (status, body) = scrape(&router, Some(READER)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(body.contains("memcached_operator_leader"), "{body}");
    assert_eq!(api.bodies("tokenreviews")[0]["spec"]["token"], READER);
    assert_eq!(api.count(), 2);
}

#[tokio::test]
async fn verdicts_are_cached_per_token() {
    let (client, api) = api();
    let router = secured(client);
    assert_eq!(scrape(&router, Some(READER)).await.0, StatusCode::OK);
    assert_eq!(scrape(&router, Some(OTHER)).await.0, StatusCode::FORBIDDEN);
    assert_eq!(
        scrape(&router, Some("forged")).await.0,
        StatusCode::UNAUTHORIZED
    );
    let asked = api.count();
    assert_eq!(asked, 5, "2 + 2 + 1 reviews for the first scrapes");

    assert_eq!(scrape(&router, Some(READER)).await.0, StatusCode::OK);
    assert_eq!(scrape(&router, Some(OTHER)).await.0, StatusCode::FORBIDDEN);
    assert_eq!(
        scrape(&router, Some("forged")).await.0,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(api.count(), asked, "the second scrapes ask nothing");
}

#[tokio::test]
async fn scrapes_beyond_the_limit_get_503() {
    let (client, api) = api();
    let router = secured(client);
    // The API server holds its answers: the first scrapes wait inside the gate.
    let held = api.hold().await;
    let waiting: Vec<_> = (0..MAX_CONCURRENT_SCRAPES)
        .map(|_| {
            let router = router.clone();
            tokio::spawn(async move { scrape(&router, Some(READER)).await.0 })
        })
        .collect();
    while api.count() < MAX_CONCURRENT_SCRAPES {
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    assert_eq!(
        scrape(&router, Some(READER)).await.0,
        StatusCode::SERVICE_UNAVAILABLE
    );
    drop(held);
    for scrape in waiting {
        assert_eq!(scrape.await.unwrap(), StatusCode::OK);
    }
    assert_eq!(
        scrape(&router, Some(READER)).await.0,
        StatusCode::OK,
        "free again"
    );
    assert!(api.answered() >= MAX_CONCURRENT_SCRAPES);
}

#[tokio::test]
async fn without_authentication_anyone_reads_them() {
    let router = metrics(Arc::new(Metrics::default()), Gate::new(None));
    let (status, body) = scrape(&router, None).await;
    assert_eq!(status, StatusCode::OK);
    assert!(body.contains("memcached_operator_leader"), "{body}");
}

/// A GET over TLS to 127.0.0.1:`port`, trusting `ca` for the name `localhost`.
async fn https_get(port: u16, ca: &rcgen::Certificate, token: Option<&str>) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio_rustls::rustls::{ClientConfig, RootCertStore, pki_types::ServerName};
    let mut roots = RootCertStore::empty();
    roots.add(ca.der().clone()).unwrap();
    let config = ClientConfig::builder_with_provider(Arc::new(
        tokio_rustls::rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let mut tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .unwrap();
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    let request =
        format!("GET /metrics HTTP/1.1\r\nHost: localhost\r\n{auth}Connection: close\r\n\r\n");
    tls.write_all(request.as_bytes()).await.unwrap();
    let mut response = Vec::new();
    let _ = tls.read_to_end(&mut response).await;
    let text = String::from_utf8_lossy(&response).into_owned();
    let code = text.get(9..12).and_then(|c| c.parse().ok()).unwrap_or(0);
    (code, text)
}

#[tokio::test]
async fn served_over_https_with_the_certificate_of_a_directory() {
    let dir = std::env::temp_dir().join(format!("metrics-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let generated = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    std::fs::write(dir.join(https::CERT_FILE), generated.cert.pem()).unwrap();
    std::fs::write(
        dir.join(https::KEY_FILE),
        generated.signing_key.serialize_pem(),
    )
    .unwrap();

    let (client, _api) = api();
    let config = https::server_config(Some(&dir)).unwrap();
    let local = https::serve("127.0.0.1:0".parse().unwrap(), secured(client), config)
        .await
        .unwrap();
    let (code, text) = https_get(local.port(), &generated.cert, None).await;
    assert_eq!(code, 401, "{text}");
    let (code, text) = https_get(local.port(), &generated.cert, Some(READER)).await;
    assert_eq!(code, 200, "{text}");
    assert!(text.contains("# EOF"), "{text}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn a_directory_without_a_certificate_fails_the_start() {
    let dir = std::env::temp_dir().join(format!("metrics-no-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let error = https::server_config(Some(&dir)).unwrap_err().to_string();
    assert!(error.contains("tls.crt"), "{error}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn a_self_signed_certificate_when_none_is_given() {
    let key = https::self_signed().unwrap();
    assert_eq!(key.cert.len(), 1);
    assert!(https::server_config(None).is_ok());
}
