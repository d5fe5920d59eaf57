//! A spec the operator cannot realise ([`InvalidSpec`]): what every check returns, reported as
//! `Degraded` with its reason.

/// A spec the operator cannot realise, found before anything is applied. Reported as `Degraded`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{reason}: {message}")]
pub struct InvalidSpec {
    /// CamelCase condition reason.
    pub reason: &'static str,
    /// Human-readable explanation naming the offending field.
    pub message: String,
}

/// Reason of every spec check that the schema cannot express (see [`validate`](super::validate)).
pub const INVALID_CONFIG: &str = "InvalidConfig";

impl InvalidSpec {
    /// A spec check failed: reason [`INVALID_CONFIG`], `message` naming the field.
    pub(crate) fn config(message: String) -> Self {
        Self {
            reason: INVALID_CONFIG,
            message,
        }
    }
}
