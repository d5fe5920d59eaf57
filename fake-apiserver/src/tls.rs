//! TLS for the fake API server, as a real API server serves: a throwaway certificate authority made at
//! start, a server certificate for `127.0.0.1` and `localhost`, and a server that offers HTTP/2 and
//! HTTP/1.1 by ALPN (`h2`, `http/1.1`). It counts the connections it accepted by the protocol each
//! negotiated, which is what tells whether the operator's requests share one HTTP/2 connection or hold one
//! HTTP/1.1 connection each. It can drop every open connection at once, as an API server that restarts
//! does, or freeze them, as when the node behind them vanishes without a reset (power loss, a load balancer
//! that drops the flow): open connections go silent while new ones are served.
//!
//! The fake API server serves through it when started with [`crate::Options::tls`]: the scale benchmark
//! (unless `--plain-http`) and the smoke tests that check HTTP/2.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use base64::Engine as _;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder;
use hyper_util::service::TowerToHyperService;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::AbortHandle;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::ServerConfig;
use tokio_rustls::rustls::crypto::ring;
use tokio_rustls::rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};

/// The ALPN protocol name of HTTP/2.
const H2: &[u8] = b"h2";

/// What the server offers, in its order of preference: HTTP/2 to the clients that ask for it, HTTP/1.1 to
/// the others.
const ALPN: [&[u8]; 2] = [H2, b"http/1.1"];

/// Streams one HTTP/2 connection may have open at once: the API server's limit since
/// kubernetes/kubernetes#121120 (the HTTP/2 rapid-reset fix), so a client that needs more than that on
/// one connection meets the same limit here.
const MAX_CONCURRENT_STREAMS: u32 = 100;

/// A throwaway certificate authority and the server certificate it signed, made at start: nothing is
/// read from or written to disk, and nothing outlives the process.
pub struct Certificates {
    /// The CA's certificate, PEM: what a client trusts.
    ca_pem: String,
    /// The server's certificate and key, with the ALPN protocols it offers.
    server: Arc<ServerConfig>,
}

impl Certificates {
    /// A new CA and a server certificate it signed for `127.0.0.1` (an IP address SAN, which a client
    /// connecting to `https://127.0.0.1:PORT` checks) and `localhost`.
    pub fn generate() -> Result<Self, String> {
        let failed = |what: &str, e: &dyn fmt::Display| format!("cannot make the {what}: {e}");
        let mut ca_params = CertificateParams::new(Vec::<String>::new())
            .map_err(|e| failed("CA's parameters", &e))?;
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "fake API server CA");
        let ca_key = KeyPair::generate().map_err(|e| failed("CA's key", &e))?;
        let ca = CertifiedIssuer::self_signed(ca_params, ca_key)
            .map_err(|e| failed("CA's certificate", &e))?;

        let mut server_params =
            CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])
                .map_err(|e| failed("server's parameters", &e))?;
        server_params
            .distinguished_name
            .push(DnType::CommonName, "fake API server");
        server_params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let server_key = KeyPair::generate().map_err(|e| failed("server's key", &e))?;
        let server_certificate = server_params
            .signed_by(&server_key, &ca)
            .map_err(|e| failed("server's certificate", &e))?;

        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(server_key.serialize_der()));
        let mut server = ServerConfig::builder_with_provider(Arc::new(ring::default_provider()))
            .with_safe_default_protocol_versions()
            .map_err(|e| failed("TLS configuration", &e))?
            .with_no_client_auth()
            .with_single_cert(vec![server_certificate.der().clone()], key)
            .map_err(|e| failed("TLS configuration", &e))?;
        server.alpn_protocols = ALPN.iter().map(|protocol| protocol.to_vec()).collect();
        Ok(Self {
            ca_pem: ca.pem(),
            server: Arc::new(server),
        })
    }

    /// The CA's certificate as a kubeconfig's `certificate-authority-data` holds it: the PEM, base64.
    pub fn certificate_authority_data(&self) -> String {
        base64::engine::general_purpose::STANDARD.encode(&self.ca_pem)
    }
}

/// The connections a [`TlsServer`] accepted, by the protocol each negotiated. A client that offers no
/// ALPN protocol gets HTTP/1.1, as from an API server: HTTP/2 over TLS is only for those that ask.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Connections {
    pub http2: usize,
    pub http1: usize,
}

impl fmt::Display for Connections {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} HTTP/2, {} HTTP/1.1", self.http2, self.http1)
    }
}

/// The number of the TLS connection a request came on (in the order accepted, from 0), put on every
/// request it carries, so the request log can say which requests shared a connection.
#[derive(Clone, Copy, Debug)]
pub struct ConnectionId(pub usize);

/// What the accept loop and every connection share.
struct Shared {
    /// Connections accepted so far (the next one's number).
    accepted: AtomicUsize,
    http2: AtomicUsize,
    http1: AtomicUsize,
    /// Every open connection ends when this is sent to ([`TlsServer::drop_connections`]).
    cut: watch::Sender<()>,
    /// Every open connection stops being served when this is sent to ([`TlsServer::freeze_connections`]).
    freeze: watch::Sender<()>,
}

/// A TLS server of an axum router on a listener, until dropped. Dropping it closes every connection.
pub struct TlsServer {
    shared: Arc<Shared>,
    accept: AbortHandle,
}

impl TlsServer {
    /// Serves `router` over TLS with `certificates` on `listener`: HTTP/2 to the clients that negotiate
    /// `h2`, HTTP/1.1 to the others.
    pub fn serve(listener: TcpListener, certificates: &Certificates, router: Router) -> Self {
        let shared = Arc::new(Shared {
            accepted: AtomicUsize::new(0),
            http2: AtomicUsize::new(0),
            http1: AtomicUsize::new(0),
            cut: watch::Sender::new(()),
            freeze: watch::Sender::new(()),
        });
        let acceptor = TlsAcceptor::from(certificates.server.clone());
        let accept = tokio::spawn(accept_loop(listener, acceptor, router, shared.clone()));
        Self {
            shared,
            accept: accept.abort_handle(),
        }
    }

    /// The connections accepted so far, by protocol (counted once the TLS handshake is done).
    pub fn connections(&self) -> Connections {
        Connections {
            http2: self.shared.http2.load(Ordering::SeqCst),
            http1: self.shared.http1.load(Ordering::SeqCst),
        }
    }

    /// Drops every open connection at once, without a TLS close or an HTTP/2 GOAWAY, as when the API
    /// server's process dies; the server goes on accepting new ones, as a restarted one would. Frozen
    /// connections are dropped too.
    pub fn drop_connections(&self) {
        self.shared.cut.send_replace(());
    }

    /// Freezes every open connection: from now on nothing is read from it or written to it (no answer,
    /// no PONG, no GOAWAY, no TLS close), but its socket stays open, so the client sees no reset and
    /// its kernel's segments are still acknowledged. A black hole, as when the node behind a load
    /// balancer vanishes: only the client's own timeouts or keep-alive pings can tell. New connections
    /// are accepted and served as before, as another node would. A frozen connection ends when the
    /// connections are dropped ([`TlsServer::drop_connections`]) or the server is.
    pub fn freeze_connections(&self) {
        self.shared.freeze.send_replace(());
    }
}

impl Drop for TlsServer {
    fn drop(&mut self) {
        self.accept.abort();
        self.drop_connections();
    }
}

/// Accepts connections until aborted, each served by its own task (so a slow handshake holds up no
/// other).
async fn accept_loop(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    router: Router,
    shared: Arc<Shared>,
) {
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            // Out of file descriptors, or a connection reset before it was accepted: try again shortly
            // rather than spin.
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        // No Nagle delay on small writes (HTTP/2 frames, TLS records), as Go, which serves the API server,
        // sets on every connection; should it fail, the connection still works.
        let _ = stream.set_nodelay(true);
        // Subscribed here, before the task runs, so a cut or a freeze asked for from now on reaches this
        // connection, and one asked for before does not.
        let signals = Signals {
            cut: shared.cut.subscribe(),
            freeze: shared.freeze.subscribe(),
        };
        let id = ConnectionId(shared.accepted.fetch_add(1, Ordering::SeqCst));
        tokio::spawn(connection(
            stream,
            acceptor.clone(),
            router.clone().layer(axum::Extension(id)),
            shared.clone(),
            signals,
        ));
    }
}

/// What the server may ask of every connection open at the time.
struct Signals {
    cut: watch::Receiver<()>,
    freeze: watch::Receiver<()>,
}

/// One connection: the TLS handshake, then HTTP/2 or HTTP/1.1 as negotiated, until the client closes
/// it or the server cuts every connection; frozen, it is kept open but no longer served until then.
async fn connection(
    stream: TcpStream,
    acceptor: TlsAcceptor,
    router: Router,
    shared: Arc<Shared>,
    Signals {
        mut cut,
        mut freeze,
    }: Signals,
) {
    let serve = async {
        let Ok(tls) = acceptor.accept(stream).await else {
            return;
        };
        let http2 = tls.get_ref().1.alpn_protocol() == Some(H2);
        let counter = if http2 { &shared.http2 } else { &shared.http1 };
        counter.fetch_add(1, Ordering::SeqCst);
        let mut builder = Builder::new(TokioExecutor::new());
        builder
            .http2()
            .max_concurrent_streams(MAX_CONCURRENT_STREAMS);
        // The protocol is the negotiated one, not guessed from the first bytes: what is counted is what
        // is spoken.
        let builder = if http2 {
            builder.http2_only()
        } else {
            builder.http1_only()
        };
        let service = TowerToHyperService::new(router);
        // An error here is the client's (a reset, a protocol error): the connection is over either way.
        let _ = builder.serve_connection(TokioIo::new(tls), service).await;
    };
    let mut serve = std::pin::pin!(serve);
    tokio::select! {
        // A cut or a freeze first: once asked for, the connection writes nothing more, even what was
        // ready to go.
        biased;
        // Dropping `serve` drops the TLS stream and its socket: the client sees the connection end.
        _ = cut.changed() => {}
        // `serve` is kept, and with it the socket, but no longer polled: the connection (its handshake,
        // if unfinished) goes silent, and what the client sends stays unread. The tasks of requests
        // already in flight may finish, but their answers are never written. Until a cut.
        _ = freeze.changed() => {
            let _ = cut.changed().await;
        }
        () = &mut serve => {}
    }
}
