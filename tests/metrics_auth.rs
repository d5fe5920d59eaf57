//! `/metrics` behind TokenReview and SubjectAccessReview, against a scripted API server: who gets 401, 403
//! and 200, that answers are remembered per token (allowed ones apart from refused ones, and reviewed
//! again in the background), that unknown tokens beyond the review slots get 429 while an allowed token
//! passes, that allowed scrapes beyond the concurrency limit get 503, and that the endpoint answers over
//! HTTPS with a certificate from a directory. And the server's limits: HTTP/2 only with the flag, the
//! header-read and idle timeouts, the connection cap, and a flood of random tokens from 200 clients (also
//! with TokenReviews slowed to 2 s) that does not hold up Prometheus.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use hyper_util::rt::TokioExecutor;
use kube::Client;
use memcached_operator::manager::http::metrics;
use memcached_operator::manager::metrics_auth::{
    Authorizer, Gate, Limits, MAX_CONCURRENT_REVIEWS, MAX_CONCURRENT_SCRAPES, MAX_DENIED_TOKENS,
    enforce,
};
use memcached_operator::manager::{https, server};
use memcached_operator::metrics::Metrics;
use serde_json::json;
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio_rustls::rustls::pki_types::ServerName;
use tokio_rustls::rustls::{ClientConfig, RootCertStore};
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
    secured_with(client, Limits::default())
}

fn secured_with(client: Client, limits: Limits) -> Router {
    metrics(
        Arc::new(Metrics::default()),
        Gate::new(Some(Arc::new(Authorizer::with_limits(client, limits)))),
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

/// Waits (5 s at most) until `done`.
async fn wait_until(what: &str, done: impl Fn() -> bool) {
    let started = Instant::now();
    while !done() {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// `count` scrapes with tokens the API server does not know, started and left waiting (for a held API
/// server) until [`Api::count`] reaches `seen`.
async fn waiting_unknown_scrapes(
    router: &Router,
    api: &Api,
    count: usize,
    seen: usize,
) -> Vec<tokio::task::JoinHandle<StatusCode>> {
    let waiting = (0..count)
        .map(|i| {
            let router = router.clone();
            tokio::spawn(async move { scrape(&router, Some(&format!("unknown-{i}"))).await.0 })
        })
        .collect();
    wait_until("the reviews of the unknown tokens", || api.count() >= seen).await;
    waiting
}

#[tokio::test]
async fn unknown_tokens_beyond_the_review_slots_get_429_while_an_allowed_one_passes() {
    let (client, api) = api();
    let router = secured(client);
    assert_eq!(scrape(&router, Some(READER)).await.0, StatusCode::OK);
    let asked = api.count();
    // The API server holds its answers: the reviews of unknown tokens take every review slot.
    let held = api.hold().await;
    let waiting = waiting_unknown_scrapes(
        &router,
        &api,
        MAX_CONCURRENT_REVIEWS,
        asked + MAX_CONCURRENT_REVIEWS,
    )
    .await;
    let (status, body) = scrape(&router, Some("one-more")).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
    assert_eq!(
        api.count(),
        asked + MAX_CONCURRENT_REVIEWS,
        "refused without a review"
    );
    let (status, body) = scrape(&router, Some(READER)).await;
    assert_eq!(
        status,
        StatusCode::OK,
        "an allowed token does not wait: {body}"
    );
    drop(held);
    for scrape in waiting {
        assert_eq!(scrape.await.unwrap(), StatusCode::UNAUTHORIZED);
    }
}

#[tokio::test]
async fn allowed_scrapes_beyond_the_limit_get_503() {
    // A handler that answers only when told: the scrapes wait inside it, past the gate.
    let release = Arc::new(tokio::sync::Notify::new());
    let handler = {
        let release = release.clone();
        move || async move {
            release.notified().await;
            "ok"
        }
    };
    let router = Router::new()
        .route("/metrics", axum::routing::get(handler))
        .route_layer(axum::middleware::from_fn_with_state(
            Gate::new(None),
            enforce,
        ));
    let waiting: Vec<_> = (0..MAX_CONCURRENT_SCRAPES)
        .map(|_| {
            let router = router.clone();
            tokio::spawn(async move { scrape(&router, None).await.0 })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        scrape(&router, None).await.0,
        StatusCode::SERVICE_UNAVAILABLE
    );
    release.notify_waiters();
    for scrape in waiting {
        assert_eq!(scrape.await.unwrap(), StatusCode::OK);
    }
}

#[tokio::test]
async fn a_flood_of_refused_tokens_does_not_push_an_allowed_token_out_of_memory() {
    let (client, api) = api();
    let router = secured(client);
    assert_eq!(scrape(&router, Some(READER)).await.0, StatusCode::OK);
    for i in 0..MAX_DENIED_TOKENS + 10 {
        let token = format!("random-{i}");
        assert_eq!(
            scrape(&router, Some(&token)).await.0,
            StatusCode::UNAUTHORIZED
        );
    }
    assert_eq!(scrape(&router, Some(READER)).await.0, StatusCode::OK);
    let reviews_of_reader = api
        .bodies("tokenreviews")
        .iter()
        .filter(|r| r["spec"]["token"] == READER)
        .count();
    assert_eq!(
        reviews_of_reader, 1,
        "the allowed token is still remembered"
    );
}

#[tokio::test]
async fn an_allowed_token_is_reviewed_again_in_the_background_before_its_verdict_runs_out() {
    let (client, api) = api();
    let limits = Limits {
        allowed_ttl: Duration::from_secs(5),
        refresh_after: Duration::from_millis(200),
        ..Limits::default()
    };
    let router = secured_with(client, limits);
    assert_eq!(scrape(&router, Some(READER)).await.0, StatusCode::OK);
    assert_eq!(api.count(), 2);
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The reviews now take longer than the whole test allows a scrape.
    let held = api.hold().await;
    let started = Instant::now();
    for _ in 0..3 {
        assert_eq!(scrape(&router, Some(READER)).await.0, StatusCode::OK);
    }
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "the scrapes did not wait for the review: {:?}",
        started.elapsed()
    );
    wait_until("a review of the allowed token in the background", || {
        api.count() >= 3
    })
    .await;
    drop(held);
    wait_until("the answers to that review", || api.answered() >= 4).await;
    assert_eq!(
        api.count(),
        4,
        "one review again (TokenReview, SubjectAccessReview)"
    );
    assert_eq!(scrape(&router, Some(READER)).await.0, StatusCode::OK);
    assert_eq!(api.count(), 4, "the verdict is fresh again");
}

#[tokio::test]
async fn an_allowed_token_whose_verdict_ran_out_is_reviewed_on_slots_unknown_tokens_cannot_take() {
    let (client, api) = api();
    let limits = Limits {
        allowed_ttl: Duration::from_millis(200),
        refresh_after: Duration::from_millis(200),
        ..Limits::default()
    };
    let router = secured_with(client, limits);
    assert_eq!(scrape(&router, Some(READER)).await.0, StatusCode::OK);
    let held = api.hold().await;
    let unknown = waiting_unknown_scrapes(
        &router,
        &api,
        MAX_CONCURRENT_REVIEWS,
        2 + MAX_CONCURRENT_REVIEWS,
    )
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let reader = {
        let router = router.clone();
        tokio::spawn(async move { scrape(&router, Some(READER)).await.0 })
    };
    wait_until("a review of the token whose verdict ran out", || {
        api.count() >= 3 + MAX_CONCURRENT_REVIEWS
    })
    .await;
    assert_eq!(
        scrape(&router, Some("one-more")).await.0,
        StatusCode::TOO_MANY_REQUESTS,
        "the review slots are still taken"
    );
    drop(held);
    assert_eq!(reader.await.unwrap(), StatusCode::OK);
    for scrape in unknown {
        assert_eq!(scrape.await.unwrap(), StatusCode::UNAUTHORIZED);
    }
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
    let config = https::server_config(Some(&dir), false).unwrap();
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
    let error = https::server_config(Some(&dir), false)
        .unwrap_err()
        .to_string();
    assert!(error.contains("tls.crt"), "{error}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn a_self_signed_certificate_when_none_is_given() {
    let key = https::self_signed().unwrap();
    assert_eq!(key.cert.len(), 1);
    assert!(https::server_config(None, false).is_ok());
}

// The server itself: HTTP/2 only when asked for, timeouts, the connection cap, and a flood.

/// A certificate for `localhost` in a directory of its own (removed on drop), as `--metrics-cert-dir`.
struct CertDir {
    dir: std::path::PathBuf,
    cert: rcgen::Certificate,
}

impl CertDir {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("metrics-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let generated = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
        std::fs::write(dir.join(https::CERT_FILE), generated.cert.pem()).unwrap();
        std::fs::write(
            dir.join(https::KEY_FILE),
            generated.signing_key.serialize_pem(),
        )
        .unwrap();
        CertDir {
            dir,
            cert: generated.cert,
        }
    }

    /// A client configuration trusting this certificate, offering `alpn`.
    fn client(&self, alpn: &[&[u8]]) -> Arc<ClientConfig> {
        let mut roots = RootCertStore::empty();
        roots.add(self.cert.der().clone()).unwrap();
        let mut config = ClientConfig::builder_with_provider(Arc::new(
            tokio_rustls::rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        Arc::new(config)
    }

    /// `/metrics` served over HTTPS from this directory's certificate, within `limits`; its port.
    async fn serve(&self, router: Router, http2: bool, limits: server::Limits) -> u16 {
        let config = https::server_config(Some(&self.dir), http2).unwrap();
        server::serve("127.0.0.1:0".parse().unwrap(), router, Some(config), limits)
            .await
            .unwrap()
            .port()
    }
}

impl Drop for CertDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

type Tls = tokio_rustls::client::TlsStream<tokio::net::TcpStream>;

async fn tls_connect(port: u16, config: Arc<ClientConfig>) -> std::io::Result<Tls> {
    tls_connect_from([127, 0, 0, 1], port, config).await
}

/// [`tls_connect`] from another loopback address (Linux routes all of 127.0.0.0/8 to loopback): another
/// client, as far as the server's per-client budget goes.
async fn tls_connect_from(
    source: [u8; 4],
    port: u16,
    config: Arc<ClientConfig>,
) -> std::io::Result<Tls> {
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.bind((source, 0).into())?;
    let tcp = socket.connect(([127, 0, 0, 1], port).into()).await?;
    tcp.set_nodelay(true)?;
    tokio_rustls::TlsConnector::from(config)
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
}

/// Everything the server sends until it closes the connection (at most 5 s), and how long that took.
async fn until_closed(reader: &mut (impl AsyncRead + Unpin)) -> (Vec<u8>, Duration, bool) {
    let started = Instant::now();
    let mut answer = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(5), reader.read_to_end(&mut answer))
        .await
        .is_ok();
    (answer, started.elapsed(), closed)
}

/// The connection preface of HTTP/2 and an empty SETTINGS frame: what a client with prior knowledge
/// sends first.
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00";

/// Whether `answer` begins with an HTTP/2 frame: a SETTINGS frame (type 4 on stream 0) is what a server
/// sends first.
fn is_http2(answer: &[u8]) -> bool {
    answer.len() >= 9 && answer[3] == 0x04 && answer[5..9] == [0, 0, 0, 0]
}

/// A GET of `/metrics` by hyper's own client over HTTP/2 only (ALPN `h2`): the version and status.
async fn h2_get(
    certs: &CertDir,
    port: u16,
    token: &str,
) -> Result<(http::Version, StatusCode), String> {
    let config = Arc::try_unwrap(certs.client(&[])).unwrap();
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(config)
        .https_only()
        .with_server_name_resolver(hyper_rustls::FixedServerNameResolver::new(
            ServerName::try_from("localhost").unwrap(),
        ))
        .enable_http2()
        .build();
    let client = hyper_util::client::legacy::Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build::<_, http_body_util::Empty<axum::body::Bytes>>(connector);
    let request = Request::get(format!("https://127.0.0.1:{port}/metrics"))
        .header("authorization", format!("Bearer {token}"))
        .body(http_body_util::Empty::new())
        .unwrap();
    let response = tokio::time::timeout(Duration::from_secs(5), client.request(request))
        .await
        .map_err(|_| "no answer in 5 s".to_owned())?
        .map_err(|e| format!("{e:?}"))?;
    Ok((response.version(), response.status()))
}

#[tokio::test]
async fn http2_is_refused_by_default() {
    let certs = CertDir::new("no-h2");
    let (client, _api) = api();
    let port = certs
        .serve(secured(client), false, server::Limits::default())
        .await;

    let tls = tls_connect(port, certs.client(&[b"h2", b"http/1.1"]))
        .await
        .unwrap();
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"http/1.1"[..]));
    // A client that speaks nothing but HTTP/2 is refused in the handshake, or gets no h2.
    if let Ok(tls) = tls_connect(port, certs.client(&[b"h2"])).await {
        assert_ne!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    }
    // Prior knowledge (the preface without ALPN) is answered as HTTP/1.1: a 400, no HTTP/2 frame.
    let mut tls = tls_connect(port, certs.client(&[])).await.unwrap();
    tls.write_all(H2_PREFACE).await.unwrap();
    let (answer, _, _) = until_closed(&mut tls).await;
    assert!(
        !is_http2(&answer),
        "answered over HTTP/2: {:?}",
        &answer[..answer.len().min(32)]
    );
    assert!(
        answer.is_empty() || answer.starts_with(b"HTTP/1.1 4"),
        "{}",
        String::from_utf8_lossy(&answer)
    );
    let refused = h2_get(&certs, port, READER).await;
    assert!(refused.is_err(), "{refused:?}");
    let (code, text) = https_get(port, &certs.cert, Some(READER)).await;
    assert_eq!(code, 200, "HTTP/1.1 serves: {text}");
}

#[tokio::test]
async fn http2_is_served_with_the_flag() {
    let certs = CertDir::new("h2");
    let (client, _api) = api();
    let port = certs
        .serve(secured(client), true, server::Limits::default())
        .await;
    let tls = tls_connect(port, certs.client(&[b"h2", b"http/1.1"]))
        .await
        .unwrap();
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    assert_eq!(
        h2_get(&certs, port, READER).await,
        Ok((http::Version::HTTP_2, StatusCode::OK))
    );
    let (code, text) = https_get(port, &certs.cert, Some(READER)).await;
    assert_eq!(code, 200, "HTTP/1.1 still serves: {text}");
}

/// Limits of a second, for tests that wait them out.
fn short_limits() -> server::Limits {
    server::Limits {
        header_read_timeout: Duration::from_secs(1),
        idle_timeout: Duration::from_secs(1),
        ..server::Limits::default()
    }
}

#[tokio::test]
async fn a_client_that_sends_its_headers_slowly_is_dropped_after_the_header_timeout() {
    assert!(server::Limits::default().header_read_timeout <= Duration::from_secs(10));
    let certs = CertDir::new("slow-headers");
    let router = metrics(Arc::new(Metrics::default()), Gate::new(None));
    let port = certs.serve(router, false, short_limits()).await;

    let tls = tls_connect(port, certs.client(&[])).await.unwrap();
    let (mut reader, mut writer) = tokio::io::split(tls);
    let trickle = tokio::spawn(async move {
        writer
            .write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n")
            .await?;
        // A header every 200 ms, never the end of them, for up to 6 s.
        for i in 0..30 {
            tokio::time::sleep(Duration::from_millis(200)).await;
            writer
                .write_all(format!("X-Slow-{i}: a\r\n").as_bytes())
                .await?;
        }
        std::io::Result::Ok(())
    });
    let (answer, took, closed) = until_closed(&mut reader).await;
    trickle.abort();
    assert!(closed, "still open after {took:?}");
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(3),
        "dropped after {took:?} (header timeout 1 s)"
    );
    let answer = String::from_utf8_lossy(&answer);
    assert!(
        answer.is_empty() || answer.starts_with("HTTP/1.1 408"),
        "{answer}"
    );

    // Connected, and silent: dropped too.
    let mut silent = tls_connect(port, certs.client(&[])).await.unwrap();
    let (_, took, closed) = until_closed(&mut silent).await;
    assert!(closed && took < Duration::from_secs(3), "{took:?}");
}

#[tokio::test]
async fn idle_keep_alive_connections_are_closed() {
    let certs = CertDir::new("idle");
    let router = metrics(Arc::new(Metrics::default()), Gate::new(None));
    let port = certs.serve(router, true, short_limits()).await;

    // HTTP/1.1: a request answered, then nothing more.
    let tls = tls_connect(port, certs.client(&[b"http/1.1"]))
        .await
        .unwrap();
    let mut tls = tokio::io::BufReader::new(tls);
    tls.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .await
        .unwrap();
    let (status, _) = read_response(&mut tls).await.unwrap();
    assert_eq!(status, 200);
    let (_, took, closed) = until_closed(&mut tls).await;
    assert!(
        closed && took < Duration::from_secs(3),
        "HTTP/1.1: {took:?}"
    );

    // HTTP/2: the preface, then nothing more.
    let mut tls = tls_connect(port, certs.client(&[b"h2"])).await.unwrap();
    tls.write_all(H2_PREFACE).await.unwrap();
    let (answer, took, closed) = until_closed(&mut tls).await;
    assert!(is_http2(&answer), "{answer:?}");
    assert!(
        closed && took >= Duration::from_millis(900) && took < Duration::from_secs(4),
        "HTTP/2: {took:?} (idle timeout 1 s)"
    );
}

#[tokio::test]
async fn a_connection_beyond_the_cap_evicts_the_oldest_idle_one() {
    let certs = CertDir::new("cap");
    let router = metrics(Arc::new(Metrics::default()), Gate::new(None));
    let limits = server::Limits {
        max_connections: 2,
        ..server::Limits::default()
    };
    let port = certs.serve(router, false, limits).await;
    let mut first = tls_connect(port, certs.client(&[])).await.unwrap();
    let _second = tls_connect_from([127, 0, 0, 2], port, certs.client(&[]))
        .await
        .unwrap();
    let third = tls_connect_from([127, 0, 0, 3], port, certs.client(&[]))
        .await
        .unwrap();
    let (_, _, closed) = until_closed(&mut first).await;
    assert!(closed, "the oldest idle connection made room");
    let mut third = tokio::io::BufReader::new(third);
    third
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .await
        .unwrap();
    let (status, _) = read_response(&mut third).await.unwrap();
    assert_eq!(status, 200, "the newcomer is served");
}

/// The status of an HTTP/1.1 response read from `reader` (its body skipped), and whether the server
/// closes the connection after it.
async fn read_response(reader: &mut (impl AsyncBufRead + Unpin)) -> std::io::Result<(u16, bool)> {
    let mut line = String::new();
    reader.read_line(&mut line).await?;
    let status = line
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("no status line: {line:?}")))?;
    let (mut length, mut close) = (0, false);
    loop {
        line.clear();
        if reader.read_line(&mut line).await? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        let header = line.trim_end().to_ascii_lowercase();
        if header.is_empty() {
            break;
        }
        if let Some(value) = header.strip_prefix("content-length:") {
            length = value.trim().parse().unwrap_or(0);
        }
        close |= header == "connection: close";
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body).await?;
    Ok((status, close))
}

/// What a flood's clients were answered, by status.
type Answers = std::collections::BTreeMap<u16, usize>;

/// One flooding client until `until`: on a keep-alive connection of its own (a new one when the server
/// closes it), a GET of `/metrics` with a new random token as soon as the previous one is answered.
async fn flood_client(port: u16, config: Arc<ClientConfig>, until: Instant) -> Answers {
    let mut answers = Answers::new();
    while Instant::now() < until {
        // From another address than Prometheus', as a flooding pod's would be.
        let Ok(tls) = tls_connect_from([127, 0, 0, 2], port, config.clone()).await else {
            *answers.entry(0).or_default() += 1;
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let mut tls = tokio::io::BufReader::new(tls);
        while Instant::now() < until {
            let token = format!("{:032x}", rand::random::<u128>());
            let request = format!(
                "GET /metrics HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {token}\r\n\r\n"
            );
            if tls.write_all(request.as_bytes()).await.is_err() {
                break;
            }
            match read_response(&mut tls).await {
                Ok((status, close)) => {
                    *answers.entry(status).or_default() += 1;
                    if close {
                        break;
                    }
                }
                Err(_) => break,
            }
        }
    }
    answers
}

/// The allowed scraper during a flood: a GET every 200 ms on a new connection until `until`; each
/// scrape's status (0 for none within 5 s) and time.
async fn allowed_scrapes(
    port: u16,
    config: Arc<ClientConfig>,
    until: Instant,
) -> Vec<(u16, Duration)> {
    let mut scrapes = Vec::new();
    while Instant::now() < until {
        let started = Instant::now();
        let scrape = async {
            let tls = tls_connect(port, config.clone()).await.ok()?;
            let mut tls = tokio::io::BufReader::new(tls);
            let request = format!(
                "GET /metrics HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {READER}\r\nConnection: close\r\n\r\n"
            );
            tls.write_all(request.as_bytes()).await.ok()?;
            read_response(&mut tls).await.ok().map(|(status, _)| status)
        };
        let status = tokio::time::timeout(Duration::from_secs(5), scrape)
            .await
            .ok()
            .flatten()
            .unwrap_or(0);
        scrapes.push((status, started.elapsed()));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    scrapes
}

/// The floods measure times: one at a time.
static FLOODS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
/// Clients sending random tokens.
const FLOODERS: usize = 200;

/// [`FLOODERS`] clients send random tokens for `duration`, with TokenReviews answered after
/// `review_delay`, while Prometheus (its token allowed a moment before) scrapes every 200 ms: every one
/// of its scrapes is answered 200 within a second.
async fn flood(name: &str, review_delay: Duration, duration: Duration) {
    let _alone = FLOODS.lock().await;
    let certs = CertDir::new(name);
    let (client, api) = api();
    let port = certs
        .serve(secured(client), false, server::Limits::default())
        .await;
    let (code, text) = https_get(port, &certs.cert, Some(READER)).await;
    assert_eq!(code, 200, "{text}");
    api.delay(review_delay);

    let until = Instant::now() + duration;
    let config = certs.client(&[b"http/1.1"]);
    let flooders: Vec<_> = (0..FLOODERS)
        .map(|_| tokio::spawn(flood_client(port, config.clone(), until)))
        .collect();
    let scrapes = allowed_scrapes(port, config, until).await;
    let mut answers = Answers::new();
    for flooder in flooders {
        for (status, n) in flooder.await.unwrap() {
            *answers.entry(status).or_default() += n;
        }
    }
    let mut times: Vec<Duration> = scrapes.iter().map(|(_, t)| *t).collect();
    times.sort();
    let flooded: usize = answers.values().sum();
    eprintln!(
        "{name}: {FLOODERS} clients, reviews after {review_delay:?}, {duration:?}: {flooded} answers \
         {answers:?} ({} TokenReviews); {} allowed scrapes, median {:?}, slowest {:?}",
        api.bodies("tokenreviews").len(),
        times.len(),
        times[times.len() / 2],
        times[times.len() - 1],
    );
    assert!(flooded >= FLOODERS, "the flood ran: {answers:?}");
    let failed: Vec<_> = scrapes
        .iter()
        .filter(|(status, _)| *status != 200)
        .collect();
    assert!(
        failed.is_empty(),
        "allowed scrapes not answered 200: {failed:?} of {}",
        scrapes.len()
    );
    let slow: Vec<_> = scrapes
        .iter()
        .filter(|(_, t)| *t > Duration::from_secs(1))
        .collect();
    assert!(
        slow.is_empty(),
        "allowed scrapes that took over 1 s: {slow:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_random_tokens_does_not_hold_up_prometheus_while_token_reviews_are_slow() {
    flood(
        "flood-slow",
        Duration::from_secs(2),
        Duration::from_secs(10),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_random_tokens_does_not_hold_up_prometheus() {
    flood("flood", Duration::ZERO, Duration::from_secs(5)).await;
}
