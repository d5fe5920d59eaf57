//! Typed reconcile errors. Each has a `kind` for metrics and says whether it is worth a `Degraded`
//! condition (a problem a person must fix) or is transient (retried with backoff, nothing to report).

use crate::status::Problem;
use crate::store::WriteError;
use crate::store::digest_key::KeyError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An apply or delete of a child (or of what warm handover writes) that failed.
    #[error(transparent)]
    Write(#[from] WriteError),

    #[error("failed to read Secret {namespace}/{name}: {source}")]
    SecretRead {
        namespace: String,
        name: String,
        #[source]
        source: kube::Error,
    },

    /// The key of the Secrets' hash could not be read or made (see [`crate::store::digest_key`]).
    #[error(transparent)]
    DigestKey(#[from] KeyError),

    #[error(
        "{kind} {name} is controlled by another owner (uid {owner_uid}), not by this Memcached"
    )]
    ForeignOwner {
        kind: String,
        name: String,
        owner_uid: String,
    },

    #[error(
        "{kind} {name} exists and is not managed by this operator (it lacks the label app.kubernetes.io/managed-by=memcached-operator)"
    )]
    NotManaged { kind: String, name: String },

    #[error("failed to update the status of Memcached {name}: {source}")]
    Status {
        name: String,
        #[source]
        source: kube::Error,
    },

    #[error("failed to remove the finalizer an earlier build of the operator added: {0}")]
    Finalizer(#[source] kube::Error),

    #[error("the Memcached object is malformed: {0}")]
    Malformed(String),
}

impl Error {
    /// Short, stable label for the `reconcile_errors` metric.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Write(error) => error.kind(),
            Self::SecretRead { .. } => "secret",
            Self::DigestKey(_) => "digest_key",
            Self::ForeignOwner { .. } => "foreign_owner",
            Self::NotManaged { .. } => "not_managed",
            Self::Status { .. } => "status",
            Self::Finalizer(_) => "finalizer",
            Self::Malformed(_) => "malformed",
        }
    }

    /// Whether the request got no answer at all (a refused or cut connection, a timeout): the API server
    /// is unreachable, which the operator reports once for the whole outage (see `connectivity`), not per
    /// failed reconcile.
    pub fn unanswered(&self) -> bool {
        let source = match self {
            Self::SecretRead { source, .. }
            | Self::DigestKey(KeyError::Api { source, .. })
            | Self::Status { source, .. }
            | Self::Finalizer(source) => source,
            Self::ForeignOwner { .. }
            | Self::NotManaged { .. }
            | Self::Malformed(_)
            | Self::DigestKey(KeyError::Malformed { .. }) => {
                return false;
            }
            Self::Write(error) => return error.unanswered(),
        };
        matches!(source, kube::Error::Service(_) | kube::Error::HyperError(_))
    }

    /// The condition to surface for errors a retry alone will not fix: requests the API server rejects as
    /// invalid or forbidden, and children someone else controls. Transient failures (conflicts, 5xx,
    /// network) return `None`: they are retried with backoff and not reported as `Degraded`.
    pub fn problem(&self) -> Option<Problem> {
        match self {
            Self::Write(error) => error.problem(),
            Self::SecretRead {
                namespace,
                name,
                source: kube::Error::Api(status),
            } if status.code == 403 => Some(Problem {
                reason: "SecretUnreadable".into(),
                message: format!(
                    "the operator may not read Secret {namespace}/{name}: {}; check its RBAC",
                    status.message
                ),
            }),
            Self::DigestKey(KeyError::Api {
                source: kube::Error::Api(status),
                ..
            }) if status.code == 403 => Some(Problem {
                reason: "DigestKeyUnavailable".into(),
                message: format!("{self}; check its RBAC"),
            }),
            Self::DigestKey(KeyError::Malformed { .. }) => Some(Problem {
                reason: "DigestKeyUnavailable".into(),
                message: self.to_string(),
            }),
            Self::ForeignOwner { .. } => Some(Problem {
                reason: "OwnershipConflict".into(),
                message: format!(
                    "{self}; delete it or rename this Memcached (an old object is removed by garbage collection \
                     shortly after its owner is deleted)"
                ),
            }),
            Self::NotManaged { .. } => Some(Problem {
                reason: "OwnershipConflict".into(),
                message: format!(
                    "{self}; it is left untouched: delete or rename it, or rename this Memcached"
                ),
            }),
            _ => None,
        }
    }
}
