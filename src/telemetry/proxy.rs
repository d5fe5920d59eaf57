//! What a memcached proxy (memcached 1.6.23+ in proxy mode) says of itself: its counters in `stats`, and
//! the backends it marks down in `stats proxybe`. Pure parsers, with [`super::stats`]'s rules.
//!
//! What memcached 1.6.45's proxy reports (checked against a live proxy in front of two servers, one of
//! them stopped; the fixtures are its replies):
//! - `stats` carries, beside a server's usual stats, `proxy_conn_requests` (requests the proxy received;
//!   the operator's own `stats` are not counted), `proxy_conn_errors` (requests it could not parse),
//!   `proxy_backend_failed` (errors that reset a backend connection: a timeout, a refused or broken
//!   connection), `proxy_backend_marked_bad` (times a backend connection was marked bad after
//!   `backend_failure_limit` failures; a counter, it does not fall when the backend is back),
//!   `proxy_config_reloads` and `proxy_config_reload_fails`.
//! - `stats proxybe` lists `STAT bad_<label> <n>` for each backend marked bad now, `<n>` being how many of
//!   the proxy's worker threads have it marked (each holds its own connection); routelib labels a backend
//!   `host:port`. A backend that is back leaves the list.
//! - No latency: neither `stats`, `stats proxy` nor `stats proxybe` reports a time per request or per
//!   backend (only the `watch proxyreqs` log stream has one, per request).
//!
//! Requests a backend failure turned away are answered `SERVER_ERROR backend failure` and are counted
//! nowhere but in `proxy_conn_requests`.

use std::collections::BTreeMap;

use super::stats::{self, Field, ParseError};
use crate::api::Server;
use crate::resources::proxy::routes::backend_label;

/// The proxy's own counters from its `stats` reply, all since it started.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProxyCounters {
    /// Requests received (`proxy_conn_requests`).
    pub requests: u64,
    /// Requests that could not be parsed (`proxy_conn_errors`).
    pub request_errors: u64,
    /// Errors that reset a backend connection (`proxy_backend_failed`).
    pub backend_failures: u64,
    /// Times a backend connection was marked bad (`proxy_backend_marked_bad`).
    pub backends_marked_bad: u64,
    /// Configuration reloads (`proxy_config_reloads`), the one at start included.
    pub config_reloads: u64,
    /// Configuration reloads that failed, the previous configuration kept (`proxy_config_reload_fails`).
    pub config_reload_failures: u64,
}

/// Every proxy reports all of them (memcached 1.6.23 and later, built with `--enable-proxy`): a
/// memcached without them is not a proxy.
const FIELDS: [Field<ProxyCounters>; 6] = [
    ("proxy_conn_requests", true, |s| &mut s.requests),
    ("proxy_conn_errors", true, |s| &mut s.request_errors),
    ("proxy_backend_failed", true, |s| &mut s.backend_failures),
    ("proxy_backend_marked_bad", true, |s| {
        &mut s.backends_marked_bad
    }),
    ("proxy_config_reloads", true, |s| &mut s.config_reloads),
    ("proxy_config_reload_fails", true, |s| {
        &mut s.config_reload_failures
    }),
];

/// The proxy's counters from a whole `stats` reply.
pub fn parse_counters(reply: &[u8]) -> Result<ProxyCounters, ParseError> {
    stats::parse_fields(reply, &FIELDS)
}

/// The prefix of a marked-down backend's stat in `stats proxybe`.
const BAD_PREFIX: &[u8] = b"bad_";

/// The backends marked down from a whole `stats proxybe` reply: by label, how many worker threads mark it.
/// Stats without the `bad_` prefix are ignored; a label given twice is an error, as a count that is not an
/// unsigned decimal.
pub fn parse_down(reply: &[u8]) -> Result<BTreeMap<String, u64>, ParseError> {
    let mut down = BTreeMap::new();
    stats::entries(reply, |name, value| {
        let Some(label) = name.strip_prefix(BAD_PREFIX) else {
            return Ok(());
        };
        let count = stats::parse_u64(value).ok_or_else(|| ParseError::BadNumber {
            name: "bad_<backend>",
            value: stats::excerpt(value),
        })?;
        let label = String::from_utf8_lossy(label).into_owned();
        if down.insert(label, count).is_some() {
            return Err(ParseError::DuplicateStat("bad_<backend>"));
        }
        Ok(())
    })?;
    down.retain(|_, count| *count > 0);
    Ok(down)
}

/// One backend of the proxy's pool, as one proxy pod sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Backend {
    /// Its slot in the published list.
    pub slot: i32,
    /// Its published `host:port`.
    pub address: String,
    /// Whether the proxy pod marks it down now (in any of its worker threads).
    pub down: bool,
}

/// What one proxy pod gave: its counters and each published backend, down or not.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProxySample {
    pub counters: ProxyCounters,
    pub backends: Vec<Backend>,
}

/// The published servers (`status.servers`, those with an address), in slot order, each marked down when
/// `down` (a `stats proxybe` reply, by routelib's label) names it, or names its slot's address in
/// `routed` (slot to `ip:port`): the proxy's route lists a StatefulSet's servers by their pods' addresses,
/// not by the published DNS names. Labels of backends no longer published (a
/// reload under way) are left out, so the backends are always the list's: their number is bounded by
/// the instance's size.
pub fn backends(
    published: &[Server],
    routed: &BTreeMap<i32, String>,
    down: &BTreeMap<String, u64>,
) -> Vec<Backend> {
    let named = |address: &str| down.contains_key(&backend_label(address));
    published
        .iter()
        .filter_map(|server| {
            let address = server.address.as_deref()?;
            Some(Backend {
                slot: server.slot,
                address: address.to_owned(),
                down: named(address) || routed.get(&server.slot).is_some_and(|a| named(a)),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `stats` of memcached 1.6.45 in proxy mode (two Debian 1.6.18 backends) after 100 sets and 100 gets.
    const HEALTHY: &[u8] = include_bytes!("../../tests/fixtures/memcached-proxy-stats.txt");
    /// Its `stats proxybe` then: nothing marked down.
    const HEALTHY_BE: &[u8] = include_bytes!("../../tests/fixtures/memcached-proxy-proxybe.txt");
    /// `stats` of the same proxy after one backend was stopped and 100 sets and 100 gets more.
    const DOWN: &[u8] =
        include_bytes!("../../tests/fixtures/memcached-proxy-stats-backend-down.txt");
    /// Its `stats proxybe` then: the stopped backend, marked by both worker threads (`-t 2`).
    const DOWN_BE: &[u8] =
        include_bytes!("../../tests/fixtures/memcached-proxy-proxybe-backend-down.txt");

    #[test]
    fn the_captured_replies_give_their_exact_counters() {
        assert_eq!(
            parse_counters(HEALTHY),
            Ok(ProxyCounters {
                requests: 200,
                request_errors: 0,
                backend_failures: 0,
                backends_marked_bad: 0,
                config_reloads: 1,
                config_reload_failures: 0,
            })
        );
        assert_eq!(
            parse_counters(DOWN),
            Ok(ProxyCounters {
                requests: 400,
                request_errors: 0,
                backend_failures: 6,
                backends_marked_bad: 2,
                config_reloads: 1,
                config_reload_failures: 0,
            })
        );
    }

    #[test]
    fn the_captured_replies_give_the_backends_marked_down() {
        assert_eq!(parse_down(HEALTHY_BE), Ok(BTreeMap::new()));
        assert_eq!(
            parse_down(DOWN_BE),
            Ok(BTreeMap::from([("127.0.0.1:39067".to_owned(), 2)]))
        );
    }

    #[test]
    fn a_proxys_stats_are_also_a_servers_stats() {
        // The collector reads a proxy pod with the servers' reader: its `stats` must satisfy that parser.
        let stats = stats::parse(DOWN).expect("a proxy's stats parse as a server's");
        assert_eq!(stats.curr_items, 0, "a proxy stores nothing");
    }

    #[test]
    fn a_servers_stats_are_not_a_proxys() {
        let server = include_bytes!("../../tests/fixtures/memcached-stats.txt");
        assert_eq!(
            parse_counters(server),
            Err(ParseError::MissingStat("proxy_conn_requests"))
        );
    }

    #[test]
    fn bad_lines_and_replies_of_proxybe_are_errors() {
        for (reply, error) in [
            (
                &b"STAT bad_a:1 x\r\nEND\r\n"[..],
                ParseError::BadNumber {
                    name: "bad_<backend>",
                    value: "x".to_owned(),
                },
            ),
            (
                b"STAT bad_a:1 1\r\nSTAT bad_a:1 2\r\nEND\r\n",
                ParseError::DuplicateStat("bad_<backend>"),
            ),
            (b"STAT bad_a:1 1\r\n", ParseError::Truncated),
            (b"ERROR\r\n", ParseError::ServerError("ERROR".to_owned())),
        ] {
            assert_eq!(parse_down(reply), Err(error), "{reply:?}");
        }
        assert_eq!(
            parse_down(b"STAT other 1\r\nSTAT bad_b:2 0\r\nSTAT bad_[::1]:3 1\r\nEND\r\n"),
            Ok(BTreeMap::from([("[::1]:3".to_owned(), 1)])),
            "other stats and zero counts are not backends marked down"
        );
    }

    #[test]
    fn backends_are_the_published_list_marked_by_routelibs_labels() {
        let server = |slot: i32, address: Option<&str>| Server {
            slot,
            pod: Some(format!("cache-{slot}")),
            address: address.map(str::to_owned),
            ready: true,
        };
        let published = [
            server(0, Some("10.0.0.1:11211")),
            server(1, None),
            server(2, Some("[fd00::2]:11211")),
            server(3, Some("cache-3.cache-headless.ns.svc:11211")),
            server(4, Some("cache-4.cache-headless.ns.svc:11211")),
        ];
        let down = parse_down(
            b"STAT bad_fd00::2:11211 4\r\nSTAT bad_10.9.9.9:11211 1\r\nSTAT bad_cache-3.cache-headless.ns.svc:11211 1\r\nSTAT bad_10.0.0.4:11211 1\r\nEND\r\n",
        )
        .unwrap();
        let marks = |routed: &BTreeMap<i32, String>| -> Vec<(i32, bool)> {
            backends(&published, routed, &down)
                .iter()
                .map(|b| (b.slot, b.down))
                .collect()
        };
        assert_eq!(
            marks(&BTreeMap::new()),
            [(0, false), (2, true), (3, true), (4, false)],
            "an unpublished slot and a label of no published server are left out"
        );
        let routed = BTreeMap::from([(4, "10.0.0.4:11211".to_owned())]);
        assert_eq!(
            marks(&routed),
            [(0, false), (2, true), (3, true), (4, true)],
            "a slot the route lists by its pod's address"
        );
    }

    #[test]
    fn every_strict_prefix_of_a_real_proxybe_reply_is_truncated() {
        for end in 0..DOWN_BE.len() {
            assert_eq!(parse_down(&DOWN_BE[..end]), Err(ParseError::Truncated));
        }
    }
}
