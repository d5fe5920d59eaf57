//! The meta protocol's words the copy sends and reads: a key as a command names it, and the header of
//! a fetched value.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;

/// The longest key memcached's text protocols take, as sent (base64 included).
pub(super) const MAX_KEY_BYTES: usize = 250;

/// A key as the meta protocol names it: as is when it is a valid text-protocol key, else in base64
/// (the `b` flag) so keys with spaces or control characters (stored through the binary protocol or a
/// base64 meta command) copy too.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct WireKey {
    pub(super) text: Vec<u8>,
    pub(super) base64: bool,
}

impl WireKey {
    /// `None` for a key no text command can name: one that needs base64 and whose base64 is longer than
    /// 250 bytes (a binary key of more than 186 bytes).
    pub(super) fn of(key: &[u8]) -> Option<Self> {
        let plain = !key.is_empty()
            && key.len() <= MAX_KEY_BYTES
            && key.iter().all(|&b| b > b' ' && b != 0x7f);
        if plain {
            return Some(Self {
                text: key.to_vec(),
                base64: false,
            });
        }
        let text = BASE64.encode(key).into_bytes();
        (text.len() <= MAX_KEY_BYTES).then_some(Self { text, base64: true })
    }
}

/// The header of an `mg … v f t u` hit: `VA <length> f<flags> t<ttl>`.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct ValueHeader {
    pub(super) length: usize,
    pub(super) flags: u32,
    /// Remaining seconds; `None` when the item never expires (`t-1`).
    pub(super) ttl: Option<i64>,
}

pub(super) fn parse_value_header(line: &[u8]) -> Option<ValueHeader> {
    let text = std::str::from_utf8(line.strip_suffix(b"\r\n")?).ok()?;
    let mut tokens = text.split(' ');
    if tokens.next()? != "VA" {
        return None;
    }
    let length = tokens.next()?.parse().ok()?;
    let (mut flags, mut ttl) = (None, None);
    for token in tokens {
        if let Some(value) = token.strip_prefix('f') {
            flags = Some(value.parse().ok()?);
        } else if let Some(value) = token.strip_prefix('t') {
            ttl = Some(value.parse::<i64>().ok()?);
        }
    }
    Some(ValueHeader {
        length,
        flags: flags?,
        ttl: match ttl? {
            -1 => None,
            seconds => Some(seconds),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_keys_go_as_they_are_and_others_in_base64() {
        let plain = |key: &[u8]| WireKey {
            text: key.to_vec(),
            base64: false,
        };
        assert_eq!(WireKey::of(b"user:42"), Some(plain(b"user:42")));
        assert_eq!(WireKey::of(&[b'k'; 250]), Some(plain(&[b'k'; 250])));
        assert_eq!(WireKey::of("ünï".as_bytes()), Some(plain("ünï".as_bytes())));
        let encoded = |key: &[u8]| WireKey::of(key).filter(|k| k.base64).map(|k| k.text);
        assert_eq!(encoded(b"a b"), Some(b"YSBi".to_vec()));
        assert_eq!(encoded(b"\x00"), Some(b"AA==".to_vec()));
        assert!(encoded(&[b' '; 186]).is_some());
        assert_eq!(WireKey::of(&[b' '; 187]), None);
        assert_eq!(WireKey::of(&[b'k'; 251]), None);
    }

    #[test]
    fn a_hit_header_gives_length_flags_and_ttl() {
        assert_eq!(
            parse_value_header(b"VA 5 f7 t100\r\n"),
            Some(ValueHeader {
                length: 5,
                flags: 7,
                ttl: Some(100)
            })
        );
        assert_eq!(
            parse_value_header(b"VA 3 f0 t-1\r\n"),
            Some(ValueHeader {
                length: 3,
                flags: 0,
                ttl: None
            })
        );
    }

    #[test]
    fn anything_else_is_not_a_header() {
        for bad in [
            &b"EN\r\n"[..],
            b"VA 5 f7\r\n",
            b"VA x f7 t1\r\n",
            b"VA 5 f7 t1",
            b"SERVER_ERROR out of memory\r\n",
            b"VA 5 f99999999999 t1\r\n",
        ] {
            assert_eq!(parse_value_header(bad), None, "{bad:?}");
        }
    }
}
