//! Enumerating a server's items: memcached's `lru_crawler metadump all`, read one line at a time.
//!
//! The crawler walks every LRU and writes one line per live item,
//! `key=<url-encoded> exp=<unix time or -1> la=<unix time> cas=<n> fetch=<yes|no> cls=<n> size=<n>`,
//! then `END`. The dump is consumed as the copy goes, so at most one line is held whatever the cache size;
//! TCP's flow control holds the crawler back while the copy is slower than the dump.

use percent_encoding::percent_decode;

/// The longest dump line read: a 250-byte key URL-encoded (at most 750 bytes) and the numeric fields fit
/// well within it; a longer line is not memcached's.
pub const MAX_LINE_BYTES: u64 = 2048;

/// One item of the dump: what the copy needs of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DumpItem {
    /// The key, decoded: any bytes (a client of the binary protocol, or of the meta protocol's base64
    /// keys, may store keys that are not text).
    pub key: Vec<u8>,
    /// When the item expires, in unix seconds on the server's clock; `None` when it never does (`-1`).
    pub expires: Option<i64>,
    /// The item's size in memory (key, value and header), to bound a batch's bytes before fetching it.
    pub size: u64,
}

impl DumpItem {
    /// Whether the item has expired by `now`, the server's clock (its `stats` `time`): memcached returns
    /// no item whose expiry time has come.
    pub fn expired_at(&self, now: i64) -> bool {
        self.expires.is_some_and(|at| at <= now)
    }
}

/// One line of the dump.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DumpLine {
    Item(DumpItem),
    /// `END`: the crawler has walked every LRU.
    End,
}

/// Why a dump line is not one: the crawler's refusal (`BUSY`, `ERROR …`) or something else entirely.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DumpError {
    /// memcached refused the dump: another crawl is running (`BUSY currently processing crawler
    /// request`), the crawler is off (`-o no_lru_crawler`), or an error line.
    #[error("the server refused the dump: {0}")]
    Refused(String),
    /// A line that is neither an item nor `END`: a field missing or not a number, a bad key encoding.
    #[error("not a metadump line: {0}")]
    Malformed(String),
}

/// Parses one line of the dump (with or without its line end).
pub fn parse_line(line: &[u8]) -> Result<DumpLine, DumpError> {
    let line = line
        .strip_suffix(b"\n")
        .map(|l| l.strip_suffix(b"\r").unwrap_or(l))
        .unwrap_or(line);
    if line == b"END" {
        return Ok(DumpLine::End);
    }
    let shown = || crate::connection::shown(line);
    if !line.starts_with(b"key=") {
        return Err(DumpError::Refused(shown()));
    }
    let (mut key, mut expires, mut size) = (None, None, None);
    for field in line.split(|&b| b == b' ') {
        let Some(eq) = field.iter().position(|&b| b == b'=') else {
            continue;
        };
        let (name, value) = (&field[..eq], &field[eq + 1..]);
        match name {
            b"key" => key = Some(percent_decode(value).collect::<Vec<u8>>()),
            b"exp" => expires = Some(number(value).ok_or_else(|| DumpError::Malformed(shown()))?),
            b"size" => size = Some(number(value).ok_or_else(|| DumpError::Malformed(shown()))?),
            _ => {}
        }
    }
    match (key, expires, size) {
        (Some(key), Some(expires), Some(size)) if !key.is_empty() => Ok(DumpLine::Item(DumpItem {
            key,
            expires: (expires >= 0).then_some(expires),
            size: u64::try_from(size).unwrap_or(0),
        })),
        _ => Err(DumpError::Malformed(shown())),
    }
}

fn number(text: &[u8]) -> Option<i64> {
    std::str::from_utf8(text).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(line: &[u8]) -> DumpItem {
        match parse_line(line) {
            Ok(DumpLine::Item(item)) => item,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_real_line_gives_key_expiry_and_size() {
        // As memcached 1.6.18 writes it.
        let parsed = item(b"key=key exp=1795656215 la=1795656115 cas=1 fetch=yes cls=1 size=71\n");
        assert_eq!(
            parsed,
            DumpItem {
                key: b"key".to_vec(),
                expires: Some(1_795_656_215),
                size: 71
            }
        );
        assert!(!parsed.expired_at(1_795_656_214));
        assert!(parsed.expired_at(1_795_656_215));
    }

    #[test]
    fn minus_one_never_expires() {
        let parsed = item(b"key=k exp=-1 la=1 cas=2 fetch=no cls=1 size=66\r\n");
        assert_eq!(parsed.expires, None);
        assert!(!parsed.expired_at(i64::MAX));
    }

    #[test]
    fn keys_are_url_decoded_to_bytes() {
        let parsed = item(b"key=a%20b%0A%FF%25 exp=-1 la=1 cas=2 fetch=no cls=1 size=66");
        assert_eq!(parsed.key, b"a b\n\xff%");
    }

    #[test]
    fn end_ends() {
        assert_eq!(parse_line(b"END\r\n"), Ok(DumpLine::End));
    }

    #[test]
    fn refusals_and_garbage_are_errors() {
        assert!(matches!(
            parse_line(b"BUSY currently processing crawler request\r\n"),
            Err(DumpError::Refused(_))
        ));
        assert!(matches!(
            parse_line(b"ERROR cannot pipeline other commands before metadump\r\n"),
            Err(DumpError::Refused(_))
        ));
        for bad in [
            &b"key=k exp=x la=1 cas=2 fetch=no cls=1 size=66"[..],
            b"key=k la=1 cas=2 fetch=no cls=1 size=66",
            b"key=k exp=-1 la=1",
            b"key= exp=-1 size=3",
        ] {
            assert!(
                matches!(parse_line(bad), Err(DumpError::Malformed(_))),
                "{bad:?}"
            );
        }
    }
}
