//! Resolving the Secrets an instance references into a content hash.
//!
//! Secrets are watched metadata-only (their existence and resourceVersion, never their data), so the
//! operator neither caches every Secret's content nor needs a read per reconcile: a Secret is read once per
//! resourceVersion, and only the SHA-256 of each value is kept (with what, if anything, makes it an auth
//! file memcached would misread; never the value).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::Secret;
use kube::api::PartialObjectMeta;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Api, ResourceExt};

use super::{Context, Error};
use crate::resources::secrets::{self, KeyDigest, SecretRef};
use crate::resources::{Instance, InvalidSpec};

/// Value digests per key of one Secret version.
type KeyHashes = BTreeMap<String, KeyDigest>;
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
        self.lock()
            .get(&(namespace.to_owned(), name.to_owned()))
            .filter(|(v, _)| v == version)
            .map(|(_, hashes)| hashes.clone())
    }

    fn put(&self, namespace: &str, name: &str, version: String, hashes: KeyHashes) {
        self.lock()
            .insert((namespace.to_owned(), name.to_owned()), (version, hashes));
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Entries> {
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether hashes of `namespace/name` are kept (any version).
    #[cfg(test)]
    fn holds(&self, namespace: &str, name: &str) -> bool {
        self.lock()
            .contains_key(&(namespace.to_owned(), name.to_owned()))
    }

    /// The observer of the Secret watch: a Secret seen deleted takes its hashes with it, and a relist (after
    /// a watch expired, or the API server came back) keeps only the Secrets it lists, since one deleted
    /// meanwhile sends no deletion. Without it the hashes of every Secret ever read would stay for the life
    /// of the process.
    pub fn observer(&self) -> impl Fn(&watcher::Event<PartialObjectMeta<Secret>>) + Send + 'static {
        let hashes = self.clone();
        // The Secrets of the relist in progress, if one is.
        let relisted: Mutex<Option<HashSet<(String, String)>>> = Mutex::default();
        move |event| {
            let key = |secret: &PartialObjectMeta<Secret>| {
                (secret.namespace().unwrap_or_default(), secret.name_any())
            };
            let mut relisted = relisted.lock().unwrap_or_else(|e| e.into_inner());
            match event {
                watcher::Event::Delete(secret) => {
                    hashes.lock().remove(&key(secret));
                }
                watcher::Event::Init => *relisted = Some(HashSet::new()),
                watcher::Event::InitApply(secret) => {
                    if let Some(listed) = relisted.as_mut() {
                        listed.insert(key(secret));
                    }
                }
                watcher::Event::InitDone => {
                    if let Some(listed) = relisted.take() {
                        hashes.lock().retain(|key, _| listed.contains(key));
                    }
                }
                watcher::Event::Apply(_) => {}
            }
        }
    }
}

/// The hashes the pod templates carry of the Secrets' content, keyed with the operator's digest key
/// (`None` where nothing is hashed).
pub struct Hashes {
    /// The servers'.
    pub servers: Option<String>,
    /// The proxy's (`resources::secrets::proxy_referenced`).
    pub proxy: Option<String>,
}

/// What resolving the Secrets gave.
pub enum Resolved {
    /// Every Secret and key is there, and the hashes of their content.
    Ready(Hashes),
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
    let has_ca = instance
        .spec
        .tls()
        .and_then(|tls| contents.get(&tls.secret_name))
        .and_then(Option::as_ref)
        .is_some_and(|keys| keys.contains_key("ca.crt"));
    let tls = secrets::tls_reload(instance.spec, instance.stats_collected, has_ca);
    let digests = secrets::digest(instance.namespace, &refs, &contents, tls).and_then(|servers| {
        Ok((
            servers,
            secrets::proxy_digest(instance.namespace, instance.spec, &contents)?,
        ))
    });
    let (servers, proxy) = match digests {
        Ok(digests) => digests,
        Err(missing) => return Ok(Resolved::Missing(missing)),
    };
    Ok(Resolved::Ready(Hashes {
        servers: keyed(ctx, servers).await?,
        proxy: keyed(ctx, proxy).await?,
    }))
}

/// `digest` keyed with the operator's digest key.
async fn keyed(ctx: &Context, digest: Option<String>) -> Result<Option<String>, Error> {
    let Some(digest) = digest else {
        return Ok(None);
    };
    let key = ctx.digest_key.bytes(&ctx.writer.client).await?;
    Ok(Some(secrets::keyed(key, &digest)))
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
    let api: Api<Secret> = ctx.writer.api(namespace);
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
        .map(|(key, value)| (key, KeyDigest::of(&value.0)))
        .collect();
    let version = secret.metadata.resource_version.unwrap_or(version);
    ctx.secret_hashes
        .put(namespace, name, version, hashes.clone());
    Ok(Some(hashes))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret(namespace: &str, name: &str) -> PartialObjectMeta<Secret> {
        let mut secret = PartialObjectMeta::<Secret>::default();
        secret.metadata.name = Some(name.into());
        secret.metadata.namespace = Some(namespace.into());
        secret
    }

    fn hashes_of(names: &[(&str, &str)]) -> SecretHashes {
        let hashes = SecretHashes::default();
        for (namespace, name) in names {
            hashes.put(namespace, name, "1".into(), KeyHashes::new());
        }
        hashes
    }

    #[test]
    fn a_deleted_secret_takes_its_hashes_with_it() {
        let hashes = hashes_of(&[("ns", "auth"), ("ns", "tls"), ("other", "auth")]);
        let observe = hashes.observer();
        observe(&watcher::Event::Delete(secret("ns", "auth")));
        assert!(!hashes.holds("ns", "auth"));
        assert!(hashes.holds("ns", "tls"), "another Secret stays");
        assert!(
            hashes.holds("other", "auth"),
            "the same name elsewhere stays"
        );
        observe(&watcher::Event::Apply(secret("ns", "tls")));
        assert!(
            hashes.holds("ns", "tls"),
            "a change is found by its version"
        );
    }

    #[test]
    fn a_relist_keeps_only_the_secrets_it_lists() {
        let hashes = hashes_of(&[("ns", "auth"), ("ns", "gone")]);
        let observe = hashes.observer();
        observe(&watcher::Event::Init);
        observe(&watcher::Event::InitApply(secret("ns", "auth")));
        assert!(
            hashes.holds("ns", "gone"),
            "nothing goes before the list is complete"
        );
        observe(&watcher::Event::InitDone);
        assert!(hashes.holds("ns", "auth"));
        assert!(
            !hashes.holds("ns", "gone"),
            "deleted while the watch was down"
        );
        // Hashes read after the relist are not dropped by a later, unrelated InitDone without an Init.
        hashes.put("ns", "new", "1".into(), KeyHashes::new());
        observe(&watcher::Event::InitDone);
        assert!(hashes.holds("ns", "new"));
    }
}
