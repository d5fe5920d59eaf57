//! Numbers as memcached reads them with C's `atoi` and `atof` (glibc, C locale): the longest numeric
//! prefix, anything else 0.

/// C's whitespace, as `isspace` in the C locale.
fn c_trim_start(s: &str) -> &str {
    s.trim_start_matches([' ', '\t', '\n', '\x0b', '\x0c', '\r'])
}

/// glibc's `atoi`: `(int) strtol(s, NULL, 10)`. Leading whitespace, a sign, then the longest run of
/// digits; none reads as 0, overflow saturates to the 64-bit `long`'s bound, and the cast to `int` keeps
/// its low 32 bits.
pub fn c_atoi(s: &str) -> i32 {
    let s = c_trim_start(s);
    let (negative, digits) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    let mut long: i64 = 0;
    for digit in digits.bytes().take_while(u8::is_ascii_digit) {
        let d = i64::from(digit - b'0');
        let next = long.checked_mul(10).and_then(|l| {
            if negative {
                l.checked_sub(d)
            } else {
                l.checked_add(d)
            }
        });
        match next {
            Some(n) => long = n,
            None => {
                long = if negative { i64::MIN } else { i64::MAX };
                break;
            }
        }
    }
    // The cast C makes from `long` to `int`: the low 32 bits.
    (long & 0xffff_ffff) as u32 as i32
}

/// glibc's `atof` for decimal spellings: leading whitespace, a sign, digits with an optional point and
/// exponent; none reads as 0. `None` for the spellings this does not read (hexadecimal, `inf`, `nan`),
/// which are left to memcached rather than guessed.
pub fn c_atof(s: &str) -> Option<f64> {
    let s = c_trim_start(s);
    let unsigned = s.strip_prefix(['+', '-']).unwrap_or(s);
    let lower = unsigned.get(..3).unwrap_or(unsigned).to_ascii_lowercase();
    if lower.starts_with("0x") || lower.starts_with("inf") || lower.starts_with("nan") {
        return None;
    }
    let bytes = s.as_bytes();
    let mut end = usize::from(matches!(bytes.first(), Some(b'+' | b'-')));
    let digits = |from: usize| {
        bytes[from..]
            .iter()
            .take_while(|b| b.is_ascii_digit())
            .count()
    };
    let whole = digits(end);
    end += whole;
    let mut fraction = 0;
    if bytes.get(end) == Some(&b'.') {
        fraction = digits(end + 1);
        if whole + fraction > 0 {
            end += 1 + fraction;
        }
    }
    if whole + fraction == 0 {
        return Some(0.0);
    }
    if matches!(bytes.get(end), Some(b'e' | b'E')) {
        let sign = usize::from(matches!(bytes.get(end + 1), Some(b'+' | b'-')));
        let exponent = digits(end + 1 + sign);
        if exponent > 0 {
            end += 1 + sign + exponent;
        }
    }
    s[..end].parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_read_as_c_reads_them() {
        for (text, value) in [
            ("40", 40),
            ("40x", 40),
            (" 13", 13),
            ("+7", 7),
            ("-1", -1),
            ("", 0),
            ("abc", 0),
            ("-p1", 0),
            ("4294967296", 0),
            ("4294967309", 13),
            ("99999999999999999999", -1),
            ("-99999999999999999999", 0),
        ] {
            assert_eq!(c_atoi(text), value, "{text:?}");
        }
        for (text, value) in [
            ("1", Some(1.0)),
            ("1.25", Some(1.25)),
            ("1.25x", Some(1.25)),
            (".5", Some(0.5)),
            ("2.", Some(2.0)),
            ("1e1", Some(10.0)),
            ("1e", Some(1.0)),
            ("abc", Some(0.0)),
            ("-", Some(0.0)),
            ("0x2", None),
            ("inf", None),
        ] {
            assert_eq!(c_atof(text), value, "{text:?}");
        }
    }
}
