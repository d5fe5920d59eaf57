//! Resolving the Secrets an instance references into a content hash, and keeping the auth file the
//! servers load ([`serve_auth_file`]).
//!
//! Secrets are watched metadata-only (their existence and resourceVersion, never their data), so the
//! operator neither caches every Secret's content nor needs a read per reconcile: a Secret is read once per
//! resourceVersion, and only the SHA-256 of each value is kept (with what, if anything, makes it an auth
//! file memcached would misread; never the value).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::Secret;
use kube::api::{DeleteParams, PartialObjectMeta, Patch, PatchParams};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Api, ResourceExt};
use zeroize::{Zeroize, Zeroizing};

use super::{Context, Error};
use crate::api::names::served_auth_name;
use crate::resources::secrets::{self, KeyDigest, SecretRef};
use crate::resources::{Instance, InvalidSpec, auth_file, labels};
use crate::store::WriteError;

/// What [`SecretHashes`] keeps of a served auth file: under this (no Secret key: it has a `/`), the hash
/// of the user's file it holds.
const SERVED_KEY: &str = "/served";

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

    /// Whether the served auth file `namespace/name`, cached at version `live` (`None`: not cached),
    /// holds the user's file of hash `hash` as this process wrote it ([`serve_auth_file`]): at the
    /// version it wrote, or at one the Secret watch has not caught up with yet (none, or an older
    /// integer version, as right after the write). The watch drops the entry when the Secret is
    /// deleted, so a deleted file is written again.
    fn serves(&self, namespace: &str, name: &str, live: Option<&str>, hash: &str) -> bool {
        let entries = self.lock();
        let Some((written, hashes)) = entries.get(&(namespace.to_owned(), name.to_owned())) else {
            return false;
        };
        let lags = |live: &str| match (live.parse::<u64>(), written.parse::<u64>()) {
            (Ok(live), Ok(written)) => live < written,
            _ => false,
        };
        hashes.get(SERVED_KEY).is_some_and(|d| d.hash == hash)
            && live.is_none_or(|live| live == written || lags(live))
    }

    fn put_served(&self, namespace: &str, name: &str, version: String, hash: String) {
        let digest = KeyDigest {
            hash,
            auth_file: Ok(()),
        };
        let hashes = KeyHashes::from([(SERVED_KEY.to_owned(), digest)]);
        self.put(namespace, name, version, hashes);
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
    /// With `spec.security.auth`: the user's auth file, for [`serve_auth_file`].
    pub auth_file: Option<UserFile>,
}

/// The user's auth file as the reconcile knows it: the hash of its value and, when its Secret was read
/// by this reconcile, the value itself (else [`serve_auth_file`] reads it when it needs it).
pub struct UserFile {
    pub hash: String,
    pub read: Option<Zeroizing<Vec<u8>>>,
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
    let mut read = None;
    for SecretRef {
        name, auth_file, ..
    } in &refs
    {
        // The auth file's value is kept for this reconcile when its Secret is read now.
        let keep = instance
            .spec
            .auth()
            .filter(|_| *auth_file)
            .map(|auth| (auth.key(), &mut read));
        let hashes = key_hashes(ctx, instance.namespace, name, keep).await?;
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
    let auth_file = instance.spec.auth().and_then(|auth| {
        let keys = contents.get(&auth.secret_name)?.as_ref()?;
        let hash = keys.get(auth.key())?.hash.clone();
        Some(UserFile { hash, read })
    });
    Ok(Resolved::Ready(Hashes {
        servers: keyed(ctx, instance, servers).await?,
        proxy: keyed(ctx, instance, proxy).await?,
        auth_file,
    }))
}

/// `digest` keyed with the operator's digest key, for `instance` (its namespace and UID).
async fn keyed(
    ctx: &Context,
    instance: &Instance<'_>,
    digest: Option<String>,
) -> Result<Option<String>, Error> {
    let Some(digest) = digest else {
        return Ok(None);
    };
    let key = ctx.digest_key.bytes(&ctx.writer.client).await?;
    let owner = secrets::Owner {
        namespace: instance.namespace,
        uid: instance.uid(),
    };
    Ok(Some(secrets::keyed(key, &owner, &digest)))
}

/// Keeps the Secret `<name>-auth-file` the servers load (`auth_file::served`): the user's file, whose
/// hash is `user_file` (`None`: auth is off), and the operator's own entry. Written when the Secret is
/// missing, changed by someone, or its user part is not `user_file`'s (known from what this process
/// wrote at its current version: after a restart, one apply per instance, which changes nothing when
/// the content is the same); deleted when auth is off. A Secret of that name that is not the
/// instance's is left alone, and the instance is not applied.
pub async fn serve_auth_file(
    ctx: &Context,
    instance: &Instance<'_>,
    user_file: Option<&UserFile>,
) -> Result<(), Error> {
    let namespace = instance.namespace;
    let name = served_auth_name(instance.name);
    let live = ctx
        .stores
        .secrets
        .get(&ObjectRef::new(&name).within(namespace));
    if let Some(live) = &live
        && !live
            .owner_references()
            .iter()
            .any(|o| o.controller == Some(true) && o.uid == instance.uid())
    {
        return Err(Error::NotManaged {
            kind: "Secret".to_owned(),
            name,
        });
    }
    let api: Api<Secret> = ctx.writer.api(namespace);
    let (Some(auth), Some(user_file)) = (instance.spec.auth(), user_file) else {
        if live.is_some_and(|l| l.metadata.deletion_timestamp.is_none()) {
            match api.delete(&name, &DeleteParams::background()).await {
                Ok(_) => {}
                Err(kube::Error::Api(status)) if status.code == 404 => {}
                Err(source) => {
                    let kind = "Secret".to_owned();
                    return Err(WriteError::Delete { kind, name, source }.into());
                }
            }
        }
        return Ok(());
    };
    let version = live
        .as_ref()
        .and_then(|l| l.metadata.resource_version.clone());
    if ctx
        .secret_hashes
        .serves(namespace, &name, version.as_deref(), &user_file.hash)
    {
        return Ok(());
    }
    let file = match &user_file.read {
        Some(file) => file.clone(),
        None => match read_user_file(&api, namespace, auth).await? {
            Some(file) => file,
            // Gone meanwhile: the Secret watch brings the instance back.
            None => return Ok(()),
        },
    };
    let key = ctx.digest_key.bytes(&ctx.writer.client).await?;
    let owner = secrets::Owner {
        namespace,
        uid: instance.uid(),
    };
    let password = secrets::operator_password(key, &owner);
    let served = auth_file::served(&file, &password);
    let desired = auth_file::served_secret(instance, auth.key(), &served);
    // Forced over the instance's own Secret only (see `children::ensure`).
    let mut params = PatchParams::apply(labels::MANAGER_NAME);
    if live.is_some() {
        params = params.force();
    }
    let applied = api
        .patch(&name, &params, &Patch::Apply(&desired))
        .await
        .map_err(|source| WriteError::Apply {
            kind: "Secret".to_owned(),
            name: name.clone(),
            source,
        })?;
    drop(desired);
    if let Some(version) = applied.metadata.resource_version {
        let hash = secrets::hash_value(&file);
        ctx.secret_hashes
            .put_served(namespace, &name, version, hash);
    }
    Ok(())
}

/// The user's auth file, read from its Secret (`None`: the Secret or the key is gone).
async fn read_user_file(
    api: &Api<Secret>,
    namespace: &str,
    auth: &crate::api::AuthConfig,
) -> Result<Option<Zeroizing<Vec<u8>>>, Error> {
    let read = api
        .get_opt(&auth.secret_name)
        .await
        .map_err(|source| Error::SecretRead {
            namespace: namespace.to_owned(),
            name: auth.secret_name.clone(),
            source,
        })?;
    Ok(read
        .and_then(|s| s.data)
        .and_then(|mut data| data.remove(auth.key()))
        .map(|value| Zeroizing::new(value.0)))
}

/// The per-key hashes of Secret `namespace/name` at its current version (read when not known yet); with
/// `keep`, the value of that key goes to its slot when the Secret is read now.
async fn key_hashes(
    ctx: &Context,
    namespace: &str,
    name: &str,
    keep: Option<(&str, &mut Option<Zeroizing<Vec<u8>>>)>,
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
    let mut data = secret.data.unwrap_or_default();
    let hashes: KeyHashes = data
        .iter()
        .map(|(key, value)| (key.clone(), KeyDigest::of(&value.0)))
        .collect();
    if let Some((key, slot)) = keep {
        *slot = data.remove(key).map(|value| Zeroizing::new(value.0));
    }
    for value in data.values_mut() {
        value.0.zeroize();
    }
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

    /// A served auth file this process wrote is current at the version it wrote and while the watch
    /// lags behind that write (a reconcile right after it rewrote the file over and over under load);
    /// a later version (someone changed it) or another user file is not.
    #[test]
    fn a_served_file_is_current_while_the_watch_lags_behind_its_write() {
        let hashes = SecretHashes::default();
        hashes.put_served("ns", "cache-auth-file", "7".into(), "h".into());
        assert!(hashes.serves("ns", "cache-auth-file", Some("7"), "h"));
        assert!(hashes.serves("ns", "cache-auth-file", None, "h"));
        assert!(hashes.serves("ns", "cache-auth-file", Some("5"), "h"));
        assert!(!hashes.serves("ns", "cache-auth-file", Some("9"), "h"));
        assert!(!hashes.serves("ns", "cache-auth-file", Some("7"), "other"));
        assert!(!hashes.serves("ns", "other-auth-file", None, "h"));
    }
}
