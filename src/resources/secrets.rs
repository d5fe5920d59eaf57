//! Which Secrets an instance reads, which keys it needs from them, and the content hash that rolls the
//! pods when they change. Only digests of Secret values are handled here (a hash, and whether the value
//! is an auth file memcached reads), never the values.
//!
//! The auth file is in the hash: memcached reads it at start only. The TLS Secret is in it only when a
//! rotated certificate cannot be reloaded in place ([`tls_reload`]): memcached loads its certificate
//! files again on `refresh_certs`, which the stats collector sends once the kubelet has updated the
//! mounted files (see [`crate::telemetry::reload`]), so a rotation restarts no pod and empties no cache.

use std::collections::BTreeMap;

use sha2::{Digest, Sha256};

use super::auth_file;
use super::invalid_spec::InvalidSpec;
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
    /// Whether it is the TLS Secret, whose content is left out of the hash when the servers reload it in
    /// place ([`TlsReload::InPlace`]).
    pub tls: bool,
}

/// How a rotated TLS certificate reaches the servers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TlsReload {
    /// The stats collector asks the running servers to reload it (`refresh_certs`): the TLS Secret's
    /// content is not in the pod template's hash.
    InPlace,
    /// The pods are replaced (the content is in the hash), for the reason given.
    Rollout(&'static str),
}

/// Whether a rotated TLS certificate can be reloaded in place for `spec`: only when something will ask
/// the servers to reload and every process that reads the files reloads them.
///
/// - The stats collector must run (`stats_collected`): it sends `refresh_certs`.
/// - With auth on, the TLS Secret must have `ca.crt` (`has_ca`): the collector sends credentials only to
///   verified servers, and `refresh_certs` only after authenticating.
/// - Not with the exporter sidecar: it reads its client certificate (with `clientAuth`) or the server's
///   certificate it verifies against (without) once, at start.
pub fn tls_reload(spec: &MemcachedSpec, stats_collected: bool, has_ca: bool) -> TlsReload {
    let Some(tls) = spec.tls() else {
        return TlsReload::Rollout("no TLS");
    };
    if !stats_collected {
        TlsReload::Rollout("stats collection is off (--stats-interval=0)")
    } else if spec.auth().is_some() && !has_ca {
        TlsReload::Rollout(
            "auth without ca.crt: the operator does not authenticate to unverified servers",
        )
    } else if spec.exporter().is_some() && tls.client_auth {
        TlsReload::Rollout("the exporter sidecar reads its client certificate at start")
    } else if spec.exporter().is_some() {
        TlsReload::Rollout(
            "the exporter sidecar reads the server certificate it verifies against at start",
        )
    } else {
        TlsReload::InPlace
    }
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
            tls: true,
        });
    }
    if let Some(auth) = spec.auth() {
        refs.push(SecretRef {
            name: auth.secret_name.clone(),
            keys: vec![auth.key().to_owned()],
            field: "spec.security.auth.secretName",
            auth_file: true,
            tls: false,
        });
    }
    refs
}

/// The Secrets the proxy reads (`spec.proxy` with `spec.security.tls`): the TLS Secret's certificate and
/// key. memcached reads them at start, so they are always hashed ([`proxy_digest`]): a rotated
/// certificate rolls the proxy pods.
pub fn proxy_referenced(spec: &MemcachedSpec) -> Vec<SecretRef> {
    let (Some(_), Some(tls)) = (spec.proxy(), spec.tls()) else {
        return Vec::new();
    };
    vec![SecretRef {
        name: tls.secret_name.clone(),
        keys: super::proxy::TLS_KEYS.map(str::to_owned).to_vec(),
        field: "spec.security.tls.secretName",
        auth_file: false,
        tls: true,
    }]
}

/// The client CA Secret of `spec.proxy.access`, while the proxy is on. Its content is in no pod
/// template's hash: the proxy loads it in place (see `resources::proxy::identities`).
pub fn access_referenced(spec: &MemcachedSpec) -> Option<SecretRef> {
    let access = spec.proxy()?.access.as_ref()?;
    Some(SecretRef {
        name: access.client_ca.secret_name.clone(),
        keys: vec![access.ca_key().to_owned()],
        field: "spec.proxy.access.clientCA.secretName",
        auth_file: false,
        tls: false,
    })
}

/// [`digest`] of what the proxy reads ([`proxy_referenced`]), the TLS Secret's content included.
pub fn proxy_digest(
    namespace: &str,
    spec: &MemcachedSpec,
    contents: &BTreeMap<String, Option<BTreeMap<String, KeyDigest>>>,
) -> Result<Option<String>, InvalidSpec> {
    digest(
        namespace,
        &proxy_referenced(spec),
        contents,
        TlsReload::Rollout("memcached's proxy reads its certificate at start"),
    )
}

/// The hash a pod template carries for `digest` (what [`digest`] gave): HMAC-SHA256 under the
/// operator's key (see `crate::store::digest_key`), so that someone who may read pod templates but not
/// Secrets cannot test a guessed Secret value against it. The instance's namespace and UID are in the
/// input: the same Secret content gives another hash in every instance, so a same-named Secret of
/// one's own in another namespace (or a deleted and re-created instance) tests no guess either.
pub fn keyed(key: &[u8], instance: &Owner<'_>, digest: &str) -> String {
    hmac(
        key,
        &[
            b"secret-hash",
            instance.namespace.as_bytes(),
            instance.uid.as_bytes(),
            digest.as_bytes(),
        ],
    )
}

/// The password of the operator's own entry in the auth file the servers of `instance` load
/// (`auth_file::served`): HMAC-SHA256 under the operator's digest key of the instance's namespace and
/// UID, hex. Stable for the life of the instance and the key, never stored but in that file; another
/// instance's (or a re-created one's) is another. Deleting the digest key changes it, with one rollout
/// of every instance using Secrets.
pub fn operator_password(key: &[u8], instance: &Owner<'_>) -> zeroize::Zeroizing<String> {
    zeroize::Zeroizing::new(hmac(
        key,
        &[
            b"operator-auth",
            instance.namespace.as_bytes(),
            instance.uid.as_bytes(),
        ],
    ))
}

/// HMAC-SHA256 under `key` of `parts`, each framed by its length (8 bytes, big-endian), so that no
/// moving of bytes from one part to the next gives the same input. Hex.
pub fn hmac(key: &[u8], parts: &[&[u8]]) -> String {
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, key);
    let mut context = ring::hmac::Context::with_key(&key);
    for part in parts {
        context.update(&(part.len() as u64).to_be_bytes());
        context.update(part);
    }
    hex(context.sign().as_ref())
}

/// The instance a keyed hash belongs to: its namespace and UID.
#[derive(Clone, Copy, Debug)]
pub struct Owner<'a> {
    pub namespace: &'a str,
    pub uid: &'a str,
}

/// Hash of one Secret value.
pub fn hash_value(value: &[u8]) -> String {
    hex(&Sha256::digest(value))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The digest over the keys every reference needs (unkeyed: it stays in the operator; what the pod
/// template carries is [`keyed`]), given each Secret's per-key value digests (`None` for a
/// Secret that does not exist); the TLS Secret's keys are checked but not hashed when `tls` is
/// [`TlsReload::InPlace`]. `None` when nothing is hashed. Fails with the first missing Secret or key, or
/// auth file memcached would misread.
pub fn digest(
    namespace: &str,
    refs: &[SecretRef],
    contents: &BTreeMap<String, Option<BTreeMap<String, KeyDigest>>>,
    tls: TlsReload,
) -> Result<Option<String>, InvalidSpec> {
    let mut hasher = Sha256::new();
    let mut hashed = false;
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
            if r.tls && tls == TlsReload::InPlace {
                continue;
            }
            hashed = true;
            for part in [r.name.as_str(), key.as_str(), value.hash.as_str()] {
                hasher.update(part.as_bytes());
                hasher.update([0]);
            }
        }
    }
    Ok(hashed.then(|| hex(&hasher.finalize())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{AuthConfig, Security, TlsConfig};

    const ROLL: TlsReload = TlsReload::Rollout("test");

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
                    allow_plaintext_stats: false,
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
        let a = digest("ns", &refs, &base, ROLL).unwrap().unwrap();
        let mut rotated = base.clone();
        rotated.insert("auth".into(), keys(&[("auth-file", "u:q\n")]));
        assert_ne!(digest("ns", &refs, &rotated, ROLL).unwrap().unwrap(), a);
        let mut unrelated = base.clone();
        unrelated.insert(
            "tls".into(),
            keys(&[("tls.crt", "c"), ("tls.key", "k"), ("unused", "y")]),
        );
        assert_eq!(digest("ns", &refs, &unrelated, ROLL).unwrap().unwrap(), a);
        assert_eq!(digest("ns", &[], &base, ROLL).unwrap(), None);
    }

    #[test]
    fn missing_secret_or_key_is_named() {
        let refs = referenced(&spec(true));
        let missing = BTreeMap::from([("tls".to_owned(), None)]);
        let err = digest("ns", &refs, &missing, ROLL).unwrap_err();
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
        let err = digest("ns", &refs, &no_ca, ROLL).unwrap_err();
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
        let err = digest("ns", &refs, &contents, ROLL).unwrap_err();
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
    fn a_tls_secret_reloaded_in_place_is_checked_but_not_hashed() {
        let refs = referenced(&spec(false));
        let with = |crt: &str| {
            BTreeMap::from([
                (
                    "tls".to_owned(),
                    keys(&[("tls.crt", crt), ("tls.key", "k")]),
                ),
                ("auth".to_owned(), keys(&[("auth-file", "u:p\n")])),
            ])
        };
        let before = digest("ns", &refs, &with("c1"), TlsReload::InPlace).unwrap();
        let after = digest("ns", &refs, &with("c2"), TlsReload::InPlace).unwrap();
        assert_eq!(before, after, "a rotated certificate rolls nothing");
        assert!(before.is_some(), "the auth file is still hashed");
        assert_ne!(
            digest("ns", &refs, &with("c1"), ROLL).unwrap(),
            digest("ns", &refs, &with("c2"), ROLL).unwrap()
        );
        let tls_only = referenced(&MemcachedSpec {
            security: Some(Box::new(Security {
                tls: spec(false).security.and_then(|s| s.tls),
                auth: None,
                network_policy: None,
            })),
            ..MemcachedSpec::default()
        });
        assert_eq!(
            digest("ns", &tls_only, &with("c1"), TlsReload::InPlace).unwrap(),
            None,
            "nothing hashed: no annotation"
        );
        let missing = BTreeMap::from([("tls".to_owned(), keys(&[("tls.crt", "c")]))]);
        assert_eq!(
            digest("ns", &tls_only, &missing, TlsReload::InPlace)
                .unwrap_err()
                .reason,
            SECRET_INVALID,
            "still checked"
        );
    }

    #[test]
    fn reload_in_place_needs_a_collector_that_can_ask_and_processes_that_reload() {
        let with = |client_auth: bool, auth: bool, exporter: bool| {
            let mut spec: MemcachedSpec = serde_json::from_value(serde_json::json!({
                "security": {"tls": {"secretName": "tls", "clientAuth": client_auth}}
            }))
            .unwrap();
            if auth {
                spec = MemcachedSpec {
                    security: Some(Box::new(Security {
                        auth: Some(AuthConfig {
                            secret_name: "auth".into(),
                            key: None,
                            allow_plaintext_stats: false,
                        }),
                        ..*spec.security.unwrap()
                    })),
                    ..spec
                };
            }
            if exporter {
                spec.monitoring =
                    serde_json::from_value(serde_json::json!({"exporter": {"enabled": true}}))
                        .unwrap();
            }
            spec
        };
        assert_eq!(
            tls_reload(&with(false, false, false), true, false),
            TlsReload::InPlace
        );
        assert_eq!(
            tls_reload(&with(false, true, false), true, true),
            TlsReload::InPlace
        );
        assert_eq!(
            tls_reload(&with(true, false, false), true, true),
            TlsReload::InPlace
        );
        for (spec, collected, has_ca) in [
            (MemcachedSpec::default(), true, true),
            (with(false, false, false), false, true),
            (with(false, true, false), true, false),
            (with(true, false, true), true, true),
        ] {
            assert!(
                matches!(tls_reload(&spec, collected, has_ca), TlsReload::Rollout(_)),
                "{spec:?} {collected} {has_ca}"
            );
        }
        assert!(
            matches!(
                tls_reload(&with(false, false, true), true, false),
                TlsReload::Rollout(_)
            ),
            "the exporter without clientAuth verifies the server against its certificate, read at start"
        );
    }

    #[test]
    fn the_proxy_hashes_its_certificate_and_key_always() {
        let spec = |proxy: bool| -> MemcachedSpec {
            serde_json::from_value(serde_json::json!({
                "proxy": {"enabled": proxy, "image": "proxy-tls"}, "security": {"tls": {"secretName": "tls"}}
            }))
            .unwrap()
        };
        assert!(proxy_referenced(&spec(false)).is_empty());
        assert!(proxy_referenced(&MemcachedSpec::default()).is_empty());
        assert_eq!(
            proxy_referenced(&spec(true))[0].keys,
            ["tls.crt", "tls.key"]
        );
        let with = |crt: &str, ca: &str| {
            BTreeMap::from([(
                "tls".to_owned(),
                keys(&[("tls.crt", crt), ("tls.key", "k"), ("ca.crt", ca)]),
            )])
        };
        let before = proxy_digest("ns", &spec(true), &with("c1", "a")).unwrap();
        assert!(before.is_some());
        assert_ne!(
            proxy_digest("ns", &spec(true), &with("c2", "a")).unwrap(),
            before,
            "a rotated certificate rolls the proxy"
        );
        assert_eq!(
            proxy_digest("ns", &spec(true), &with("c1", "b")).unwrap(),
            before,
            "the proxy reads no CA"
        );
        assert_eq!(
            proxy_digest("ns", &spec(false), &with("c1", "a")).unwrap(),
            None
        );
    }

    #[test]
    fn the_same_secret_hashes_differently_in_another_namespace_or_instance() {
        let key = [7u8; 32];
        let digest = hash_value(b"u:same-password\n");
        let keyed_for =
            |namespace: &str, uid: &str| keyed(&key, &Owner { namespace, uid }, &digest);
        let here = keyed_for("team-a", "uid-1");
        assert_eq!(
            keyed_for("team-a", "uid-1"),
            here,
            "stable for one instance"
        );
        assert_ne!(keyed_for("team-b", "uid-1"), here, "another namespace");
        assert_ne!(
            keyed_for("team-a", "uid-2"),
            here,
            "another instance (a re-created one too)"
        );
        // Framed: moving bytes between namespace and UID gives another input.
        assert_ne!(keyed_for("ab", "c"), keyed_for("a", "bc"));
    }

    #[test]
    fn the_operators_password_is_its_own_per_instance() {
        let key = [7u8; 32];
        let password = |namespace: &str, uid: &str| {
            operator_password(&key, &Owner { namespace, uid }).to_string()
        };
        let here = password("team-a", "uid-1");
        assert_eq!(here.len(), 64);
        assert_eq!(password("team-a", "uid-1"), here);
        assert_ne!(password("team-b", "uid-1"), here);
        assert_ne!(password("team-a", "uid-2"), here);
        let owner = Owner {
            namespace: "team-a",
            uid: "uid-1",
        };
        assert_ne!(
            operator_password(&[8u8; 32], &owner).as_str(),
            here,
            "another key"
        );
        assert_ne!(keyed(&key, &owner, ""), here, "not the template's hash");
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
        assert!(digest("ns", &refs, &contents, ROLL).is_ok());
    }
}
