//! libmemcached's default distribution (`MEMCACHED_DISTRIBUTION_MODULA` with `MEMCACHED_HASH_DEFAULT`,
//! its "one at a time" hash): `hash(key) % n` over slot order. What pylibmc and PHP's Memcached do
//! unless told otherwise.

/// The slot of `key` among `count` (at least 1) servers.
pub(super) fn server(key: &[u8], count: usize) -> usize {
    one_at_a_time(key) as usize % count
}

/// libhashkit's `hashkit_one_at_a_time`: Bob Jenkins' one-at-a-time hash, with each byte read through a
/// `char`, which is signed on x86: a byte of 0x80 or more adds 0xffffff80 and up, not 0x80. Clients
/// built for a platform with an unsigned `char` (ARM) place such keys elsewhere.
pub(super) fn one_at_a_time(key: &[u8]) -> u32 {
    let mut value: u32 = 0;
    for &byte in key {
        value = value.wrapping_add(byte as i8 as i32 as u32);
        value = value.wrapping_add(value << 10);
        value ^= value >> 6;
    }
    value = value.wrapping_add(value << 3);
    value ^= value >> 11;
    value.wrapping_add(value << 15)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_above_0x7f_are_sign_extended() {
        // Reading 0xff as 255 would give another hash; libmemcached reads it as -1.
        let unsigned = {
            let mut value: u32 = 255;
            value = value.wrapping_add(value << 10);
            value ^= value >> 6;
            value = value.wrapping_add(value << 3);
            value ^= value >> 11;
            value.wrapping_add(value << 15)
        };
        assert_ne!(one_at_a_time(&[0xff]), unsigned);
    }
}
