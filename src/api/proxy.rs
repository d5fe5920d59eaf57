//! A managed memcached proxy in front of the pool (`spec.proxy`).
//!
//! memcached 1.6.23 and later run as a proxy (`-o proxy_config=routelib`): clients connect to one address,
//! `<name>-proxy`, and the proxy spreads keys over the published server list. The operator generates the
//! proxy's route configuration from that list and chooses the proxy's key distribution itself (jump hash
//! of the key's XXH3 over slot indexes, the proxy's default), so warm handover on scale always follows
//! the hashing that the proxy's clients actually get.

use k8s_openapi::api::core::v1::ResourceRequirements;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Default for `spec.proxy.replicas`.
pub const DEFAULT_PROXY_REPLICAS: i32 = 2;
/// Upper bound for `spec.proxy.replicas`.
pub const MAX_PROXY_REPLICAS: i32 = 32;

/// CEL rule on `spec`: memcached's proxy mode has no authentication, to its clients or to the servers, so
/// it cannot run in front of servers that require it.
pub const PROXY_AUTH_RULE: &str = "!has(self.proxy) || !has(self.proxy.enabled) || !self.proxy.enabled \
     || !has(self.security) || !has(self.security.auth)";
/// Message of [`PROXY_AUTH_RULE`].
pub const PROXY_AUTH_MESSAGE: &str = "spec.proxy does not support spec.security.auth: memcached's proxy \
     mode refuses ASCII authentication (-Y) and SASL for its clients, and sends no credentials to the servers";
/// CEL rule on `spec`: with the proxy on, the operator chooses the key distribution, and warm handover
/// follows it; a declared client hashing would be a second one it cannot follow at the same time.
pub const PROXY_HASHING_RULE: &str = "!has(self.proxy) || !has(self.proxy.enabled) || !self.proxy.enabled \
     || !has(self.clients) || !has(self.clients.hashing) || self.clients.hashing == 'unknown'";
/// Message of [`PROXY_HASHING_RULE`].
pub const PROXY_HASHING_MESSAGE: &str = "spec.clients.hashing must be unknown (or left out) with \
     spec.proxy.enabled: the operator chooses the proxy's key distribution, and warm handover follows it";
/// CEL rule on `spec`: TLS runs through the proxy (clients to the proxy, the proxy to the servers), but
/// memcached's proxy presents no client certificate to the servers, so not with `clientAuth`.
pub const PROXY_TLS_RULE: &str = "!has(self.proxy) || !has(self.proxy.enabled) || !self.proxy.enabled \
     || !has(self.security) || !has(self.security.tls) || !has(self.security.tls.clientAuth) \
     || !self.security.tls.clientAuth";
/// Message of [`PROXY_TLS_RULE`].
pub const PROXY_TLS_MESSAGE: &str = "spec.proxy does not support spec.security.tls.clientAuth: memcached's \
     proxy presents no client certificate to the servers, which would refuse it";
/// CEL rule on `spec`: with TLS the proxy reaches the servers over TLS, which takes a memcached built with
/// `--enable-proxy-tls`; the official images (the default) are not, so the image must be given.
pub const PROXY_TLS_IMAGE_RULE: &str = "!has(self.proxy) || !has(self.proxy.enabled) \
     || !self.proxy.enabled || !has(self.security) || !has(self.security.tls) || has(self.proxy.image)";
/// Message of [`PROXY_TLS_IMAGE_RULE`].
pub const PROXY_TLS_IMAGE_MESSAGE: &str = "spec.proxy.image is required with spec.security.tls: the \
     official memcached images are built with --enable-proxy (since 1.6.38) but not with \
     --enable-proxy-tls, which the proxy needs to reach the servers over TLS (memcached refuses the route \
     configuration with \"cannot set mcp.backend_use_tls: TLS support not compiled\"); give an image built \
     with --enable-proxy-tls";

/// CEL rule on `spec`: access control needs the proxy to serve TLS, which client certificates are part of.
pub const PROXY_ACCESS_TLS_RULE: &str = "!has(self.proxy) || !has(self.proxy.enabled) \
     || !self.proxy.enabled || !has(self.proxy.access) \
     || (has(self.security) && has(self.security.tls))";
/// Message of [`PROXY_ACCESS_TLS_RULE`].
pub const PROXY_ACCESS_TLS_MESSAGE: &str = "spec.proxy.access requires spec.security.tls: clients prove \
     who they are with TLS client certificates, which the proxy checks on its TLS listener";
/// Most identities of `spec.proxy.access`.
pub const MAX_IDENTITIES: usize = 32;
/// Most key prefixes of one identity.
pub const MAX_PREFIXES: usize = 8;
/// Longest key prefix (memcached keys are at most 250 bytes).
pub const MAX_PREFIX_LEN: usize = 128;
/// Default key of the client CA Secret.
pub const DEFAULT_CLIENT_CA_KEY: &str = "ca.crt";
/// Message of [`IDENTITIES_UNIQUE_RULE`].
pub const IDENTITIES_UNIQUE_MESSAGE: &str =
    "spec.proxy.access.identities need distinct names and distinct commonNames";
/// Rule on `identities`: names and certificate names are unique.
const IDENTITIES_UNIQUE_RULE: &str = "self.all(i, self.exists_one(j, j.name == i.name)) \
     && self.all(i, self.exists_one(j, (has(j.commonName) ? j.commonName : j.name) \
     == (has(i.commonName) ? i.commonName : i.name)))";

/// The proxy tier (`spec.proxy`). Off unless `enabled`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Proxy {
    /// Whether to run the proxy: a Deployment `<name>-proxy` of memcached in proxy mode, the Service
    /// `<name>-proxy` on the memcached port (the one address clients need), and its route configuration
    /// (the ConfigMap `<name>-proxy`, over the published server list in slot order), reloaded in place
    /// when the list changes. The proxy spreads keys with jump hash over the slots (the operator's choice;
    /// warm handover on scale follows it). With `spec.security.tls`, clients reach the proxy over TLS with
    /// the same certificate as the servers, and the proxy reaches the servers over TLS (encrypted, but
    /// memcached's proxy does not verify the servers' certificates); not with `clientAuth` (the proxy
    /// presents no client certificate) nor with `spec.security.auth` (the proxy has no authentication).
    /// With TLS, `image` is required: the proxy must be built with `--enable-proxy-tls`, which the
    /// official images are not. Default false.
    #[serde(default)]
    pub enabled: bool,

    /// Number of proxy pods. Default 2; a PodDisruptionBudget keeps all but one up when above 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 32))]
    pub replicas: Option<i32>,

    /// Image of the proxy: a memcached 1.6.23 or later built with the proxy (`--enable-proxy`; the
    /// official images are since 1.6.38). Default: the operator's default memcached image
    /// (`MEMCACHED_IMAGE`, itself `memcached:1.6-alpine` unless the install sets it). Required with
    /// `spec.security.tls`: give an image built with `--enable-proxy-tls` too (the official images are
    /// not), or memcached refuses the route configuration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 512))]
    pub image: Option<String>,

    /// CPU and memory for the proxy container. Default: requests of 100m CPU and 64Mi memory, a memory
    /// limit of 256Mi; keys given here replace those defaults one by one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<Box<ResourceRequirements>>,

    /// Who may use the proxy, and for which keys (see docs/clients.md, "Separate key spaces behind one
    /// proxy"). With access set, the proxy accepts only clients presenting a TLS certificate signed by
    /// `clientCA`, maps the certificate's common name to one of `identities`, and lets that identity read
    /// and write only keys starting with one of its prefixes; every command that is not a key's read or
    /// write (`stats`, `watch`, `flush_all`, ...) is refused to clients. Changed identities and added CAs
    /// reach the running proxy within seconds; a CA removed from the Secret replaces the proxy's pods
    /// (memcached keeps trusting a CA it has loaded until it restarts). Requires `spec.security.tls`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access: Option<ProxyAccess>,
}

/// Access control through the proxy (`spec.proxy.access`): client certificates and key prefixes.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProxyAccess {
    /// The CA that signs the clients' certificates: a Secret of the instance's namespace and its key
    /// (PEM, one or more certificates; several during a rotation).
    #[serde(rename = "clientCA")]
    pub client_ca: ClientCa,

    /// The identities allowed through, each by its certificate's common name.
    #[schemars(length(min = 1, max = 32))]
    #[schemars(extend("x-kubernetes-validations" = [{
        "rule": IDENTITIES_UNIQUE_RULE,
        "message": IDENTITIES_UNIQUE_MESSAGE
    }]))]
    pub identities: Vec<ProxyIdentity>,
}

/// The Secret holding the client CA (`spec.proxy.access.clientCA`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClientCa {
    /// Name of the Secret, in the instance's namespace.
    #[schemars(length(min = 1, max = 253))]
    pub secret_name: String,

    /// Key of the Secret holding the CA certificates (PEM). Default `ca.crt`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub key: Option<String>,
}

/// One identity allowed through the proxy.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProxyIdentity {
    /// The identity's name, as metrics and `status.stats.proxy` report it (a DNS label).
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    )]
    pub name: String,

    /// The common name (CN) of the client certificate that is this identity. Default: `name`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 64), regex(pattern = r"^[^\x00-\x1f\x7f]+$"))]
    pub common_name: Option<String>,

    /// The key prefixes this identity may read and write (a key is allowed when it starts with one).
    #[schemars(length(min = 1, max = 8))]
    #[schemars(extend("items" = {"type": "string", "minLength": 1, "maxLength": 128,
        "pattern": "^[^\\s\\x00-\\x1f\\x7f]+$"}))]
    pub prefixes: Vec<String>,

    /// Reads only: writes, deletes, touches and counters are refused. Default false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub read_only: bool,
}

impl ProxyAccess {
    /// The key of the client CA Secret.
    pub fn ca_key(&self) -> &str {
        self.client_ca
            .key
            .as_deref()
            .unwrap_or(DEFAULT_CLIENT_CA_KEY)
    }
}

impl ProxyIdentity {
    /// The certificate common name of this identity.
    pub fn common_name(&self) -> &str {
        self.common_name.as_deref().unwrap_or(&self.name)
    }
}

/// The proxy as last seen (`status.proxy`), while `spec.proxy.enabled`: its pods' counts and the address
/// its clients use. The `ProxyAvailable` condition says whether it serves.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProxyStatus {
    /// Number of proxy pods that exist (ready or not), as reported by the Deployment `<name>-proxy`.
    #[serde(default)]
    pub replicas: i32,

    /// Number of proxy pods that are ready: the endpoints of the Service `service`.
    #[serde(default)]
    pub ready_replicas: i32,

    /// The Service clients connect to, `<name>-proxy`, on the memcached port (`spec.containerPort`).
    #[serde(default)]
    pub service: String,
}

impl Proxy {
    /// `replicas`, or its default.
    pub fn replicas(&self) -> i32 {
        self.replicas.unwrap_or(DEFAULT_PROXY_REPLICAS)
    }

    /// `image`, or `default`: the operator's default memcached image (`MEMCACHED_IMAGE`, the servers'
    /// default too), so that a mirror or registry set for the operator's images applies to the proxy.
    /// The built-in default, the official memcached image of the 1.6 series, has the proxy
    /// (`--enable-proxy`) since 1.6.38 but not `--enable-proxy-tls`, so it cannot serve
    /// `spec.security.tls` ([`PROXY_TLS_IMAGE_RULE`]).
    pub fn image_or<'a>(&'a self, default: &'a str) -> &'a str {
        self.image.as_deref().unwrap_or(default)
    }
}

#[cfg(test)]
mod tests {
    use crate::api::MemcachedSpec;

    #[test]
    fn the_proxy_is_off_unless_enabled() {
        let spec: MemcachedSpec = serde_json::from_str(r#"{"size": 3}"#).unwrap();
        assert_eq!(spec.proxy(), None);
        let spec: MemcachedSpec = serde_json::from_str(r#"{"proxy": {"replicas": 3}}"#).unwrap();
        assert_eq!(spec.proxy(), None);
    }

    #[test]
    fn an_enabled_proxy_has_its_defaults() {
        let spec: MemcachedSpec = serde_json::from_str(r#"{"proxy": {"enabled": true}}"#).unwrap();
        let proxy = spec.proxy().unwrap();
        assert_eq!(proxy.replicas(), 2);
        assert_eq!(
            proxy.image_or("mirror.example/memcached:1.6-alpine"),
            "mirror.example/memcached:1.6-alpine"
        );
        let spec: MemcachedSpec = serde_json::from_value(serde_json::json!({"proxy": {
            "enabled": true, "replicas": 1, "image": "registry.example.com/memcached:1.6.45"
        }}))
        .unwrap();
        let proxy = spec.proxy().unwrap();
        assert_eq!(proxy.replicas(), 1);
        assert_eq!(
            proxy.image_or("memcached:1.6-alpine"),
            "registry.example.com/memcached:1.6.45"
        );
    }
}
