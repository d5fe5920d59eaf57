//! libmemcached's libketama-compatible consistent hashing: `MEMCACHED_BEHAVIOR_KETAMA_WEIGHTED`, which
//! PHP's `Memcached::OPT_LIBKETAMA_COMPATIBLE` and pylibmc's `behaviors={"ketama_weighted": True}` set
//! (it also sets the key hash to MD5). Built as libmemcached 1.x's `update_continuum` (hosts.cc) builds
//! its continuum, and searched as its `dispatch_host` searches it.
//!
//! Not pylibmc's `{"ketama": True}` alone: that keeps the one-at-a-time hash and 100 points per server,
//! another placement.

use md5::{Digest, Md5};

use super::endpoint::Endpoint;

/// `MEMCACHED_POINTS_PER_SERVER_KETAMA`: points per server of equal weight.
const POINTS_PER_SERVER: u32 = 160;
/// Points taken from one MD5 digest (four 32-bit words).
const POINTS_PER_HASH: u32 = 4;
/// `MEMCACHED_DEFAULT_PORT`: a server on this port is hashed as `host-N`, others as `host:port-N`.
const DEFAULT_PORT: u16 = 11211;

/// The sorted points of the ring, each with the index of its server.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Continuum {
    points: Vec<(u32, usize)>,
}

impl Continuum {
    pub(super) fn new(servers: &[Endpoint<'_>]) -> Self {
        let per_server = points_per_server(servers.len());
        let mut points = Vec::with_capacity(servers.len() * per_server as usize);
        for (index, server) in servers.iter().enumerate() {
            for point in 0..per_server / POINTS_PER_HASH {
                let label = if server.port == DEFAULT_PORT {
                    format!("{}-{point}", server.host)
                } else {
                    format!("{}:{}-{point}", server.host, server.port)
                };
                let digest = Md5::digest(label.as_bytes());
                for word in digest.chunks_exact(4) {
                    points.push((le_word(word), index));
                }
            }
        }
        // libmemcached's qsort orders equal values by server index too (continuum_item_cmp), so the
        // order is total and a sort reproduces it.
        points.sort_unstable();
        Self { points }
    }

    /// The server of the first point at or after the key's hash, wrapping to the first point.
    pub(super) fn server(&self, key: &[u8]) -> usize {
        let hash = le_word(&Md5::digest(key)[..4]);
        let at = self.points.partition_point(|&(value, _)| value < hash);
        self.points
            .get(at)
            .or_else(|| self.points.first())
            .map_or(0, |&(_, index)| index)
    }
}

/// Points per server when every server has weight 1 (what pylibmc and PHP give servers added without
/// a weight), computed in `float` as libmemcached does: `floor(pct * 160 / 4 * live + 1e-10f) * 4`
/// with `pct = 1 / n`. Rounding in `float` can make this 156 instead of 160 for some list sizes, and
/// the client then has fewer points per server: the exact arithmetic is part of the placement.
pub(super) fn points_per_server(count: usize) -> u32 {
    if count == 0 {
        return 0;
    }
    let live = count as f32;
    let pct = 1.0f32 / live;
    let scaled = pct * POINTS_PER_SERVER as f32 / 4.0 * live + 0.000_000_000_1f32;
    scaled.floor() as u32 * 4
}

/// A 32-bit word of an MD5 digest, little-endian, as libmemcached's `ketama_server_hash` and
/// `hashkit_md5` read it.
fn le_word(bytes: &[u8]) -> u32 {
    bytes
        .iter()
        .take(4)
        .rev()
        .fold(0, |acc, &b| (acc << 8) | u32::from(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn points_per_server_follow_float_rounding() {
        // 1/n * 160 / 4 * n rounds below 40 in `float` for these sizes (tests/hashing.rs has lists of 25
        // and 50 servers, checked against libmemcached itself).
        let short = [25, 47, 50, 55, 61];
        for n in 1..=64 {
            let expected = if short.contains(&n) { 156 } else { 160 };
            assert_eq!(points_per_server(n), expected, "{n} servers");
        }
    }

    #[test]
    fn the_default_port_is_left_out_of_the_hashed_label() {
        let default = Continuum::new(&[Endpoint::parse("a:11211").unwrap()]);
        let other = Continuum::new(&[Endpoint::parse("a:11212").unwrap()]);
        let first = le_word(&Md5::digest(b"a-0")[..4]);
        assert!(default.points.iter().any(|&(value, _)| value == first));
        assert!(!other.points.iter().any(|&(value, _)| value == first));
        let labelled = le_word(&Md5::digest(b"a:11212-0")[..4]);
        assert!(other.points.iter().any(|&(value, _)| value == labelled));
    }
}
