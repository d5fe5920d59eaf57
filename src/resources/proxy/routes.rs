//! The proxy's route: the ConfigMap `<name>-proxy` carries data only, the published server list in slot
//! order and whether the servers serve TLS ([`Route`], key [`DATA_KEY`]); the configuration writer in
//! each proxy pod (`crate::proxy_config`) checks it ([`Route::parse`]) and renders from it the routelib
//! configuration (Lua, [`render`]) memcached loads: one pool whose backends are those servers.
//!
//! The ConfigMap holds no code: memcached's proxy runs its configuration with Lua's whole standard
//! library, in pods that mount the TLS key, and whoever may update ConfigMaps in the namespace could
//! otherwise run code there. What the writer renders comes from its own templates; every address it
//! puts in is checked first (an IP address or a DNS name, and a port: [`check_address`]), and escaped
//! as a Lua string besides; a route with more servers or bytes than bounded is refused.
//!
//! The pool names no distribution, so memcached uses its default: jump consistent hash over the
//! backends' positions of the key's XXH3 (`mcp.dist_jump_hash` with `mcp.hash_xxhash`, seed 0). That is
//! the operator's choice for the proxy (`crate::hashing::Scheme::ProxyJump` reproduces it, and warm
//! handover follows it): a position is a slot, so a replaced server keeps its keys, and a scale moves only
//! the keys of the slots added or removed.
//!
//! With `spec.security.tls` the proxy reaches the servers over TLS (`settings{ backend_use_tls = true }`,
//! memcached built with `--enable-proxy-tls`). memcached's proxy (1.6.45) neither verifies the servers'
//! certificates nor presents one of its own: the connection is encrypted, not authenticated.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::net::{Ipv4Addr, Ipv6Addr};

use k8s_openapi::api::core::v1::ConfigMap;
use serde::{Deserialize, Serialize};

use super::super::instance::Instance;
use super::super::servers::published_addresses;
use super::identities::{self, RouteAccess};
use super::metadata::meta;
use crate::api::{MAX_SIZE, Server};
use crate::hashing::Endpoint;

/// The file name the writer gives the rendered configuration (memcached's `proxy_arg`).
pub const CONFIG_KEY: &str = "proxy.lua";
/// The ConfigMap key holding the route's data ([`Route`], JSON).
pub const DATA_KEY: &str = "route.json";
/// Most servers a route may list: twice the most an instance has.
pub const MAX_SERVERS: usize = 2 * MAX_SIZE as usize;
/// Most bytes of a route's data.
pub const MAX_ROUTE_BYTES: usize = 256 * 1024;
/// Longest address: a DNS name of 253 characters, `:`, a port of 5 digits.
pub const MAX_ADDRESS_LEN: usize = 253 + 1 + 5;

/// What the route configuration is made from: the published server list (`host:port`, `[v6]:port`), in
/// slot order, and whether the servers serve TLS.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Route {
    pub servers: Vec<String>,
    pub backend_tls: bool,
    /// With `spec.proxy.access`: the client CA and identities ([`identities`](super::identities)).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access: Option<RouteAccess>,
}

/// Why route data is refused. The messages quote nothing of the data but its sizes and a server's
/// position.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RouteError {
    #[error("the route data is {0} bytes, more than the {MAX_ROUTE_BYTES} a route may have")]
    TooLarge(usize),
    #[error("the route data is not a route: {0}")]
    Malformed(String),
    #[error("the route lists {0} servers, more than the {MAX_SERVERS} a route may list")]
    TooManyServers(usize),
    #[error("server {index} of the route is not an address: {problem}")]
    BadAddress { index: usize, problem: &'static str },
    #[error("the route's access control is refused: {0}")]
    BadAccess(&'static str),
}

impl Route {
    /// The route's data as the ConfigMap carries it (JSON, keys in a fixed order, a final newline).
    pub fn to_data(&self) -> String {
        // Serialising strings and a bool cannot fail.
        serde_json::to_string_pretty(self).unwrap_or_default() + "\n"
    }

    /// Reads route data, refusing what is oversize, malformed, or lists anything but addresses.
    pub fn parse(data: &str) -> Result<Self, RouteError> {
        if data.len() > MAX_ROUTE_BYTES {
            return Err(RouteError::TooLarge(data.len()));
        }
        let route: Route =
            serde_json::from_str(data).map_err(|error| RouteError::Malformed(error.to_string()))?;
        if route.servers.len() > MAX_SERVERS {
            return Err(RouteError::TooManyServers(route.servers.len()));
        }
        for (index, address) in route.servers.iter().enumerate() {
            check_address(address).map_err(|problem| RouteError::BadAddress { index, problem })?;
        }
        if let Some(access) = &route.access {
            access.check().map_err(RouteError::BadAccess)?;
        }
        Ok(route)
    }
}

/// Checks one `host:port` entry strictly: the host an IPv4 address, a bracketed IPv6 address or a DNS
/// name (lowercase letters, digits and `-` in labels of 1 to 63 characters, dot-separated, at most 253
/// characters), the port a decimal number from 1 to 65535 without sign or leading zero.
pub fn check_address(address: &str) -> Result<(), &'static str> {
    if address.len() > MAX_ADDRESS_LEN {
        return Err("too long");
    }
    let (host, port) = match address.strip_prefix('[') {
        Some(bracketed) => {
            let (host, port) = bracketed
                .split_once("]:")
                .ok_or("no `]:` after an IPv6 address")?;
            host.parse::<Ipv6Addr>()
                .map_err(|_| "not an IPv6 address")?;
            (host, port)
        }
        None => address.rsplit_once(':').ok_or("no port")?,
    };
    let digits = !port.is_empty() && port.len() <= 5 && port.bytes().all(|b| b.is_ascii_digit());
    if !digits || port.starts_with('0') || port.parse::<u32>().map_or(true, |p| p > 65535) {
        return Err("the port is not a number from 1 to 65535");
    }
    if address.starts_with('[') || host.parse::<Ipv4Addr>().is_ok() {
        return Ok(());
    }
    dns_name(host)
}

/// A DNS name of lowercase labels (RFC 1123), as Kubernetes names pods and Services.
fn dns_name(host: &str) -> Result<(), &'static str> {
    if host.is_empty() || host.len() > 253 {
        return Err("the host is empty or longer than 253 characters");
    }
    for label in host.split('.') {
        let allowed = label
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
        if label.is_empty() || label.len() > 63 || !allowed {
            return Err("the host is not an IP address or a DNS name");
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Err("a label of the host starts or ends with `-`");
        }
    }
    Ok(())
}

/// The route ConfigMap of `instance` over its published `servers`, or `None` when the proxy is off.
pub fn config_map(instance: &Instance<'_>, servers: &[Server]) -> Option<ConfigMap> {
    instance.spec.proxy()?;
    let route = Route {
        servers: published_addresses(servers)
            .into_iter()
            .map(str::to_owned)
            .collect(),
        backend_tls: instance.spec.tls().is_some(),
        access: instance
            .spec
            .proxy()
            .and_then(|proxy| proxy.access.as_ref())
            .zip(instance.proxy_access.as_ref())
            .map(|(access, material)| RouteAccess::new(access, material)),
    };
    Some(ConfigMap {
        metadata: meta(instance),
        data: Some(BTreeMap::from([(DATA_KEY.to_owned(), route.to_data())])),
        ..ConfigMap::default()
    })
}

/// The routelib configuration over `addresses` (`host:port`, `[v6]:port`), in slot order, to servers
/// without TLS. With no server, every request gets routelib's null answer (a miss for a get, `NS` for a
/// set) instead of an error: an empty pool is refused by memcached.
pub fn config(instance: &str, addresses: &[&str]) -> String {
    render(instance, &route(addresses, false))
}

/// [`config`] to servers that serve TLS (`spec.security.tls`).
pub fn tls_config(instance: &str, addresses: &[&str]) -> String {
    render(instance, &route(addresses, true))
}

fn route(addresses: &[&str], backend_tls: bool) -> Route {
    Route {
        servers: addresses.iter().map(|a| (*a).to_owned()).collect(),
        backend_tls,
        access: None,
    }
}

/// The routelib configuration of `route`, for the ConfigMap `name` (in a comment: a Kubernetes name).
/// Every value from the route is a Lua string literal or a number ([`lua_string`]).
pub fn render(name: &str, route: &Route) -> String {
    let mut lua = format!(
        "-- The route configuration of the memcached proxy, rendered by memcached-operator's \
         configuration writer from ConfigMap {} (the published server list, in slot order). Do not \
         edit.\n",
        name.replace(|c: char| c.is_control(), " ")
    );
    if route.servers.is_empty() {
        match &route.access {
            Some(access) => lua.push_str(&identities::render_routes(
                access,
                "route_null{}",
                lua_string,
            )),
            None => lua.push_str("routes{\n    default = route_null{},\n}\n"),
        }
        return lua;
    }
    if route.backend_tls {
        lua.push_str("settings{\n    backend_use_tls = true,\n}\n");
    }
    lua.push_str("pools{\n    servers = {\n        backends = {\n");
    for address in &route.servers {
        let (host, port) = host_port(address);
        // Writing to a String cannot fail.
        let _ = writeln!(
            lua,
            "            {{ host = {}, port = {port} }},",
            lua_string(&host)
        );
    }
    lua.push_str("        },\n    },\n}\n");
    let direct = "route_direct{ child = \"servers\" }";
    match &route.access {
        // The access route sends an allowed request to the pool itself: one function generator per
        // request, as without access control.
        Some(access) => lua.push_str(&identities::render_routes(
            access,
            "\"servers\"",
            lua_string,
        )),
        None => {
            let _ = write!(lua, "routes{{\n    default = {direct},\n}}\n");
        }
    }
    lua
}

/// The label routelib gives the backend of a published entry (`host:port`, the host without brackets):
/// the name `stats proxybe` reports it by.
pub fn backend_label(address: &str) -> String {
    let (host, port) = host_port(address);
    format!("{host}:{port}")
}

/// The host (without brackets) and port of a published entry. The operator publishes `host:port` only;
/// anything else would be passed on whole as a host on port 0, a backend nobody answers on.
fn host_port(address: &str) -> (String, u16) {
    match Endpoint::parse(address) {
        Ok(endpoint) => (endpoint.host.to_owned(), endpoint.port),
        Err(_) => (address.to_owned(), 0),
    }
}

/// A Lua string literal of `text`: quotes, backslashes and control characters escaped.
fn lua_string(text: &str) -> String {
    let mut quoted = String::with_capacity(text.len() + 2);
    quoted.push('"');
    for c in text.chars() {
        match c {
            '"' | '\\' => {
                quoted.push('\\');
                quoted.push(c);
            }
            c if c.is_control() => {
                let _ = write!(quoted, "\\{:03}", u32::from(c));
            }
            c => quoted.push(c),
        }
    }
    quoted.push('"');
    quoted
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backend_labels_are_routelibs_host_colon_port() {
        assert_eq!(backend_label("10.0.0.7:11211"), "10.0.0.7:11211");
        assert_eq!(backend_label("[fd00::1]:11211"), "fd00::1:11211");
        assert_eq!(
            backend_label("cache-1.cache-headless.ns.svc:11311"),
            "cache-1.cache-headless.ns.svc:11311"
        );
    }

    #[test]
    fn backends_follow_the_list_in_slot_order() {
        let lua = config(
            "cache",
            &[
                "10.0.0.7:11211",
                "cache-1.cache-headless.ns.svc:11311",
                "[fd00::1]:11211",
            ],
        );
        let expected = "pools{
    servers = {
        backends = {
            { host = \"10.0.0.7\", port = 11211 },
            { host = \"cache-1.cache-headless.ns.svc\", port = 11311 },
            { host = \"fd00::1\", port = 11211 },
        },
    },
}
routes{
    default = route_direct{ child = \"servers\" },
}
";
        assert!(lua.starts_with("-- The route configuration of the memcached proxy"));
        assert!(lua.ends_with(expected), "{lua}");
    }

    #[test]
    fn servers_with_tls_are_reached_over_tls() {
        let lua = tls_config("cache", &["10.0.0.7:11211"]);
        assert!(
            lua.contains("\nsettings{\n    backend_use_tls = true,\n}\npools{\n"),
            "{lua}"
        );
        assert!(!config("cache", &["10.0.0.7:11211"]).contains("backend_use_tls"));
        assert!(!tls_config("cache", &[]).contains("settings"));
    }

    #[test]
    fn no_server_routes_to_the_null_route() {
        let lua = config("cache", &[]);
        assert!(lua.ends_with("routes{\n    default = route_null{},\n}\n"));
        assert!(!lua.contains("pools"));
    }

    #[test]
    fn route_data_round_trips_and_renders_what_it_lists() {
        let route = Route {
            servers: vec!["10.0.0.7:11211".into(), "[fd00::1]:11211".into()],
            backend_tls: true,
            access: None,
        };
        let data = route.to_data();
        assert_eq!(Route::parse(&data), Ok(route.clone()));
        assert_eq!(
            render("cache", &route),
            tls_config("cache", &["10.0.0.7:11211", "[fd00::1]:11211"])
        );
    }

    #[test]
    fn addresses_are_ip_addresses_or_dns_names_with_a_port() {
        for good in [
            "10.0.0.7:11211",
            "[fd00::1]:1",
            "cache-1.cache-headless.ns.svc:65535",
            "a:11211",
        ] {
            assert_eq!(check_address(good), Ok(()), "{good}");
        }
        let long_label = format!("{}:11211", "a".repeat(64));
        let long_name = format!("{}:11211", vec!["a".repeat(63); 5].join("."));
        for bad in [
            "",
            "10.0.0.7",
            "10.0.0.7:0",
            "10.0.0.7:65536",
            "10.0.0.7:+1",
            "10.0.0.7:011211",
            "10.0.0.7: 1",
            "[fd00::1]11211",
            "[not-v6]:11211",
            "fd00::1:11211",
            "Cache:11211",
            "-cache:11211",
            "cache-:11211",
            "a..b:11211",
            "a\"b:11211",
            "a]]b:11211",
            "a\nb:11211",
            "a b:11211",
            "a_b:11211",
            long_label.as_str(),
            long_name.as_str(),
        ] {
            assert!(check_address(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn route_data_that_is_oversize_malformed_or_lists_no_address_is_refused() {
        let with = |servers: Vec<String>| {
            Route {
                servers,
                backend_tls: false,
                access: None,
            }
            .to_data()
        };
        let at_most = with(vec!["10.0.0.7:11211".to_owned(); MAX_SERVERS]);
        assert!(Route::parse(&at_most).is_ok());
        let too_many = with(vec!["10.0.0.7:11211".to_owned(); MAX_SERVERS + 1]);
        assert_eq!(
            Route::parse(&too_many),
            Err(RouteError::TooManyServers(MAX_SERVERS + 1))
        );
        let huge = format!(
            "{{\"servers\": [], \"backendTls\": false{}}}",
            " ".repeat(MAX_ROUTE_BYTES)
        );
        assert!(matches!(Route::parse(&huge), Err(RouteError::TooLarge(_))));
        for malformed in [
            "",
            "servers = {}",
            "{\"servers\": [], \"backendTls\": false, \"lua\": \"os.exit()\"}",
            "{\"servers\": [1], \"backendTls\": false}",
        ] {
            assert!(
                matches!(Route::parse(malformed), Err(RouteError::Malformed(_))),
                "{malformed}"
            );
        }
        let quoted = with(vec![
            "10.0.0.7:11211".into(),
            "x\" }}, os.execute(\"id\") --:1".into(),
        ]);
        assert_eq!(
            Route::parse(&quoted),
            Err(RouteError::BadAddress {
                index: 1,
                problem: "the host is not an IP address or a DNS name"
            })
        );
    }

    #[test]
    fn strings_cannot_break_out_of_their_quotes() {
        assert_eq!(lua_string("a\"b\\c\n"), "\"a\\\"b\\\\c\\010\"");
    }
}
