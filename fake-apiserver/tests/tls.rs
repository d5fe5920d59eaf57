//! The TLS server of the fake (`fake_apiserver::tls`), spoken to as clients would: HTTP/2 to a client that
//! negotiates `h2`, HTTP/1.1 to one that negotiates `http/1.1` or offers no ALPN at all, each connection
//! counted under the protocol it spoke; a certificate that the kubeconfig's CA data vouches for, for
//! `127.0.0.1` and `localhost`; and every open connection dropped, or frozen (open but silent), on demand
//! while new ones are still served.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::Request;
use axum::http::Version;
use base64::Engine as _;
use fake_apiserver::tls::{Certificates, Connections, TlsServer};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;
use tokio_rustls::rustls::crypto::ring;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName};
use tokio_rustls::rustls::{ClientConfig, RootCertStore};

/// A server whose every answer is the HTTP version the request came in with, and its address.
async fn server() -> (Certificates, TlsServer, SocketAddr) {
    let certificates = Certificates::generate().unwrap();
    let router = Router::new()
        .fallback(|request: Request| async move { format!("{:?}", request.version()) });
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = TlsServer::serve(listener, &certificates, router);
    (certificates, server, addr)
}

/// A TLS connection to the server at `addr` as `name`, trusting only the CA of the kubeconfig's
/// `certificate-authority-data`, offering `alpn`.
async fn connect(
    addr: SocketAddr,
    certificates: &Certificates,
    name: &str,
    alpn: &[&[u8]],
) -> TlsStream<TcpStream> {
    let pem = base64::engine::general_purpose::STANDARD
        .decode(certificates.certificate_authority_data())
        .unwrap();
    let mut roots = RootCertStore::empty();
    for certificate in CertificateDer::pem_slice_iter(&pem) {
        roots.add(certificate.unwrap()).unwrap();
    }
    let mut config = ClientConfig::builder_with_provider(Arc::new(ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|protocol| protocol.to_vec()).collect();
    let tcp = TcpStream::connect(addr).await.unwrap();
    TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from(name.to_owned()).unwrap(), tcp)
        .await
        .unwrap()
}

/// An HTTP/2 client on a new TLS connection to the server at `addr` (as `127.0.0.1`, negotiating `h2`),
/// and the task that drives the connection.
async fn http2_client(
    addr: SocketAddr,
    certificates: &Certificates,
) -> (
    hyper::client::conn::http2::SendRequest<Body>,
    tokio::task::JoinHandle<hyper::Result<()>>,
) {
    let tls = connect(addr, certificates, "127.0.0.1", &[b"h2"]).await;
    let (sender, connection) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
            .await
            .unwrap();
    (sender, tokio::spawn(connection))
}

/// What the server answers to a GET on `sender`'s connection: the HTTP version it was served over.
async fn served_over(sender: &mut hyper::client::conn::http2::SendRequest<Body>) -> String {
    let response = sender
        .send_request(get("https://127.0.0.1/"))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    text(response).await
}

/// The body of `response`, as text.
async fn text(response: hyper::Response<hyper::body::Incoming>) -> String {
    let bytes = axum::body::to_bytes(Body::new(response.into_body()), 1024)
        .await
        .unwrap();
    String::from_utf8(bytes.to_vec()).unwrap()
}

fn get(path: &str) -> hyper::Request<Body> {
    hyper::Request::get(path)
        .header("host", "localhost")
        .body(Body::empty())
        .unwrap()
}

#[tokio::test]
async fn a_client_that_negotiates_h2_speaks_http2_on_one_connection() {
    let (certificates, server, addr) = server().await;
    let tls = connect(addr, &certificates, "127.0.0.1", &[b"h2", b"http/1.1"]).await;
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let (mut sender, connection) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
            .await
            .unwrap();
    tokio::spawn(connection);
    // Several requests in flight at once, on the one connection.
    let requests = (0..3).map(|i| sender.send_request(get(&format!("https://127.0.0.1/{i}"))));
    for response in futures::future::join_all(requests).await {
        let response = response.unwrap();
        assert_eq!(response.version(), Version::HTTP_2);
        assert_eq!(text(response).await, "HTTP/2.0");
    }
    assert_eq!(server.connections(), Connections { http2: 1, http1: 0 });
    assert_eq!(server.connections().to_string(), "1 HTTP/2, 0 HTTP/1.1");
}

#[tokio::test]
async fn a_client_that_negotiates_http1_or_nothing_speaks_http1_and_localhost_is_vouched_for() {
    let (certificates, server, addr) = server().await;
    for alpn in [&[&b"http/1.1"[..]][..], &[]] {
        let tls = connect(addr, &certificates, "localhost", alpn).await;
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .unwrap();
        tokio::spawn(connection);
        let response = sender.send_request(get("/")).await.unwrap();
        assert_eq!(response.version(), Version::HTTP_11);
        assert_eq!(text(response).await, "HTTP/1.1");
    }
    assert_eq!(server.connections(), Connections { http2: 0, http1: 2 });
}

#[tokio::test]
async fn dropping_the_connections_ends_every_open_one_and_new_ones_are_still_served() {
    let (certificates, server, addr) = server().await;
    let (mut sender, connection) = http2_client(addr, &certificates).await;
    assert_eq!(served_over(&mut sender).await, "HTTP/2.0");

    server.drop_connections();
    // The client's side of the connection ends (how it reports an abrupt end is the client's business).
    let _ = tokio::time::timeout(Duration::from_secs(5), connection)
        .await
        .expect("the client sees its connection end")
        .unwrap();
    assert!(
        sender
            .send_request(get("https://127.0.0.1/"))
            .await
            .is_err()
    );

    let (mut sender, _connection) = http2_client(addr, &certificates).await;
    assert_eq!(served_over(&mut sender).await, "HTTP/2.0");
    assert_eq!(server.connections().http2, 2);
}

#[tokio::test]
async fn a_frozen_connection_stays_open_but_answers_nothing_while_new_ones_are_served() {
    let (certificates, server, addr) = server().await;
    let (mut sender, connection) = http2_client(addr, &certificates).await;
    assert_eq!(served_over(&mut sender).await, "HTTP/2.0");

    server.freeze_connections();
    // The request goes out on the open connection, and no answer comes back.
    let unanswered = tokio::time::timeout(
        Duration::from_secs(1),
        sender.send_request(get("https://127.0.0.1/")),
    )
    .await;
    assert!(unanswered.is_err(), "answered: {unanswered:?}");
    // Nor does the connection end: no reset, no GOAWAY, no TLS close.
    assert!(!connection.is_finished(), "the frozen connection ended");

    // A new connection is served as before.
    let (mut fresh, _fresh_connection) = http2_client(addr, &certificates).await;
    assert_eq!(served_over(&mut fresh).await, "HTTP/2.0");
    assert_eq!(server.connections(), Connections { http2: 2, http1: 0 });
    assert!(!connection.is_finished(), "the frozen connection ended");

    // Dropping the connections ends the frozen one too.
    server.drop_connections();
    let _ = tokio::time::timeout(Duration::from_secs(5), connection)
        .await
        .expect("the client sees the frozen connection end")
        .unwrap();
}
