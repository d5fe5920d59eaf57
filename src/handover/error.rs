//! Why a copy ended before its end: typed, with a short stable reason for metrics and a message for the
//! Warning event.

use std::fmt;
use std::time::Duration;

use super::dump::DumpError;
use super::progress::Snapshot;
use crate::connection::LinkError;

/// Why a handover step failed: a write to the API server its decisions need (a gate, the spare server),
/// typed as every write of the operator is. The copies' own failures are no error: a rollout or a scale
/// goes on cold, said in an event.
pub use crate::store::WriteError as Error;

/// Which server of a copy an error concerns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    /// The server the items are copied from.
    Source,
    /// The server the items are copied to.
    Target,
}

impl fmt::Display for Side {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Source => "source",
            Self::Target => "target",
        })
    }
}

/// Why a copy stopped. Messages never carry a credential or an item's value.
#[derive(Debug, thiserror::Error)]
pub enum CopyError {
    /// Connecting, the TLS handshake or authentication failed, or the connection broke.
    #[error("{side} server: {error}")]
    Link {
        side: Side,
        #[source]
        error: LinkError,
    },
    /// The whole copy did not finish within its time bound (`spec.handover.timeoutSeconds`).
    #[error("not finished within {0:?}")]
    Timeout(Duration),
    /// One request (a connection, a batch, a dump line) got no complete answer in time: a server that
    /// accepts and stops answering.
    #[error("{side} server did not answer within {after:?}")]
    Stalled { side: Side, after: Duration },
    /// The source sent less than the minimum within a window ([`super::Settings::min_bytes_per_window`]):
    /// a server that drips its answers holds a copy slot no longer.
    #[error("source server sent {read} bytes in {window:?}, under the minimum of {min}")]
    Slow {
        read: u64,
        min: u64,
        window: Duration,
    },
    /// The source refused the dump or sent something that is not one.
    #[error("source server's item dump: {0}")]
    Dump(#[from] DumpError),
    /// A server answered something the copy cannot go on from (an error line, a malformed answer, a
    /// target out of memory).
    #[error("{side} server answered {answer:?}")]
    Protocol { side: Side, answer: String },
}

impl CopyError {
    /// Whether the source refused the dump because another crawl is running (`BUSY`): asked again.
    pub fn source_busy(&self) -> bool {
        matches!(self, Self::Dump(DumpError::Refused(answer)) if answer.starts_with("BUSY"))
    }

    /// A short stable label for metrics: `connect`, `tls`, `auth`, `closed`, `io`, `timeout`, `stalled`,
    /// `slow`, `refused` (the dump) or `protocol`.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Link { error, .. } => error.reason(),
            Self::Timeout(_) => "timeout",
            Self::Stalled { .. } => "stalled",
            Self::Slow { .. } => "slow",
            Self::Dump(DumpError::Refused(_)) => "refused",
            Self::Dump(DumpError::Malformed(_)) | Self::Protocol { .. } => "protocol",
        }
    }

    /// Every label [`CopyError::reason`] gives, so the metrics can drop an instance's series.
    pub const REASONS: [&'static str; 10] = [
        "connect", "tls", "auth", "closed", "io", "timeout", "stalled", "slow", "refused",
        "protocol",
    ];
}

/// A copy that stopped: why, and what it had done by then (the items copied stay copied).
#[derive(Debug, thiserror::Error)]
#[error("{error} ({} items, {} bytes copied in {:.1} s)", progress.copied, progress.bytes, progress.elapsed.as_secs_f64())]
pub struct Failure {
    #[source]
    pub error: CopyError,
    pub progress: Snapshot,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_error_has_a_listed_reason_and_says_which_side() {
        let errors = [
            CopyError::Link {
                side: Side::Target,
                error: LinkError::Connect(std::io::ErrorKind::ConnectionRefused.into()),
            },
            CopyError::Timeout(Duration::from_secs(1)),
            CopyError::Stalled {
                side: Side::Source,
                after: Duration::from_secs(1),
            },
            CopyError::Slow {
                read: 10,
                min: 100,
                window: Duration::from_secs(1),
            },
            CopyError::Dump(DumpError::Refused("BUSY".into())),
            CopyError::Protocol {
                side: Side::Target,
                answer: "SERVER_ERROR out of memory".into(),
            },
        ];
        for error in &errors {
            assert!(CopyError::REASONS.contains(&error.reason()), "{error}");
        }
        assert!(
            errors[0]
                .to_string()
                .starts_with("target server: cannot connect")
        );
        let failure = Failure {
            error: CopyError::Timeout(Duration::from_secs(2)),
            progress: Snapshot {
                copied: 3,
                bytes: 30,
                ..Snapshot::default()
            },
        };
        assert_eq!(
            failure.to_string(),
            "not finished within 2s (3 items, 30 bytes copied in 0.0 s)"
        );
    }
}
