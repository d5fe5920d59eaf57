//! The write side of storage: the client that sends the operator's writes, the answers it keeps until the
//! caches catch up (read-your-writes), and the event publisher. What a reconcile and warm handover write
//! through: every write's refusal is a [`WriteError`], and every request is counted by the client's
//! observer layer (`crate::observe`).
//!
//! The stats collector writes `status.stats` through a writer of its own (its own field manager).
//!
//! Who keeps a write's answer until the caches catch up: the children's applies keep it in [`Written`];
//! the served auth file's, the Secret reader's cache (`super::secrets`: the version written); a pod's
//! (a handover gate, a source's deletion cost, the spare server), warm handover's registry, which reads
//! the pod cache for no more than it wrote.

use std::fmt::Debug;
use std::sync::Arc;

use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::{Api, Client, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::events::Publisher;
use super::written::Written;
use crate::resources::labels;
use crate::status::Problem;

/// Source of "now" for what the operator writes (condition transition times, handover bounds); pinned
/// in tests.
pub type Clock = Arc<dyn Fn() -> Time + Send + Sync>;

/// Whether a server-side apply takes over fields another manager set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Force {
    /// Over an object the operator manages, to take back fields someone else changed.
    Yes,
    /// Creating: an object of that name that is not the operator's answers 409 and is left alone.
    No,
}

/// The client, read-your-writes and the event publisher. Cloning shares them.
#[derive(Clone)]
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

    /// Server-side applies `desired` as object `name` in `namespace`, under the operator's field
    /// manager; the API server's answer.
    pub async fn apply<K, P>(
        &self,
        namespace: &str,
        name: &str,
        desired: &P,
        force: Force,
    ) -> Result<K, WriteError>
    where
        K: Resource<Scope = NamespaceResourceScope> + Clone + DeserializeOwned + Debug,
        K::DynamicType: Default,
        P: Serialize + Debug,
    {
        let mut params = PatchParams::apply(labels::MANAGER_NAME);
        if force == Force::Yes {
            params = params.force();
        }
        self.api::<K>(namespace)
            .patch(name, &params, &Patch::Apply(desired))
            .await
            .map_err(|source| WriteError::Apply {
                kind: K::kind(&K::DynamicType::default()).into_owned(),
                name: name.to_owned(),
                source,
            })
    }

    /// Server-side applies `patch` to the status subresource of object `name` under `field_manager`
    /// (forced: the fields that manager owns are its own); the API server's answer.
    pub async fn apply_status<K, P>(
        &self,
        namespace: &str,
        name: &str,
        patch: &P,
        field_manager: &str,
    ) -> Result<K, WriteError>
    where
        K: Resource<Scope = NamespaceResourceScope> + Clone + DeserializeOwned + Debug,
        K::DynamicType: Default,
        P: Serialize + Debug,
    {
        let params = PatchParams::apply(field_manager).force();
        self.api::<K>(namespace)
            .patch_status(name, &params, &Patch::Apply(patch))
            .await
            .map_err(|source| WriteError::Apply {
                kind: K::kind(&K::DynamicType::default()).into_owned(),
                name: name.to_owned(),
                source,
            })
    }

    /// Patches the status subresource of object `name` with `patch`. `Ok(None)`: the object is gone.
    pub async fn patch_status<K, P>(
        &self,
        namespace: &str,
        name: &str,
        patch: &Patch<P>,
    ) -> Result<Option<K>, WriteError>
    where
        K: Resource<Scope = NamespaceResourceScope> + Clone + DeserializeOwned + Debug,
        K::DynamicType: Default,
        P: Serialize + Debug,
    {
        let api = self.api::<K>(namespace);
        match api.patch_status(name, &PatchParams::default(), patch).await {
            Ok(answer) => Ok(Some(answer)),
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(None),
            Err(source) => Err(WriteError::Apply {
                kind: K::kind(&K::DynamicType::default()).into_owned(),
                name: name.to_owned(),
                source,
            }),
        }
    }

    /// Deletes object `name` in `namespace` with `params`; whether it was there (one already gone, a
    /// 404, needs nothing).
    pub async fn delete<K>(
        &self,
        namespace: &str,
        name: &str,
        params: &DeleteParams,
    ) -> Result<bool, WriteError>
    where
        K: Resource<Scope = NamespaceResourceScope> + Clone + DeserializeOwned + Debug,
        K::DynamicType: Default,
    {
        match self.api::<K>(namespace).delete(name, params).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(false),
            Err(source) => Err(WriteError::Delete {
                kind: K::kind(&K::DynamicType::default()).into_owned(),
                name: name.to_owned(),
                source,
            }),
        }
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
