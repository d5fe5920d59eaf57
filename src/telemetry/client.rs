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

use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, BufReader};

use crate::connection::{self, LINE_REPLY_LIMIT};
pub use crate::connection::{
    CertificateDigest, Credentials, CredentialsError, DEFAULT_CLUSTER_DOMAIN, ExpectedCertificate,
    LinkError, ServerNames, Target, TlsClient, TlsError, TlsMaterial, matching_pair,
};

use super::proxy::{self, AccessCounters, AccessNames, ProxyCounters};
use super::stats::{self, MAX_REPLY_BYTES, ParseError, Stats};

/// What one read gave: the stats and, over TLS, what the server presented.
#[derive(Clone, Debug)]
pub struct Reading {
    pub stats: Stats,
    pub certificate: Option<Presented>,
}

/// What one read of a proxy pod gave: its counters, the backends it marks down (by label, how many of
/// its worker threads do), with access control the counters of each identity it was asked for (by name;
/// empty without), and over TLS what it presented.
#[derive(Clone, Debug)]
pub struct ProxyReading {
    pub counters: ProxyCounters,
    pub down: std::collections::BTreeMap<String, u64>,
    pub access: std::collections::BTreeMap<String, AccessCounters>,
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
/// The connection's own failures (connect, TLS, authentication, a closed or broken connection) are the
/// connection's error, [`LinkError`], as the warm handover sees them too; a read adds its time bound and
/// the reply it could not make sense of. Messages carry the detail (an OS error, the server's answer) and
/// never a credential.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// Connecting, the TLS handshake, authenticating, or the open connection failed (before the reply was
    /// complete, for [`LinkError::Closed`]).
    #[error(transparent)]
    Link(#[from] LinkError),
    /// The exchange (connect, handshake, authentication, reply) did not finish in time.
    #[error("no complete exchange within {0:?}")]
    Timeout(Duration),
    /// The server's reply is not a `stats` reply: malformed, an error line, or longer than the bound.
    #[error("not a stats reply: {0}")]
    Protocol(#[from] ParseError),
}

impl ReadError {
    /// A short stable label for metrics and logs: the connection's ([`LinkError::reason`]: `connect`,
    /// `tls`, `auth`, `closed`, `io`), `timeout` or `protocol`. A metric label must have few values, so
    /// this never carries the detail.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Link(error) => error.reason(),
            Self::Timeout(_) => "timeout",
            Self::Protocol(_) => "protocol",
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

/// [`read`] of a proxy pod: the same connection and bounds, then `stats` and `stats proxybe`
/// ([`super::proxy`]); with `access` (the instance has access control), `stats proxy` too, of which
/// only the counters of `access`'s identities are kept. No `refresh_certs`: a proxy's certificate is not
/// the servers'.
pub async fn read_proxy(
    target: &Target,
    timeout: Duration,
    access: Option<&AccessNames>,
) -> Result<ProxyReading, ReadError> {
    tokio::time::timeout(timeout, proxy_exchange(target, access))
        .await
        .unwrap_or(Err(ReadError::Timeout(timeout)))
}

async fn proxy_exchange(
    target: &Target,
    access: Option<&AccessNames>,
) -> Result<ProxyReading, ReadError> {
    let connection::Connection {
        mut stream,
        presented,
    } = connection::open(target).await?;
    let counters = proxy::parse_counters(&read_reply(&mut stream, b"stats\r\n").await?)?;
    let down = proxy::parse_down(&read_reply(&mut stream, b"stats proxybe\r\n").await?)?;
    let access = match access {
        Some(names) => {
            let reply = read_reply(&mut stream, b"stats proxy\r\n").await?;
            proxy::parse_access(&reply, names)?
        }
        None => std::collections::BTreeMap::new(),
    };
    Ok(ProxyReading {
        counters,
        down,
        access,
        certificate: presented.map(|digest| Presented {
            digest,
            refresh: None,
        }),
    })
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
    let stats = stats::parse(&read_reply(&mut stream, b"stats\r\n").await?)?;
    Ok(Reading {
        stats,
        certificate: presented.map(|digest| Presented {
            digest,
            refresh: refreshed,
        }),
    })
}

/// Sends `command` (a `stats` command) and reads its whole reply, bounded by [`MAX_REPLY_BYTES`].
async fn read_reply<S>(stream: &mut BufReader<S>, command: &[u8]) -> Result<Vec<u8>, ReadError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    connection::send(stream, command).await?;
    let mut reply = Vec::with_capacity(4096);
    loop {
        let start = reply.len();
        // One byte more than the bound, so a reply that exceeds it is seen to exceed it.
        let room = (MAX_REPLY_BYTES + 1).saturating_sub(start) as u64;
        let read = (&mut *stream)
            .take(room)
            .read_until(b'\n', &mut reply)
            .await
            .map_err(connection::classify)?;
        if reply.len() > MAX_REPLY_BYTES {
            return Err(ParseError::TooLong {
                limit: MAX_REPLY_BYTES,
            }
            .into());
        }
        if read == 0 || !reply.ends_with(b"\n") {
            return Err(LinkError::Closed.into());
        }
        // Stop at the end of the reply, and at the first line that cannot be part of one (garbage from
        // something that is not memcached): the parser then says what was wrong, without waiting for more.
        let line = reply.get(start..).unwrap_or_default();
        if stats::ends_reply(line) || !line.starts_with(b"STAT ") {
            return Ok(reply);
        }
    }
}

/// Sends `refresh_certs` and reads the one-line answer.
async fn refresh_certs<S>(stream: &mut BufReader<S>) -> Result<RefreshAnswer, ReadError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    connection::send(stream, b"refresh_certs\r\n").await?;
    let mut line = Vec::new();
    let read = (&mut *stream)
        .take(LINE_REPLY_LIMIT)
        .read_until(b'\n', &mut line)
        .await
        .map_err(connection::classify)?;
    if read == 0 {
        return Err(LinkError::Closed.into());
    }
    if line == b"OK\r\n" {
        return Ok(RefreshAnswer::Reloaded);
    }
    Ok(RefreshAnswer::Refused(connection::shown(&line)))
}

#[cfg(test)]
mod tests {
    use std::io;

    use super::*;

    #[test]
    fn reasons_are_short_stable_labels() {
        let errors: [ReadError; 8] = [
            LinkError::Connect(io::ErrorKind::ConnectionRefused.into()).into(),
            ReadError::Timeout(Duration::from_secs(2)),
            LinkError::Tls(io::ErrorKind::InvalidData.into()).into(),
            LinkError::Unverified.into(),
            LinkError::Auth(String::new()).into(),
            LinkError::Closed.into(),
            ReadError::Protocol(ParseError::Truncated),
            LinkError::Io(io::ErrorKind::Other.into()).into(),
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
