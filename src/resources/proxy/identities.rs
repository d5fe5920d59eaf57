//! Who may use the proxy, and for which keys (`spec.proxy.access`): the client CA the proxy trusts, the
//! identities it maps certificates to, and how both reach running proxy pods.
//!
//! What memcached 1.6.45 offers, and what the operator builds on it (each checked against that proxy):
//! - A listener that requires a client certificate signed by the CA file (`-l mtls:...`, with
//!   `ssl_ca_cert`): a client without a certificate, or with one of another CA, fails the handshake.
//! - Lua reads the verified certificate's common name per request (`tls_peer_cn()`); a listener tag
//!   (`tag[client]`) gives the client listener hooks of its own. The operator's Lua library
//!   ([`LIBRARY`], the file `access.lua` the configuration writer writes beside `proxy.lua`) defines a
//!   routelib route, `route_access`, that finds the identity of the certificate's name and lets a
//!   request through only when its key starts with one of the identity's prefixes (and, for a read-only
//!   identity, when the command only reads). Multi-gets are split by the proxy into one request per key,
//!   so each key is checked. A meta command with a base64 key (flag `b`) is refused: the key checked
//!   would be its encoding, not the key stored. Every other command a client sends (`stats`, `watch`, `version`) is answered
//!   with an error by a hook on the client listener; the commands memcached's proxy does not parse
//!   (`flush_all`, `lru_crawler`, `verbosity`, `shutdown`, `refresh_certs`, ...) close the connection.
//! - The operator's own `stats` reads go to a second TLS listener without client certificates (the
//!   `ops` port, [`OPS_PORT`]) whose hooks refuse every key command and every command but `stats`; with
//!   `spec.networkPolicy`, only the operator's pods may reach it. The configuration writer reads `stats`
//!   on the pod's loopback, as without access control.
//! - `SIGHUP` makes memcached reload both its TLS files (the CA file included) and the Lua: changed
//!   identities, and CAs added to the Secret, reach the running proxy within seconds, through the same
//!   path as a changed server list (the route ConfigMap, the configuration writer, `SIGHUP`). But
//!   OpenSSL adds the reloaded CAs to the ones it holds: a CA removed from the Secret stays trusted
//!   until memcached restarts. So the operator replaces the proxy's pods when a CA leaves the Secret
//!   ([`trust`]): the Deployment records the CAs its pods may trust ([`TRUSTED_ANNOTATION`], on the
//!   Deployment, which rolls nothing) and the trust epoch its pods started under
//!   ([`EPOCH_ANNOTATION`], on the pod template, which rolls the pods when it changes); a new pod's
//!   configuration writer waits for the route of its own epoch before memcached first starts.
//!
//! The route ConfigMap carries the CA bundle (public certificates, re-encoded from what was parsed:
//! nothing else of the Secret) and the identities as data ([`RouteAccess`]), checked again by the writer
//! ([`RouteAccess::check`]) before it renders them into Lua string literals.

use std::collections::BTreeSet;
use std::fmt::Write;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use k8s_openapi::api::apps::v1::Deployment;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio_rustls::rustls::RootCertStore;
use tokio_rustls::rustls::pki_types::CertificateDer;

use crate::api::{MAX_IDENTITIES, MAX_PREFIX_LEN, MAX_PREFIXES, ProxyAccess};

/// The file of the Lua library, beside the route configuration.
pub const LIBRARY_FILE: &str = "access.lua";
/// The file of the client CA bundle, beside the route configuration.
pub const CA_FILE: &str = "client-ca.crt";
/// The tag of the client listener.
pub const CLIENT_TAG: &str = "client";
/// The port of the operator's `stats` listener with access control on.
pub const OPS_PORT: i32 = 11298;
/// Deployment annotation: the fingerprints of every CA the running proxy pods may trust.
pub const TRUSTED_ANNOTATION: &str = "cache.example.com/proxy-trusted-cas";
/// Pod-template annotation: the trust epoch the pods start under (a change replaces them).
pub const EPOCH_ANNOTATION: &str = "cache.example.com/proxy-trust-epoch";
/// Most bytes of a client CA bundle.
pub const MAX_CA_BYTES: usize = 64 * 1024;
/// Most certificates in a client CA bundle.
pub const MAX_CAS: usize = 16;
/// Longest common name (X.509's upper bound).
pub const MAX_COMMON_NAME: usize = 64;

/// The client CA as the proxy gets it: every certificate of the Secret's bundle, re-encoded as PEM, and
/// their fingerprints (the first 16 hex digits of each DER's SHA-256), sorted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientCa {
    pub pem: String,
    pub fingerprints: Vec<String>,
}

/// Why a client CA bundle is refused. The messages quote nothing of it but positions and sizes.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CaError {
    #[error("it is {0} bytes, more than the {MAX_CA_BYTES} a client CA bundle may have")]
    TooLarge(usize),
    #[error("it holds no PEM certificate")]
    Empty,
    #[error("it holds more than {MAX_CAS} certificates")]
    TooMany,
    #[error("certificate {0} is not valid PEM (base64 between BEGIN and END CERTIFICATE lines)")]
    NotPem(usize),
    #[error("certificate {0} is not a certificate a TLS server can trust as a CA")]
    NotCa(usize),
}

impl ClientCa {
    /// Reads a PEM bundle: every `CERTIFICATE` block must decode and parse as a trust anchor; text
    /// outside the blocks is ignored (as OpenSSL does), and left out of [`ClientCa::pem`].
    pub fn parse(bundle: &[u8]) -> Result<Self, CaError> {
        if bundle.len() > MAX_CA_BYTES {
            return Err(CaError::TooLarge(bundle.len()));
        }
        let text = String::from_utf8_lossy(bundle);
        let mut ders = Vec::new();
        let mut block: Option<String> = None;
        for line in text.lines().map(str::trim) {
            match (&mut block, line) {
                (None, "-----BEGIN CERTIFICATE-----") => block = Some(String::new()),
                (Some(body), "-----END CERTIFICATE-----") => {
                    let index = ders.len() + 1;
                    let der = STANDARD
                        .decode(body.as_bytes())
                        .map_err(|_| CaError::NotPem(index))?;
                    ders.push(der);
                    block = None;
                }
                (Some(body), line) => body.push_str(line),
                (None, _) => {}
            }
            if ders.len() > MAX_CAS {
                return Err(CaError::TooMany);
            }
        }
        if block.is_some() {
            return Err(CaError::NotPem(ders.len() + 1));
        }
        if ders.is_empty() {
            return Err(CaError::Empty);
        }
        let mut pem = String::new();
        let mut fingerprints = BTreeSet::new();
        for (index, der) in ders.iter().enumerate() {
            let mut store = RootCertStore::empty();
            store
                .add(CertificateDer::from(der.as_slice()))
                .map_err(|_| CaError::NotCa(index + 1))?;
            pem.push_str("-----BEGIN CERTIFICATE-----\n");
            for chunk in STANDARD.encode(der).as_bytes().chunks(64) {
                pem.push_str(&String::from_utf8_lossy(chunk));
                pem.push('\n');
            }
            pem.push_str("-----END CERTIFICATE-----\n");
            fingerprints.insert(fingerprint(der));
        }
        Ok(Self {
            pem,
            fingerprints: fingerprints.into_iter().collect(),
        })
    }
}

fn fingerprint(der: &[u8]) -> String {
    let digest = Sha256::digest(der);
    digest[..8].iter().fold(String::new(), |mut hex, byte| {
        let _ = write!(hex, "{byte:02x}");
        hex
    })
}

/// What the builders need of access control beside the spec: the client CA read and the trust to record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Material {
    pub ca: ClientCa,
    pub trust: Trust,
}

/// What the proxy Deployment records of the CAs (see the module doc).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Trust {
    /// [`TRUSTED_ANNOTATION`]: the fingerprints the running pods may trust, comma-separated.
    pub trusted: String,
    /// [`EPOCH_ANNOTATION`] and the route's epoch.
    pub epoch: String,
}

/// The trust to record for `ca`, given what the live Deployment records (`previous`: its
/// [`TRUSTED_ANNOTATION`] and [`EPOCH_ANNOTATION`], when it has both). The pods keep their epoch while
/// every CA they may trust is still in the bundle (they load the added ones on `SIGHUP`); otherwise a new
/// epoch replaces them.
pub fn trust(previous: Option<(&str, &str)>, ca: &ClientCa) -> Trust {
    let trusted = ca.fingerprints.join(",");
    let kept = previous.filter(|(recorded, epoch)| {
        !epoch.is_empty()
            && recorded
                .split(',')
                .filter(|f| !f.is_empty())
                .all(|f| ca.fingerprints.iter().any(|have| have == f))
    });
    let epoch = match kept {
        Some((_, epoch)) => epoch.to_owned(),
        None => fingerprint(trusted.as_bytes()),
    };
    Trust { trusted, epoch }
}

/// What a live proxy Deployment records of its trust, for [`trust`]: its [`TRUSTED_ANNOTATION`] and its
/// pod template's [`EPOCH_ANNOTATION`] (each empty when missing).
pub fn recorded(deployment: &Deployment) -> (String, String) {
    let get = |annotations: Option<&std::collections::BTreeMap<String, String>>, key: &str| {
        annotations
            .and_then(|a| a.get(key))
            .cloned()
            .unwrap_or_default()
    };
    let template = deployment
        .spec
        .as_ref()
        .and_then(|spec| spec.template.metadata.as_ref())
        .and_then(|meta| meta.annotations.as_ref());
    (
        get(deployment.metadata.annotations.as_ref(), TRUSTED_ANNOTATION),
        get(template, EPOCH_ANNOTATION),
    )
}

/// Access control as the route ConfigMap carries it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RouteAccess {
    /// The trust epoch of the route ([`Trust::epoch`]).
    pub epoch: String,
    /// The client CA bundle (PEM certificates only).
    pub client_ca: String,
    pub identities: Vec<RouteIdentity>,
}

/// One identity of [`RouteAccess`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RouteIdentity {
    pub name: String,
    pub common_name: String,
    pub prefixes: Vec<String>,
    #[serde(default)]
    pub read_only: bool,
}

impl RouteAccess {
    /// The route's access part for `access` (the spec) and `material`.
    pub fn new(access: &ProxyAccess, material: &Material) -> Self {
        Self {
            epoch: material.trust.epoch.clone(),
            client_ca: material.ca.pem.clone(),
            identities: access
                .identities
                .iter()
                .map(|identity| RouteIdentity {
                    name: identity.name.clone(),
                    common_name: identity.common_name().to_owned(),
                    prefixes: identity.prefixes.clone(),
                    read_only: identity.read_only,
                })
                .collect(),
        }
    }

    /// Checks what the writer renders: the schema's bounds again (the ConfigMap may have been edited),
    /// and a CA bundle that parses.
    pub fn check(&self) -> Result<(), &'static str> {
        let hex = |s: &str| s.len() <= 64 && s.bytes().all(|b| b.is_ascii_hexdigit());
        if self.epoch.is_empty() || !hex(&self.epoch) {
            return Err("the trust epoch is not a hex digest");
        }
        ClientCa::parse(self.client_ca.as_bytes()).map_err(|_| "the client CA is not valid")?;
        if self.identities.is_empty() || self.identities.len() > MAX_IDENTITIES {
            return Err("the identities are none or too many");
        }
        let (mut names, mut common) = (BTreeSet::new(), BTreeSet::new());
        for identity in &self.identities {
            check_identity(identity)?;
            if !names.insert(&identity.name) || !common.insert(&identity.common_name) {
                return Err("two identities share a name or a common name");
            }
        }
        Ok(())
    }
}

fn check_identity(identity: &RouteIdentity) -> Result<(), &'static str> {
    let name = &identity.name;
    let label = name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if name.is_empty() || name.len() > 63 || !label || name.starts_with('-') || name.ends_with('-')
    {
        return Err("an identity's name is not a DNS label");
    }
    if name == crate::api::UNKNOWN_IDENTITY {
        return Err("an identity is named unknown");
    }
    let cn = &identity.common_name;
    if cn.is_empty() || cn.chars().count() > MAX_COMMON_NAME || cn.chars().any(char::is_control) {
        return Err("an identity's common name is empty, too long or has control characters");
    }
    if identity.prefixes.is_empty() || identity.prefixes.len() > MAX_PREFIXES {
        return Err("an identity has no prefix or too many");
    }
    let bad = |p: &String| {
        p.is_empty()
            || p.len() > MAX_PREFIX_LEN
            || p.chars().any(|c| c.is_whitespace() || c.is_control())
    };
    if identity.prefixes.iter().any(bad) {
        return Err("a prefix is empty, too long, or has spaces or control characters");
    }
    Ok(())
}

/// The routelib routes of the client listener: `child` (a routelib route expression, or a pool's name as
/// a Lua string) behind `route_access` with `access`'s identities, keyed by common name. Strings go
/// through `quote`.
pub fn render_routes(access: &RouteAccess, child: &str, quote: impl Fn(&str) -> String) -> String {
    let mut lua = format!(
        "routes{{\n    tag = {},\n    default = route_access{{\n        identities = {{\n",
        quote(CLIENT_TAG)
    );
    for identity in &access.identities {
        let prefixes: Vec<String> = identity.prefixes.iter().map(|p| quote(p)).collect();
        let _ = writeln!(
            lua,
            "            [{}] = {{ name = {}, prefixes = {{ {} }}, read_only = {} }},",
            quote(&identity.common_name),
            quote(&identity.name),
            prefixes.join(", "),
            identity.read_only,
        );
    }
    let _ = write!(lua, "        }},\n        child = {child},\n    }},\n}}\n");
    lua
}

/// Requests of an identity a proxy worker thread counts before it adds them to the identity's counter
/// (the library's `PUBLISH_EVERY`): a counter's update takes the worker's stats lock, which cost about as
/// much CPU as the checks themselves (`bench --proxy-hop --cost`).
pub const PUBLISH_EVERY: u32 = 64;

/// The Lua library the proxy loads after routelib (`-o proxy_config=routelib:<dir>/access.lua`): the
/// `route_access` route and the hooks that refuse every other command (see the module doc). Per
/// identity, two counters in `stats proxy`: `user_access_<name>_requests` (published by each worker
/// thread every [`PUBLISH_EVERY`] requests, and at once with a refusal) and
/// `user_access_<name>_refused`; and `user_access_unknown_refused` for verified certificates that name
/// no identity.
pub const LIBRARY: &str = r#"-- memcached-operator: access control of the proxy's clients. Written by the configuration writer; do not edit.
register_route_handlers({ "access" })

function route_access_conf(t, ctx)
    for _, id in pairs(t.identities) do
        id.requests = ctx:get_stats_id("access_" .. id.name .. "_requests")
        id.refused = ctx:get_stats_id("access_" .. id.name .. "_refused")
        id.pending = 0
    end
    t.unknown = ctx:get_stats_id("access_unknown_refused")
    return t
end

local WRITES <const> = {
    [mcp.CMD_MS] = true, [mcp.CMD_MD] = true, [mcp.CMD_MA] = true, [mcp.CMD_SET] = true,
    [mcp.CMD_ADD] = true, [mcp.CMD_CAS] = true, [mcp.CMD_INCR] = true, [mcp.CMD_DECR] = true,
    [mcp.CMD_TOUCH] = true, [mcp.CMD_APPEND] = true, [mcp.CMD_DELETE] = true,
    [mcp.CMD_REPLACE] = true, [mcp.CMD_PREPEND] = true, [mcp.CMD_GAT] = true,
    [mcp.CMD_GATS] = true,
}
-- Meta commands whose key may be base64 (flag b): the key checked would not be the key stored.
local META <const> = {
    [mcp.CMD_MG] = true, [mcp.CMD_MS] = true, [mcp.CMD_MD] = true, [mcp.CMD_MA] = true,
    [mcp.CMD_ME] = true,
}
local DENIED <const> = "CLIENT_ERROR access denied\r\n"
-- An identity's requests are counted in its table (each worker has its own) and added to its counter
-- every PUBLISH_EVERY requests, and at once with a refusal (refusals never outrun requests): the counter
-- takes the worker's stats lock, which cost as much as the checks themselves.
local PUBLISH_EVERY <const> = 64
local CLIENT <const> = "client"
local REFUSED <const> = "CLIENT_ERROR command not allowed through this proxy\r\n"

local find <const> = string.find

local function allowed(id, r)
    local cmd = r:command()
    if id.read_only and WRITES[cmd] then
        return false
    end
    if META[cmd] and r:has_flag("b") then
        return false
    end
    local key = r:key()
    -- find (plain) at position 1 rather than a compared substring: no string is made per request.
    for _, prefix in ipairs(id.prefixes) do
        if find(key, prefix, 1, true) == 1 then
            return true
        end
    end
    return false
end

local function route_access_f(rctx, arg)
    local stat = mcp.stat
    return function(r)
        local id = arg.identities[rctx:tls_peer_cn() or ""]
        if id == nil then
            stat(arg.unknown, 1)
            return DENIED
        end
        local pending = id.pending + 1
        if not allowed(id, r) then
            id.pending = 0
            stat(id.requests, pending)
            stat(id.refused, 1)
            return DENIED
        end
        if pending < PUBLISH_EVERY then
            id.pending = pending
        else
            id.pending = 0
            stat(id.requests, pending)
        end
        return rctx:enqueue_and_wait(r, arg.handle)
    end
end

function route_access_start(a, ctx, fgen)
    local arg = { handle = fgen:new_handle(a.child), identities = a.identities, unknown = a.unknown }
    fgen:ready({ a = arg, n = ctx:label(), f = route_access_f })
end

-- Every command but the keys' own: refused on the client listener; on the others (the operator's
-- stats listener, the pod's loopback) every key command and every command but stats and version.
local OTHERS <const> = {
    mcp.CMD_STATS, mcp.CMD_SLABS, mcp.CMD_WATCH, mcp.CMD_LRU, mcp.CMD_VERSION, mcp.CMD_SHUTDOWN,
    mcp.CMD_EXTSTORE, mcp.CMD_FLUSH_ALL, mcp.CMD_VERBOSITY, mcp.CMD_LRU_CRAWLER,
    mcp.CMD_REFRESH_CERTS, mcp.CMD_CACHE_MEMLIMIT,
}
local routelib_config_routes = mcp_config_routes
function mcp_config_routes(c)
    routelib_config_routes(c)
    -- A route without access control (turned off, this pod about to be replaced): serve it as given.
    if c.r[CLIENT] == nil then
        return
    end
    local refuse = function(r) return REFUSED end
    mcp.attach(mcp.CMD_ANY_STORAGE, refuse)
    for _, cmd in ipairs(OTHERS) do
        mcp.attach(cmd, refuse, CLIENT)
        if cmd ~= mcp.CMD_STATS and cmd ~= mcp.CMD_VERSION then
            mcp.attach(cmd, refuse)
        end
    end
end
"#;

#[cfg(test)]
mod tests;
