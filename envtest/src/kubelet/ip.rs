//! Pod IPs on loopback: 127.1.x.y, unique among the pods running now.
//!
//! Linux routes all of 127.0.0.0/8 to `lo` without any setup, so every pod can have an address of its
//! own on which a real memcached listens on the pod's own port, as on a pod network.
//!
//! Several stand-in kubelets may run on one machine (test binaries in parallel, `envtest up` beside
//! them): each pool starts at a point of the range derived from its process id, so that they seldom
//! offer the same addresses, and the kubelet passes over an address whose port is taken anyway
//! ([`super::pod`]).

use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex, OnceLock};

/// Hands out addresses; a [`IpLease`] gives its address back when dropped.
#[derive(Clone)]
pub struct IpPool {
    inner: Arc<Mutex<Inner>>,
}

impl Default for IpPool {
    /// The process's one pool, starting at a point of the range that depends on the process id. One per
    /// process, so the kubelets of one test binary (the shared control plane's and those of scenarios
    /// with a control plane of their own, running at the same time) never hand out the same address.
    fn default() -> Self {
        static PROCESS: OnceLock<IpPool> = OnceLock::new();
        PROCESS
            .get_or_init(|| {
                // Knuth's multiplicative hash spreads consecutive pids over the range.
                let spread =
                    u64::from(std::process::id()).wrapping_mul(2_654_435_761) % u64::from(SLOTS);
                IpPool::starting_at(u16::try_from(spread).unwrap_or(0))
            })
            .clone()
    }
}

#[derive(Default)]
struct Inner {
    used: BTreeSet<u16>,
    next: u16,
}

/// 254 × 254 addresses: x and y in 1..=254, leaving out the .0 and .255 that look like network and
/// broadcast addresses to tools that do not know loopback is special.
const SLOTS: u16 = 254 * 254;

/// One address, held while its pod runs.
pub struct IpLease {
    pool: IpPool,
    slot: u16,
}

impl IpPool {
    /// A pool whose first address is slot `slot` (0 is 127.1.1.1, 254 is 127.1.2.1).
    pub fn starting_at(slot: u16) -> IpPool {
        IpPool {
            inner: Arc::new(Mutex::new(Inner {
                used: BTreeSet::new(),
                next: slot % SLOTS,
            })),
        }
    }

    /// A free address, or `None` when all 64 516 are taken.
    pub fn lease(&self) -> Option<IpLease> {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        for _ in 0..SLOTS {
            let slot = inner.next;
            inner.next = (inner.next + 1) % SLOTS;
            if inner.used.insert(slot) {
                return Some(IpLease {
                    pool: self.clone(),
                    slot,
                });
            }
        }
        None
    }
}

impl IpLease {
    pub fn ip(&self) -> Ipv4Addr {
        let x = (self.slot / 254 + 1) as u8;
        let y = (self.slot % 254 + 1) as u8;
        Ipv4Addr::new(127, 1, x, y)
    }
}

impl Drop for IpLease {
    fn drop(&mut self) {
        let mut inner = self.pool.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner.used.remove(&self.slot);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_unique_while_held_and_reused_after() {
        let pool = IpPool::starting_at(0);
        let a = pool.lease().unwrap();
        let b = pool.lease().unwrap();
        assert_eq!(a.ip(), Ipv4Addr::new(127, 1, 1, 1));
        assert_eq!(b.ip(), Ipv4Addr::new(127, 1, 1, 2));
        drop(a);
        let held: Vec<IpLease> = (0..SLOTS - 1).map(|_| pool.lease().unwrap()).collect();
        assert!(pool.lease().is_none());
        assert!(held.iter().all(|l| l.ip() != b.ip()));
        assert_eq!(held.last().unwrap().ip(), Ipv4Addr::new(127, 1, 1, 1));
    }

    #[test]
    fn pools_of_other_processes_start_elsewhere() {
        let pool = IpPool::starting_at(254 * 3 + 4);
        assert_eq!(pool.lease().unwrap().ip(), Ipv4Addr::new(127, 1, 4, 5));
        let last = IpPool::starting_at(SLOTS - 1).lease().unwrap().ip();
        assert_eq!(last, Ipv4Addr::new(127, 1, 254, 254));
        let default = IpPool::default().lease().unwrap().ip();
        assert_eq!(default.octets()[..2], [127, 1]);
    }
}
