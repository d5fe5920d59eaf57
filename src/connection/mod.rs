//! Opening one connection to one memcached server: plain TCP or TLS, optionally authenticated.
//!
//! Shared by everything the operator says to memcached servers: the stats collector
//! ([`crate::telemetry::client`]) and the warm handover ([`crate::handover`]), so both verify servers and
//! send credentials the same way.
//!
//! - [`Credentials`]: the user and password for memcached's ASCII authentication, from an auth file.
//! - [`TlsClient`]: the rustls client configuration from an instance's TLS Secret; its documentation says
//!   what is verified: the chain to the instance's CA and one of the names in [`ServerNames`] or the pod IP.
//! - [`open`]: connect, handshake, authenticate; what is said next is the caller's.

mod certificate;
mod credentials;
mod names;
mod tls;
mod verifier;

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::ServerName;
use tokio_util::either::Either;

pub use certificate::{CertificateDigest, matching_pair};
pub use credentials::{Credentials, CredentialsError};
pub use names::{DEFAULT_CLUSTER_DOMAIN, ServerNames};
pub use tls::{TlsClient, TlsError, TlsMaterial};

/// The longest one-line answer read to the authenticating `set` (`STORED\r\n` or an error line).
pub const LINE_REPLY_LIMIT: u64 = 1024;

/// One memcached server, and how to talk to it.
#[derive(Clone)]
pub struct Target {
    /// The pod's address, `podIP:containerPort`.
    pub address: SocketAddr,
    /// Set when the instance serves TLS: the client built from its Secret.
    pub tls: Option<TlsClient>,
    /// The names besides its IP that the server's certificate may be valid for (over TLS with a CA).
    pub names: ServerNames,
    /// Set when the instance requires authentication.
    pub credentials: Option<Arc<Credentials>>,
    /// Over TLS: the certificate the server should present (the leaf of the instance's `tls.crt`), and
    /// whether a stats read may ask it to reload its certificate files when it presents another. Only the
    /// stats collector acts on it.
    pub certificate: Option<ExpectedCertificate>,
    /// Without TLS, with credentials: asked after connecting and before the credentials go out in the
    /// clear, whether the address still belongs to the pod the target was made for (the pod cache still
    /// shows that pod, with that IP, not terminating). A pod IP taken from a cache can be stale or, after
    /// the pod is gone, another pod's; over verified TLS the certificate says who answers instead.
    pub still_the_pod: Option<PodCheck>,
}

/// See [`Target::still_the_pod`].
pub type PodCheck = Arc<dyn Fn() -> bool + Send + Sync>;

impl Target {
    /// A server reached over plain TCP without authentication.
    pub fn plain(address: SocketAddr) -> Self {
        Self {
            address,
            tls: None,
            names: ServerNames::default(),
            credentials: None,
            certificate: None,
            still_the_pod: None,
        }
    }
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Target")
            .field("address", &self.address)
            .field("tls", &self.tls)
            .field("names", &self.names.dns().len())
            .field("credentials", &self.credentials)
            .field("certificate", &self.certificate)
            .finish()
    }
}

/// The certificate a server should present, and whether to ask it to reload when it presents another.
///
/// memcached reads its certificate files at start and again on the `refresh_certs` command (since
/// 1.5.13, the release that brought TLS); the kubelet updates a mounted Secret's files in place some time
/// after the Secret changed. So a rotated certificate reaches a running server without a restart: the
/// collector sends `refresh_certs` (on the connection it reads stats on, after authenticating) until the
/// handshake shows the new certificate. Whether a read may send it is the collector's call (it spaces the
/// attempts out: [`crate::telemetry::reload`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExpectedCertificate {
    pub digest: CertificateDigest,
    pub refresh: bool,
}

/// A plain or TLS stream to a server.
pub type Stream = Either<TcpStream, Box<TlsStream<TcpStream>>>;

/// An open, authenticated connection, buffered for reading lines.
pub struct Connection {
    pub stream: BufReader<Stream>,
    /// Over TLS: the digest of the leaf certificate the server presented in the handshake.
    pub presented: Option<CertificateDigest>,
}

/// Why a connection could not be opened or broke. [`LinkError::reason`] gives a short stable label.
///
/// Messages carry the detail (an OS error, the server's answer) and never a credential.
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    /// The TCP connection could not be opened: refused, unreachable, no route.
    #[error("cannot connect: {0}")]
    Connect(io::Error),
    /// The TLS handshake failed, or the TLS session was broken off by an alert (a server requiring a client
    /// certificate the operator does not have rejects it this way, after the TLS 1.3 handshake).
    #[error("TLS failed: {0}")]
    Tls(io::Error),
    /// Authentication is on but the server cannot be verified: the TLS Secret has no CA. The credentials
    /// would go to whoever answers at the pod's address, so the client does not connect at all.
    #[error(
        "not sending credentials to an unverified server: the TLS Secret needs a ca.crt (the CA of the \
         server certificates) for the operator to authenticate"
    )]
    Unverified,
    /// Credentials would go in the clear to an address whose pod is no longer the one expected (gone,
    /// terminating, or another IP): nothing is sent.
    #[error(
        "not sending credentials in the clear: the pod is gone, terminating or has another IP since the \
         address was read"
    )]
    NotThePod,
    /// The server did not answer the authenticating `set` with `STORED`: it refused the credentials, or
    /// closed the connection, or said something else.
    #[error("authentication refused: {0}")]
    Auth(String),
    /// The server closed the connection.
    #[error("the server closed the connection")]
    Closed,
    /// Any other I/O error on the open connection.
    #[error("I/O error: {0}")]
    Io(io::Error),
}

impl LinkError {
    /// A short stable label for metrics and logs: `connect`, `tls`, `auth`, `closed` or `io`.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Connect(_) => "connect",
            Self::Tls(_) | Self::Unverified => "tls",
            Self::Auth(_) => "auth",
            Self::NotThePod => "not_the_pod",
            Self::Closed => "closed",
            Self::Io(_) => "io",
        }
    }
}

/// Connects, (TLS handshake), (authenticates). Not bounded in time: callers bound the whole exchange.
pub async fn open(target: &Target) -> Result<Connection, LinkError> {
    let credentials = target.credentials.as_deref();
    // Checked before connecting: nothing at all goes to a server the credentials cannot be trusted to.
    if credentials.is_some()
        && target
            .tls
            .as_ref()
            .is_some_and(|tls| !tls.verifies_server())
    {
        return Err(LinkError::Unverified);
    }
    let tcp = TcpStream::connect(target.address)
        .await
        .map_err(LinkError::Connect)?;
    // Commands are written whole; without Nagle's delay they leave at once. Failing to set it costs
    // latency only, not correctness.
    let _ = tcp.set_nodelay(true);
    let (stream, presented) = match &target.tls {
        None => (Either::Left(tcp), None),
        Some(tls) => {
            // Pods are addressed by IP: rustls sends no SNI for an IP. The certificate must be valid for the
            // IP or one of `names` (see `tls`).
            let name = ServerName::IpAddress(target.address.ip().into());
            let stream = tls
                .connector(&target.names)
                .connect(name, tcp)
                .await
                .map_err(LinkError::Tls)?;
            // rustls gives the peer's chain once the handshake is done; a server always sends one.
            let presented = stream
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|chain| chain.first())
                .map(|leaf| CertificateDigest::of_der(leaf));
            (Either::Right(Box::new(stream)), presented)
        }
    };
    let mut stream = BufReader::new(stream);
    if let Some(credentials) = credentials {
        if target.tls.is_none()
            && let Some(check) = &target.still_the_pod
            && !check()
        {
            return Err(LinkError::NotThePod);
        }
        authenticate(&mut stream, credentials).await?;
    }
    Ok(Connection { stream, presented })
}

/// Sends the credentials and requires `STORED`.
async fn authenticate<S>(
    stream: &mut BufReader<S>,
    credentials: &Credentials,
) -> Result<(), LinkError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    send(stream, &credentials.auth_command()).await?;
    let mut line = Vec::new();
    let read = match (&mut *stream)
        .take(LINE_REPLY_LIMIT)
        .read_until(b'\n', &mut line)
        .await
    {
        Ok(read) => read,
        Err(error) => {
            return Err(match classify(error) {
                LinkError::Closed => LinkError::Auth("the server closed the connection".to_owned()),
                other => other,
            });
        }
    };
    if read == 0 {
        return Err(LinkError::Auth(
            "the server closed the connection".to_owned(),
        ));
    }
    if line == b"STORED\r\n" {
        return Ok(());
    }
    Err(LinkError::Auth(format!(
        "the server answered {:?}",
        shown(&line)
    )))
}

/// Writes `bytes` and flushes them (a TLS stream holds what it encrypted until flushed).
pub async fn send<S>(stream: &mut BufReader<S>, bytes: &[u8]) -> Result<(), LinkError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    stream.write_all(bytes).await.map_err(classify)?;
    stream.flush().await.map_err(classify)
}

/// A server's answer line for a message: without its line end, at most 128 bytes, lossy UTF-8.
pub fn shown(line: &[u8]) -> String {
    let answer = line
        .strip_suffix(b"\r\n")
        .or_else(|| line.strip_suffix(b"\n"))
        .unwrap_or(line);
    let answer = answer.get(..128).unwrap_or(answer);
    String::from_utf8_lossy(answer).into_owned()
}

/// Sorts an I/O error on an open connection: a TLS failure (an alert, a bad record), the peer going away,
/// or anything else.
pub fn classify(error: io::Error) -> LinkError {
    if error
        .get_ref()
        .is_some_and(|inner| inner.is::<rustls::Error>())
    {
        return LinkError::Tls(error);
    }
    match error.kind() {
        io::ErrorKind::UnexpectedEof
        | io::ErrorKind::ConnectionReset
        | io::ErrorKind::ConnectionAborted
        | io::ErrorKind::BrokenPipe => LinkError::Closed,
        _ => LinkError::Io(error),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn io_errors_are_sorted_by_cause() {
        let alert = io::Error::new(io::ErrorKind::InvalidData, rustls::Error::DecryptError);
        assert_eq!(classify(alert).reason(), "tls");
        assert_eq!(
            classify(io::ErrorKind::ConnectionReset.into()).reason(),
            "closed"
        );
        assert_eq!(
            classify(io::ErrorKind::UnexpectedEof.into()).reason(),
            "closed"
        );
        assert_eq!(
            classify(io::ErrorKind::PermissionDenied.into()).reason(),
            "io"
        );
    }

    #[test]
    fn a_target_shows_no_secret() {
        let credentials = Credentials::new("alice", "hunter2").expect("valid");
        let target = Target {
            credentials: Some(Arc::new(credentials)),
            ..Target::plain(SocketAddr::from(([127, 0, 0, 1], 11211)))
        };
        let debug = format!("{target:?}");
        assert!(
            debug.contains("alice") && !debug.contains("hunter2"),
            "{debug}"
        );
    }

    #[test]
    fn answers_are_shown_short_and_without_line_end() {
        assert_eq!(shown(b"CLIENT_ERROR bad\r\n"), "CLIENT_ERROR bad");
        assert_eq!(shown(&[b'x'; 300]).len(), 128);
    }
}
