//! Reading `stats` from one memcached server: one connection, plain TCP or TLS, optionally authenticated,
//! bounded in time and in the bytes it buffers.
//!
//! - The connection itself (plain or TLS, [`Credentials`], [`TlsClient`], [`Target`]) is opened by
//!   [`crate::connection`], which the warm handover shares; its types are re-exported here.
//! - [`read`] (and [`read_stats`]): the exchange itself; over TLS it also says which certificate the
//!   server presented and, when that is not the one it should present, asks the server to load its
//!   certificate files again (`refresh_certs`; see [`ExpectedCertificate`]).
//!
//! A read is one short-lived connection, closed when the reply is in: memcached counts it in
//! `curr_connections` (so that stat includes the operator's own connection), and the operator holds no
//! connection to a pod between reads.

use std::io;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, BufReader};

use crate::connection::{self, LINE_REPLY_LIMIT, LinkError};
pub use crate::connection::{
    CertificateDigest, Credentials, CredentialsError, DEFAULT_CLUSTER_DOMAIN, ExpectedCertificate,
    ServerNames, Target, TlsClient, TlsError, TlsMaterial, matching_pair,
};

use super::stats::{self, MAX_REPLY_BYTES, ParseError, Stats};

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

impl From<LinkError> for ReadError {
    fn from(error: LinkError) -> Self {
        match error {
            LinkError::Connect(error) => Self::Connect(error),
            LinkError::Tls(error) => Self::Tls(error),
            LinkError::Unverified => Self::Unverified,
            LinkError::Auth(answer) => Self::Auth(answer),
            LinkError::Closed => Self::Closed,
            LinkError::Io(error) => Self::Io(error),
        }
    }
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
    let connection::Connection {
        mut stream,
        presented,
    } = connection::open(target).await?;
    let refresh = match (target.certificate, presented) {
        (Some(expected), Some(presented)) => expected.refresh && presented != expected.digest,
        _ => false,
    };
    let refreshed = if refresh {
        Some(refresh_certs(&mut stream).await?)
    } else {
        None
    };
    let stats = read_reply(&mut stream).await?;
    Ok(Reading {
        stats,
        certificate: presented.map(|digest| Presented {
            digest,
            refresh: refreshed,
        }),
    })
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
        .take(LINE_REPLY_LIMIT)
        .read_until(b'\n', &mut line)
        .await
        .map_err(classify)?;
    if read == 0 {
        return Err(ReadError::Closed);
    }
    if line == b"OK\r\n" {
        return Ok(RefreshAnswer::Reloaded);
    }
    Ok(RefreshAnswer::Refused(connection::shown(&line)))
}

async fn send<S>(stream: &mut BufReader<S>, bytes: &[u8]) -> Result<(), ReadError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    Ok(connection::send(stream, bytes).await?)
}

fn classify(error: io::Error) -> ReadError {
    connection::classify(error).into()
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
}
