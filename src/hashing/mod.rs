//! Which server a client picks for a key, for the key placements `spec.clients.hashing` can declare.
//!
//! Clients spread keys over the list the operator publishes (the `<name>-servers` ConfigMap, one
//! `host:port` per line in slot order). To keep keys warm when that list changes, the operator must know
//! where a client looks for a key under the old list and under the new one; a [`Placement`] answers that
//! for one list, a [`Handover`] for a change of list. Each scheme reproduces one real client library bit
//! for bit (tests/hashing.rs checks them against vectors those libraries produced,
//! hack/hashing-vectors.py): an approximation would send copies to servers clients never ask.

mod endpoint;
mod jump;
mod ketama;
mod modula;
mod rendezvous;

pub use endpoint::{Endpoint, InvalidEntry};

/// A key placement clients use over the published server list, with the library that defines it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Scheme {
    /// libmemcached's libketama-compatible consistent hashing (MD5, 160 points per server).
    Ketama,
    /// pymemcache `HashClient`'s rendezvous hashing (murmur3 of `host:port-key`, highest wins).
    Rendezvous,
    /// Lamping and Veach's jump consistent hash of the key's MD5 over slot indexes.
    Jump,
    /// libmemcached's default: its one-at-a-time hash of the key modulo the number of servers.
    Modula,
    /// memcached's proxy (1.6.23 and later) with its default pool distribution: jump consistent hash of
    /// the key's XXH3 over the backends in list order, the published slots. Not for clients to declare:
    /// the operator chooses it for the proxy it runs (`spec.proxy`).
    ProxyJump,
}

impl Scheme {
    /// Whether, from a list of `old` servers to one of `new`, a key changes server only when the server
    /// it was on left the list or the one it goes to joined it (for [`Scheme::Jump`], which places over
    /// slot indexes: only from an index at or past `new`, to an index at or past `old`, or at an index
    /// whose entry changed). What lets a scale handover copy from the leaving servers (or to the joining
    /// ones) alone instead of listing every server once per other server. Not [`Scheme::Modula`], which
    /// moves most keys; not [`Scheme::Ketama`] between list sizes whose points per server differ (its
    /// float rounding gives some sizes 156 points instead of 160, which moves points of every server).
    pub fn consistent_between(self, old: usize, new: usize) -> bool {
        match self {
            Self::Jump | Self::ProxyJump | Self::Rendezvous => true,
            Self::Ketama => ketama::points_per_server(old) == ketama::points_per_server(new),
            Self::Modula => false,
        }
    }
}

/// Where one scheme puts keys over one published server list.
#[derive(Clone, Debug, PartialEq)]
pub struct Placement {
    scheme: Scheme,
    entries: Vec<String>,
    chooser: Chooser,
}

/// The per-scheme state built once per list, so that placing a key costs no allocation beyond the
/// scheme's own hashing.
#[derive(Clone, Debug, PartialEq)]
enum Chooser {
    Ketama(ketama::Continuum),
    Rendezvous(rendezvous::Nodes),
    Jump,
    ProxyJump,
    Modula,
}

impl Placement {
    /// The placement of `scheme` over `servers`, the published `host:port` entries in slot order.
    /// Fails on an entry that is not `host:port` (`[v6-address]:port` for IPv6), which the operator never
    /// publishes.
    pub fn new<S: AsRef<str>>(scheme: Scheme, servers: &[S]) -> Result<Self, InvalidEntry> {
        let endpoints = servers
            .iter()
            .map(|s| Endpoint::parse(s.as_ref()))
            .collect::<Result<Vec<_>, _>>()?;
        let chooser = match scheme {
            Scheme::Ketama => Chooser::Ketama(ketama::Continuum::new(&endpoints)),
            Scheme::Rendezvous => Chooser::Rendezvous(rendezvous::Nodes::new(&endpoints)),
            Scheme::Jump => Chooser::Jump,
            Scheme::ProxyJump => Chooser::ProxyJump,
            Scheme::Modula => Chooser::Modula,
        };
        Ok(Self {
            scheme,
            entries: servers.iter().map(|s| s.as_ref().to_owned()).collect(),
            chooser,
        })
    }

    /// The scheme this placement follows.
    pub fn scheme(&self) -> Scheme {
        self.scheme
    }

    /// The published entries, in slot order.
    pub fn servers(&self) -> &[String] {
        &self.entries
    }

    /// Index in the list of the server a client sends `key` to (the key's bytes as on the wire); `None`
    /// for an empty list.
    pub fn server(&self, key: &[u8]) -> Option<usize> {
        let count = self.entries.len();
        if count == 0 {
            return None;
        }
        // libmemcached answers 0 for a single server without hashing; every scheme here agrees.
        if count == 1 {
            return Some(0);
        }
        Some(match &self.chooser {
            Chooser::Ketama(continuum) => continuum.server(key),
            Chooser::Rendezvous(nodes) => nodes.server(key),
            Chooser::Jump => jump::server(key, count),
            Chooser::ProxyJump => jump::proxy_server(key, count),
            Chooser::Modula => modula::server(key, count),
        })
    }
}

/// Where a key is before and after a change of the published list.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyMove {
    /// Clients find the key on the same server (the same published entry) under both lists.
    Stays { from: usize, to: usize },
    /// Clients looked for the key on `old[from]` and will look on `new[to]`, another server: a copy
    /// keeps it warm.
    Moves { from: usize, to: usize },
    /// One of the lists is empty: the key had no server before, or has none after.
    Unplaced,
}

/// A change of published list under one scheme: what the copy planner asks about each key.
#[derive(Clone, Debug, PartialEq)]
pub struct Handover {
    old: Placement,
    new: Placement,
}

impl Handover {
    /// The change from `old` to `new` (published entries in slot order) under `scheme`.
    pub fn new<S: AsRef<str>, T: AsRef<str>>(
        scheme: Scheme,
        old: &[S],
        new: &[T],
    ) -> Result<Self, InvalidEntry> {
        Ok(Self {
            old: Placement::new(scheme, old)?,
            new: Placement::new(scheme, new)?,
        })
    }

    /// The placement under the old list.
    pub fn old(&self) -> &Placement {
        &self.old
    }

    /// The placement under the new list.
    pub fn new_placement(&self) -> &Placement {
        &self.new
    }

    /// Whether `key` changes server. Servers are compared by their published entry, not their index: a
    /// slot whose address changed (a replaced Deployment pod) is another server even at the same index.
    pub fn key_move(&self, key: &[u8]) -> KeyMove {
        match (self.old.server(key), self.new.server(key)) {
            (Some(from), Some(to)) if self.old.entries[from] == self.new.entries[to] => {
                KeyMove::Stays { from, to }
            }
            (Some(from), Some(to)) => KeyMove::Moves { from, to },
            _ => KeyMove::Unplaced,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: [Scheme; 5] = [
        Scheme::Ketama,
        Scheme::Rendezvous,
        Scheme::Jump,
        Scheme::ProxyJump,
        Scheme::Modula,
    ];

    fn pods(n: usize) -> Vec<String> {
        (0..n)
            .map(|i| format!("10.244.0.{}:11211", i + 1))
            .collect()
    }

    #[test]
    fn an_empty_list_places_no_key() {
        for scheme in ALL {
            let placement = Placement::new::<&str>(scheme, &[]).unwrap();
            assert_eq!(placement.server(b"key"), None, "{scheme:?}");
        }
    }

    #[test]
    fn a_single_server_takes_every_key() {
        for scheme in ALL {
            let placement = Placement::new(scheme, &pods(1)).unwrap();
            for key in [&b"a"[..], b"user:1", &[0xff; 250]] {
                assert_eq!(placement.server(key), Some(0), "{scheme:?}");
            }
        }
    }

    #[test]
    fn every_server_of_a_list_gets_keys() {
        for scheme in ALL {
            let placement = Placement::new(scheme, &pods(5)).unwrap();
            let mut seen = [false; 5];
            for i in 0..500 {
                let server = placement.server(format!("key:{i}").as_bytes()).unwrap();
                seen[server] = true;
            }
            assert_eq!(seen, [true; 5], "{scheme:?}");
        }
    }

    #[test]
    fn an_entry_without_a_port_is_refused() {
        for scheme in ALL {
            let err = Placement::new(scheme, &["10.0.0.1"]).unwrap_err();
            assert_eq!(err.entry, "10.0.0.1");
        }
    }

    #[test]
    fn scaling_up_moves_keys_only_to_the_new_server_under_consistent_schemes() {
        for scheme in [
            Scheme::Ketama,
            Scheme::Rendezvous,
            Scheme::Jump,
            Scheme::ProxyJump,
        ] {
            let handover = Handover::new(scheme, &pods(3), &pods(4)).unwrap();
            let mut moved = 0;
            for i in 0..1000 {
                match handover.key_move(format!("key:{i}").as_bytes()) {
                    KeyMove::Moves { to, .. } => {
                        assert_eq!(to, 3, "{scheme:?}");
                        moved += 1;
                    }
                    KeyMove::Stays { from, to } => assert_eq!(from, to, "{scheme:?}"),
                    KeyMove::Unplaced => panic!("{scheme:?}: both lists have servers"),
                }
            }
            assert!(
                (150..350).contains(&moved),
                "{scheme:?}: {moved} of 1000 moved"
            );
        }
    }

    #[test]
    fn scaling_up_under_modula_moves_most_keys() {
        let handover = Handover::new(Scheme::Modula, &pods(3), &pods(4)).unwrap();
        let moved = (0..1000)
            .filter(|i| {
                matches!(
                    handover.key_move(format!("key:{i}").as_bytes()),
                    KeyMove::Moves { .. }
                )
            })
            .count();
        assert!(moved > 600, "{moved} of 1000 moved");
    }

    #[test]
    fn a_replaced_address_at_the_same_slot_is_a_move() {
        let old = pods(3);
        let mut new = old.clone();
        new[1] = "10.244.9.9:11211".to_owned();
        let handover = Handover::new(Scheme::Jump, &old, &new).unwrap();
        let mut saw_replaced = false;
        for i in 0..100 {
            match handover.key_move(format!("key:{i}").as_bytes()) {
                KeyMove::Moves { from: 1, to: 1 } => saw_replaced = true,
                KeyMove::Stays { from, to } => assert!(from == to && from != 1),
                other => panic!("jump keeps slots: {other:?}"),
            }
        }
        assert!(saw_replaced);
    }

    #[test]
    fn scaling_to_zero_leaves_keys_unplaced() {
        for scheme in ALL {
            let handover = Handover::new::<_, &str>(scheme, &pods(2), &[]).unwrap();
            assert_eq!(handover.key_move(b"key"), KeyMove::Unplaced, "{scheme:?}");
        }
    }
}
