//! Resolving the Secrets an instance references into a content hash, and keeping the auth file the
//! servers load ([`serve_auth_file`]).
//!
//! Secrets are watched metadata-only (their existence and resourceVersion, never their data), so their
//! values are read through the one reader ([`crate::store::secrets`]): once per resourceVersion, and of
//! each value only the SHA-256 is kept (with what, if anything, makes it an auth file memcached would
//! misread; never the value).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::api::DeleteParams;
use zeroize::Zeroizing;

use super::error::Error;
use crate::api::names::served_auth_name;
use crate::resources::proxy::identities::ClientCa;
use crate::resources::secrets::{self, SecretRef};
use crate::resources::{Instance, InvalidSpec, auth_file};
use crate::store::secrets::{KeyHashes, ReadError};
use crate::store::{Force, SecretReader, Writer};

/// The hashes the pod templates carry of the Secrets' content, keyed with the operator's digest key
/// (`None` where nothing is hashed).
pub struct Hashes {
    /// The servers'.
    pub servers: Option<String>,
    /// The proxy's (`resources::secrets::proxy_referenced`).
    pub proxy: Option<String>,
    /// With `spec.security.auth`: the user's auth file, for [`serve_auth_file`].
    pub auth_file: Option<UserFile>,
    /// With `spec.proxy.access`: the client CA the proxy trusts.
    pub client_ca: Option<ClientCa>,
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

/// Resolves the Secrets `instance` references, read through `reader`.
pub async fn resolve(reader: &SecretReader, instance: &Instance<'_>) -> Result<Resolved, Error> {
    reader.naming(instance.namespace, instance.name, instance.spec);
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
        let hashes = key_hashes(reader, instance.namespace, name, keep).await?;
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
    let client_ca = match client_ca(reader, instance).await? {
        Ok(ca) => ca,
        Err(problem) => return Ok(Resolved::Missing(problem)),
    };
    Ok(Resolved::Ready(Hashes {
        servers: keyed(reader, instance, servers).await?,
        proxy: keyed(reader, instance, proxy).await?,
        auth_file,
        client_ca,
    }))
}

/// The client CA of `spec.proxy.access` (`None` without it), or the problem that holds the instance: the
/// Secret or its key missing, or a bundle the proxy could not load.
async fn client_ca(
    reader: &SecretReader,
    instance: &Instance<'_>,
) -> Result<Result<Option<ClientCa>, InvalidSpec>, Error> {
    let Some(access) = instance.spec.proxy().and_then(|p| p.access.as_ref()) else {
        return Ok(Ok(None));
    };
    let (name, key) = (&access.client_ca.secret_name, access.ca_key());
    let value = reader
        .public_value(instance.namespace, name, key)
        .await
        .map_err(read_error)?;
    let field = "spec.proxy.access.clientCA";
    let Some(value) = value else {
        return Ok(Err(InvalidSpec {
            reason: "ClientCAMissing",
            message: format!(
                "{field}: Secret {}/{name} or its key {key} does not exist",
                instance.namespace
            ),
        }));
    };
    Ok(ClientCa::parse(&value)
        .map(Some)
        .map_err(|error| InvalidSpec {
            reason: "ClientCAInvalid",
            message: format!(
                "{field}: key {key} of Secret {}/{name} cannot be the proxy's client CA: {error}",
                instance.namespace
            ),
        }))
}

/// `digest` keyed with the operator's digest key, for `instance` (its namespace and UID).
async fn keyed(
    reader: &SecretReader,
    instance: &Instance<'_>,
    digest: Option<String>,
) -> Result<Option<String>, Error> {
    let Some(digest) = digest else {
        return Ok(None);
    };
    let key = reader.digest_key().await?;
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
/// instance's is left alone, and the instance is not applied. Written through `writer`; what this
/// process wrote is kept in `reader`.
pub async fn serve_auth_file(
    writer: &Writer,
    reader: &SecretReader,
    instance: &Instance<'_>,
    user_file: Option<&UserFile>,
) -> Result<(), Error> {
    let namespace = instance.namespace;
    let name = served_auth_name(instance.name);
    let live = reader.cached(namespace, &name);
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
    let (Some(auth), Some(user_file)) = (instance.spec.auth(), user_file) else {
        if live.is_some_and(|l| l.metadata.deletion_timestamp.is_none()) {
            let params = DeleteParams::background();
            writer.delete::<Secret>(namespace, &name, &params).await?;
        }
        return Ok(());
    };
    let version = live
        .as_ref()
        .and_then(|l| l.metadata.resource_version.clone());
    if reader.serves(namespace, &name, version.as_deref(), &user_file.hash) {
        return Ok(());
    }
    let file = match &user_file.read {
        Some(file) => file.clone(),
        None => match reader
            .value(namespace, &auth.secret_name, auth.key())
            .await
            .map_err(read_error)?
        {
            Some(file) => file,
            // Gone meanwhile: the Secret watch brings the instance back.
            None => return Ok(()),
        },
    };
    let key = reader.digest_key().await?;
    let owner = secrets::Owner {
        namespace,
        uid: instance.uid(),
    };
    let password = secrets::operator_password(key, &owner);
    let served = auth_file::served(&file, &password);
    let desired = auth_file::served_secret(instance, auth.key(), &served);
    // Forced over the instance's own Secret only (see `children::ensure`).
    let force = if live.is_some() {
        Force::Yes
    } else {
        Force::No
    };
    let applied: Secret = writer.apply(namespace, &name, &desired, force).await?;
    drop(desired);
    if let Some(version) = applied.metadata.resource_version {
        let hash = secrets::hash_value(&file);
        reader.wrote_served(namespace, &name, version, hash);
    }
    Ok(())
}

/// The controller's error for a Secret that could not be read.
fn read_error(error: ReadError) -> Error {
    let ReadError {
        namespace,
        name,
        source,
    } = error;
    Error::SecretRead {
        namespace,
        name,
        source,
    }
}

/// The per-key hashes of Secret `namespace/name` at its current version (read when not known yet); with
/// `keep`, the value of that key goes to its slot when the Secret is read now.
async fn key_hashes(
    reader: &SecretReader,
    namespace: &str,
    name: &str,
    keep: Option<(&str, &mut Option<Zeroizing<Vec<u8>>>)>,
) -> Result<Option<KeyHashes>, Error> {
    let Some((hashes, value)) = reader
        .hashes(namespace, name, keep.as_ref().map(|(key, _)| *key))
        .await
        .map_err(read_error)?
    else {
        return Ok(None);
    };
    if let Some((_, slot)) = keep {
        *slot = value;
    }
    Ok(Some(hashes))
}
