//! The operator's digest key: the secret that keys the hash of the Secrets an instance uses, so that the
//! hash the pod template carries (`cache.example.com/secret-hash`) says when a Secret changed and nothing
//! about what it holds.
//!
//! An unkeyed hash of a Secret's value can be tested offline by anyone who may read Deployments or pods
//! (the built-in `view` role, which deliberately leaves Secrets out): a guessed password is hashed the
//! same way and compared. Keyed with 32 random bytes that only the operator reads, the same guess cannot
//! be checked without the key.
//!
//! The key lives in a Secret of the operator's own namespace, created by the first replica that needs it
//! and read once per process; every replica (and every restart) keys with the same bytes, so an operator
//! restart rolls no pod. Deleting that Secret makes a new key, and with it one rollout of every instance
//! that uses Secrets (warm, where handover is on): the way to rotate it.

use std::sync::Arc;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};
use rand::RngCore;
use tokio::sync::OnceCell;
use zeroize::Zeroizing;

/// The data key holding the key's bytes in its Secret.
pub const DATA_KEY: &str = "key";
/// Length of the key, in bytes.
pub const KEY_LEN: usize = 32;
/// Default name of the Secret (`--digest-key-secret`).
pub const DEFAULT_SECRET: &str = "memcached-operator-digest-key";

/// Where the key's Secret lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyLocation {
    pub namespace: String,
    pub name: String,
}

/// Why the key could not be had.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error(
        "cannot read or create the digest key Secret {namespace}/{name} (the operator needs get and create on Secrets in its own namespace): {source}"
    )]
    Api {
        namespace: String,
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error(
        "the digest key Secret {namespace}/{name} has no {DATA_KEY:?} of {KEY_LEN} or more bytes; delete it and the operator makes a new one (every instance using Secrets rolls once)"
    )]
    Malformed { namespace: String, name: String },
}

/// The key, read or made once per process; cloning shares it.
#[derive(Clone)]
pub struct DigestKey {
    location: KeyLocation,
    key: Arc<OnceCell<Zeroizing<Vec<u8>>>>,
}

impl DigestKey {
    pub fn new(location: KeyLocation) -> Self {
        Self {
            location,
            key: Arc::default(),
        }
    }

    /// A key known in advance (tests).
    pub fn fixed(bytes: &[u8]) -> Self {
        let key = Self::new(KeyLocation {
            namespace: String::new(),
            name: String::new(),
        });
        key.key
            .set(Zeroizing::new(bytes.to_vec()))
            .unwrap_or_else(|_| unreachable!("a new cell is empty"));
        key
    }

    pub fn location(&self) -> &KeyLocation {
        &self.location
    }

    /// The key's bytes: from memory after the first success, else read from its Secret, which is created
    /// with fresh random bytes when it does not exist. At most one read (and one create) per process while
    /// it succeeds; a failure is retried by the next caller.
    pub async fn bytes(&self, client: &Client) -> Result<&[u8], KeyError> {
        let key = self.key.get_or_try_init(|| self.load(client)).await?;
        Ok(key.as_slice())
    }

    async fn load(&self, client: &Client) -> Result<Zeroizing<Vec<u8>>, KeyError> {
        let KeyLocation { namespace, name } = &self.location;
        let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
        let api_error = |source| KeyError::Api {
            namespace: namespace.clone(),
            name: name.clone(),
            source,
        };
        let secret = match api.get_opt(name).await.map_err(api_error)? {
            Some(secret) => secret,
            None => match api.create(&PostParams::default(), &self.fresh()).await {
                Ok(created) => created,
                // Another replica made it first: its key is the key.
                Err(kube::Error::Api(status)) if status.code == 409 => {
                    api.get(name).await.map_err(api_error)?
                }
                Err(source) => return Err(api_error(source)),
            },
        };
        key_of(secret).ok_or_else(|| KeyError::Malformed {
            namespace: namespace.clone(),
            name: name.clone(),
        })
    }

    /// A new key Secret with 32 random bytes.
    fn fresh(&self) -> Secret {
        let mut bytes = vec![0u8; KEY_LEN];
        // The thread's generator: ChaCha12, seeded and reseeded from the operating system's source.
        rand::rng().fill_bytes(&mut bytes);
        Secret {
            metadata: ObjectMeta {
                name: Some(self.location.name.clone()),
                namespace: Some(self.location.namespace.clone()),
                labels: Some(
                    [(
                        "app.kubernetes.io/managed-by".to_owned(),
                        "memcached-operator".to_owned(),
                    )]
                    .into(),
                ),
                annotations: Some(
                    [(
                        "cache.example.com/purpose".to_owned(),
                        "Keys the hash of Memcached instances' Secrets in their pod templates. Deleting it rolls every instance that uses Secrets once.".to_owned(),
                    )]
                    .into(),
                ),
                ..ObjectMeta::default()
            },
            data: Some([(DATA_KEY.to_owned(), ByteString(bytes))].into()),
            type_: Some("Opaque".to_owned()),
            ..Secret::default()
        }
    }
}

/// The key in `secret`, when it holds one long enough.
fn key_of(mut secret: Secret) -> Option<Zeroizing<Vec<u8>>> {
    let value = secret.data.as_mut()?.remove(DATA_KEY)?;
    let key = Zeroizing::new(value.0);
    (key.len() >= KEY_LEN).then_some(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fresh_key_is_random_and_long_enough() {
        let key = DigestKey::new(KeyLocation {
            namespace: "ops".into(),
            name: DEFAULT_SECRET.into(),
        });
        let a = key_of(key.fresh()).expect("a key");
        let b = key_of(key.fresh()).expect("a key");
        assert_eq!(a.len(), KEY_LEN);
        assert_ne!(a, b, "two fresh keys differ");
    }

    #[test]
    fn a_short_or_missing_key_is_not_a_key() {
        let with = |data: Option<Vec<u8>>| Secret {
            data: data.map(|d| [(DATA_KEY.to_owned(), ByteString(d))].into()),
            ..Secret::default()
        };
        assert!(key_of(with(None)).is_none());
        assert!(key_of(with(Some(vec![1; KEY_LEN - 1]))).is_none());
        assert!(key_of(with(Some(vec![1; KEY_LEN]))).is_some());
    }
}
