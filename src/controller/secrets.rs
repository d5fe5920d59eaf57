//! Resolving the Secrets an instance references into a content hash.
//!
//! Secrets are watched metadata-only (their existence and resourceVersion, never their data), so the
//! operator neither caches every Secret's content nor needs a read per reconcile: a Secret is read once per
//! resourceVersion, and only the SHA-256 of each value is kept.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::runtime::reflector::ObjectRef;

use super::{Context, Error};
use crate::resources::secrets::{self, SecretRef};
use crate::resources::{Instance, InvalidSpec};

/// Value hashes per key of one Secret version.
type KeyHashes = BTreeMap<String, String>;
/// (namespace, name) of a Secret → (resourceVersion, value hashes).
type Entries = HashMap<(String, String), (String, KeyHashes)>;

/// Per-key value hashes of the Secrets read so far, by namespace, name and resourceVersion. Cloning
/// shares the cache.
#[derive(Clone, Default)]
pub struct SecretHashes {
    entries: Arc<Mutex<Entries>>,
}

impl SecretHashes {
    fn get(&self, namespace: &str, name: &str, version: &str) -> Option<KeyHashes> {
        let entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        entries
            .get(&(namespace.to_owned(), name.to_owned()))
            .filter(|(v, _)| v == version)
            .map(|(_, hashes)| hashes.clone())
    }

    fn put(&self, namespace: &str, name: &str, version: String, hashes: KeyHashes) {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        entries.insert((namespace.to_owned(), name.to_owned()), (version, hashes));
    }
}

/// What resolving the Secrets gave.
pub enum Resolved {
    /// Every Secret and key is there; the hash of their content (`None` when none are referenced).
    Ready(Option<String>),
    /// A Secret or key is missing: report it, apply nothing, and wait for the Secret watch.
    Missing(InvalidSpec),
}

/// Resolves the Secrets `instance` references.
pub async fn resolve(ctx: &Context, instance: &Instance<'_>) -> Result<Resolved, Error> {
    let refs = secrets::referenced(instance.spec);
    let mut contents = BTreeMap::new();
    for SecretRef { name, .. } in &refs {
        let hashes = key_hashes(ctx, instance.namespace, name).await?;
        contents.insert(name.clone(), hashes);
    }
    Ok(
        match secrets::digest(instance.namespace, &refs, &contents) {
            Ok(hash) => Resolved::Ready(hash),
            Err(missing) => Resolved::Missing(missing),
        },
    )
}

async fn key_hashes(
    ctx: &Context,
    namespace: &str,
    name: &str,
) -> Result<Option<KeyHashes>, Error> {
    let Some(meta) = ctx
        .stores
        .secrets
        .get(&ObjectRef::new(name).within(namespace))
    else {
        return Ok(None);
    };
    let version = meta.metadata.resource_version.clone().unwrap_or_default();
    if let Some(hashes) = ctx.secret_hashes.get(namespace, name, &version) {
        return Ok(Some(hashes));
    }
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), namespace);
    let secret = api
        .get_opt(name)
        .await
        .map_err(|source| Error::SecretRead {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            source,
        })?;
    let Some(secret) = secret else {
        return Ok(None);
    };
    let hashes: KeyHashes = secret
        .data
        .unwrap_or_default()
        .into_iter()
        .map(|(key, value)| (key, secrets::hash_value(&value.0)))
        .collect();
    let version = secret.metadata.resource_version.unwrap_or(version);
    ctx.secret_hashes
        .put(namespace, name, version, hashes.clone());
    Ok(Some(hashes))
}
