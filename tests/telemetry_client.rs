//! The telemetry client (`read_stats`) against fake memcached servers on 127.0.0.1 that misbehave on purpose,
//! against TLS servers with certificates generated here (no key is ever committed), and against the real
//! `memcached` when it is installed (`real_*` tests; CI must install it: they fail when `CI` is set and it
//! is missing, and are skipped with a message otherwise).

mod common;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use memcached_operator::telemetry::client::{
    CertificateDigest, Credentials, ExpectedCertificate, LinkError, ReadError, RefreshAnswer,
    ServerNames, Target, TlsClient, TlsMaterial, read, read_stats,
};
use memcached_operator::telemetry::stats::{ParseError, Stats, parse};
use rcgen::ExtendedKeyUsagePurpose;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::server::WebPkiClientVerifier;
use tokio_rustls::rustls::{RootCertStore, ServerConfig, crypto::ring};

use common::memcached::{Mode, RealServer, converse, exercise, real_binary, real_tls_binary};
use common::pki::{Leaf, Pki};

/// A real reply of Debian's memcached 1.6.18, CRLFs included.
const FIXTURE: &[u8] = include_bytes!("fixtures/memcached-stats.txt");
/// For exchanges that must succeed or fail fast: generous, so a loaded CI machine does not flake.
const GENEROUS: Duration = Duration::from_secs(10);

fn fixture_stats() -> Stats {
    parse(FIXTURE).expect("the fixture parses")
}

fn plain(address: SocketAddr) -> Target {
    Target {
        address,
        tls: None,
        names: ServerNames::default(),
        credentials: None,
        certificate: None,
        still_the_pod: None,
    }
}

/// Accepts one connection on a fresh 127.0.0.1 port and hands it to `handler`.
async fn fake<F, Fut>(handler: F) -> SocketAddr
where
    F: FnOnce(TcpStream) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind a test port");
    let address = listener.local_addr().expect("local address");
    tokio::spawn(async move {
        if let Ok((stream, _)) = listener.accept().await {
            handler(stream).await;
        }
    });
    address
}

/// Fails the test if more than 2 s went by since `started`: a failure that should come at once, or at its
/// short timeout, did not.
fn assert_quick(started: Instant) {
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "took {:?}",
        started.elapsed()
    );
}

/// How reading `target` within `timeout` fails; a success fails the test, with `expected` (what the failure
/// should have been) as the message.
async fn read_error(target: &Target, timeout: Duration, expected: &str) -> ReadError {
    read_stats(target, timeout).await.expect_err(expected)
}

/// Reads the client's `stats\r\n` (and fails the server task if anything else came).
async fn after_stats_command(stream: &mut TcpStream) {
    let mut command = [0; 7];
    let _ = stream.read_exact(&mut command).await;
    assert_eq!(&command, b"stats\r\n");
}

#[tokio::test]
async fn a_normal_reply_is_read_and_parsed() {
    let address = fake(|stream| converse(stream, Mode::Answer, None, FIXTURE)).await;
    assert_eq!(
        read_stats(&plain(address), GENEROUS).await.expect("stats"),
        fixture_stats()
    );
}

#[tokio::test]
async fn a_server_that_never_answers_costs_the_timeout_and_no_more() {
    let address = fake(|mut stream| async move {
        let mut sink = Vec::new();
        let _ = stream.read_to_end(&mut sink).await;
    })
    .await;
    let started = Instant::now();
    let error = read_error(&plain(address), Duration::from_millis(200), "no answer").await;
    assert!(
        matches!(error, ReadError::Timeout(t) if t == Duration::from_millis(200)),
        "{error:?}"
    );
    assert_eq!(error.reason(), "timeout");
    assert_quick(started);
}

#[tokio::test]
async fn a_server_that_trickles_is_bounded_by_one_timeout_for_the_whole_exchange() {
    let address = fake(|mut stream| async move {
        after_stats_command(&mut stream).await;
        for byte in FIXTURE {
            if stream.write_all(&[*byte]).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    let started = Instant::now();
    let error = read_error(&plain(address), Duration::from_millis(300), "too slow").await;
    assert_eq!(error.reason(), "timeout", "{error:?}");
    assert_quick(started);
}

#[tokio::test]
async fn a_dead_address_is_a_connect_error_at_once() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let address = listener.local_addr().expect("address");
    drop(listener);
    let started = Instant::now();
    let error = read_error(&plain(address), GENEROUS, "nobody listens").await;
    assert!(
        matches!(error, ReadError::Link(LinkError::Connect(_))),
        "{error:?}"
    );
    assert_eq!(error.reason(), "connect");
    assert_quick(started);
}

#[tokio::test]
async fn a_server_that_closes_mid_reply_is_closed_not_half_parsed() {
    let between_lines = FIXTURE
        .windows(2)
        .position(|w| w == b"\r\n")
        .expect("a line")
        + 2;
    let inside_a_line = FIXTURE.len() / 2;
    let before_end = FIXTURE.len() - b"END\r\n".len();
    for cut in [between_lines, inside_a_line, before_end, FIXTURE.len() - 1] {
        let address = fake(move |mut stream| async move {
            after_stats_command(&mut stream).await;
            let _ = stream.write_all(&FIXTURE[..cut]).await;
        })
        .await;
        let error = read_error(&plain(address), GENEROUS, "half a reply").await;
        assert!(
            matches!(error, ReadError::Link(LinkError::Closed)),
            "cut at {cut}: {error:?}"
        );
        assert_eq!(error.reason(), "closed");
    }
}

#[tokio::test]
async fn a_server_that_closes_before_answering_is_closed() {
    let address = fake(|mut stream| async move { after_stats_command(&mut stream).await }).await;
    let error = read_error(&plain(address), GENEROUS, "no reply").await;
    assert!(
        matches!(error, ReadError::Link(LinkError::Closed)),
        "{error:?}"
    );
}

#[tokio::test]
async fn an_endless_reply_is_a_protocol_error_at_the_bound() {
    // Lines that look right, forever: the client stops at 64 KiB instead of buffering without end.
    let address = fake(|mut stream| async move {
        after_stats_command(&mut stream).await;
        let line = b"STAT padding 1\r\n".repeat(1024);
        for _ in 0..100 {
            if stream.write_all(&line).await.is_err() {
                return;
            }
        }
    })
    .await;
    let error = read_error(&plain(address), GENEROUS, "too long").await;
    assert!(
        matches!(error, ReadError::Protocol(ParseError::TooLong { .. })),
        "{error:?}"
    );
    assert_eq!(error.reason(), "protocol");
}

#[tokio::test]
async fn one_endless_line_is_a_protocol_error_at_the_bound() {
    let address = fake(|mut stream| async move {
        after_stats_command(&mut stream).await;
        let _ = stream.write_all(b"STAT x ").await;
        let _ = stream.write_all(&vec![b'9'; 200 * 1024]).await;
        let mut sink = Vec::new();
        let _ = stream.read_to_end(&mut sink).await;
    })
    .await;
    let error = read_error(&plain(address), GENEROUS, "too long").await;
    assert!(
        matches!(error, ReadError::Protocol(ParseError::TooLong { .. })),
        "{error:?}"
    );
}

#[tokio::test]
async fn garbage_and_error_lines_are_protocol_errors_without_waiting_for_more() {
    for (reply, expected) in [
        (&b"HTTP/1.1 400 Bad Request\r\n"[..], "malformed"),
        (b"ERROR\r\n", "server"),
        (b"SERVER_ERROR out of memory\r\n", "server"),
        (b"STAT uptime -1\r\nEND\r\n", "number"),
    ] {
        // The server keeps the connection open: only recognising the bad line ends the exchange in time.
        let address = fake(move |stream| converse(stream, Mode::Answer, None, reply)).await;
        let error = read_error(&plain(address), GENEROUS, "not stats").await;
        let kind = match &error {
            ReadError::Protocol(ParseError::MalformedLine { .. }) => "malformed",
            ReadError::Protocol(ParseError::ServerError(_)) => "server",
            ReadError::Protocol(ParseError::BadNumber { .. }) => "number",
            _ => "other",
        };
        assert_eq!(kind, expected, "{reply:?}: {error:?}");
    }
}

fn with_credentials(address: SocketAddr, user: &str, password: &str) -> Target {
    let credentials = Credentials::new(user, password).expect("valid credentials");
    Target {
        address,
        tls: None,
        names: ServerNames::default(),
        credentials: Some(Arc::new(credentials)),
        certificate: None,
        still_the_pod: None,
    }
}

#[tokio::test]
async fn accepted_credentials_are_sent_first_then_stats_are_read() {
    let address =
        fake(|stream| converse(stream, Mode::Answer, Some("alice pa:ss word"), FIXTURE)).await;
    let target = with_credentials(address, "alice", "pa:ss word");
    assert_eq!(
        read_stats(&target, GENEROUS).await.expect("stats"),
        fixture_stats()
    );
}

/// Credentials in the clear go only to the pod the address was read for: when the pod cache no longer
/// shows it there (gone, terminating, another IP), the connection is closed with nothing sent.
#[tokio::test]
async fn credentials_in_the_clear_go_to_nobody_but_the_expected_pod() {
    let (heard_tx, heard_rx) = tokio::sync::oneshot::channel();
    let address = fake(|mut stream| async move {
        let mut heard = Vec::new();
        let _ = stream.read_to_end(&mut heard).await;
        let _ = heard_tx.send(heard);
    })
    .await;
    let target = Target {
        still_the_pod: Some(Arc::new(|| false)),
        ..with_credentials(address, "alice", "secret")
    };
    let error = read_error(&target, GENEROUS, "not the pod").await;
    assert!(
        matches!(error, ReadError::Link(LinkError::NotThePod)),
        "{error:?}"
    );
    let heard = heard_rx.await.expect("the server saw the connection");
    assert!(
        heard.is_empty(),
        "sent: {:?}",
        String::from_utf8_lossy(&heard)
    );

    // The pod it was read for: the credentials go, then the stats are read.
    let address =
        fake(|stream| converse(stream, Mode::Answer, Some("alice secret"), FIXTURE)).await;
    let target = Target {
        still_the_pod: Some(Arc::new(|| true)),
        ..with_credentials(address, "alice", "secret")
    };
    assert_eq!(
        read_stats(&target, GENEROUS).await.expect("stats"),
        fixture_stats()
    );
}

#[tokio::test]
async fn refused_credentials_are_an_auth_error() {
    let address = fake(|stream| converse(stream, Mode::Answer, Some("alice right"), FIXTURE)).await;
    let error = read_error(
        &with_credentials(address, "alice", "wrong"),
        GENEROUS,
        "refused",
    )
    .await;
    assert!(
        matches!(&error, ReadError::Link(LinkError::Auth(answer)) if answer.contains("authentication failure")),
        "{error:?}"
    );
    assert_eq!(error.reason(), "auth");
    assert!(!error.to_string().contains("wrong"), "{error}");
}

#[tokio::test]
async fn a_connection_closed_after_the_credentials_is_an_auth_error() {
    let address = fake(|mut stream| async move {
        let mut buffer = [0; 256];
        let _ = stream.read(&mut buffer).await;
    })
    .await;
    let error = read_error(
        &with_credentials(address, "alice", "secret"),
        GENEROUS,
        "closed",
    )
    .await;
    assert!(
        matches!(error, ReadError::Link(LinkError::Auth(_))),
        "{error:?}"
    );
}

fn server_config(leaf: &Leaf, client_ca: Option<&Pki>) -> Arc<ServerConfig> {
    let provider = Arc::new(ring::default_provider());
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .expect("protocol versions");
    let builder = match client_ca {
        Some(pki) => {
            let mut roots = RootCertStore::empty();
            roots.add(pki.ca.der().clone()).expect("client CA");
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .expect("client verifier");
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let chain = CertificateDer::pem_slice_iter(leaf.chain.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .expect("chain");
    let key = PrivateKeyDer::from_pem_slice(leaf.key.as_bytes()).expect("key");
    Arc::new(builder.with_single_cert(chain, key).expect("server config"))
}

/// A fake memcached that serves TLS with `config` (and auth when `auth` is set).
async fn tls_fake(config: Arc<ServerConfig>, auth: Option<&'static str>) -> SocketAddr {
    fake(move |stream| async move {
        if let Ok(tls) = TlsAcceptor::from(config).accept(stream).await {
            converse(tls, Mode::Answer, auth, FIXTURE).await;
        }
    })
    .await
}

/// A TLS target for pod `memcached-0` of instance `memcached` in namespace `cache`: [`Pki::server`]'s
/// certificate names its Service.
fn tls_target(address: SocketAddr, material: &TlsMaterial) -> Target {
    Target {
        address,
        tls: Some(TlsClient::new(material).expect("TLS client")),
        names: ServerNames::for_pod("memcached", "cache", "memcached-0", "cluster.local"),
        credentials: None,
        certificate: None,
        still_the_pod: None,
    }
}

/// What reached a TLS server: `None` when no TLS session was established, else every byte the client sent
/// over it until it closed.
async fn record_one_session(listener: TcpListener, config: Arc<ServerConfig>) -> Option<Vec<u8>> {
    let (stream, _) = listener.accept().await.expect("a connection");
    let mut tls = TlsAcceptor::from(config).accept(stream).await.ok()?;
    let mut received = Vec::new();
    let _ = tls.read_to_end(&mut received).await;
    Some(received)
}

#[tokio::test]
async fn tls_verified_against_the_instance_ca_and_a_service_name() {
    let pki = Pki::new("instance CA");
    let address = tls_fake(server_config(&pki.server(), None), None).await;
    let material = pki.trusted();
    assert_eq!(
        read_stats(&tls_target(address, &material), GENEROUS)
            .await
            .expect("stats"),
        fixture_stats()
    );
}

#[tokio::test]
async fn tls_with_a_certificate_of_the_instance_ca_for_another_name_fails_before_any_credentials() {
    let pki = Pki::new("instance CA");
    let evil = pki.issue(
        &["evil.example.com"],
        ExtendedKeyUsagePurpose::ServerAuth,
        false,
    );
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let address = listener.local_addr().expect("address");
    let server = tokio::spawn(record_one_session(listener, server_config(&evil, None)));
    let mut target = tls_target(address, &pki.trusted());
    target.credentials = Some(Arc::new(
        Credentials::new("alice", "secret").expect("valid"),
    ));
    let error = read_error(&target, GENEROUS, "a certificate for another name").await;
    assert_eq!(error.reason(), "tls", "{error:?}");
    assert!(
        error
            .to_string()
            .contains("valid neither for the pod IP 127.0.0.1"),
        "{error}"
    );
    assert_eq!(
        server.await.expect("server task"),
        None,
        "the client completed a TLS session with the impostor"
    );
}

#[tokio::test]
async fn tls_with_a_certificate_for_the_pod_ip_is_accepted() {
    let pki = Pki::new("instance CA");
    let by_ip = pki.issue(&["127.0.0.1"], ExtendedKeyUsagePurpose::ServerAuth, false);
    let address = tls_fake(server_config(&by_ip, None), None).await;
    let mut target = tls_target(address, &pki.trusted());
    target.names = ServerNames::default();
    assert_eq!(
        read_stats(&target, GENEROUS).await.expect("stats"),
        fixture_stats()
    );
}

#[tokio::test]
async fn tls_without_a_ca_never_sends_credentials() {
    let stranger = Pki::new("unknown CA");
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let address = listener.local_addr().expect("address");
    let mut target = tls_target(address, &TlsMaterial::default());
    target.credentials = Some(Arc::new(
        Credentials::new("alice", "secret").expect("valid"),
    ));
    let error = read_error(&target, GENEROUS, "unverified").await;
    assert!(
        matches!(error, ReadError::Link(LinkError::Unverified)),
        "{error:?}"
    );
    assert_eq!(error.reason(), "tls");
    assert!(error.to_string().contains("ca.crt"), "{error}");
    // A connection the client opened would be waiting in the listener's backlog by now: there is none.
    let waiting = tokio::time::timeout(Duration::from_millis(200), listener.accept()).await;
    assert!(
        waiting.is_err(),
        "the client connected to an unverified server"
    );
    // The same server is read without credentials (encrypted, unverified).
    let served = tokio::spawn(async move {
        let (stream, _) = listener.accept().await.expect("a connection");
        let config = server_config(&stranger.server(), None);
        if let Ok(tls) = TlsAcceptor::from(config).accept(stream).await {
            converse(tls, Mode::Answer, None, FIXTURE).await;
        }
    });
    target.credentials = None;
    assert_eq!(
        read_stats(&target, GENEROUS).await.expect("stats"),
        fixture_stats()
    );
    served.await.expect("server task");
}

#[tokio::test]
async fn tls_with_a_server_certificate_from_another_ca_fails() {
    let (pki, other) = (Pki::new("instance CA"), Pki::new("other CA"));
    let address = tls_fake(server_config(&other.server(), None), None).await;
    let material = pki.trusted();
    let error = read_error(&tls_target(address, &material), GENEROUS, "untrusted").await;
    assert!(
        matches!(error, ReadError::Link(LinkError::Tls(_))),
        "{error:?}"
    );
    assert_eq!(error.reason(), "tls");
}

#[tokio::test]
async fn tls_checks_expiry_and_usage_too() {
    let pki = Pki::new("instance CA");
    let expired = pki.issue(
        &["memcached.cache.svc"],
        ExtendedKeyUsagePurpose::ServerAuth,
        true,
    );
    let client_only = pki.issue(
        &["memcached.cache.svc"],
        ExtendedKeyUsagePurpose::ClientAuth,
        false,
    );
    for leaf in [expired, client_only] {
        let address = tls_fake(server_config(&leaf, None), None).await;
        let material = pki.trusted();
        let error = read_error(&tls_target(address, &material), GENEROUS, "invalid").await;
        assert!(
            matches!(error, ReadError::Link(LinkError::Tls(_))),
            "{error:?}"
        );
    }
}

#[tokio::test]
async fn tls_without_a_ca_encrypts_without_verifying() {
    let stranger = Pki::new("unknown CA");
    let address = tls_fake(server_config(&stranger.server(), None), None).await;
    let target = tls_target(address, &TlsMaterial::default());
    assert_eq!(
        read_stats(&target, GENEROUS).await.expect("stats"),
        fixture_stats()
    );
}

#[tokio::test]
async fn tls_to_a_plain_server_is_a_tls_error() {
    let address = fake(|stream| converse(stream, Mode::Answer, None, FIXTURE)).await;
    let error = read_error(
        &tls_target(address, &TlsMaterial::default()),
        GENEROUS,
        "plain",
    )
    .await;
    assert_eq!(error.reason(), "tls", "{error:?}");
}

#[tokio::test]
async fn mutual_tls_presents_the_client_identity_when_required() {
    let (pki, clients) = (Pki::new("instance CA"), Pki::new("client CA"));
    let client = clients.client();
    let with_identity = TlsMaterial {
        ca: Some(pki.ca_pem()),
        client_identity: Some((
            client.chain.clone().into_bytes(),
            client.key.clone().into_bytes(),
        )),
    };
    let address = tls_fake(
        server_config(&pki.server(), Some(&clients)),
        Some("alice secret"),
    )
    .await;
    let mut target = tls_target(address, &with_identity);
    target.credentials = Some(Arc::new(
        Credentials::new("alice", "secret").expect("valid"),
    ));
    assert_eq!(
        read_stats(&target, GENEROUS).await.expect("stats"),
        fixture_stats()
    );
}

#[tokio::test]
async fn mutual_tls_without_an_identity_or_with_a_foreign_one_fails() {
    let (pki, clients, strangers) = (
        Pki::new("instance CA"),
        Pki::new("client CA"),
        Pki::new("stranger CA"),
    );
    let stranger = strangers.client();
    for client_identity in [
        None,
        Some((stranger.chain.into_bytes(), stranger.key.into_bytes())),
    ] {
        let address = tls_fake(server_config(&pki.server(), Some(&clients)), None).await;
        let material = TlsMaterial {
            ca: Some(pki.ca_pem()),
            client_identity,
        };
        let error = read_error(&tls_target(address, &material), GENEROUS, "no identity").await;
        // Under TLS 1.3 the server refuses the client after the client's side of the handshake is done: the
        // refusal is an alert (Tls), unless the server's reset overtakes it (Closed). Either is a failure.
        assert!(
            matches!(
                error,
                ReadError::Link(LinkError::Tls(_) | LinkError::Closed)
            ),
            "{error:?}"
        );
    }
}

// ---- The real memcached, when installed ----------------------------------------------------------------

/// 3 sets, then 3 hits and 1 miss, after authenticating when `auth` is set: see [`assert_exercised`].
async fn exercise_three_keys(address: SocketAddr, auth: Option<&str>) {
    exercise(address, auth, &["a", "b", "c"], 1).await;
}

fn assert_exercised(stats: &Stats) {
    assert_eq!(
        (stats.get_hits, stats.get_misses, stats.curr_items),
        (3, 1, 3),
        "{stats:?}"
    );
    assert_eq!(stats.limit_maxbytes, 8 * 1024 * 1024);
    assert!(
        stats.curr_connections >= 1 && stats.bytes > 0 && stats.bytes_read > 0,
        "{stats:?}"
    );
}

#[tokio::test]
async fn real_memcached_plain_stats() {
    let Some(binary) = real_binary() else {
        return;
    };
    let server = RealServer::start(&binary, "plain", &[], &[]).await;
    exercise_three_keys(server.address, None).await;
    let stats = read_stats(&plain(server.address), GENEROUS)
        .await
        .expect("stats");
    assert_exercised(&stats);
    assert_eq!(stats.evictions, 0);
}

#[tokio::test]
async fn real_memcached_with_an_auth_file() {
    let Some(binary) = real_binary() else {
        return;
    };
    let file: &[u8] = b"alice:pa:ss\n";
    let server = RealServer::start(&binary, "auth", &[("auth", file)], &["-Y", "{dir}/auth"]).await;
    exercise_three_keys(server.address, Some("alice pa:ss")).await;
    let right = Credentials::from_auth_file(file).expect("credentials");
    let target = Target {
        address: server.address,
        tls: None,
        names: ServerNames::default(),
        credentials: Some(Arc::new(right)),
        certificate: None,
        still_the_pod: None,
    };
    assert_exercised(&read_stats(&target, GENEROUS).await.expect("stats"));

    let wrong = with_credentials(server.address, "alice", "nope");
    let error = read_error(&wrong, GENEROUS, "wrong password").await;
    assert_eq!(error.reason(), "auth", "{error:?}");

    let error = read_error(&plain(server.address), GENEROUS, "no credentials").await;
    assert!(
        matches!(error, ReadError::Protocol(ParseError::ServerError(_))),
        "{error:?}"
    );
}

#[tokio::test]
async fn real_memcached_over_tls_and_mutual_tls() {
    let Some(binary) = real_tls_binary() else {
        return;
    };
    let (pki, clients) = (Pki::new("instance CA"), Pki::new("client CA"));
    let (server_leaf, client_ca) = (pki.server(), clients.ca.pem());
    let files: [(&str, &[u8]); 3] = [
        ("server.crt", server_leaf.chain.as_bytes()),
        ("server.key", server_leaf.key.as_bytes()),
        ("client-ca.crt", client_ca.as_bytes()),
    ];
    let tls = "ssl_chain_cert={dir}/server.crt,ssl_key={dir}/server.key";
    let server = RealServer::start(&binary, "tls", &files, &["-Z", "-o", tls]).await;
    let verified = pki.trusted();
    let stats = read_stats(&tls_target(server.address, &verified), GENEROUS)
        .await
        .expect("stats over TLS");
    assert!(
        stats.uptime_seconds < 3600 && stats.limit_maxbytes == 8 * 1024 * 1024,
        "{stats:?}"
    );
    let wrong = clients.trusted();
    let error = read_error(&tls_target(server.address, &wrong), GENEROUS, "wrong CA").await;
    assert_eq!(error.reason(), "tls", "{error:?}");

    // The operator's own client certificate, from a CA other than the server's: accepted by a server that
    // requires one (ssl_verify_mode=2) and by one that requires it and checks it once (3, "once").
    let client = clients.client();
    let identity = TlsMaterial {
        ca: Some(pki.ca_pem()),
        client_identity: Some((client.chain.into_bytes(), client.key.into_bytes())),
    };
    for mode in [2, 3] {
        let mutual_tls = format!("{tls},ssl_verify_mode={mode},ssl_ca_cert={{dir}}/client-ca.crt");
        let name = format!("mtls{mode}");
        let mutual = RealServer::start(&binary, &name, &files, &["-Z", "-o", &mutual_tls]).await;
        read_stats(&tls_target(mutual.address, &identity), GENEROUS)
            .await
            .unwrap_or_else(|e| panic!("stats over mutual TLS, mode {mode}: {e}"));
        let error = read_error(
            &tls_target(mutual.address, &verified),
            GENEROUS,
            "no identity",
        )
        .await;
        assert!(
            matches!(
                error,
                ReadError::Link(LinkError::Tls(_) | LinkError::Closed)
            ),
            "mode {mode}: {error:?}"
        );
    }
}

#[tokio::test]
async fn real_memcached_with_a_certificate_for_another_name_is_refused() {
    let Some(binary) = real_tls_binary() else {
        return;
    };
    let pki = Pki::new("instance CA");
    let evil = pki.issue(
        &["evil.example.com"],
        ExtendedKeyUsagePurpose::ServerAuth,
        false,
    );
    let files: [(&str, &[u8]); 3] = [
        ("server.crt", evil.chain.as_bytes()),
        ("server.key", evil.key.as_bytes()),
        ("auth", b"alice:secret\n"),
    ];
    let options = "ssl_chain_cert={dir}/server.crt,ssl_key={dir}/server.key";
    let server = RealServer::start(
        &binary,
        "evil",
        &files,
        &["-Z", "-o", options, "-Y", "{dir}/auth"],
    )
    .await;
    let mut target = tls_target(server.address, &pki.trusted());
    target.credentials = Some(Arc::new(
        Credentials::new("alice", "secret").expect("valid"),
    ));
    let error = read_error(&target, GENEROUS, "another name").await;
    assert_eq!(error.reason(), "tls", "{error:?}");
}

/// A rotated certificate (and CA) reaches a running memcached through `refresh_certs`: the read that finds
/// the server presenting the previous certificate asks it to reload, after authenticating; the next
/// handshake presents the new one. Reads that may not ask (backoff) or find the expected certificate send
/// nothing. A key that does not match its certificate is refused and the server keeps what it had.
#[tokio::test]
async fn real_memcached_reloads_a_rotated_certificate_on_refresh_certs() {
    let Some(binary) = real_tls_binary() else {
        return;
    };
    let (old_ca, new_ca) = (Pki::new("old CA"), Pki::new("new CA"));
    let (old, new) = (old_ca.server(), new_ca.server());
    let auth_file: &[u8] = b"alice:s3cret\n";
    let files: [(&str, &[u8]); 3] = [
        ("server.crt", old.chain.as_bytes()),
        ("server.key", old.key.as_bytes()),
        ("auth", auth_file),
    ];
    let tls = "ssl_chain_cert={dir}/server.crt,ssl_key={dir}/server.key";
    let server = RealServer::start(
        &binary,
        "reload",
        &files,
        &["-Z", "-o", tls, "-Y", "{dir}/auth"],
    )
    .await;
    let digest =
        |leaf: &Leaf| CertificateDigest::of_pem_leaf(leaf.chain.as_bytes()).expect("a certificate");
    // Both CAs trusted, as the collector trusts the previous one during a rotation.
    let mut both = new_ca.ca_pem();
    both.extend_from_slice(&old_ca.ca_pem());
    let target = |refresh: bool| Target {
        credentials: Some(Arc::new(
            Credentials::from_auth_file(auth_file).expect("credentials"),
        )),
        certificate: Some(ExpectedCertificate {
            digest: digest(&new),
            refresh,
        }),
        ..tls_target(
            server.address,
            &TlsMaterial {
                ca: Some(both.clone()),
                client_identity: None,
            },
        )
    };
    let presented = |reading: &memcached_operator::telemetry::client::Reading| {
        reading.certificate.clone().expect("read over TLS")
    };

    // The files have not changed yet: asked, it reloads the same files and still presents the old one.
    let first = read(&target(true), GENEROUS).await.expect("stats");
    assert_eq!(presented(&first).digest, digest(&old));
    assert_eq!(presented(&first).refresh, Some(RefreshAnswer::Reloaded));
    let again = read(&target(true), GENEROUS).await.expect("stats");
    assert_eq!(presented(&again).digest, digest(&old));

    // The kubelet's update completes: asked once more, it presents the new certificate from then on.
    server.replace_file("server.key", new.key.as_bytes());
    server.replace_file("server.crt", new.chain.as_bytes());
    let not_asked = read(&target(false), GENEROUS).await.expect("stats");
    assert_eq!(presented(&not_asked).refresh, None, "backoff: not asked");
    assert_eq!(
        presented(&not_asked).digest,
        digest(&old),
        "nothing reloaded by itself"
    );
    let asked = read(&target(true), GENEROUS).await.expect("stats");
    assert_eq!(presented(&asked).refresh, Some(RefreshAnswer::Reloaded));
    let reloaded = read(&target(true), GENEROUS).await.expect("stats");
    assert_eq!(presented(&reloaded).digest, digest(&new));
    assert_eq!(
        presented(&reloaded).refresh,
        None,
        "the expected certificate: nothing sent"
    );
    // Only the new CA trusted now: verified.
    let new_only = Target {
        tls: Some(TlsClient::new(&new_ca.trusted()).expect("TLS client")),
        ..target(true)
    };
    read(&new_only, GENEROUS)
        .await
        .expect("verified against the new CA");

    // Why the collector checks tls.key against tls.crt before asking: told to load a key that does not go
    // with its certificate, memcached 1.6.18 answers with OpenSSL's complaint ("Error loading the key:
    // <path> : ...") but keeps the certificate it loaded, with the key it had: every handshake fails.
    server.replace_file("server.crt", old.chain.as_bytes());
    let refused = read(&new_only, GENEROUS).await.expect("stats");
    assert_eq!(presented(&refused).refresh, None, "expected certificate");
    let ask_anyway = Target {
        certificate: Some(ExpectedCertificate {
            digest: digest(&old),
            refresh: true,
        }),
        ..new_only.clone()
    };
    match read(&ask_anyway, GENEROUS)
        .await
        .expect("stats")
        .certificate
    {
        Some(shown) => assert!(
            matches!(&shown.refresh, Some(RefreshAnswer::Refused(answer)) if answer.contains("key")),
            "{shown:?}"
        ),
        None => panic!("read over TLS"),
    }
    let error = read_error(&new_only, GENEROUS, "broken after a bad reload").await;
    assert_eq!(error.reason(), "tls", "{error:?}");
}
