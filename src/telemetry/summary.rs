//! The instance summary (`status.stats`) from the servers read, and when to write it: pure functions.

use std::time::{Duration, Instant};

use super::proxy::ProxySample;
use super::stats::Stats;
use crate::api::{CacheStats, IdentityStats, ProxyStats};

/// Summarises one collection of an instance: `ready` servers were there to read, `read` are the stats of
/// those that answered, `proxy` the proxy's summary ([`summarize_proxy`]). `None` when no server and no
/// proxy pod is ready: there is nothing to say (a new instance, or one scaled to zero), and a summary that
/// says "0 of 0" would only cost a write.
pub fn summarize(ready: usize, read: &[Stats], proxy: Option<ProxyStats>) -> Option<CacheStats> {
    if ready == 0 && proxy.is_none() {
        return None;
    }
    let sum = |f: fn(&Stats) -> u64| read.iter().map(f).fold(0u64, u64::saturating_add);
    let any = !read.is_empty();
    let hits = sum(|s| s.get_hits);
    let gets = hits.saturating_add(sum(|s| s.get_misses));
    let limit = sum(|s| s.limit_maxbytes);
    Some(CacheStats {
        hit_ratio_percent: percent(hits, gets),
        memory_used_percent: percent(sum(|s| s.bytes), limit),
        items: any.then(|| count(sum(|s| s.curr_items))),
        evictions: any.then(|| count(sum(|s| s.evictions))),
        connections: any.then(|| count(sum(|s| s.curr_connections))),
        servers_read: small(read.len()),
        servers_ready: small(ready),
        proxy,
    })
}

/// Summarises the proxy pods of one collection: `ready` were there to read, `read` are the samples of
/// those that answered. `None` when no proxy pod is ready (the proxy is off, or starting).
pub fn summarize_proxy(ready: usize, read: &[ProxySample]) -> Option<ProxyStats> {
    if ready == 0 {
        return None;
    }
    let sum = |f: fn(&ProxySample) -> u64| read.iter().map(f).fold(0u64, u64::saturating_add);
    let any = !read.is_empty();
    let mut backends_down: Vec<i32> = read
        .iter()
        .flat_map(|sample| sample.backends.iter())
        .filter(|backend| backend.down)
        .map(|backend| backend.slot)
        .collect();
    backends_down.sort_unstable();
    backends_down.dedup();
    // By name: the samples hold only names of the spec (and `unknown`), so this is bounded by it.
    let mut identities: std::collections::BTreeMap<&str, (u64, u64)> = Default::default();
    for (name, counters) in read.iter().flat_map(|sample| sample.access.iter()) {
        let (requests, refused) = identities.entry(name).or_default();
        *requests = requests.saturating_add(counters.requests);
        *refused = refused.saturating_add(counters.refused);
    }
    Some(ProxyStats {
        requests: any.then(|| count(sum(|s| s.counters.requests))),
        backend_errors: any.then(|| count(sum(|s| s.counters.backend_failures))),
        backends_down,
        proxies_read: small(read.len()),
        proxies_ready: small(ready),
        identities: identities
            .into_iter()
            .map(|(name, (requests, refused))| IdentityStats {
                name: name.to_owned(),
                requests: count(requests),
                refusals: count(refused),
            })
            .collect(),
    })
}

/// `part / whole` in whole percent, rounded down and at most 100; `None` when `whole` is 0.
pub fn percent(part: u64, whole: u64) -> Option<i32> {
    if whole == 0 {
        return None;
    }
    let p = u128::from(part) * 100 / u128::from(whole);
    Some(i32::try_from(p.min(100)).unwrap_or(100))
}

fn count(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn small(n: usize) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

/// Whether to write `new` as `status.stats` now. Only when it differs from what the cached instance holds
/// (`stored`), so an idle cache causes no writes, and at most once per `min_interval` per instance (since
/// `last_write`, this replica's last write for it), so a busy one causes at most one write per interval.
/// The first write after the operator starts (or takes over leadership) is not held back.
pub fn should_write(
    stored: Option<&CacheStats>,
    new: Option<&CacheStats>,
    last_write: Option<Instant>,
    now: Instant,
    min_interval: Duration,
) -> bool {
    stored != new && last_write.is_none_or(|at| now.saturating_duration_since(at) >= min_interval)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    use crate::telemetry::proxy::{AccessCounters, Backend, ProxyCounters};

    fn server(hits: u64, misses: u64, bytes: u64, limit: u64, items: u64) -> Stats {
        Stats {
            get_hits: hits,
            get_misses: misses,
            bytes,
            limit_maxbytes: limit,
            curr_items: items,
            evictions: 1,
            curr_connections: 2,
            ..Stats::default()
        }
    }

    #[test]
    fn sums_over_the_servers_read_and_rounds_down() {
        let read = [server(2, 1, 100, 1000, 3), server(0, 0, 899, 1000, 4)];
        assert_eq!(
            summarize(3, &read, None),
            Some(CacheStats {
                hit_ratio_percent: Some(66),
                memory_used_percent: Some(49),
                items: Some(7),
                evictions: Some(2),
                connections: Some(4),
                servers_read: 2,
                servers_ready: 3,
                proxy: None,
            })
        );
    }

    #[test]
    fn absent_values_when_there_is_nothing_to_divide() {
        assert_eq!(summarize(0, &[], None), None, "no ready server: no summary");
        assert_eq!(
            summarize(2, &[], None),
            Some(CacheStats {
                servers_ready: 2,
                ..CacheStats::default()
            }),
            "none read: only the counts"
        );
        let idle = summarize(1, &[server(0, 0, 0, 64, 0)], None).unwrap();
        assert_eq!(idle.hit_ratio_percent, None, "no gets yet");
        assert_eq!(idle.memory_used_percent, Some(0));
        assert_eq!(idle.items, Some(0));
    }

    fn proxy(requests: u64, failures: u64, down: &[i32]) -> ProxySample {
        ProxySample {
            counters: ProxyCounters {
                requests,
                backend_failures: failures,
                ..ProxyCounters::default()
            },
            backends: (0..3)
                .map(|slot| Backend {
                    slot,
                    address: format!("10.0.0.{slot}:11211"),
                    down: down.contains(&slot),
                })
                .collect(),
            access: BTreeMap::new(),
        }
    }

    #[test]
    fn the_proxy_sums_its_pods_and_joins_the_backends_they_mark_down() {
        let read = [proxy(200, 6, &[2, 1]), proxy(50, 0, &[1])];
        let summary = summarize_proxy(3, &read);
        assert_eq!(
            summary,
            Some(ProxyStats {
                requests: Some(250),
                backend_errors: Some(6),
                backends_down: vec![1, 2],
                proxies_read: 2,
                proxies_ready: 3,
                identities: Vec::new(),
            })
        );
        assert_eq!(summarize_proxy(0, &[]), None, "no proxy pod ready");
        assert_eq!(
            summarize_proxy(1, &[]),
            Some(ProxyStats {
                proxies_ready: 1,
                ..ProxyStats::default()
            }),
            "none read: only the counts"
        );
        let with_proxy = summarize(0, &[], summary.clone()).expect("a proxy to speak of");
        assert_eq!((with_proxy.servers_ready, with_proxy.proxy), (0, summary));
    }

    fn access(counts: &[(&str, u64, u64)]) -> BTreeMap<String, AccessCounters> {
        counts
            .iter()
            .map(|&(name, requests, refused)| {
                (name.to_owned(), AccessCounters { requests, refused })
            })
            .collect()
    }

    #[test]
    fn identities_sum_over_the_pods_read_by_name() {
        let mut a = proxy(20, 0, &[]);
        a.access = access(&[("orders", 9, 5), ("reports", 3, 2), ("unknown", 1, 1)]);
        let mut b = proxy(7, 0, &[]);
        // A pod that has not loaded `reports` yet.
        b.access = access(&[("orders", 4, 0), ("unknown", 0, 0)]);
        let summary = summarize_proxy(3, &[a.clone(), b]).unwrap();
        let identity = |name: &str, requests, refusals| IdentityStats {
            name: name.to_owned(),
            requests,
            refusals,
        };
        assert_eq!(
            summary.identities,
            [
                identity("orders", 13, 5),
                identity("reports", 3, 2),
                identity("unknown", 1, 1)
            ]
        );
        assert_eq!(
            summarize_proxy(1, &[proxy(20, 0, &[])]).unwrap().identities,
            [],
            "without access control: none"
        );
    }

    #[test]
    fn identity_counters_change_the_summary_only_with_the_requests() {
        // Every request an identity counter counts is a request the proxy received: a summary whose
        // identities changed has changed requests too, so per identity counters add no status write.
        let mut before = proxy(20, 0, &[]);
        before.access = access(&[("orders", 9, 5)]);
        let mut after = proxy(21, 0, &[]);
        after.access = access(&[("orders", 10, 6)]);
        let (before, after) = (
            summarize_proxy(1, &[before]).unwrap(),
            summarize_proxy(1, &[after]).unwrap(),
        );
        assert_ne!(before.requests, after.requests);
        assert_ne!(before.identities, after.identities);
    }

    #[test]
    fn percent_is_whole_bounded_and_overflow_free() {
        assert_eq!(percent(999, 1000), Some(99), "100 only when all");
        assert_eq!(percent(1000, 1000), Some(100));
        assert_eq!(percent(2000, 1000), Some(100), "never above 100");
        assert_eq!(percent(u64::MAX, u64::MAX), Some(100));
        assert_eq!(percent(1, 0), None);
    }

    #[test]
    fn writes_only_changes_and_at_most_once_per_interval() {
        let t0 = Instant::now();
        let interval = Duration::from_secs(300);
        let a = CacheStats {
            items: Some(1),
            servers_ready: 1,
            servers_read: 1,
            ..CacheStats::default()
        };
        let b = CacheStats {
            items: Some(2),
            ..a.clone()
        };
        assert!(
            should_write(None, Some(&a), None, t0, interval),
            "first value"
        );
        assert!(
            !should_write(Some(&a), Some(&a), None, t0, interval),
            "unchanged"
        );
        assert!(
            !should_write(
                Some(&a),
                Some(&b),
                Some(t0),
                t0 + Duration::from_secs(299),
                interval
            ),
            "changed, but written less than an interval ago"
        );
        assert!(should_write(
            Some(&a),
            Some(&b),
            Some(t0),
            t0 + interval,
            interval
        ));
        assert!(
            should_write(Some(&a), None, Some(t0), t0 + interval, interval),
            "no server ready any more: the summary goes"
        );
        assert!(!should_write(None, None, None, t0, interval));
        assert!(
            !should_write(Some(&a), Some(&a), Some(t0), t0 + 10 * interval, interval),
            "an idle cache never causes a write"
        );
    }
}
