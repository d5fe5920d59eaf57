//! Which Secrets an instance reads, which keys it needs from them, and the content hash that rolls the
//! pods when they change. Only digests of Secret values are handled here (a hash, and whether the value
//! is an auth file memcached reads), never the values.

use std::collections::BTreeMap;

use sha2::{Digest, Sha256};

use super::{InvalidSpec, auth_file};
use crate::api::MemcachedSpec;

/// Reason when a referenced Secret does not exist.
pub const SECRET_NOT_FOUND: &str = "SecretNotFound";
/// Reason when a referenced Secret lacks a key.
pub const SECRET_INVALID: &str = "SecretInvalid";

/// A Secret the spec points at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SecretRef {
    pub name: String,
    /// Keys that must be present.
    pub keys: Vec<String>,
    /// The spec field naming it, for messages.
    pub field: &'static str,
    /// Whether its keys hold memcached auth files, which must pass [`auth_file::check`].
    pub auth_file: bool,
}

/// What the operator keeps of one Secret value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyDigest {
    /// SHA-256 of the value, hex.
    pub hash: String,
    /// The value checked as an auth file: what is wrong with it, if anything.
    pub auth_file: Result<(), String>,
}

impl KeyDigest {
    pub fn of(value: &[u8]) -> Self {
        Self {
            hash: hash_value(value),
            auth_file: auth_file::check(value),
        }
    }
}

/// The Secrets `spec` references, in a fixed order.
pub fn referenced(spec: &MemcachedSpec) -> Vec<SecretRef> {
    let mut refs = Vec::new();
    if let Some(tls) = spec.tls() {
        let mut keys = vec!["tls.crt".to_owned(), "tls.key".to_owned()];
        if tls.client_auth {
            keys.push("ca.crt".to_owned());
        }
        refs.push(SecretRef {
            name: tls.secret_name.clone(),
            keys,
            field: "spec.security.tls.secretName",
            auth_file: false,
        });
    }
    if let Some(auth) = spec.auth() {
        refs.push(SecretRef {
            name: auth.secret_name.clone(),
            keys: vec![auth.key().to_owned()],
            field: "spec.security.auth.secretName",
            auth_file: true,
        });
    }
    refs
}

/// Hash of one Secret value.
pub fn hash_value(value: &[u8]) -> String {
    hex(&Sha256::digest(value))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The hash over the keys every reference needs, given each Secret's per-key value digests (`None` for a
/// Secret that does not exist). Fails with the first missing Secret or key, or auth file memcached would
/// misread.
pub fn digest(
    namespace: &str,
    refs: &[SecretRef],
    contents: &BTreeMap<String, Option<BTreeMap<String, KeyDigest>>>,
) -> Result<Option<String>, InvalidSpec> {
    if refs.is_empty() {
        return Ok(None);
    }
    let mut hasher = Sha256::new();
    for r in refs {
        let Some(Some(keys)) = contents.get(&r.name) else {
            return Err(InvalidSpec {
                reason: SECRET_NOT_FOUND,
                message: format!(
                    "Secret {namespace}/{} named by {} does not exist",
                    r.name, r.field
                ),
            });
        };
        for key in &r.keys {
            let Some(value) = keys.get(key) else {
                return Err(InvalidSpec {
                    reason: SECRET_INVALID,
                    message: format!(
                        "Secret {namespace}/{} named by {} has no key {key:?} (it needs {})",
                        r.name,
                        r.field,
                        r.keys.join(", ")
                    ),
                });
            };
            if r.auth_file
                && let Err(problem) = &value.auth_file
            {
                return Err(InvalidSpec {
                    reason: SECRET_INVALID,
                    message: format!(
                        "the auth file in key {key:?} of Secret {namespace}/{} named by {} {problem}",
                        r.name, r.field
                    ),
                });
            }
            for part in [r.name.as_str(), key.as_str(), value.hash.as_str()] {
                hasher.update(part.as_bytes());
                hasher.update([0]);
            }
        }
    }
    Ok(Some(hex(&hasher.finalize())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{AuthConfig, Security, TlsConfig};

    fn spec(client_auth: bool) -> MemcachedSpec {
        MemcachedSpec {
            security: Some(Box::new(Security {
                tls: Some(TlsConfig {
                    secret_name: "tls".into(),
                    client_auth,
                    client_secret_name: None,
                }),
                auth: Some(AuthConfig {
                    secret_name: "auth".into(),
                    key: None,
                }),
                network_policy: None,
            })),
            ..MemcachedSpec::default()
        }
    }

    fn keys(pairs: &[(&str, &str)]) -> Option<BTreeMap<String, KeyDigest>> {
        Some(
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), KeyDigest::of(v.as_bytes())))
                .collect(),
        )
    }

    #[test]
    fn references_and_needed_keys() {
        assert!(referenced(&MemcachedSpec::default()).is_empty());
        let refs = referenced(&spec(true));
        assert_eq!(refs[0].keys, ["tls.crt", "tls.key", "ca.crt"]);
        assert_eq!(refs[1].keys, ["auth-file"]);
        assert_eq!(referenced(&spec(false))[0].keys, ["tls.crt", "tls.key"]);
    }

    #[test]
    fn digest_changes_with_needed_content_only() {
        let refs = referenced(&spec(false));
        let base = BTreeMap::from([
            (
                "tls".to_owned(),
                keys(&[("tls.crt", "c"), ("tls.key", "k"), ("unused", "x")]),
            ),
            ("auth".to_owned(), keys(&[("auth-file", "u:p\n")])),
        ]);
        let a = digest("ns", &refs, &base).unwrap().unwrap();
        let mut rotated = base.clone();
        rotated.insert("auth".into(), keys(&[("auth-file", "u:q\n")]));
        assert_ne!(digest("ns", &refs, &rotated).unwrap().unwrap(), a);
        let mut unrelated = base.clone();
        unrelated.insert(
            "tls".into(),
            keys(&[("tls.crt", "c"), ("tls.key", "k"), ("unused", "y")]),
        );
        assert_eq!(digest("ns", &refs, &unrelated).unwrap().unwrap(), a);
        assert_eq!(digest("ns", &[], &base).unwrap(), None);
    }

    #[test]
    fn missing_secret_or_key_is_named() {
        let refs = referenced(&spec(true));
        let missing = BTreeMap::from([("tls".to_owned(), None)]);
        let err = digest("ns", &refs, &missing).unwrap_err();
        assert_eq!(err.reason, SECRET_NOT_FOUND);
        assert!(
            err.message.contains("ns/tls") && err.message.contains("spec.security.tls.secretName")
        );

        let no_ca = BTreeMap::from([
            (
                "tls".to_owned(),
                keys(&[("tls.crt", "c"), ("tls.key", "k")]),
            ),
            ("auth".to_owned(), keys(&[("auth-file", "u:p\n")])),
        ]);
        let err = digest("ns", &refs, &no_ca).unwrap_err();
        assert_eq!(err.reason, SECRET_INVALID);
        assert!(err.message.contains("\"ca.crt\""), "{}", err.message);
    }

    #[test]
    fn an_auth_file_memcached_would_misread_is_invalid_and_named() {
        let refs = referenced(&spec(false));
        let contents = BTreeMap::from([
            (
                "tls".to_owned(),
                keys(&[("tls.crt", "c"), ("tls.key", "k")]),
            ),
            ("auth".to_owned(), keys(&[("auth-file", "app:s3cret")])),
        ]);
        let err = digest("ns", &refs, &contents).unwrap_err();
        assert_eq!(err.reason, SECRET_INVALID);
        assert!(
            err.message.starts_with(
                "the auth file in key \"auth-file\" of Secret ns/auth named by \
                 spec.security.auth.secretName does not end with a newline"
            ),
            "{}",
            err.message
        );
        assert!(!err.message.contains("s3cret"));
    }

    #[test]
    fn tls_keys_are_not_checked_as_auth_files() {
        let refs = referenced(&spec(false));
        let contents = BTreeMap::from([
            (
                "tls".to_owned(),
                keys(&[("tls.crt", "no newline"), ("tls.key", "k")]),
            ),
            ("auth".to_owned(), keys(&[("auth-file", "u:p\n")])),
        ]);
        assert!(digest("ns", &refs, &contents).is_ok());
    }
}
