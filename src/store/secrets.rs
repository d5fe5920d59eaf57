//! The one reader of Secrets' values, for every part of the operator that needs them: the reconciler
//! (the hash of their content in the pod templates, the user's auth file it serves), the stats
//! collector and warm handover (the TLS material to connect with, and the operator's own credentials).
//!
//! The credentials are the operator's own: the entry it adds to the auth file the servers load
//! (`crate::resources::auth_file::served`), its password derived from the operator's digest key and the
//! instance's namespace and UID. [`SecretReader::transport`] never asks for the user's auth file, so
//! none of its passwords is held or sent by the collector or the warm handover; the reconciler gets the
//! user's file for the one reconcile that serves it ([`SecretReader::hashes`]' `keep`), never kept.
//!
//! The operator watches Secrets by metadata only, so their values are read with a GET, and only for the
//! Secrets an instance names. Each Secret is read once per `resourceVersion` (the metadata cache says
//! which version is current), whoever asks first, and what was read stays in the one cache
//! ([`cache`]): of every key the SHA-256 of its value, and the values of only the keys the collector and
//! the handover use (`tls.crt`, `tls.key`, `ca.crt`; `tls.key` also to check that a rotated certificate
//! goes with its key before servers are asked to load them). Nothing read is ever logged, put in an
//! event or a status. Every value is wiped from memory when it is dropped (a newer version read, the
//! Secret no longer named by any instance or deleted, its instance forgotten); the other keys of the
//! Secret are wiped as soon as it is read. (The answer's bytes in the HTTP client's buffers are beyond
//! the operator's reach.) The operator's RBAC allows `get` on Secrets, nothing more is needed.

pub mod cache;

use std::collections::BTreeSet;
use std::sync::Arc;

use zeroize::{Zeroize, Zeroizing};

use crate::api::MemcachedSpec;
use crate::api::names::served_auth_name;
use crate::connection::{CertificateDigest, Credentials, TlsClient, TlsMaterial, matching_pair};
use crate::resources::auth_file::OPERATOR_USER;
use crate::resources::secrets::{KeyDigest, Owner, operator_password};
use crate::store::digest_key::{DigestKey, KeyError};
use k8s_openapi::api::core::v1::Secret;
use kube::api::PartialObjectMeta;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, Client};

pub use cache::{InstanceKey, KeyHashes, SecretCache, SecretKey, Values};

/// How to talk to an instance's servers.
#[derive(Clone, Default)]
pub struct Transport {
    pub tls: Option<TlsClient>,
    pub credentials: Option<Arc<Credentials>>,
    /// The operator presents the server's own certificate as its client certificate: `clientAuth` is on
    /// and `clientSecretName` unset (kept for instances created before that field; the collector says so
    /// once per instance).
    pub presents_server_certificate: bool,
    /// Over TLS: the certificate the servers should present, the leaf of the TLS Secret's `tls.crt`, when
    /// `tls.key` goes with it (else why not: then no server is asked to load them).
    pub certificate: Option<Result<CertificateDigest, String>>,
}

/// Told the TLS Secret's certificate (or why it cannot be loaded) and CA as read, gives the CA to trust
/// besides (the previous one, during a rotation: see `telemetry::reload::Reload`).
pub type TrustPrevious<'a> =
    &'a (dyn Fn(Result<CertificateDigest, String>, Option<&[u8]>) -> Option<Vec<u8>> + Sync);

/// Every Secret the operator reads for instance `name` with `spec`: the TLS Secret, the client Secret, the
/// user's auth file and the served one the operator writes. What the cache keeps of them lives as long
/// as an instance names them.
pub fn named(namespace: &str, name: &str, spec: &MemcachedSpec) -> BTreeSet<SecretKey> {
    let tls = spec.tls().map(|t| t.secret_name.clone());
    let client = spec
        .tls()
        .filter(|t| t.client_auth)
        .and_then(|t| t.client_secret_name.clone());
    let auth = spec
        .auth()
        .map(|a| [a.secret_name.clone(), served_auth_name(name)]);
    let access = spec
        .proxy()
        .and_then(|p| p.access.as_ref())
        .map(|a| a.client_ca.secret_name.clone());
    tls.into_iter()
        .chain(client)
        .chain(access)
        .chain(auth.into_iter().flatten())
        .map(|secret| (namespace.to_owned(), secret))
        .collect()
}

/// A Secret that could not be read.
#[derive(Debug, thiserror::Error)]
#[error("cannot read Secret {namespace}/{name}: {source}")]
pub struct ReadError {
    pub namespace: String,
    pub name: String,
    #[source]
    pub source: kube::Error,
}

/// What one read of a Secret gave.
struct Read {
    hashes: KeyHashes,
    values: Values,
    /// The value of the key asked to be kept for the caller alone.
    kept: Option<Zeroizing<Vec<u8>>>,
}

/// Reads the Secrets' values through the API, once per version, into the one cache. Cloning shares it.
#[derive(Clone)]
pub struct SecretReader {
    client: Client,
    /// The metadata-only Secret cache: which exist, at which version.
    store: Store<PartialObjectMeta<Secret>>,
    cache: SecretCache,
    /// The operator's digest key, from which its own credentials are derived.
    digest_key: DigestKey,
}

impl SecretReader {
    pub fn new(
        client: Client,
        store: Store<PartialObjectMeta<Secret>>,
        cache: SecretCache,
        digest_key: DigestKey,
    ) -> Self {
        Self {
            client,
            store,
            cache,
            digest_key,
        }
    }

    /// The one cache.
    pub fn cache(&self) -> &SecretCache {
        &self.cache
    }

    /// Records which Secrets instance `namespace/name` names now (see [`named`]); what no instance
    /// names any more goes.
    pub fn naming(&self, namespace: &str, name: &str, spec: &MemcachedSpec) {
        let instance = (namespace.to_owned(), name.to_owned());
        self.cache.name(&instance, named(namespace, name, spec));
    }

    /// The operator's digest key (see [`crate::store::digest_key`]), read or made when first needed.
    pub async fn digest_key(&self) -> Result<&[u8], KeyError> {
        self.digest_key.bytes(&self.client).await
    }

    /// Secret `namespace/name` as the metadata-only watch last saw it (`None`: it does not exist).
    pub fn cached(&self, namespace: &str, name: &str) -> Option<Arc<PartialObjectMeta<Secret>>> {
        self.store.get(&ObjectRef::new(name).within(namespace))
    }

    /// Drops what is kept for instance `namespace/name`, which is gone.
    pub fn forget(&self, namespace: &str, name: &str) {
        self.cache.forget(&(namespace.to_owned(), name.to_owned()));
    }

    /// The per-key hashes of Secret `namespace/name` at its current version (`None`: it does not
    /// exist), read when not known yet; with `keep`, the value of that key when the Secret is read now,
    /// for the caller alone (not kept here).
    pub async fn hashes(
        &self,
        namespace: &str,
        name: &str,
        keep: Option<&str>,
    ) -> Result<Option<(KeyHashes, Option<Zeroizing<Vec<u8>>>)>, ReadError> {
        let Some(version) = self.version(namespace, name) else {
            return Ok(None);
        };
        let key = (namespace.to_owned(), name.to_owned());
        let known = self
            .cache
            .with(&key, |entry| {
                entry.hashes.clone().filter(|_| entry.version == version)
            })
            .flatten();
        if let Some(hashes) = known {
            return Ok(Some((hashes, None)));
        }
        let read = self.read(&key, version, &[], keep).await?;
        Ok(read.map(|read| (read.hashes, read.kept)))
    }

    /// The value of `key` of Secret `namespace/name`, read now and kept nowhere (`None`: the Secret or
    /// the key is gone).
    pub async fn value(
        &self,
        namespace: &str,
        name: &str,
        key: &str,
    ) -> Result<Option<Zeroizing<Vec<u8>>>, ReadError> {
        let api: Api<Secret> = Api::namespaced(self.client.clone(), namespace);
        let read = api.get_opt(name).await.map_err(|source| ReadError {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            source,
        })?;
        let mut data = read.and_then(|s| s.data).unwrap_or_default();
        let value = data.remove(key).map(|value| Zeroizing::new(value.0));
        for value in data.values_mut() {
            value.0.zeroize();
        }
        Ok(value)
    }

    /// Whether the served auth file `namespace/name`, cached at version `live` (`None`: not cached),
    /// holds the user's file of hash `hash` as this process wrote it ([`SecretReader::wrote_served`]):
    /// at the version it wrote, or at one the Secret watch has not caught up with yet (none, or an older
    /// integer version, as right after the write). The watch drops the entry when the Secret is
    /// deleted, so a deleted file is written again.
    pub fn serves(&self, namespace: &str, name: &str, live: Option<&str>, hash: &str) -> bool {
        let key = (namespace.to_owned(), name.to_owned());
        let lags = |live: &str, written: &str| match (live.parse::<u64>(), written.parse::<u64>()) {
            (Ok(live), Ok(written)) => live < written,
            _ => false,
        };
        self.cache
            .with(&key, |entry| {
                entry.served.as_deref() == Some(hash)
                    && live.is_none_or(|live| live == entry.version || lags(live, &entry.version))
            })
            .unwrap_or(false)
    }

    /// Keeps that this process wrote the served auth file `namespace/name` at `version`, holding the
    /// user's file of hash `hash`.
    pub fn wrote_served(&self, namespace: &str, name: &str, version: String, hash: String) {
        let key = (namespace.to_owned(), name.to_owned());
        self.cache.update(&key, |entry| {
            *entry = cache::Entry {
                version,
                served: Some(hash),
                ..Default::default()
            };
        });
    }

    /// The value of `key` of Secret `namespace/name` at its current version, kept with the Secret like
    /// the TLS keys (for public material: a CA bundle); `None` when the Secret or the key is missing.
    pub async fn public_value(
        &self,
        namespace: &str,
        name: &str,
        key: &str,
    ) -> Result<Option<Vec<u8>>, ReadError> {
        let Some(version) = self.version(namespace, name) else {
            return Ok(None);
        };
        let secret = (namespace.to_owned(), name.to_owned());
        let known = self
            .cache
            .with(&secret, |entry| {
                let current = entry.version == version && entry.hashes.is_some();
                (current && entry.wanted.contains(key))
                    .then(|| entry.values.get(key).map(|value| value.to_vec()))
            })
            .flatten();
        if let Some(value) = known {
            return Ok(value);
        }
        let read = self.read(&secret, version, &[key], None).await?;
        Ok(read.and_then(|read| read.values.get(key).map(|value| value.to_vec())))
    }

    /// The current version of Secret `namespace/name` in the metadata cache (`None`: it does not exist).
    fn version(&self, namespace: &str, name: &str) -> Option<String> {
        let meta = self.cached(namespace, name)?;
        Some(meta.metadata.resource_version.clone().unwrap_or_default())
    }

    /// Reads Secret `key` (`None`: gone meanwhile): every key's hash, and the values of the keys wanted
    /// so far and of `keys`, kept in the cache; the value of `keep` for the caller; every other value
    /// wiped at once. `version` is the metadata cache's, for an answer without one.
    async fn read(
        &self,
        key: &SecretKey,
        version: String,
        keys: &[&str],
        keep: Option<&str>,
    ) -> Result<Option<Read>, ReadError> {
        let (namespace, name) = key;
        let api: Api<Secret> = Api::namespaced(self.client.clone(), namespace);
        let secret = api.get_opt(name).await.map_err(|source| ReadError {
            namespace: namespace.clone(),
            name: name.clone(),
            source,
        })?;
        let Some(secret) = secret else {
            return Ok(None);
        };
        let version = secret.metadata.resource_version.clone().unwrap_or(version);
        let mut wanted = self
            .cache
            .with(key, |entry| entry.wanted.clone())
            .unwrap_or_default();
        wanted.extend(keys.iter().map(|k| (*k).to_owned()));
        let (mut hashes, mut values, mut kept) = (KeyHashes::new(), Values::default(), None);
        let kept_values = Arc::make_mut(&mut values);
        for (k, mut value) in secret.data.unwrap_or_default() {
            hashes.insert(k.clone(), KeyDigest::of(&value.0));
            if keep == Some(k.as_str()) {
                kept = Some(Zeroizing::new(value.0.clone()));
            }
            if wanted.contains(&k) {
                kept_values.insert(k, Zeroizing::new(std::mem::take(&mut value.0)));
            }
            value.0.zeroize();
        }
        self.cache.update(key, |entry| {
            let served = entry.served.take().filter(|_| entry.version == version);
            *entry = cache::Entry {
                version,
                hashes: Some(hashes.clone()),
                wanted,
                values: values.clone(),
                served,
            };
        });
        Ok(Some(Read {
            hashes,
            values,
            kept,
        }))
    }

    /// The values of `keys` (those it has) of Secret `namespace/name` at its current version: from memory
    /// when that version was read for them before, else read now.
    async fn values(&self, namespace: &str, name: &str, keys: &[&str]) -> Result<Values, String> {
        let missing = || format!("Secret {namespace}/{name} does not exist");
        let version = self.version(namespace, name).ok_or_else(missing)?;
        let key = (namespace.to_owned(), name.to_owned());
        let known = self
            .cache
            .with(&key, |entry| {
                let current = entry.version == version && entry.hashes.is_some();
                let all = keys.iter().all(|k| entry.wanted.contains(*k));
                (current && all).then(|| entry.values.clone())
            })
            .flatten();
        if let Some(values) = known {
            return Ok(values);
        }
        let read = self.read(&key, version, keys, None).await;
        match read.map_err(|error| error.to_string())? {
            Some(read) => Ok(read.values),
            None => Err(missing()),
        }
    }

    /// How to reach the servers of the instance `name` of `owner` (namespace and UID) with `spec`, or
    /// why they cannot be read (a message for the log, naming the Secret and the key, never a value).
    /// `previous` is told the certificate and CA read and says which CA to trust besides.
    pub async fn transport(
        &self,
        name: &str,
        owner: &Owner<'_>,
        spec: &MemcachedSpec,
        previous: TrustPrevious<'_>,
    ) -> Result<Transport, String> {
        self.naming(owner.namespace, name, spec);
        let mut transport = Transport::default();
        if spec.tls().is_some() {
            self.tls(owner.namespace, spec, previous, &mut transport)
                .await?;
        }
        if spec.auth().is_some() {
            let key = self.digest_key().await.map_err(|error| error.to_string())?;
            let password = operator_password(key, owner);
            let credentials = Credentials::new(OPERATOR_USER, password.as_bytes())
                .map_err(|error| format!("the operator's credentials: {error}"))?;
            transport.credentials = Some(Arc::new(credentials));
        }
        Ok(transport)
    }

    /// The TLS part of [`SecretReader::transport`]: the CA to trust, the identity to present, the
    /// certificate the servers should present.
    async fn tls(
        &self,
        namespace: &str,
        spec: &MemcachedSpec,
        previous: TrustPrevious<'_>,
        transport: &mut Transport,
    ) -> Result<(), String> {
        let Some(tls) = spec.tls() else {
            return Ok(());
        };
        // tls.crt and tls.key: the certificate the servers should present, checked against its key
        // before they are asked to load them (and, without clientSecretName, the identity the
        // operator presents to them).
        let server_keys: &[&str] = &["ca.crt", "tls.crt", "tls.key"];
        let values = self
            .values(namespace, &tls.secret_name, server_keys)
            .await?;
        let client_identity = if tls.client_auth {
            Some(self.identity(namespace, spec, &values, transport).await?)
        } else {
            None
        };
        let certificate = match (values.get("tls.crt"), values.get("tls.key")) {
            (Some(chain), Some(key)) => matching_pair(chain, key),
            _ => Err("the Secret lacks tls.crt or tls.key".to_owned()),
        };
        transport.certificate = Some(certificate.clone());
        let ca = values.get("ca.crt").map(|ca| ca.to_vec());
        let ca = match (previous(certificate, ca.as_deref()), ca) {
            (Some(mut previous), Some(ca)) => {
                previous.push(b'\n');
                previous.extend_from_slice(&ca);
                Some(previous)
            }
            (_, ca) => ca,
        };
        let material = TlsMaterial {
            ca,
            client_identity,
        };
        let client = TlsClient::new(&material).map_err(|error| {
            format!(
                "cannot use the TLS material of Secret {namespace}/{}{}: {error}",
                tls.secret_name,
                match (&tls.client_secret_name, tls.client_auth) {
                    (Some(client), true) => format!(" or client Secret {namespace}/{client}"),
                    _ => String::new(),
                }
            )
        })?;
        transport.tls = Some(client);
        Ok(())
    }

    /// The certificate and key the operator presents to servers that require client certificates: the
    /// client Secret's, else the server's own (`values`, said in `transport`).
    async fn identity(
        &self,
        namespace: &str,
        spec: &MemcachedSpec,
        values: &Values,
        transport: &mut Transport,
    ) -> Result<(Vec<u8>, Vec<u8>), String> {
        let Some(tls) = spec.tls() else {
            return Err("TLS is off".to_owned());
        };
        let (secret, identity) = match &tls.client_secret_name {
            Some(name) => (
                name,
                self.values(namespace, name, &["tls.crt", "tls.key"])
                    .await?,
            ),
            None => {
                transport.presents_server_certificate = true;
                (&tls.secret_name, values.clone())
            }
        };
        match (identity.get("tls.crt"), identity.get("tls.key")) {
            (Some(cert), Some(private)) => Ok((cert.to_vec(), private.to_vec())),
            _ => Err(format!(
                "Secret {namespace}/{secret} lacks tls.crt or tls.key, which the operator \
                 presents to servers that require client certificates"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{Request, Response};
    use kube::client::Body;
    use kube::runtime::{reflector, watcher};
    use serde_json::json;
    use std::time::Duration;
    use tower_test::mock::{self, Handle};

    impl SecretReader {
        /// The keys whose values are kept of Secret `namespace/name`.
        fn kept(&self, namespace: &str, name: &str) -> Vec<String> {
            let key = (namespace.to_owned(), name.to_owned());
            self.cache
                .with(&key, |entry| entry.values.keys().cloned().collect())
                .unwrap_or_default()
        }
    }

    fn reader() -> (SecretReader, Handle<Request<Body>, Response<Body>>) {
        let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
        let mut writer = reflector::store::Writer::<PartialObjectMeta<Secret>>::new(());
        let meta = kube::api::ObjectMeta {
            name: Some("creds".into()),
            namespace: Some("ns".into()),
            resource_version: Some("7".into()),
            ..Default::default()
        };
        writer.apply_watcher_event(&watcher::Event::Apply(
            kube::api::PartialObjectMetaExt::into_response_partial(meta),
        ));
        let reader = SecretReader::new(
            Client::new(service, "ns"),
            writer.as_reader(),
            SecretCache::default(),
            DigestKey::fixed(&[7; 32]),
        );
        // An instance that names the Secret (its TLS Secret), so that what is read is kept.
        let named = BTreeSet::from([("ns".to_owned(), "creds".to_owned())]);
        reader
            .cache
            .name(&("ns".to_owned(), "cache".to_owned()), named);
        (reader, handle)
    }

    /// Answers the next request, a GET of Secret ns/creds, with three keys.
    async fn answer(handle: &mut Handle<Request<Body>, Response<Body>>) {
        let (request, send) = handle.next_request().await.expect("a GET of the Secret");
        assert_eq!(request.uri().path(), "/api/v1/namespaces/ns/secrets/creds");
        // base64 of "u:p\n", "crt", "other"
        let secret = json!({"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "creds", "namespace": "ns", "resourceVersion": "7"},
            "data": {"auth-file": "dTpwCg==", "tls.crt": "Y3J0", "other": "b3RoZXI="}});
        send.send_response(
            Response::builder()
                .body(Body::from(serde_json::to_vec(&secret).unwrap()))
                .unwrap(),
        );
    }

    #[tokio::test]
    async fn only_the_keys_asked_for_are_kept_and_a_version_is_read_once_per_key_set() {
        let (reader, mut handle) = reader();
        let (values, ()) = tokio::join!(
            reader.values("ns", "creds", &["auth-file"]),
            answer(&mut handle)
        );
        assert_eq!(values.unwrap().keys().collect::<Vec<_>>(), ["auth-file"]);
        assert_eq!(reader.kept("ns", "creds"), ["auth-file"]);

        // The same key at the same version: from memory (nobody answers now: a request would time out).
        let again = tokio::time::timeout(
            Duration::from_secs(1),
            reader.values("ns", "creds", &["auth-file"]),
        )
        .await
        .expect("no request")
        .unwrap();
        assert_eq!(again.keys().collect::<Vec<_>>(), ["auth-file"]);

        // Another key of the same Secret: read again, both kept, never the key nobody asked for.
        let (both, ()) = tokio::join!(
            reader.values("ns", "creds", &["tls.crt"]),
            answer(&mut handle)
        );
        assert_eq!(
            both.unwrap().keys().collect::<Vec<_>>(),
            ["auth-file", "tls.crt"]
        );
        assert_eq!(reader.kept("ns", "creds"), ["auth-file", "tls.crt"]);

        // The instance that named it forgotten: dropped (its values wiped with it).
        reader.forget("ns", "cache");
        assert!(reader.cache.is_empty());
    }

    /// The reconciler's read for the hashes and the collector's for the values are one read of a
    /// version: whoever asks second finds it in the one cache.
    #[tokio::test]
    async fn the_hashes_and_the_values_of_a_version_are_one_read() {
        let (reader, mut handle) = reader();
        let (values, ()) = tokio::join!(
            reader.values("ns", "creds", &["tls.crt"]),
            answer(&mut handle)
        );
        assert_eq!(values.unwrap().keys().collect::<Vec<_>>(), ["tls.crt"]);
        let no_request = Duration::from_secs(1);
        let (hashes, kept) = tokio::time::timeout(no_request, reader.hashes("ns", "creds", None))
            .await
            .expect("no request")
            .unwrap()
            .expect("the Secret exists");
        let keys: Vec<_> = hashes.keys().collect();
        assert_eq!(keys, ["auth-file", "other", "tls.crt"], "every key hashed");
        assert!(kept.is_none(), "nothing read now, nothing handed out");
        assert_eq!(
            reader.kept("ns", "creds"),
            ["tls.crt"],
            "no value of another key"
        );
    }

    /// The user's auth file asked for by the reconcile is handed to it and kept nowhere.
    #[tokio::test]
    async fn a_kept_key_is_the_callers_alone() {
        let (reader, mut handle) = reader();
        let (read, ()) = tokio::join!(
            reader.hashes("ns", "creds", Some("auth-file")),
            answer(&mut handle)
        );
        let (hashes, kept) = read.unwrap().expect("the Secret exists");
        assert_eq!(kept.as_deref().map(Vec::as_slice), Some(&b"u:p\n"[..]));
        assert!(hashes.contains_key("auth-file"));
        assert!(reader.kept("ns", "creds").is_empty(), "no value kept");
    }

    /// A served auth file this process wrote is current at the version it wrote and while the watch
    /// lags behind that write (a reconcile right after it rewrote the file over and over under load);
    /// a later version (someone changed it) or another user file is not.
    #[tokio::test]
    async fn a_served_file_is_current_while_the_watch_lags_behind_its_write() {
        let (reader, _handle) = reader();
        let served = ("ns".to_owned(), "cache-auth-file".to_owned());
        let instance = ("ns".to_owned(), "cache".to_owned());
        reader.cache.name(&instance, BTreeSet::from([served]));
        reader.wrote_served("ns", "cache-auth-file", "7".into(), "h".into());
        assert!(reader.serves("ns", "cache-auth-file", Some("7"), "h"));
        assert!(reader.serves("ns", "cache-auth-file", None, "h"));
        assert!(reader.serves("ns", "cache-auth-file", Some("5"), "h"));
        assert!(!reader.serves("ns", "cache-auth-file", Some("9"), "h"));
        assert!(!reader.serves("ns", "cache-auth-file", Some("7"), "other"));
        assert!(!reader.serves("ns", "other-auth-file", None, "h"));
        reader.forget("ns", "cache");
        assert!(
            !reader.serves("ns", "cache-auth-file", None, "h"),
            "forgotten"
        );
    }
}
