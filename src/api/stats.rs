//! `status.stats`: what the operator read from the instance's memcached servers themselves.
//!
//! Written by the operand-telemetry collector under its own field manager, never by the reconciler, so
//! each owns its own part of the status. Every value is a whole number that changes only when the cache
//! really changes (no timestamps, no rates), so an idle cache causes no status writes at all.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A summary of memcached's own `stats` over the instance's ready servers, from the latest collection.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CacheStats {
    /// Share of `get` requests that found their key, in whole percent rounded down (so 100 means every
    /// get hit), over the servers read: get_hits / (get_hits + get_misses) since each server started.
    /// Absent when those servers have served no get yet, or none could be read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 100))]
    pub hit_ratio_percent: Option<i32>,

    /// Memory used by items, in whole percent of the memory limit rounded down (so 100 means full), over
    /// the servers read: the sum of their `bytes` over the sum of their `limit_maxbytes`. Absent when no
    /// server could be read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 100))]
    pub memory_used_percent: Option<i32>,

    /// Items stored (`curr_items`), summed over the servers read. Absent when no server could be read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub items: Option<i64>,

    /// Valid items removed to make room for new ones (`evictions`) since each server started, summed
    /// over the servers read. A growing number means the cache is too small. Absent when no server could
    /// be read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub evictions: Option<i64>,

    /// Open client connections (`curr_connections`, which counts the operator's own reading connection
    /// too), summed over the servers read. Absent when no server could be read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub connections: Option<i64>,

    /// Servers whose stats were read in the latest collection. Fewer than `serversReady` means some could
    /// not be read (timeout, refused, TLS or auth failure); the operator's log and the `memcached_up`
    /// metric say which and why.
    #[schemars(range(min = 0))]
    pub servers_read: i32,

    /// Ready, non-terminating pods with an address in the latest collection: the servers there were to
    /// read.
    #[schemars(range(min = 0))]
    pub servers_ready: i32,

    /// What the proxy pods say of themselves (`spec.proxy`); absent when the proxy is off or none of its
    /// pods is ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy: Option<ProxyStats>,
}

/// A summary of the proxy pods' own `stats` and `stats proxybe`, from the latest collection. memcached's
/// proxy reports no latency, so there is none here.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProxyStats {
    /// Requests the proxy pods received since each started (`proxy_conn_requests`), summed over the pods
    /// read. Absent when none could be read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub requests: Option<i64>,

    /// Errors that reset a connection from a proxy pod to a server (`proxy_backend_failed`: a timeout, a
    /// refused or broken connection) since each started, summed over the pods read. Absent when none
    /// could be read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub backend_errors: Option<i64>,

    /// The slots of the published list whose server some proxy pod read marks down now (it answers
    /// their keys `SERVER_ERROR backend failure` until the server answers again), in slot order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub backends_down: Vec<i32>,

    /// Proxy pods whose stats were read in the latest collection.
    #[schemars(range(min = 0))]
    pub proxies_read: i32,

    /// Ready, non-terminating proxy pods with an address in the latest collection.
    #[schemars(range(min = 0))]
    pub proxies_ready: i32,

    /// With access control (`spec.proxy.access`): per identity of the spec, and `unknown` (verified
    /// certificates naming no identity), its requests and refusals since each proxy pod started, summed
    /// over the pods read, by name. Only names the spec has (at most 32, and `unknown`); an identity no
    /// pod read reports yet is left out. Absent without access control or when no pod could be read.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 33))]
    pub identities: Vec<IdentityStats>,
}

/// One identity's requests and refusals through the proxy (`status.stats.proxy.identities`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IdentityStats {
    /// The identity's name (`spec.proxy.access.identities[].name`), or `unknown`.
    #[schemars(length(min = 1, max = 63))]
    pub name: String,

    /// Its requests, allowed or refused (`user_access_<name>_requests` of `stats proxy`), since each
    /// proxy pod started, summed over the pods read. Each proxy worker thread adds its count every 64
    /// requests and at once with a refusal, so this may trail by up to 63 requests per worker thread.
    /// For `unknown`, whose every request is refused, its refusals.
    #[schemars(range(min = 0))]
    pub requests: i64,

    /// Its requests the proxy refused (a key outside its prefixes, a write of a read-only identity, or
    /// for `unknown` every request: `user_access_<name>_refused`), since each proxy pod started, summed
    /// over the pods read.
    #[schemars(range(min = 0))]
    pub refusals: i64,
}
