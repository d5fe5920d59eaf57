//! Reading `stats` from one memcached server: one connection, plain TCP or TLS, optionally authenticated,
//! bounded in time and in the bytes it buffers.
//!
//! - [`Credentials`]: the user and password for memcached's ASCII authentication, from an auth file.
//! - [`TlsClient`]: the rustls client configuration from an instance's TLS Secret; its documentation says
//!   what is verified: the chain to the instance's CA and one of the names in [`ServerNames`] or the pod IP.
//! - [`read_stats`]: the exchange itself.
//!
//! A read is one short-lived connection, closed when the reply is in: memcached counts it in
//! `curr_connections` (so that stat includes the operator's own connection), and the operator holds no
//! connection to a pod between reads.

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

pub use credentials::{Credentials, CredentialsError};
pub use names::{DEFAULT_CLUSTER_DOMAIN, ServerNames};
pub use tls::{TlsClient, TlsError, TlsMaterial};

use super::stats::{self, MAX_REPLY_BYTES, ParseError, Stats};

/// The longest answer to the authenticating `set` that is read (`STORED\r\n` or an error line).
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
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Target")
            .field("address", &self.address)
            .field("tls", &self.tls)
            .field("names", &self.names.dns().len())
            .field("credentials", &self.credentials)
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

/// Connects, (TLS handshake), (authenticates), sends `stats\r\n`, reads to `END\r\n`, parses.
///
/// The whole exchange is bounded by `timeout`, so a pod that accepts and never answers, or answers a byte at
/// a time, costs at most that. The reply is bounded by [`MAX_REPLY_BYTES`]. Never panics on any input.
pub async fn read_stats(target: &Target, timeout: Duration) -> Result<Stats, ReadError> {
    tokio::time::timeout(timeout, exchange(target))
        .await
        .unwrap_or(Err(ReadError::Timeout(timeout)))
}

async fn exchange(target: &Target) -> Result<Stats, ReadError> {
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
        None => converse(tcp, credentials).await,
        Some(tls) => {
            // Pods are addressed by IP: rustls sends no SNI for an IP. The certificate must be valid for the
            // IP or one of `names` (see `tls`).
            let name = ServerName::IpAddress(target.address.ip().into());
            let stream = tls
                .connector(&target.names)
                .connect(name, tcp)
                .await
                .map_err(ReadError::Tls)?;
            converse(stream, credentials).await
        }
    }
}

/// The text-protocol conversation on an open (plain or TLS) stream.
async fn converse<S>(stream: S, credentials: Option<&Credentials>) -> Result<Stats, ReadError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut stream = BufReader::new(stream);
    if let Some(credentials) = credentials {
        authenticate(&mut stream, credentials).await?;
    }
    send(&mut stream, b"stats\r\n").await?;
    let mut reply = Vec::with_capacity(4096);
    loop {
        let start = reply.len();
        // One byte more than the bound, so a reply that exceeds it is seen to exceed it.
        let room = (MAX_REPLY_BYTES + 1).saturating_sub(start) as u64;
        let read = (&mut stream)
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
        };
        let debug = format!("{target:?}");
        assert!(
            debug.contains("alice") && !debug.contains("hunter2"),
            "{debug}"
        );
    }
}
