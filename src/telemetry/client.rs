//! Reading `stats` from one memcached server: one connection, plain TCP or TLS, optionally authenticated,
//! bounded in time and in the bytes it buffers.
//!
//! - [`Credentials`]: the user and password for memcached's ASCII authentication, from an auth file.
//! - [`TlsClient`]: the rustls client configuration from an instance's TLS Secret; its documentation says
//!   what is verified: the chain to the instance's CA and one of the names in [`ServerNames`] or the pod IP.
//! - [`read`] (and [`read_stats`]): the exchange itself; over TLS it also says which certificate the
//!   server presented and, when that is not the one it should present, asks the server to load its
//!   certificate files again (`refresh_certs`; see [`ExpectedCertificate`]).
//!
//! A read is one short-lived connection, closed when the reply is in: memcached counts it in
//! `curr_connections` (so that stat includes the operator's own connection), and the operator holds no
//! connection to a pod between reads.

mod certificate;
mod credentials;
mod names;
mod tls;
mod verifier;

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::ServerName;

pub use certificate::{CertificateDigest, matching_pair};
pub use credentials::{Credentials, CredentialsError};
pub use names::{DEFAULT_CLUSTER_DOMAIN, ServerNames};
pub use tls::{TlsClient, TlsError, TlsMaterial};

use super::stats::{self, MAX_REPLY_BYTES, ParseError, Stats};

/// The longest answer to the authenticating `set`, or to `refresh_certs`, that is read (`STORED\r\n`,
/// `OK\r\n` or an error line).
const AUTH_REPLY_LIMIT: u64 = 1024;

/// One memcached server to read, and how to talk to it.
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
    /// whether this read may ask it to reload its certificate files when it presents another.
    pub certificate: Option<ExpectedCertificate>,
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

/// What one read gave: the stats and, over TLS, what the server presented.
#[derive(Clone, Debug)]
pub struct Reading {
    pub stats: Stats,
    pub certificate: Option<Presented>,
}

/// The certificate a server presented in the handshake, and its answer to `refresh_certs` when the read
/// sent it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Presented {
    pub digest: CertificateDigest,
    pub refresh: Option<RefreshAnswer>,
}

/// memcached's answer to `refresh_certs`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RefreshAnswer {
    /// `OK`: it loaded its certificate files again; new connections get what they now hold (which is the
    /// same certificate when the kubelet has not updated them yet).
    Reloaded,
    /// Anything else (`ERROR` and why: a key that does not match the certificate, a file it cannot
    /// read, a server without TLS or too old for the command): it keeps the certificate it had.
    Refused(String),
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

/// Why a server's stats could not be read. [`ReadError::reason`] gives a short stable label for each.
///
/// Messages carry the detail (an OS error, the server's answer) and never a credential.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The TCP connection could not be opened: refused, unreachable, no route.
    #[error("cannot connect: {0}")]
    Connect(io::Error),
    /// The exchange (connect, handshake, authentication, reply) did not finish in time.
    #[error("no complete exchange within {0:?}")]
    Timeout(Duration),
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
    /// The server did not answer the authenticating `set` with `STORED`: it refused the credentials, or
    /// closed the connection, or said something else.
    #[error("authentication refused: {0}")]
    Auth(String),
    /// The server closed the connection before the reply was complete.
    #[error("the server closed the connection before the reply was complete")]
    Closed,
    /// The server's reply is not a `stats` reply: malformed, an error line, or longer than the bound.
    #[error("not a stats reply: {0}")]
    Protocol(ParseError),
    /// Any other I/O error on the open connection.
    #[error("I/O error: {0}")]
    Io(io::Error),
}

impl From<ParseError> for ReadError {
    fn from(error: ParseError) -> Self {
        Self::Protocol(error)
    }
}

impl ReadError {
    /// A short stable label for metrics and logs: `connect`, `timeout`, `tls`, `auth`, `closed`, `protocol`
    /// or `io`. A metric label must have few values, so this never carries the detail.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Connect(_) => "connect",
            Self::Timeout(_) => "timeout",
            Self::Tls(_) | Self::Unverified => "tls",
            Self::Auth(_) => "auth",
            Self::Closed => "closed",
            Self::Protocol(_) => "protocol",
            Self::Io(_) => "io",
        }
    }
}

/// Connects, (TLS handshake), (authenticates), (`refresh_certs`), sends `stats\r\n`, reads to
/// `END\r\n`, parses.
///
/// The whole exchange is bounded by `timeout`, so a pod that accepts and never answers, or answers a byte at
/// a time, costs at most that. The reply is bounded by [`MAX_REPLY_BYTES`]. Never panics on any input.
pub async fn read(target: &Target, timeout: Duration) -> Result<Reading, ReadError> {
    tokio::time::timeout(timeout, exchange(target))
        .await
        .unwrap_or(Err(ReadError::Timeout(timeout)))
}

/// [`read`], for the stats only.
pub async fn read_stats(target: &Target, timeout: Duration) -> Result<Stats, ReadError> {
    read(target, timeout).await.map(|reading| reading.stats)
}

async fn exchange(target: &Target) -> Result<Reading, ReadError> {
    let credentials = target.credentials.as_deref();
    // Checked before connecting: nothing at all goes to a server the credentials cannot be trusted to.
    if credentials.is_some()
        && target
            .tls
            .as_ref()
            .is_some_and(|tls| !tls.verifies_server())
    {
        return Err(ReadError::Unverified);
    }
    let tcp = TcpStream::connect(target.address)
        .await
        .map_err(ReadError::Connect)?;
    // Commands are written whole; without Nagle's delay the `stats` after `STORED` leaves at once. Failing to
    // set it costs latency only, not correctness.
    let _ = tcp.set_nodelay(true);
    match &target.tls {
        None => {
            let (stats, _) = converse(tcp, credentials, false).await?;
            Ok(Reading {
                stats,
                certificate: None,
            })
        }
        Some(tls) => {
            // Pods are addressed by IP: rustls sends no SNI for an IP. The certificate must be valid for the
            // IP or one of `names` (see `tls`).
            let name = ServerName::IpAddress(target.address.ip().into());
            let stream = tls
                .connector(&target.names)
                .connect(name, tcp)
                .await
                .map_err(ReadError::Tls)?;
            // rustls gives the peer's chain once the handshake is done; a server always sends one.
            let presented = stream
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|chain| chain.first())
                .map(|leaf| CertificateDigest::of_der(leaf));
            let refresh = match (target.certificate, presented) {
                (Some(expected), Some(presented)) => {
                    expected.refresh && presented != expected.digest
                }
                _ => false,
            };
            let (stats, refresh) = converse(stream, credentials, refresh).await?;
            Ok(Reading {
                stats,
                certificate: presented.map(|digest| Presented { digest, refresh }),
            })
        }
    }
}

/// The text-protocol conversation on an open (plain or TLS) stream: the stats, and the answer to
/// `refresh_certs` when `refresh` asks to send it.
async fn converse<S>(
    stream: S,
    credentials: Option<&Credentials>,
    refresh: bool,
) -> Result<(Stats, Option<RefreshAnswer>), ReadError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut stream = BufReader::new(stream);
    if let Some(credentials) = credentials {
        authenticate(&mut stream, credentials).await?;
    }
    let refreshed = if refresh {
        Some(refresh_certs(&mut stream).await?)
    } else {
        None
    };
    let stats = read_reply(&mut stream).await?;
    Ok((stats, refreshed))
}

/// Sends `stats` and reads its reply.
async fn read_reply<S>(stream: &mut BufReader<S>) -> Result<Stats, ReadError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    send(stream, b"stats\r\n").await?;
    let mut reply = Vec::with_capacity(4096);
    loop {
        let start = reply.len();
        // One byte more than the bound, so a reply that exceeds it is seen to exceed it.
        let room = (MAX_REPLY_BYTES + 1).saturating_sub(start) as u64;
        let read = (&mut *stream)
            .take(room)
            .read_until(b'\n', &mut reply)
            .await
            .map_err(classify)?;
        if reply.len() > MAX_REPLY_BYTES {
            return Err(ParseError::TooLong {
                limit: MAX_REPLY_BYTES,
            }
            .into());
        }
        if read == 0 || !reply.ends_with(b"\n") {
            return Err(ReadError::Closed);
        }
        // Stop at the end of the reply, and at the first line that cannot be part of one (garbage from
        // something that is not memcached): the parser then says what was wrong, without waiting for more.
        let line = reply.get(start..).unwrap_or_default();
        if stats::ends_reply(line) || !line.starts_with(b"STAT ") {
            return Ok(stats::parse(&reply)?);
        }
    }
}

/// Sends `refresh_certs` and reads the one-line answer.
async fn refresh_certs<S>(stream: &mut BufReader<S>) -> Result<RefreshAnswer, ReadError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    send(stream, b"refresh_certs\r\n").await?;
    let mut line = Vec::new();
    let read = (&mut *stream)
        .take(AUTH_REPLY_LIMIT)
        .read_until(b'\n', &mut line)
        .await
        .map_err(classify)?;
    if read == 0 {
        return Err(ReadError::Closed);
    }
    if line == b"OK\r\n" {
        return Ok(RefreshAnswer::Reloaded);
    }
    let answer = line.strip_suffix(b"\r\n").unwrap_or(&line);
    let shown = answer.get(..128).unwrap_or(answer);
    Ok(RefreshAnswer::Refused(
        String::from_utf8_lossy(shown).into_owned(),
    ))
}

/// Sends the credentials and requires `STORED`.
async fn authenticate<S>(
    stream: &mut BufReader<S>,
    credentials: &Credentials,
) -> Result<(), ReadError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    send(stream, &credentials.auth_command()).await?;
    let mut line = Vec::new();
    let read = match (&mut *stream)
        .take(AUTH_REPLY_LIMIT)
        .read_until(b'\n', &mut line)
        .await
    {
        Ok(read) => read,
        Err(error) => {
            return Err(match classify(error) {
                ReadError::Closed => ReadError::Auth("the server closed the connection".to_owned()),
                other => other,
            });
        }
    };
    if read == 0 {
        return Err(ReadError::Auth(
            "the server closed the connection".to_owned(),
        ));
    }
    if line == b"STORED\r\n" {
        return Ok(());
    }
    let answer = line.strip_suffix(b"\r\n").unwrap_or(&line);
    let shown = answer.get(..128).unwrap_or(answer);
    Err(ReadError::Auth(format!(
        "the server answered {:?}",
        String::from_utf8_lossy(shown)
    )))
}

async fn send<S>(stream: &mut BufReader<S>, bytes: &[u8]) -> Result<(), ReadError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    stream.write_all(bytes).await.map_err(classify)?;
    // A TLS stream holds what it encrypted until flushed.
    stream.flush().await.map_err(classify)
}

/// Sorts an I/O error on an open connection: a TLS failure (an alert, a bad record), the peer going away,
/// or anything else.
fn classify(error: io::Error) -> ReadError {
    if error
        .get_ref()
        .is_some_and(|inner| inner.is::<rustls::Error>())
    {
        return ReadError::Tls(error);
    }
    match error.kind() {
        io::ErrorKind::UnexpectedEof
        | io::ErrorKind::ConnectionReset
        | io::ErrorKind::ConnectionAborted
        | io::ErrorKind::BrokenPipe => ReadError::Closed,
        _ => ReadError::Io(error),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_are_short_stable_labels() {
        let errors = [
            ReadError::Connect(io::ErrorKind::ConnectionRefused.into()),
            ReadError::Timeout(Duration::from_secs(2)),
            ReadError::Tls(io::ErrorKind::InvalidData.into()),
            ReadError::Unverified,
            ReadError::Auth(String::new()),
            ReadError::Closed,
            ReadError::Protocol(ParseError::Truncated),
            ReadError::Io(io::ErrorKind::Other.into()),
        ];
        let reasons: Vec<_> = errors.iter().map(ReadError::reason).collect();
        assert_eq!(
            reasons,
            [
                "connect", "timeout", "tls", "tls", "auth", "closed", "protocol", "io"
            ]
        );
    }

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
            address: SocketAddr::from(([127, 0, 0, 1], 11211)),
            tls: None,
            names: ServerNames::default(),
            credentials: Some(Arc::new(credentials)),
            certificate: None,
        };
        let debug = format!("{target:?}");
        assert!(
            debug.contains("alice") && !debug.contains("hunter2"),
            "{debug}"
        );
    }
}
