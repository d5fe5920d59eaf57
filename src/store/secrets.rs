//! What an instance's Secrets give the stats collector: the TLS material to connect with and the
//! credentials to authenticate with.
//!
//! The credentials are the operator's own: the entry it adds to the auth file the servers load
//! (`crate::resources::auth_file::served`), its password derived from the operator's digest key and the
//! instance's namespace and UID. The user's auth Secret is never read here, so none of its passwords
//! is held or sent by the collector or the warm handover.
//!
//! The operator watches Secrets by metadata only, so their values are read with a GET, and only for the
//! Secrets an instance with TLS or auth names. Each Secret is read once per `resourceVersion` (the
//! metadata cache says which version is current), not once per collection, and what was read stays in
//! this process's memory: it is never logged, never put in an event or a status. Only the keys the
//! collector uses are kept (`tls.crt`, `tls.key`, `ca.crt`, the auth key; `tls.key` also to check that
//! a rotated certificate goes with its key before servers are asked to load them), and every value is wiped from
//! memory when it is dropped (a newer version read, the Secret no longer named, a key no longer wanted);
//! the other keys of the Secret are wiped as soon as it is read. (The answer's bytes in the HTTP client's
//! buffers are beyond the operator's reach.) The operator's RBAC already allows `get` on Secrets (the
//! reconciler reads them to hash their content), so nothing new is needed.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex};

use zeroize::{Zeroize, Zeroizing};

use crate::api::MemcachedSpec;
use crate::connection::{CertificateDigest, Credentials, TlsClient, TlsMaterial, matching_pair};
use crate::resources::auth_file::OPERATOR_USER;
use crate::resources::secrets::{Owner, operator_password};
use crate::store::digest_key::DigestKey;
use k8s_openapi::api::core::v1::Secret;
use kube::api::PartialObjectMeta;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, Client};

/// The kept keys of one Secret version (those asked for that it has).
type Values = Arc<BTreeMap<String, Zeroizing<Vec<u8>>>>;

/// What is kept of one Secret: the version read, the keys asked for so far, and their values.
struct Entry {
    version: String,
    wanted: BTreeSet<String>,
    values: Values,
}

/// (namespace, name) of a Secret → what is kept of it.
type Entries = HashMap<(String, String), Entry>;

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
/// besides (the previous one, during a rotation: see [`super::reload::Reload`]).
pub type TrustPrevious<'a> =
    &'a (dyn Fn(Result<CertificateDigest, String>, Option<&[u8]>) -> Option<Vec<u8>> + Sync);

/// Secret values read so far, by (namespace, name), with the `resourceVersion` they were read at.
/// Cloning shares the cache.
#[derive(Clone, Default)]
pub struct SecretValues {
    entries: Arc<Mutex<Entries>>,
}

impl SecretValues {
    /// The values of Secret `key` at `version`, when every one of `keys` was asked for at that version.
    fn get(&self, key: &(String, String), version: &str, keys: &[&str]) -> Option<Values> {
        let entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        entries
            .get(key)
            .filter(|entry| {
                entry.version == version && keys.iter().all(|k| entry.wanted.contains(*k))
            })
            .map(|entry| entry.values.clone())
    }

    /// The keys asked for before at `version`, so that a new read keeps them too.
    fn wanted(&self, key: &(String, String), version: &str) -> BTreeSet<String> {
        let entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        entries
            .get(key)
            .filter(|entry| entry.version == version)
            .map(|entry| entry.wanted.clone())
            .unwrap_or_default()
    }

    fn put(&self, key: (String, String), entry: Entry) {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        entries.insert(key, entry);
    }

    /// Forgets every Secret not in `used` (namespace, name): no longer named by any instance.
    pub fn retain(&self, used: &HashSet<(String, String)>) {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        entries.retain(|key, _| used.contains(key));
    }

    /// How many Secret versions are held (for tests).
    pub fn len(&self) -> usize {
        self.entries.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Whether none are held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The Secrets `spec` makes the collector read, as (namespace, name).
pub fn named(namespace: &str, spec: &MemcachedSpec) -> Vec<(String, String)> {
    let tls = spec.tls().map(|t| t.secret_name.clone());
    let client = spec
        .tls()
        .filter(|t| t.client_auth)
        .and_then(|t| t.client_secret_name.clone());
    tls.into_iter()
        .chain(client)
        .map(|name| (namespace.to_owned(), name))
        .collect()
}

/// Reads the Secrets' values through the API, once per version.
pub struct SecretReader {
    pub client: Client,
    /// The metadata-only Secret cache: which exist, at which version.
    pub store: Store<PartialObjectMeta<Secret>>,
    pub values: SecretValues,
    /// The operator's digest key, from which its own credentials are derived.
    pub digest_key: DigestKey,
}

impl SecretReader {
    /// How to reach the servers of the instance `owner` (namespace and UID) with `spec`, or why they
    /// cannot be read (a message for the log, naming the Secret and the key, never a value). `previous`
    /// is told the certificate and CA read and says which CA to trust besides.
    pub async fn transport(
        &self,
        owner: &Owner<'_>,
        spec: &MemcachedSpec,
        previous: TrustPrevious<'_>,
    ) -> Result<Transport, String> {
        let namespace = owner.namespace;
        let mut transport = Transport::default();
        if let Some(tls) = spec.tls() {
            // tls.crt and tls.key: the certificate the servers should present, checked against its key
            // before they are asked to load them (and, without clientSecretName, the identity the
            // operator presents to them).
            let server_keys: &[&str] = &["ca.crt", "tls.crt", "tls.key"];
            let values = self
                .values(namespace, &tls.secret_name, server_keys)
                .await?;
            let client_identity = if tls.client_auth {
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
                    (Some(cert), Some(private)) => Some((cert.to_vec(), private.to_vec())),
                    _ => {
                        return Err(format!(
                            "Secret {namespace}/{secret} lacks tls.crt or tls.key, which the operator \
                             presents to servers that require client certificates"
                        ));
                    }
                }
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
        }
        if spec.auth().is_some() {
            let key = self
                .digest_key
                .bytes(&self.client)
                .await
                .map_err(|error| error.to_string())?;
            let password = operator_password(key, owner);
            let credentials = Credentials::new(OPERATOR_USER, password.as_bytes())
                .map_err(|error| format!("the operator's credentials: {error}"))?;
            transport.credentials = Some(Arc::new(credentials));
        }
        Ok(transport)
    }

    /// The values of `keys` (those it has) of Secret `namespace/name` at its current version: from memory
    /// when that version was read for them before, else read now; the other keys are wiped at once.
    async fn values(&self, namespace: &str, name: &str, keys: &[&str]) -> Result<Values, String> {
        let Some(meta) = self.store.get(&ObjectRef::new(name).within(namespace)) else {
            return Err(format!("Secret {namespace}/{name} does not exist"));
        };
        let key = (namespace.to_owned(), name.to_owned());
        let version = meta.metadata.resource_version.clone().unwrap_or_default();
        if let Some(values) = self.values.get(&key, &version, keys) {
            return Ok(values);
        }
        let api: Api<Secret> = Api::namespaced(self.client.clone(), namespace);
        let secret = api
            .get(name)
            .await
            .map_err(|error| format!("cannot read Secret {namespace}/{name}: {error}"))?;
        let read_version = secret.metadata.resource_version.clone().unwrap_or(version);
        let mut wanted = self.values.wanted(&key, &read_version);
        wanted.extend(keys.iter().map(|k| (*k).to_owned()));
        let values: Values = Arc::new(
            secret
                .data
                .unwrap_or_default()
                .into_iter()
                .filter_map(|(k, mut v)| {
                    if wanted.contains(&k) {
                        Some((k, Zeroizing::new(v.0)))
                    } else {
                        v.0.zeroize();
                        None
                    }
                })
                .collect(),
        );
        self.values.put(
            key,
            Entry {
                version: read_version,
                wanted,
                values: values.clone(),
            },
        );
        Ok(values)
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

    impl SecretValues {
        /// The keys kept of Secret `namespace/name`.
        fn kept(&self, namespace: &str, name: &str) -> Vec<String> {
            let entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
            entries
                .get(&(namespace.to_owned(), name.to_owned()))
                .map(|entry| entry.values.keys().cloned().collect())
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
        let reader = SecretReader {
            client: Client::new(service, "ns"),
            store: writer.as_reader(),
            values: SecretValues::default(),
            digest_key: DigestKey::fixed(&[7; 32]),
        };
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
        assert_eq!(reader.values.kept("ns", "creds"), ["auth-file"]);

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
        assert_eq!(reader.values.kept("ns", "creds"), ["auth-file", "tls.crt"]);

        // A Secret no longer named is dropped (its values wiped with it).
        reader.values.retain(&HashSet::new());
        assert!(reader.values.is_empty());
    }
}
