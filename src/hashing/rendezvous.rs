//! pymemcache's rendezvous hashing (`pymemcache.client.rendezvous.RendezvousHash`, the default hasher of
//! `pymemcache.client.hash.HashClient`): every server scores `murmur3_32(f"{node}-{key}")`, the highest
//! score wins, a tie goes to the greater node name.
//!
//! HashClient names a node `host:port` from the server it was given (`_make_client_key` over
//! `normalize_server_spec`), so an IPv6 server is named without its brackets. The hashed text is a
//! Python `str` and pymemcache's murmur3 reads each character's code point truncated to 8 bits: for
//! a key passed as `str`, which HashClient sends as UTF-8, that is each character of the UTF-8-decoded
//! key, not each byte on the wire. A key that is not UTF-8 cannot come from a `str` (pymemcache hashes
//! a `bytes` key's `repr`, `b'...'`); such keys are placed by their bytes, which no pymemcache client
//! matches.

use super::endpoint::Endpoint;

/// The node names, in slot order.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Nodes {
    names: Vec<String>,
}

impl Nodes {
    pub(super) fn new(servers: &[Endpoint<'_>]) -> Self {
        Self {
            names: servers
                .iter()
                .map(|s| format!("{}:{}", s.host, s.port))
                .collect(),
        }
    }

    pub(super) fn server(&self, key: &[u8]) -> usize {
        let key_chars = key_code_units(key);
        let mut text = Vec::new();
        let mut winner: Option<(u32, usize)> = None;
        for (index, name) in self.names.iter().enumerate() {
            text.clear();
            text.extend(name.chars().map(low_byte));
            text.push(b'-');
            text.extend_from_slice(&key_chars);
            let score = murmur3_32(&text);
            winner = match winner {
                None => Some((score, index)),
                Some((best, _)) if score > best => Some((score, index)),
                Some((best, at)) if score == best && name > &self.names[at] => Some((score, index)),
                kept => kept,
            };
        }
        winner.map_or(0, |(_, index)| index)
    }
}

/// The bytes pymemcache's murmur3 reads for the key: one per character of the UTF-8 key.
fn key_code_units(key: &[u8]) -> Vec<u8> {
    match std::str::from_utf8(key) {
        Ok(text) => text.chars().map(low_byte).collect(),
        Err(_) => key.to_vec(),
    }
}

/// `ord(c) & 0xFF`, as pymemcache's murmur3 reads a character.
fn low_byte(c: char) -> u8 {
    (u32::from(c) & 0xff) as u8
}

/// MurmurHash3_x86_32 with seed 0, the function pymemcache's pure-Python `murmur3_32` computes (its
/// unbounded Python integers agree with 32-bit arithmetic on the low 32 bits it returns). Written out
/// rather than taken from a crate because its input is not the key's bytes (see `key_code_units`) and
/// the `murmur3` crate in our lock file reads an `io::Read` and returns an `io::Result` for what
/// cannot fail here.
fn murmur3_32(data: &[u8]) -> u32 {
    const C1: u32 = 0xcc9e_2d51;
    const C2: u32 = 0x1b87_3593;
    let mut h1: u32 = 0;
    let mut blocks = data.chunks_exact(4);
    for block in &mut blocks {
        let k1 = u32::from_le_bytes([block[0], block[1], block[2], block[3]]);
        h1 ^= k1.wrapping_mul(C1).rotate_left(15).wrapping_mul(C2);
        h1 = h1.rotate_left(13).wrapping_mul(5).wrapping_add(0xe654_6b64);
    }
    let tail = blocks.remainder();
    if !tail.is_empty() {
        let k1 = tail
            .iter()
            .rev()
            .fold(0u32, |acc, &b| (acc << 8) | u32::from(b));
        h1 ^= k1.wrapping_mul(C1).rotate_left(15).wrapping_mul(C2);
    }
    h1 ^= data.len() as u32;
    h1 ^= h1 >> 16;
    h1 = h1.wrapping_mul(0x85eb_ca6b);
    h1 ^= h1 >> 13;
    h1 = h1.wrapping_mul(0xc2b2_ae35);
    h1 ^ (h1 >> 16)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn murmur3_matches_pymemcache() {
        // pymemcache 4.0.0: murmur3_32(s) for each s.
        for (text, expected) in PYMEMCACHE_MURMUR3 {
            assert_eq!(murmur3_32(text.as_bytes()), *expected, "{text:?}");
        }
    }

    #[test]
    fn a_non_ascii_key_is_hashed_by_its_characters_low_bytes() {
        assert_eq!(key_code_units("é€".as_bytes()), vec![0xe9, 0xac]);
        assert_eq!(key_code_units(b"\xff"), vec![0xff]);
    }

    /// murmur3_32 of each text as pymemcache 4.0.0 computes it.
    const PYMEMCACHE_MURMUR3: &[(&str, u32)] = &[
        ("", 0x00000000),
        ("a", 0x3c2569b2),
        ("ab", 0x9bbfd75f),
        ("abc", 0xb3dd93fa),
        ("abcd", 0x43ed676a),
        ("abcde", 0xe89b9af6),
        ("hello", 0x248bfa47),
        ("The quick brown fox jumps over the lazy dog", 0x2e4ff723),
        ("10.0.0.1:11211-user:1", 0xaf9465c0),
    ];
}
