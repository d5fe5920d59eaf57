//! A published `host:port` entry split the way the client libraries split it.

use thiserror::Error;

/// A published entry that is not `host:port`.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("server entry {entry:?} is not host:port ([address]:port for IPv6)")]
pub struct InvalidEntry {
    /// The entry as given.
    pub entry: String,
}

/// One server of the list: its host, without the brackets of an IPv6 address, and its port.
///
/// Both libraries hash the host without brackets: pylibmc's `translate_server_spec` and pymemcache's
/// `normalize_server_spec` strip them before the host reaches libmemcached or the node name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint<'a> {
    pub host: &'a str,
    pub port: u16,
}

impl<'a> Endpoint<'a> {
    /// Splits `host:port` or `[address]:port`.
    pub fn parse(entry: &'a str) -> Result<Self, InvalidEntry> {
        let invalid = || InvalidEntry {
            entry: entry.to_owned(),
        };
        let (host, port) = match entry.strip_prefix('[') {
            Some(bracketed) => bracketed.rsplit_once("]:").ok_or_else(invalid)?,
            None => entry.rsplit_once(':').ok_or_else(invalid)?,
        };
        if host.is_empty() {
            return Err(invalid());
        }
        let port = port.parse().map_err(|_| invalid())?;
        Ok(Self { host, port })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dns_name_splits_at_the_port() {
        let endpoint = Endpoint::parse("cache-0.cache-headless.ns.svc:11211").unwrap();
        assert_eq!(endpoint.host, "cache-0.cache-headless.ns.svc");
        assert_eq!(endpoint.port, 11211);
    }

    #[test]
    fn an_ipv6_address_loses_its_brackets() {
        let endpoint = Endpoint::parse("[fd00::5]:11311").unwrap();
        assert_eq!(endpoint.host, "fd00::5");
        assert_eq!(endpoint.port, 11311);
    }

    #[test]
    fn entries_without_a_valid_port_or_host_are_refused() {
        for entry in [
            "10.0.0.1",
            "10.0.0.1:",
            ":11211",
            "[fd00::5]",
            "10.0.0.1:70000",
            "h:x",
        ] {
            assert!(Endpoint::parse(entry).is_err(), "{entry}");
        }
    }
}
