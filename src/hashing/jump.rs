//! Jump consistent hash (Lamping and Veach, "A Fast, Minimal Memory, Consistent Hash Algorithm", 2014)
//! over slot indexes, with the key turned into a number as the PyPI package `jump-consistent-hash`
//! documents it: `jump.hash(int(hashlib.md5(key).hexdigest(), 16), n)`.
//!
//! That integer is the whole 128-bit digest; the algorithm's first step multiplies it modulo 2^64, so
//! only its low 64 bits count: the digest's last eight bytes, read big-endian.
//!
//! memcached's proxy places keys with the same algorithm over its pool's backends, from the key's XXH3
//! ([`proxy_server`]).
//!
//! mcrouter's default `Ch3` hash (furc) is another algorithm, and no package here ships it: a client of
//! mcrouter is not matched by this scheme.

use md5::{Digest, Md5};

/// The slot of `key` among `count` (at least 1) servers.
pub(super) fn server(key: &[u8], count: usize) -> usize {
    let digest = Md5::digest(key);
    let mut low = [0u8; 8];
    low.copy_from_slice(&digest[8..]);
    bucket(u64::from_be_bytes(low), count)
}

/// The slot of `key` among `count` (at least 1) backends of memcached's proxy with its default
/// distribution: `mcp.dist_jump_hash` over the key's `XXH3_64bits_withSeed(key, 0)` (`mcp.hash_xxhash`, the
/// pool's default key hasher, no seed), memcached 1.6.23 and later (`proxy_jump_hash.c`, the same
/// reference algorithm below).
pub(super) fn proxy_server(key: &[u8], count: usize) -> usize {
    bucket(xxhash_rust::xxh3::xxh3_64(key), count)
}

/// The reference algorithm: `count` above i32::MAX cannot occur (a list has at most 64 servers) and
/// would only cap the buckets used.
fn bucket(mut key: u64, count: usize) -> usize {
    let count = i64::try_from(count).unwrap_or(i64::MAX);
    let (mut b, mut j) = (-1i64, 0i64);
    while j < count {
        b = j;
        key = key.wrapping_mul(2_862_933_555_777_941_757).wrapping_add(1);
        j = ((b + 1) as f64 * ((1u64 << 31) as f64 / ((key >> 33) + 1) as f64)) as i64;
    }
    // b is at least 0 once the loop ran, and it always runs (count >= 1).
    usize::try_from(b).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_matches_the_packages_readme_example() {
        // jump-consistent-hash's README: jump.hash(256, 1024) == 520.
        assert_eq!(bucket(256, 1024), 520);
    }

    /// Picks of memcached 1.6.45's proxy (`tests/proxy_hashing.rs` checks 400 keys over 1 to 5 backends
    /// against a running proxy when one is available), kept here so that CI checks them without one.
    #[test]
    fn proxy_server_matches_memcached_picks() {
        assert_eq!(xxhash_rust::xxh3::xxh3_64(b"a"), 0xe6c6_32b6_1e96_4e1f);
        for (key, over_3, over_5) in [
            ("user:0:0", 1, 3),
            ("user:1:7919", 0, 0),
            ("user:399:3159681", 2, 2),
        ] {
            assert_eq!(proxy_server(key.as_bytes(), 3), over_3, "{key}");
            assert_eq!(proxy_server(key.as_bytes(), 5), over_5, "{key}");
        }
    }

    #[test]
    fn growing_the_list_moves_keys_only_to_the_new_bucket() {
        for key in 0..2000u64 {
            let before = bucket(key, 7);
            let after = bucket(key, 8);
            assert!(
                after == before || after == 7,
                "key {key}: {before} -> {after}"
            );
        }
    }
}
