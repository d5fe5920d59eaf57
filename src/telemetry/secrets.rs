//! What an instance's Secrets give the stats collector: the TLS material to connect with and the
//! credentials to authenticate with.
//!
//! The operator watches Secrets by metadata only, so their values are read with a GET, and only for the
//! Secrets an instance with TLS or auth names. Each Secret is read once per `resourceVersion` (the
//! metadata cache says which version is current), not once per collection, and what was read stays in
//! this process's memory: it is never logged, never put in an event or a status. The operator's RBAC
//! already allows `get` on Secrets (the reconciler reads them to hash their content), so nothing new is
//! needed.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};

use super::client::{Credentials, TlsClient, TlsMaterial};
use crate::api::MemcachedSpec;
use k8s_openapi::api::core::v1::Secret;
use kube::api::PartialObjectMeta;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, Client};

/// The keys of one Secret version.
type Values = Arc<BTreeMap<String, Vec<u8>>>;

/// (namespace, name) of a Secret → (resourceVersion, values).
type Entries = HashMap<(String, String), (String, Values)>;

/// How to talk to an instance's servers.
#[derive(Clone, Default)]
pub struct Transport {
    pub tls: Option<TlsClient>,
    pub credentials: Option<Arc<Credentials>>,
    /// The operator presents the server's own certificate as its client certificate: `clientAuth` is on
    /// and `clientSecretName` unset (kept for instances created before that field; the collector says so
    /// once per instance).
    pub presents_server_certificate: bool,
}

/// Secret values read so far, by (namespace, name), with the `resourceVersion` they were read at.
/// Cloning shares the cache.
#[derive(Clone, Default)]
pub struct SecretValues {
    entries: Arc<Mutex<Entries>>,
}

impl SecretValues {
    fn get(&self, key: &(String, String), version: &str) -> Option<Values> {
        let entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        entries
            .get(key)
            .filter(|(v, _)| v == version)
            .map(|(_, values)| values.clone())
    }

    fn put(&self, key: (String, String), version: String, values: Values) {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        entries.insert(key, (version, values));
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
    let auth = spec.auth().map(|a| a.secret_name.clone());
    tls.into_iter()
        .chain(client)
        .chain(auth)
        .map(|name| (namespace.to_owned(), name))
        .collect()
}

/// Reads the Secrets' values through the API, once per version.
pub struct SecretReader {
    pub client: Client,
    /// The metadata-only Secret cache: which exist, at which version.
    pub store: Store<PartialObjectMeta<Secret>>,
    pub values: SecretValues,
}

impl SecretReader {
    /// How to reach the servers of an instance with `spec` in `namespace`, or why they cannot be read
    /// (a message for the log, naming the Secret and the key, never a value).
    pub async fn transport(
        &self,
        namespace: &str,
        spec: &MemcachedSpec,
    ) -> Result<Transport, String> {
        let mut transport = Transport::default();
        if let Some(tls) = spec.tls() {
            let values = self.values(namespace, &tls.secret_name).await?;
            let client_identity = if tls.client_auth {
                let (secret, identity) = match &tls.client_secret_name {
                    Some(name) => (name, self.values(namespace, name).await?),
                    None => {
                        transport.presents_server_certificate = true;
                        (&tls.secret_name, values.clone())
                    }
                };
                match (identity.get("tls.crt"), identity.get("tls.key")) {
                    (Some(cert), Some(private)) => Some((cert.clone(), private.clone())),
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
            let material = TlsMaterial {
                ca: values.get("ca.crt").cloned(),
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
        if let Some(auth) = spec.auth() {
            let values = self.values(namespace, &auth.secret_name).await?;
            let Some(file) = values.get(auth.key()) else {
                return Err(format!(
                    "Secret {namespace}/{} has no key {}",
                    auth.secret_name,
                    auth.key()
                ));
            };
            let credentials = Credentials::from_auth_file(file).map_err(|error| {
                format!(
                    "cannot use the credentials in key {} of Secret {namespace}/{}: {error}",
                    auth.key(),
                    auth.secret_name
                )
            })?;
            transport.credentials = Some(Arc::new(credentials));
        }
        Ok(transport)
    }

    /// The values of Secret `namespace/name` at its current version: from memory when that version was
    /// read before, else read now.
    async fn values(&self, namespace: &str, name: &str) -> Result<Values, String> {
        let Some(meta) = self.store.get(&ObjectRef::new(name).within(namespace)) else {
            return Err(format!("Secret {namespace}/{name} does not exist"));
        };
        let key = (namespace.to_owned(), name.to_owned());
        let version = meta.metadata.resource_version.clone().unwrap_or_default();
        if let Some(values) = self.values.get(&key, &version) {
            return Ok(values);
        }
        let api: Api<Secret> = Api::namespaced(self.client.clone(), namespace);
        let secret = api
            .get(name)
            .await
            .map_err(|error| format!("cannot read Secret {namespace}/{name}: {error}"))?;
        let read_version = secret.metadata.resource_version.clone().unwrap_or(version);
        let values: Values = Arc::new(
            secret
                .data
                .unwrap_or_default()
                .into_iter()
                .map(|(k, v)| (k, v.0))
                .collect(),
        );
        self.values.put(key, read_version, values.clone());
        Ok(values)
    }
}
