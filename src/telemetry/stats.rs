//! Parsing memcached's `stats` reply (text protocol).
//!
//! The reply is a list of `STAT <name> <value>\r\n` lines closed by `END\r\n`. The parser is pure and total:
//! it reads bytes, never indexes out of bounds, never panics, and answers every input either with the
//! [`Stats`] the operator uses or with a [`ParseError`] that says what was wrong. Bytes come from a network
//! peer, so nothing about them is trusted: not their encoding, not their length, not their order.

/// The largest `stats` reply the operator accepts, in bytes.
///
/// memcached 1.6 answers `stats` with about 2.2 KiB (some 90 lines); 64 KiB leaves room for every version and
/// build option while bounding what a misbehaving peer can make the operator buffer, per pod.
pub const MAX_REPLY_BYTES: usize = 64 * 1024;

/// The `stats` the operator reads from one memcached server.
///
/// All are counters or gauges that memcached reports as unsigned decimal integers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Seconds since the server started (`uptime`).
    pub uptime_seconds: u64,
    /// Reads of a key that existed (`get_hits`, a counter).
    pub get_hits: u64,
    /// Reads of a key that did not exist (`get_misses`, a counter).
    pub get_misses: u64,
    /// Valid items removed to make room for new ones (`evictions`, a counter): non-zero means the cache is
    /// too small for what is written to it.
    pub evictions: u64,
    /// Items stored now (`curr_items`).
    pub curr_items: u64,
    /// Bytes used to store items now (`bytes`).
    pub bytes: u64,
    /// The memory limit for items, in bytes (`limit_maxbytes`, memcached's `-m`).
    pub limit_maxbytes: u64,
    /// Connections open now (`curr_connections`), the operator's own included.
    pub curr_connections: u64,
    /// Connections refused because `-c` was reached (`rejected_connections`, a counter).
    pub rejected_connections: u64,
    /// Bytes read from the network by the server (`bytes_read`, a counter).
    pub bytes_read: u64,
    /// Bytes written to the network by the server (`bytes_written`, a counter).
    pub bytes_written: u64,
}

/// Why a reply is not a `stats` reply the operator can use.
///
/// Messages quote at most a short excerpt of what the peer sent, never the whole reply.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    /// The reply stops before `END\r\n`: empty, cut in the middle of a line, or cut between lines.
    #[error("the reply ends before END")]
    Truncated,
    /// The reply is longer than [`MAX_REPLY_BYTES`].
    #[error("the reply is longer than {limit} bytes")]
    TooLong {
        /// The bound that was exceeded, in bytes.
        limit: usize,
    },
    /// The server answered with `ERROR`, `CLIENT_ERROR …` or `SERVER_ERROR …` instead of stats.
    #[error("the server answered {0:?}")]
    ServerError(String),
    /// A line is neither `STAT <name> <value>` nor `END`, or holds a lone CR or LF.
    #[error("line {line} is not `STAT <name> <value>`: {excerpt:?}")]
    MalformedLine {
        /// The line's number, from 1.
        line: usize,
        /// The line's start.
        excerpt: String,
    },
    /// Bytes follow the closing `END\r\n`.
    #[error("{0} bytes follow END")]
    TrailingData(usize),
    /// A stat the operator uses is not an unsigned decimal integer that fits in 64 bits.
    #[error("stat {name} is {value:?}, not an unsigned 64-bit integer")]
    BadNumber {
        /// The stat's name.
        name: &'static str,
        /// The value's start.
        value: String,
    },
    /// A stat the operator uses appears twice: the reply is ambiguous.
    #[error("stat {0} appears more than once")]
    DuplicateStat(&'static str),
    /// A stat the operator needs is absent.
    #[error("stat {0} is missing")]
    MissingStat(&'static str),
}

/// A stat a parser reads: its name in the reply, whether it is required, and the field of `T` its value
/// goes to.
pub(crate) type Field<T> = (&'static str, bool, fn(&mut T) -> &mut u64);

/// How many bytes of the peer's text an error quotes.
const EXCERPT_BYTES: usize = 64;

/// The stats the operator reads: each name, whether every memcached the operator can meet reports it, and
/// where its value goes.
///
/// All of them exist in every memcached since 1.4 except `rejected_connections`, which older 1.4 releases did
/// not report: it is optional and reads as 0 when absent, so those versions still give the rest. Any other
/// stat is ignored, whatever its value, so new or build-specific stats never break the parser.
const FIELDS: [Field<Stats>; 11] = [
    ("uptime", true, |s| &mut s.uptime_seconds),
    ("get_hits", true, |s| &mut s.get_hits),
    ("get_misses", true, |s| &mut s.get_misses),
    ("evictions", true, |s| &mut s.evictions),
    ("curr_items", true, |s| &mut s.curr_items),
    ("bytes", true, |s| &mut s.bytes),
    ("limit_maxbytes", true, |s| &mut s.limit_maxbytes),
    ("curr_connections", true, |s| &mut s.curr_connections),
    ("rejected_connections", false, |s| {
        &mut s.rejected_connections
    }),
    ("bytes_read", true, |s| &mut s.bytes_read),
    ("bytes_written", true, |s| &mut s.bytes_written),
];

/// Parses a whole `stats` reply.
///
/// `reply` is the whole reply including the final `END\r\n`, and nothing after it. Lines must end with CRLF
/// as the protocol says. An error line from the server (`ERROR`, `CLIENT_ERROR …`, `SERVER_ERROR …`) is
/// reported as [`ParseError::ServerError`], wherever it appears.
pub fn parse(reply: &[u8]) -> Result<Stats, ParseError> {
    parse_fields(reply, &FIELDS)
}

/// Parses a whole `stats` reply into the `fields` of a `T`, with [`parse`]'s rules: other stats are
/// ignored, a field's stat must be an unsigned decimal given at most once, and a required one must be there.
pub(crate) fn parse_fields<T: Default, const N: usize>(
    reply: &[u8],
    fields: &[Field<T>; N],
) -> Result<T, ParseError> {
    let mut parsed = T::default();
    let mut seen = [false; N];
    entries(reply, |name, value| {
        let known = fields
            .iter()
            .zip(seen.iter_mut())
            .find(|((field_name, _, _), _)| name == field_name.as_bytes());
        if let Some((&(field_name, _, field), seen)) = known {
            if *seen {
                return Err(ParseError::DuplicateStat(field_name));
            }
            *seen = true;
            *field(&mut parsed) = parse_u64(value).ok_or_else(|| ParseError::BadNumber {
                name: field_name,
                value: excerpt(value),
            })?;
        }
        Ok(())
    })?;
    for (&(name, required, _), seen) in fields.iter().zip(seen) {
        if required && !seen {
            return Err(ParseError::MissingStat(name));
        }
    }
    Ok(parsed)
}

/// Checks the framing of a whole reply (size, CRLF lines, `STAT <name> <value>` lines, `END` last, no
/// error line) and hands each stat's name and value to `visit`, in order; the first error stops it.
pub(crate) fn entries(
    reply: &[u8],
    mut visit: impl FnMut(&[u8], &[u8]) -> Result<(), ParseError>,
) -> Result<(), ParseError> {
    if reply.len() > MAX_REPLY_BYTES {
        return Err(ParseError::TooLong {
            limit: MAX_REPLY_BYTES,
        });
    }
    let mut rest = reply;
    let mut number = 0;
    loop {
        let Some((line, after)) = split_line(rest) else {
            return Err(ParseError::Truncated);
        };
        number += 1;
        rest = after;
        if is_server_error(line) {
            return Err(ParseError::ServerError(excerpt(line)));
        }
        if line.contains(&b'\r') || line.contains(&b'\n') {
            return Err(malformed(number, line));
        }
        if line == b"END" {
            if !rest.is_empty() {
                return Err(ParseError::TrailingData(rest.len()));
            }
            return Ok(());
        }
        let Some(stat) = line.strip_prefix(b"STAT ") else {
            return Err(malformed(number, line));
        };
        let Some(space) = stat.iter().position(|&b| b == b' ') else {
            return Err(malformed(number, line));
        };
        let (name, value) = (&stat[..space], &stat[space + 1..]);
        if name.is_empty() {
            return Err(malformed(number, line));
        }
        visit(name, value)?;
    }
}

/// Whether `line` (one line with its CRLF) closes a reply to `stats`: `END`, or one of the error lines after
/// which memcached sends nothing more. A reader stops at such a line and hands what it has to [`parse`].
pub(crate) fn ends_reply(line: &[u8]) -> bool {
    line.strip_suffix(b"\r\n")
        .is_some_and(|line| line == b"END" || is_server_error(line))
}

/// The first line of `bytes` without its CRLF, and what follows it; `None` when no CRLF is there.
fn split_line(bytes: &[u8]) -> Option<(&[u8], &[u8])> {
    let end = bytes.windows(2).position(|pair| pair == b"\r\n")?;
    let (line, rest) = bytes.split_at(end);
    Some((line, rest.get(2..).unwrap_or_default()))
}

/// Whether `line` (without CRLF) is one of the protocol's error lines: `ERROR`, `CLIENT_ERROR <message>`,
/// `SERVER_ERROR <message>` (a message after `ERROR` is tolerated too).
fn is_server_error(line: &[u8]) -> bool {
    [&b"ERROR"[..], b"CLIENT_ERROR", b"SERVER_ERROR"]
        .iter()
        .any(|word| {
            line.strip_prefix(*word)
                .is_some_and(|rest| rest.is_empty() || rest.starts_with(b" "))
        })
}

/// A decimal, unsigned, 64-bit value: digits only (no sign, no spaces, no leading `+` that `str::parse`
/// would accept), at least one.
pub(crate) fn parse_u64(value: &[u8]) -> Option<u64> {
    if value.is_empty() || !value.iter().all(u8::is_ascii_digit) {
        return None;
    }
    value.iter().try_fold(0u64, |acc, &digit| {
        acc.checked_mul(10)?.checked_add(u64::from(digit - b'0'))
    })
}

fn malformed(line: usize, bytes: &[u8]) -> ParseError {
    ParseError::MalformedLine {
        line,
        excerpt: excerpt(bytes),
    }
}

/// The start of what the peer sent, as text that is safe to log: at most [`EXCERPT_BYTES`] bytes, invalid
/// UTF-8 replaced.
pub(crate) fn excerpt(bytes: &[u8]) -> String {
    let cut = bytes.get(..EXCERPT_BYTES).unwrap_or(bytes);
    String::from_utf8_lossy(cut).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `stats` from Debian's memcached 1.6.18 after 20 sets and 30 gets (20 hits), bytes as received.
    const FIXTURE: &[u8] = include_bytes!("../../tests/fixtures/memcached-stats.txt");
    /// `stats` from the same memcached run with `-m 2` after 3000 sets of 2000 bytes: evicting.
    const EVICTING: &[u8] = include_bytes!("../../tests/fixtures/memcached-stats-evicting.txt");

    /// A minimal reply: every required stat once, in the order and form memcached writes them.
    fn minimal() -> Vec<u8> {
        let mut reply = Vec::new();
        for (index, (name, _, _)) in FIELDS.iter().enumerate() {
            reply.extend_from_slice(format!("STAT {name} {}\r\n", index + 1).as_bytes());
        }
        reply.extend_from_slice(b"END\r\n");
        reply
    }

    fn replace(reply: &[u8], from: &str, to: &str) -> Vec<u8> {
        String::from_utf8(reply.to_vec())
            .expect("test replies are UTF-8")
            .replace(from, to)
            .into_bytes()
    }

    #[test]
    fn the_captured_reply_gives_its_exact_values() {
        assert!(
            FIXTURE.ends_with(b"\r\nEND\r\n"),
            "the fixture must keep its CRLFs (.gitattributes -text)"
        );
        assert_eq!(
            parse(FIXTURE),
            Ok(Stats {
                uptime_seconds: 2,
                get_hits: 20,
                get_misses: 10,
                evictions: 0,
                curr_items: 20,
                bytes: 1720,
                limit_maxbytes: 67_108_864,
                curr_connections: 1,
                rejected_connections: 0,
                bytes_read: 1167,
                bytes_written: 1150,
            })
        );
    }

    #[test]
    fn the_captured_reply_of_an_evicting_server_gives_its_evictions() {
        assert_eq!(
            parse(EVICTING),
            Ok(Stats {
                uptime_seconds: 2,
                get_hits: 90,
                get_misses: 210,
                evictions: 2098,
                curr_items: 902,
                bytes: 1_863_532,
                limit_maxbytes: 2_097_152,
                curr_connections: 1,
                rejected_connections: 0,
                bytes_read: 6_074_686,
                bytes_written: 207_660,
            })
        );
    }

    #[test]
    fn every_strict_prefix_of_a_real_reply_is_truncated() {
        for fixture in [FIXTURE, EVICTING] {
            for end in 0..fixture.len() {
                assert_eq!(
                    parse(&fixture[..end]),
                    Err(ParseError::Truncated),
                    "prefix of {end} bytes"
                );
            }
        }
    }

    #[test]
    fn every_byte_of_a_real_reply_can_be_dropped_or_flipped_without_a_panic() {
        // Not an exact answer per byte (a flipped digit is still a number), just totality on near-misses.
        for index in 0..FIXTURE.len() {
            let mut dropped = FIXTURE.to_vec();
            dropped.remove(index);
            let _ = parse(&dropped);
            for byte in [0u8, b'\r', b'\n', b' ', b'-', 0xff] {
                let mut flipped = FIXTURE.to_vec();
                flipped[index] = byte;
                let _ = parse(&flipped);
            }
        }
    }

    #[test]
    fn a_minimal_reply_parses_and_unknown_stats_are_ignored() {
        let stats = parse(&minimal()).expect("minimal reply");
        assert_eq!(stats.uptime_seconds, 1);
        assert_eq!(stats.bytes_written, 11);
        let mut with_unknown = replace(
            &minimal(),
            "END\r\n",
            "STAT version 1.6.18\r\nSTAT libevent 2.1.12-stable\r\nSTAT rusage_user 0.005752\r\n",
        );
        with_unknown.extend_from_slice(b"STAT odd \xff\xfe value\r\nEND\r\n");
        assert_eq!(parse(&with_unknown), Ok(stats));
    }

    #[test]
    fn rejected_connections_is_optional_and_reads_as_zero() {
        let without = replace(&minimal(), "STAT rejected_connections 9\r\n", "");
        assert_eq!(parse(&without).map(|s| s.rejected_connections), Ok(0));
    }

    #[test]
    fn each_required_stat_is_required() {
        for (name, _, _) in FIELDS.iter().filter(|(_, required, _)| *required) {
            let reply = String::from_utf8(minimal()).expect("UTF-8");
            let without: String = reply
                .split_inclusive("\r\n")
                .filter(|line| !line.starts_with(&format!("STAT {name} ")))
                .collect();
            assert_eq!(
                parse(without.as_bytes()),
                Err(ParseError::MissingStat(name)),
                "{name}"
            );
        }
    }

    #[test]
    fn empty_and_partial_replies_are_truncated() {
        for reply in [
            &b""[..],
            b"END",
            b"END\r",
            b"STAT uptime 1",
            b"STAT uptime 1\r\n",
            b"\r",
        ] {
            assert_eq!(parse(reply), Err(ParseError::Truncated), "{reply:?}");
        }
    }

    #[test]
    fn error_lines_are_server_errors() {
        for (reply, message) in [
            (&b"ERROR\r\n"[..], "ERROR"),
            (
                b"CLIENT_ERROR bad command line format\r\n",
                "CLIENT_ERROR bad command line format",
            ),
            (
                b"SERVER_ERROR out of memory\r\n",
                "SERVER_ERROR out of memory",
            ),
            (
                b"STAT uptime 1\r\nSERVER_ERROR busy\r\n",
                "SERVER_ERROR busy",
            ),
        ] {
            assert_eq!(
                parse(reply),
                Err(ParseError::ServerError(message.to_owned())),
                "{reply:?}"
            );
        }
    }

    #[test]
    fn lines_that_are_not_stat_lines_are_malformed() {
        for (from, to, line) in [
            ("STAT uptime 1\r\n", "STAT uptime\r\n", 1),
            ("STAT uptime 1\r\n", "STAT  1\r\n", 1),
            ("STAT uptime 1\r\n", "hello\r\n", 1),
            ("STAT uptime 1\r\n", "\r\n", 1),
            ("STAT uptime 1\r\n", "STAT uptime 1\rSTAT x 2\r\n", 1),
            ("STAT uptime 1\r\n", "STAT uptime 1\nSTAT x 2\r\n", 1),
            ("STAT get_hits 2\r\n", "stat get_hits 2\r\n", 2),
        ] {
            let reply = replace(&minimal(), from, to);
            assert!(
                matches!(parse(&reply), Err(ParseError::MalformedLine { line: l, .. }) if l == line),
                "{to:?}: {:?}",
                parse(&reply)
            );
        }
    }

    #[test]
    fn values_must_be_unsigned_64_bit_decimals() {
        for value in [
            "-1",
            "+1",
            "1.5",
            "",
            " 1",
            "1 ",
            "0x10",
            "18446744073709551616",
            "99999999999999999999999",
        ] {
            let reply = replace(
                &minimal(),
                "STAT evictions 4\r\n",
                &format!("STAT evictions {value}\r\n"),
            );
            assert!(
                matches!(
                    parse(&reply),
                    Err(ParseError::BadNumber {
                        name: "evictions",
                        ..
                    })
                ),
                "{value:?}: {:?}",
                parse(&reply)
            );
        }
        let max = replace(
            &minimal(),
            "STAT evictions 4\r\n",
            "STAT evictions 18446744073709551615\r\n",
        );
        assert_eq!(parse(&max).map(|s| s.evictions), Ok(u64::MAX));
        for value in [&b"\xff"[..], b"1\xff", "\u{0661}".as_bytes()] {
            let mut reply = replace(
                &minimal(),
                "STAT evictions 4\r\nSTAT curr_items 5\r\n",
                "STAT curr_items 5\r\n",
            );
            let end = reply.len() - b"END\r\n".len();
            reply.splice(end..end, [&b"STAT evictions "[..], value, b"\r\n"].concat());
            assert!(
                matches!(
                    parse(&reply),
                    Err(ParseError::BadNumber {
                        name: "evictions",
                        ..
                    })
                ),
                "{value:?}"
            );
        }
    }

    #[test]
    fn a_duplicate_used_stat_is_an_error_and_a_duplicate_unknown_one_is_not() {
        let twice = replace(&minimal(), "END\r\n", "STAT curr_items 5\r\nEND\r\n");
        assert_eq!(parse(&twice), Err(ParseError::DuplicateStat("curr_items")));
        let unknown_twice = replace(&minimal(), "END\r\n", "STAT pid 1\r\nSTAT pid 2\r\nEND\r\n");
        assert!(parse(&unknown_twice).is_ok());
    }

    #[test]
    fn bytes_after_end_and_oversized_replies_are_rejected() {
        let mut trailing = minimal();
        trailing.extend_from_slice(b"STAT x 1\r\n");
        assert_eq!(parse(&trailing), Err(ParseError::TrailingData(10)));
        let mut huge = b"STAT pad ".to_vec();
        huge.resize(MAX_REPLY_BYTES, b'x');
        huge.extend_from_slice(&minimal());
        assert_eq!(
            parse(&huge),
            Err(ParseError::TooLong {
                limit: MAX_REPLY_BYTES
            })
        );
    }

    #[test]
    fn excerpts_in_errors_are_bounded() {
        let long = "y".repeat(10_000);
        let reply = replace(&minimal(), "STAT uptime 1\r\n", &format!("{long}\r\n"));
        match parse(&reply) {
            Err(ParseError::MalformedLine { excerpt, .. }) => {
                assert_eq!(excerpt.len(), EXCERPT_BYTES)
            }
            other => panic!("expected a malformed line, got {other:?}"),
        }
    }

    #[test]
    fn reply_ends_are_recognised_line_by_line() {
        for line in [
            &b"END\r\n"[..],
            b"ERROR\r\n",
            b"CLIENT_ERROR x\r\n",
            b"SERVER_ERROR y\r\n",
        ] {
            assert!(ends_reply(line), "{line:?}");
        }
        for line in [
            &b"END"[..],
            b"END\n",
            b"STAT END 1\r\n",
            b"ENDS\r\n",
            b"ERRORS\r\n",
            b"",
        ] {
            assert!(!ends_reply(line), "{line:?}");
        }
    }
}
