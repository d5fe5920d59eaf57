//! The write side of storage: the client that sends the operator's writes, the answers it keeps until the
//! caches catch up (read-your-writes), and the event publisher. What a reconcile writes through.

use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::{Api, Client, Resource};

use super::events::Publisher;
use super::written::Written;
use crate::status::Problem;

/// Source of "now" for what the operator writes (condition transition times, handover bounds); pinned
/// in tests.
pub type Clock = Arc<dyn Fn() -> Time + Send + Sync>;

/// The client, read-your-writes and the event publisher.
pub struct Writer {
    pub client: Client,
    /// The answers to this operator's latest writes, until the caches catch up; shared with the watches,
    /// which end an answer when they see the object deleted.
    pub written: Arc<Written>,
    pub events: Arc<Publisher>,
}

impl Writer {
    /// The API of `K` in `namespace`, through this writer's client.
    pub fn api<K>(&self, namespace: &str) -> Api<K>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        K::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), namespace)
    }
}

/// A write the API server refused or did not answer: an apply or a delete of one object.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    #[error("failed to apply {kind} {name}: {source}")]
    Apply {
        kind: String,
        name: String,
        #[source]
        source: kube::Error,
    },

    #[error("failed to delete {kind} {name}: {source}")]
    Delete {
        kind: String,
        name: String,
        #[source]
        source: kube::Error,
    },
}

impl WriteError {
    /// Short, stable label for the `reconcile_errors` metric.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Apply { .. } => "apply",
            Self::Delete { .. } => "delete",
        }
    }

    /// Whether the request got no answer at all (a refused or cut connection, a timeout).
    pub fn unanswered(&self) -> bool {
        let (Self::Apply { source, .. } | Self::Delete { source, .. }) = self;
        matches!(source, kube::Error::Service(_) | kube::Error::HyperError(_))
    }

    /// The condition a refusal a retry alone will not fix is worth: an apply the API server rejects as
    /// invalid or forbidden.
    pub fn problem(&self) -> Option<Problem> {
        match self {
            Self::Apply {
                kind,
                name,
                source: kube::Error::Api(status),
            } if matches!(status.code, 400 | 403 | 422) => Some(Problem {
                reason: "ApplyRejected".into(),
                message: format!("the API server rejected {kind} {name}: {}", status.message),
            }),
            _ => None,
        }
    }
}
