//! Eviction episodes: when an instance starts evicting, one Warning event, not one per collection.
//!
//! memcached's `evictions` counter only grows while a server runs, so "evicting" means: some server's
//! counter grew since the previous collection. An episode starts with the first collection that sees it
//! grow and ends once [`QUIET_COLLECTIONS`] collections in a row have not (5 minutes at the default
//! 30 s interval): a cache that evicts every few minutes is one episode, not an event storm, and one that
//! stopped for a while and starts again is worth a new warning. Pure functions, so the rules are tested
//! without servers or time.

use std::collections::BTreeMap;

/// Collections in a row without new evictions that end an episode.
pub const QUIET_COLLECTIONS: u32 = 10;

/// What a server reported that the episode rules read: its uptime (to see restarts) and its evictions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Counter {
    pub uptime_seconds: u64,
    pub evictions: u64,
}

/// The eviction state of one instance.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Episode {
    /// An episode is under way.
    pub evicting: bool,
    /// Collections in a row without new evictions during the episode.
    pub quiet: u32,
}

/// Evictions since the previous collection, over the servers (by pod name) read both times; `None` when
/// no server was read both times, so nothing can be compared. A server that restarted in between (its
/// uptime went down) counts all its evictions since the restart.
pub fn evicted(
    previous: &BTreeMap<String, Counter>,
    current: &BTreeMap<String, Counter>,
) -> Option<u64> {
    let mut compared = false;
    let mut total = 0u64;
    for (pod, now) in current {
        let Some(before) = previous.get(pod) else {
            continue;
        };
        compared = true;
        let restarted =
            now.uptime_seconds < before.uptime_seconds || now.evictions < before.evictions;
        let new = if restarted {
            now.evictions
        } else {
            now.evictions - before.evictions
        };
        total = total.saturating_add(new);
    }
    compared.then_some(total)
}

/// The next state after a collection that saw `evicted` new evictions (`None`: nothing comparable was
/// read, which changes nothing), and whether an episode starts with it.
pub fn step(episode: &Episode, evicted: Option<u64>) -> (Episode, bool) {
    match evicted {
        None => (episode.clone(), false),
        Some(0) if episode.evicting => {
            let quiet = episode.quiet + 1;
            if quiet >= QUIET_COLLECTIONS {
                (Episode::default(), false)
            } else {
                (
                    Episode {
                        evicting: true,
                        quiet,
                    },
                    false,
                )
            }
        }
        Some(0) => (Episode::default(), false),
        Some(_) => (
            Episode {
                evicting: true,
                quiet: 0,
            },
            !episode.evicting,
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn servers(list: &[(&str, u64, u64)]) -> BTreeMap<String, Counter> {
        list.iter()
            .map(|(pod, uptime_seconds, evictions)| {
                (
                    (*pod).to_owned(),
                    Counter {
                        uptime_seconds: *uptime_seconds,
                        evictions: *evictions,
                    },
                )
            })
            .collect()
    }

    #[test]
    fn counts_growth_per_server_and_restarts_from_zero() {
        let before = servers(&[("a", 100, 10), ("b", 100, 5)]);
        assert_eq!(evicted(&before, &before), Some(0));
        assert_eq!(
            evicted(&before, &servers(&[("a", 130, 12), ("b", 130, 5)])),
            Some(2)
        );
        assert_eq!(
            evicted(&before, &servers(&[("a", 20, 3), ("b", 130, 5)])),
            Some(3),
            "a restarted: its 3 evictions since are new"
        );
        assert_eq!(
            evicted(&before, &servers(&[("c", 10, 7)])),
            None,
            "a new server has no baseline"
        );
        assert_eq!(evicted(&BTreeMap::new(), &before), None, "first collection");
    }

    #[test]
    fn one_start_per_episode_which_ends_after_quiet_collections() {
        let mut episode = Episode::default();
        let mut starts = 0;
        let mut run = |evicted: Option<u64>, episode: &mut Episode| {
            let (next, started) = step(episode, evicted);
            *episode = next;
            starts += usize::from(started);
        };
        // Evicting for a while, with pauses shorter than the quiet period and unreadable collections.
        for e in [Some(5), Some(3), Some(0), None, Some(0), Some(8), Some(1)] {
            run(e, &mut episode);
        }
        assert!(episode.evicting);
        for _ in 0..QUIET_COLLECTIONS - 1 {
            run(Some(0), &mut episode);
        }
        assert!(episode.evicting, "not quiet long enough yet");
        run(Some(0), &mut episode);
        assert_eq!(episode, Episode::default(), "the episode ended");
        run(Some(2), &mut episode);
        assert_eq!(starts, 2, "one start per episode");
    }

    #[test]
    fn nothing_comparable_changes_nothing() {
        let quiet = Episode {
            evicting: true,
            quiet: 3,
        };
        assert_eq!(step(&quiet, None), (quiet.clone(), false));
        assert_eq!(
            step(&Episode::default(), Some(0)),
            (Episode::default(), false)
        );
        assert_eq!(
            step(&Episode::default(), Some(1)),
            (
                Episode {
                    evicting: true,
                    quiet: 0
                },
                true
            )
        );
    }
}
