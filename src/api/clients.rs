//! What the operator may assume about the instance's clients (`spec.clients`).
//!
//! The operator publishes the server list; how clients spread keys over it is the clients' choice. Declared
//! here, that choice lets the operator know, for any key, which server clients ask for it, so that it can
//! keep keys warm when the list changes.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::hashing::Scheme;

/// What the instance's clients do with the published server list (`spec.clients`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Clients {
    /// How the clients place keys over the published server list (the `<name>-servers` ConfigMap's
    /// `servers`, in slot order). With `spec.handover.enabled` the operator uses it to keep keys warm when
    /// scaling: before a scale-down's drained servers go, and before a scale-up's new servers are
    /// published, it copies each item that changes server to the one clients will ask for it. It must
    /// then match every client of the instance exactly, or copies go where no client looks. Default
    /// `unknown`.
    ///
    /// `unknown`: the operator assumes nothing about the clients (scaling copies no item).
    /// `ketama`: libmemcached's libketama-compatible consistent hashing (MEMCACHED_BEHAVIOR_KETAMA_WEIGHTED):
    /// PHP Memcached with `Memcached::OPT_LIBKETAMA_COMPATIBLE` true, pylibmc with
    /// `behaviors={"ketama_weighted": True}` (not `{"ketama": True}` alone, another placement), servers
    /// added in list order without weights. A ring of 160 points per server (156 with 25, 47, 50, 55 or 61
    /// servers: libmemcached's float rounding), 4 from each MD5 of `host-N` (N from 0) for a server on
    /// port 11211 and of `host:port-N` on another port, host as published (an IPv6 address without its
    /// brackets); a key goes to the first point at or after its MD5's first 4 bytes (little-endian).
    /// `rendezvous`: pymemcache's HashClient with its default RendezvousHash, given the published
    /// `host:port` entries and `str` keys: each server scores murmur3_32 of `host:port-key` (host without
    /// brackets), the highest wins.
    /// `jump`: jump consistent hash over the slot index of the key's MD5 as an integer, as the PyPI package
    /// jump-consistent-hash computes `jump.hash(int(hashlib.md5(key).hexdigest(), 16), len(servers))`
    /// (not mcrouter's Ch3, another function).
    /// `modula`: libmemcached's default (MEMCACHED_DISTRIBUTION_MODULA with MEMCACHED_HASH_DEFAULT, its
    /// one-at-a-time hash, bytes above 0x7f read as signed as on x86) modulo the number of servers, over
    /// the slot index: pylibmc and PHP Memcached without distribution or hash options.
    #[serde(default)]
    pub hashing: ClientHashing,
}

/// A key placement clients may declare (`spec.clients.hashing`).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum ClientHashing {
    /// Nothing is assumed about the clients.
    #[default]
    Unknown,
    /// libmemcached's libketama-compatible consistent hashing.
    Ketama,
    /// pymemcache HashClient's rendezvous hashing.
    Rendezvous,
    /// Jump consistent hash of the key's MD5 over slot indexes.
    Jump,
    /// libmemcached's one-at-a-time hash modulo the number of servers.
    Modula,
}

impl ClientHashing {
    /// The placement to compute, or `None` when nothing is declared.
    pub fn scheme(self) -> Option<Scheme> {
        match self {
            Self::Unknown => None,
            Self::Ketama => Some(Scheme::Ketama),
            Self::Rendezvous => Some(Scheme::Rendezvous),
            Self::Jump => Some(Scheme::Jump),
            Self::Modula => Some(Scheme::Modula),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::MemcachedSpec;

    #[test]
    fn hashing_defaults_to_unknown_which_declares_no_scheme() {
        let spec: MemcachedSpec = serde_json::from_str(r#"{"size": 3}"#).unwrap();
        assert_eq!(spec.client_hashing(), ClientHashing::Unknown);
        let spec: MemcachedSpec = serde_json::from_str(r#"{"clients": {}}"#).unwrap();
        assert_eq!(spec.client_hashing(), ClientHashing::Unknown);
        assert_eq!(ClientHashing::Unknown.scheme(), None);
    }

    #[test]
    fn hashing_values_are_camel_case_and_name_their_scheme() {
        for (value, scheme) in [
            ("ketama", Scheme::Ketama),
            ("rendezvous", Scheme::Rendezvous),
            ("jump", Scheme::Jump),
            ("modula", Scheme::Modula),
        ] {
            let spec: MemcachedSpec =
                serde_json::from_value(serde_json::json!({"clients": {"hashing": value}})).unwrap();
            assert_eq!(spec.client_hashing().scheme(), Some(scheme), "{value}");
        }
        let refused =
            serde_json::from_str::<MemcachedSpec>(r#"{"clients": {"hashing": "Ketama"}}"#);
        assert!(refused.is_err());
    }
}
