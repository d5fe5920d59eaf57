//! The connections one HTTP server holds: at most [`Budget::total`] at once, and at most
//! [`Budget::per_client`] from one client address (an IPv4 address, or an IPv6 /64, which one host
//! commonly holds whole). The accept loop never waits for room: a connection over budget makes room by
//! evicting an idle one of the client that holds the most (its own client's, over the per-client
//! budget) — the oldest that has not yet sent a request, else the oldest idle between requests — and is
//! itself dropped only when every connection of its budget is answering a request at that moment. So
//! idle or slow clients cannot keep a client that holds few connections (the kubelet's probe from its
//! node, Prometheus' scrape) from being served, however fast they reconnect: the connections evicted are
//! theirs, as long as they hold more than the prober does. Floods from more addresses than the budget
//! holds connections are for the NetworkPolicy to keep out.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio_util::sync::CancellationToken;

/// How many connections a server holds at once, and from one client address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    pub total: usize,
    pub per_client: usize,
}

/// What the connections a server holds are doing.
#[derive(Debug)]
pub struct Table {
    budget: Budget,
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// Connection numbers grow with time, so the map's order is the connections' age.
    next: u64,
    open: BTreeMap<u64, Slot>,
    per_client: HashMap<Client, usize>,
}

#[derive(Debug)]
struct Slot {
    client: Client,
    activity: Arc<Activity>,
    evict: CancellationToken,
}

/// Who a connection counts against: an IPv4 address, or an IPv6 address's /64.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Client(IpAddr);

impl Client {
    pub fn of(address: IpAddr) -> Client {
        match address.to_canonical() {
            IpAddr::V6(v6) => {
                let prefix = u128::from(v6) & !((1u128 << 64) - 1);
                Client(IpAddr::V6(prefix.into()))
            }
            v4 => Client(v4),
        }
    }
}

/// Whether a connection is answering a request now, and whether it ever completed one.
#[derive(Debug, Default)]
pub struct Activity {
    in_flight: AtomicUsize,
    served: AtomicBool,
}

impl Activity {
    /// Marks a request being answered until the guard is dropped.
    pub fn begin(self: &Arc<Self>) -> Request {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        Request(self.clone())
    }

    fn busy(&self) -> bool {
        self.in_flight.load(Ordering::Acquire) > 0
    }

    fn served(&self) -> bool {
        self.served.load(Ordering::Acquire)
    }
}

/// A request being answered (see [`Activity::begin`]).
#[derive(Debug)]
pub struct Request(Arc<Activity>);

impl Drop for Request {
    fn drop(&mut self) {
        self.0.served.store(true, Ordering::Release);
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// One admitted connection's place in its [`Table`]; dropping it frees the place.
#[derive(Debug)]
pub struct Ticket {
    table: Arc<Table>,
    id: u64,
    pub activity: Arc<Activity>,
    /// Cancelled when the connection is evicted to make room: it must then close.
    pub evicted: CancellationToken,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.table.lock().remove(self.id);
    }
}

impl Table {
    pub fn new(budget: Budget) -> Arc<Table> {
        Arc::new(Table {
            budget,
            inner: Mutex::default(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A place for a new connection from `address`, evicting an idle connection when its client's or the
    /// server's budget is full; `None` (drop the connection) when every candidate is answering a request.
    pub fn admit(self: &Arc<Self>, address: IpAddr) -> Option<Ticket> {
        let client = Client::of(address);
        let mut inner = self.lock();
        if inner.per_client.get(&client).copied().unwrap_or(0) >= self.budget.per_client {
            let victim = inner.victim(|slot| slot.client == client)?;
            inner.evict(victim);
        }
        if inner.open.len() >= self.budget.total {
            let victim = inner.victim(|_| true)?;
            inner.evict(victim);
        }
        let id = inner.next;
        inner.next += 1;
        let activity = Arc::new(Activity::default());
        let evicted = CancellationToken::new();
        inner.open.insert(
            id,
            Slot {
                client,
                activity: activity.clone(),
                evict: evicted.clone(),
            },
        );
        *inner.per_client.entry(client).or_default() += 1;
        Some(Ticket {
            table: self.clone(),
            id,
            activity,
            evicted,
        })
    }

    /// Connections held now, in all and from `address`'s client.
    pub fn held(&self, address: IpAddr) -> (usize, usize) {
        let inner = self.lock();
        let client = Client::of(address);
        (
            inner.open.len(),
            inner.per_client.get(&client).copied().unwrap_or(0),
        )
    }
}

impl Inner {
    /// The connection to evict among those `eligible`, never one answering a request: one of the client
    /// that holds the most connections (so that a client holding a few, like the kubelet, keeps them
    /// while others flood), the oldest that never completed a request, else its oldest.
    fn victim(&self, eligible: impl Fn(&Slot) -> bool) -> Option<u64> {
        let mut best: Option<((usize, bool), u64)> = None;
        for (id, slot) in &self.open {
            if !eligible(slot) || slot.activity.busy() {
                continue;
            }
            let held = self.per_client.get(&slot.client).copied().unwrap_or(0);
            let rank = (held, !slot.activity.served());
            // In age order: only a strictly better rank replaces the oldest of its rank.
            if best.is_none_or(|(best, _)| rank > best) {
                best = Some((rank, *id));
            }
        }
        best.map(|(_, id)| id)
    }

    fn evict(&mut self, id: u64) {
        if let Some(slot) = self.remove(id) {
            tracing::debug!(client = %slot.client.0, "evicting an idle connection to make room");
            slot.evict.cancel();
        }
    }

    fn remove(&mut self, id: u64) -> Option<Slot> {
        let slot = self.open.remove(&id)?;
        if let Some(count) = self.per_client.get_mut(&slot.client) {
            *count -= 1;
            if *count == 0 {
                self.per_client.remove(&slot.client);
            }
        }
        Some(slot)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn a_full_budget_evicts_the_oldest_idle_connection_never_a_busy_one() {
        let table = Table::new(Budget {
            total: 3,
            per_client: 3,
        });
        let first = table.admit(ip("10.0.0.1")).unwrap();
        let second = table.admit(ip("10.0.0.2")).unwrap();
        let third = table.admit(ip("10.0.0.3")).unwrap();
        let answering = first.activity.begin();
        let fourth = table.admit(ip("10.0.0.4")).unwrap();
        assert!(!first.evicted.is_cancelled(), "answering a request");
        assert!(second.evicted.is_cancelled(), "the oldest idle one");
        assert!(!third.evicted.is_cancelled());
        assert_eq!(table.held(ip("10.0.0.4")), (3, 1));

        // Served before: evicted after those that never sent a request.
        drop(answering);
        let fifth = table.admit(ip("10.0.0.5")).unwrap();
        assert!(third.evicted.is_cancelled(), "never served, so first");
        assert!(!first.evicted.is_cancelled());
        let _busy = (fourth.activity.begin(), fifth.activity.begin());
        let sixth = table.admit(ip("10.0.0.6")).unwrap();
        assert!(
            first.evicted.is_cancelled(),
            "served, idle, and the only idle one"
        );

        let _last = sixth.activity.begin();
        assert!(
            table.admit(ip("10.0.0.7")).is_none(),
            "all answering: the newcomer is dropped"
        );
        drop((first, second, third));
        assert_eq!(
            table.held(ip("10.0.0.7")),
            (3, 0),
            "evicted places freed once"
        );
    }

    #[test]
    fn the_client_holding_the_most_loses_a_connection_not_the_oldest_client() {
        let table = Table::new(Budget {
            total: 4,
            per_client: 4,
        });
        let prober = table.admit(ip("10.0.0.1")).unwrap();
        let flood: Vec<_> = (0..3)
            .map(|_| table.admit(ip("10.0.0.2")).unwrap())
            .collect();
        let newcomer = table.admit(ip("10.0.0.3")).unwrap();
        assert!(!prober.evicted.is_cancelled(), "older, but holding one");
        assert!(flood[0].evicted.is_cancelled(), "the flood's oldest");
        assert!(!newcomer.evicted.is_cancelled());
        assert_eq!(table.held(ip("10.0.0.2")), (4, 2));
    }

    #[test]
    fn a_client_over_its_budget_evicts_its_own_connections_only() {
        let table = Table::new(Budget {
            total: 10,
            per_client: 2,
        });
        let other = table.admit(ip("10.0.0.9")).unwrap();
        let tickets: Vec<_> = (0..5)
            .map(|_| table.admit(ip("10.0.0.1")).unwrap())
            .collect();
        assert!(!other.evicted.is_cancelled());
        let open = tickets.iter().filter(|t| !t.evicted.is_cancelled()).count();
        assert_eq!(open, 2);
        assert_eq!(table.held(ip("10.0.0.1")), (3, 2));
        // An IPv6 /64 is one client; an IPv4-mapped address is its IPv4 address.
        assert_eq!(
            Client::of(ip("2001:db8::1")),
            Client::of(ip("2001:db8::ffff"))
        );
        assert_ne!(
            Client::of(ip("2001:db8::1")),
            Client::of(ip("2001:db8:0:1::1"))
        );
        assert_eq!(
            Client::of(ip("::ffff:10.0.0.1")),
            Client::of(ip("10.0.0.1"))
        );
    }
}
