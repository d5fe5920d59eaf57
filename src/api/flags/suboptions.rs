//! The values each `-o` sub-option accepts, as memcached's own parser reads them (`main()`'s
//! `getsubopt` switch in `memcached.c`, and `storage_read_config` in `storage.c` for the `ext_*` ones),
//! in every version the operator runs (see [`super`]): a value any of them exits on is refused.
//!
//! memcached reads a value in one of three ways, and each is modelled as it reads it:
//! - C's `atoi`/`atof` (`c_atoi`, `c_atof`): the longest numeric prefix, anything else 0, so
//!   `tail_repair_time=abc` is 0 (and exits: less than 10);
//! - its `safe_strtoul`/`safe_strtol`/`safe_strtod`: a number and nothing else (`slab_chunk_max=abc`
//!   exits, or on 1.6.18 divides by zero). Only plain decimal digits are admitted here, which is stricter
//!   than memcached (it also skips leading blanks and takes a sign), never looser;
//! - a word compared exactly (`hash_algorithm`).
//!
//! The rules between options (the LRU percentages together, `slab_sizes` against the chunk sizes,
//! `slab_chunk_max` against the item size, `temporary_ttl` without the LRU maintainer) are in
//! `super::startup`, which sees the whole command line.

use super::cnum::{c_atof, c_atoi};
use super::table::{Accepts, Policy, SUB_OPTIONS, SubOption};

/// Most classes `slab_sizes` may list: memcached exits at the 63rd (`MAX_NUMBER_OF_SLAB_CLASSES - 1`).
pub const MAX_SLAB_SIZES: usize = 62;
/// How much larger than the previous each `slab_sizes` class must be (`CHUNK_ALIGN_BYTES`, exclusive).
pub const SLAB_SIZE_STEP: u64 = 8;
/// Largest `slab_chunk_max` 1.6.24 and later take (kilobytes: "must be specified in kilobytes").
pub const SLAB_CHUNK_MAX_KIB: u64 = 1024;

/// Why memcached would not start with `name[=value]`, or `None` when every supported version does.
/// `name` is an allowed sub-option of [`SUB_OPTIONS`]; an unknown one is not this function's to judge.
pub fn refusal(name: &str, value: Option<&str>) -> Option<String> {
    let sub = SUB_OPTIONS.iter().find(|s| s.name == name)?;
    let value = value?;
    let accepts = sub.accepts;
    let fine = match accepts {
        Accepts::Ignored => true,
        Accepts::Int { min, max } => (min..=max).contains(&i64::from(c_atoi(value))),
        Accepts::Positive { max } => {
            c_atof(value).is_some_and(|f| f > 0.0 && max.is_none_or(|max| f <= max))
        }
        Accepts::Count { max } => digits(value).is_some_and(|n| n <= max),
        Accepts::Decimal => decimal(value),
        Accepts::OneOf(words) => words.contains(&value),
        Accepts::SlabSizes => slab_sizes(value).is_ok(),
        Accepts::SlabChunkMax => {
            digits(value).is_some_and(|n| n.is_power_of_two() && n <= SLAB_CHUNK_MAX_KIB)
        }
    };
    if fine {
        return None;
    }
    let reads = match accepts {
        Accepts::Int { .. } if value != c_atoi(value).to_string() => {
            format!(" (memcached reads it as {})", c_atoi(value))
        }
        Accepts::SlabSizes => match slab_sizes(value) {
            Err(why) => format!(" ({why})"),
            Ok(_) => String::new(),
        },
        _ => String::new(),
    };
    Some(format!(
        "-o {name}={value}{reads}: memcached starts only with {}, and exits (or crashes) otherwise",
        accepts.describe()
    ))
}

/// `value` as plain decimal digits, if it is (and fits 64 bits).
pub fn digits(value: &str) -> Option<u64> {
    if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    value.parse().ok()
}

fn decimal(value: &str) -> bool {
    let (whole, fraction) = value.split_once('.').unwrap_or((value, "0"));
    digits(whole).is_some() && digits(fraction).is_some()
}

/// The sizes of a `slab_sizes` list, checked as far as they do not depend on other options: digits
/// (memcached's `strtok_r` skips empty pieces, as this does), each more than [`SLAB_SIZE_STEP`] larger
/// than the last, at most [`MAX_SLAB_SIZES`] of them, at least one.
pub fn slab_sizes(value: &str) -> Result<Vec<u64>, String> {
    let mut sizes: Vec<u64> = Vec::new();
    for piece in value.split('-').filter(|p| !p.is_empty()) {
        let size = digits(piece)
            .filter(|&n| n <= u64::from(u32::MAX))
            .ok_or_else(|| format!("{piece:?} is not a size in bytes"))?;
        if let Some(&last) = sizes.last()
            && size <= last + SLAB_SIZE_STEP
        {
            return Err(format!(
                "{size} is not more than {SLAB_SIZE_STEP} bytes larger than the class before, {last}"
            ));
        }
        sizes.push(size);
    }
    if sizes.is_empty() {
        return Err("it lists no size".to_owned());
    }
    if sizes.len() > MAX_SLAB_SIZES {
        return Err(format!(
            "it lists {} classes, more than {MAX_SLAB_SIZES}",
            sizes.len()
        ));
    }
    Ok(sizes)
}

impl Accepts {
    /// The accepted values, in words (for messages and the documentation's table).
    pub fn describe(&self) -> String {
        match *self {
            Accepts::Ignored => "no value (a value given is ignored)".to_owned(),
            Accepts::Int { min, max }
                if min == i64::from(i32::MIN) && max == i64::from(i32::MAX) =>
            {
                "any integer (read as C's `atoi` reads it: `abc` is 0)".to_owned()
            }
            Accepts::Int { min, max } if max == i64::from(i32::MAX) => {
                format!("an integer of at least {min} (read as C's `atoi` reads it: `abc` is 0)")
            }
            Accepts::Int { min, max } => {
                format!("an integer from {min} to {max} (read as C's `atoi` reads it: `abc` is 0)")
            }
            Accepts::Positive { max: None } => "a decimal number above 0".to_owned(),
            Accepts::Positive { max: Some(max) } => {
                format!("a decimal number above 0 and at most {max}")
            }
            Accepts::Count { max } => format!("a whole number in decimal digits, at most {max}"),
            Accepts::Decimal => "a decimal number (digits, optionally `.` and digits)".to_owned(),
            Accepts::OneOf(words) => format!("one of `{}`", words.join("`, `")),
            Accepts::SlabSizes => format!(
                "sizes in bytes joined by `-`, each more than {SLAB_SIZE_STEP} larger than the last, at \
                 most {MAX_SLAB_SIZES}, from the `-n` chunk size (48 by default) to the slab chunk size \
                 (`slab_chunk_max`)"
            ),
            Accepts::SlabChunkMax => format!(
                "a power of two from 1 to {SLAB_CHUNK_MAX_KIB} whose chunk divides `maxItemSize`: kilobytes \
                 on memcached 1.6.24 and later, bytes before (so `512` is 512 KiB on one and 512 bytes on \
                 the other)"
            ),
        }
    }

    /// Values at and around the edges of what is accepted, and spellings that probe the reading
    /// (non-numeric, empty, huge): what the tests run against the real memcached.
    pub fn samples(&self) -> Vec<String> {
        let mut out: Vec<String> = ["", "abc", "99999999999", "-1", "1x"]
            .map(str::to_owned)
            .to_vec();
        let more: Vec<String> = match *self {
            Accepts::Ignored => vec!["1".into()],
            Accepts::Int { min, max } => [min - 1, min, min + 1, max - 1, max, max + 1]
                .iter()
                .filter(|n| i32::try_from(**n).is_ok())
                .map(i64::to_string)
                .collect(),
            Accepts::Positive { max } => {
                let mut v = vec!["0".into(), "0.01".into(), "1".into(), "nan".into()];
                if let Some(max) = max {
                    v.extend([format!("{max}"), format!("{}", max + 0.01)]);
                }
                v
            }
            Accepts::Count { max } => vec![
                "0".into(),
                "1".into(),
                max.to_string(),
                (max + 1).to_string(),
            ],
            Accepts::Decimal => vec!["0".into(), "0.5".into(), "1.5".into()],
            Accepts::OneOf(words) => {
                let mut v: Vec<String> = words.iter().map(|w| (*w).to_owned()).collect();
                v.push(format!("{}x", words[0]));
                v
            }
            Accepts::SlabSizes => vec![
                "48".into(),
                "47".into(),
                "100-200".into(),
                "100-108".into(),
                "100-109".into(),
                "100-50".into(),
                "524288".into(),
                "524289".into(),
                "1048577".into(),
                (1..=MAX_SLAB_SIZES)
                    .map(|i| (i * 100).to_string())
                    .collect::<Vec<_>>()
                    .join("-"),
                (1..=MAX_SLAB_SIZES + 1)
                    .map(|i| (i * 100).to_string())
                    .collect::<Vec<_>>()
                    .join("-"),
            ],
            Accepts::SlabChunkMax => [
                "0", "1", "2", "3", "512", "1000", "1024", "2048", "99999999",
            ]
            .map(str::to_owned)
            .to_vec(),
        };
        out.extend(more);
        out
    }
}

/// Where [`options_markdown`] is committed (written by `cargo xtask manifests`, compared by its checks).
pub const OPTIONS_DOC_PATH: &str = "docs/memcached-options.md";

/// The reference of the `-o` sub-options extraArgs may set and the values the operator admits.
pub fn options_markdown() -> String {
    format!(
        "# memcached `-o` sub-options in `spec.memcached.extraArgs`\n\n\
         Generated from the operator's option table (`src/api/flags/`) by `cargo xtask manifests`; do not \
         edit.\n\n\
         The values the operator admits for each of memcached's `-o` sub-options: those every memcached it \
         runs (1.6.18, Debian's, to 1.6.45, the official images') starts with, as memcached's own parser reads \
         them. The operator refuses other values, and sub-options not listed (the instance is `Degraded` \
         with reason `InvalidConfig`, naming the element of `extraArgs`, and the running pods keep \
         serving): memcached exits on them, except where this table is stricter than memcached (plain \
         digits only where memcached also skips blanks or takes a sign, decimal spellings only). `tests/memcached_differential.rs` runs the \
         boundary values of each against the real binary.\n\n\
         Checked together, as memcached checks them once it has read every option:\n\n\
         - `hot_lru_pct` + `warm_lru_pct` at most 80 (defaults 20 and 40);\n\
         - `temporary_ttl` needs the LRU maintainer (not after `no_lru_maintainer` or `no_modern` without a \
         later `lru_maintainer`);\n\
         - the slab chunk size (`slab_chunk_max`; 512 KiB by default, 1 MiB after `no_chunked_items`, or after \
         `no_modern` without `slab_chunk_max`) must divide the 1 MiB slab page and `maxItemSize`, and not \
         exceed it; so without `slab_chunk_max`, `maxItemSize` is a multiple of 512k;\n\
         - every `slab_sizes` size is from the `-n` chunk size to the slab chunk size;\n\
         - both readings of `slab_chunk_max` (bytes before 1.6.24, kilobytes since) must pass these;\n\
         - `hashpower` is above the item lock table of the threads (12 for 4 threads, 13 for 5 to 10, 14 for \
         11 to 20, 15 above) and its table (`8 << hashpower` bytes) fits the container's memory limit.\n\n\
         {}",
        markdown_table()
    )
}

/// The table of `-o` sub-options and the values they accept.
pub fn markdown_table() -> String {
    let mut out = String::from("| `-o` sub-option | Accepted |\n|---|---|\n");
    for sub in SUB_OPTIONS {
        out.push_str(&format!("| `{}` | {} |\n", sub.name, cell(sub)));
    }
    out
}

fn cell(sub: &SubOption) -> String {
    match sub.policy {
        Policy::Refused(why) => format!("refused: {}", why.replace('|', "\\|")),
        Policy::Allowed => sub.accepts.describe(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slab_size_lists_are_read_as_memcached_splits_them() {
        assert_eq!(slab_sizes("100-200"), Ok(vec![100, 200]));
        assert_eq!(slab_sizes("-100--200-"), Ok(vec![100, 200]));
        assert!(slab_sizes("100-108").is_err());
        assert!(slab_sizes("200-100").is_err());
        assert!(slab_sizes("abc").is_err());
        assert!(slab_sizes("---").is_err());
        assert!(slab_sizes("").is_err());
    }

    #[test]
    fn every_allowed_sub_option_has_samples_on_both_sides() {
        for sub in SUB_OPTIONS.iter().filter(|s| s.policy == Policy::Allowed) {
            let samples = sub.accepts.samples();
            let refused = samples
                .iter()
                .filter(|v| refusal(sub.name, Some(v)).is_some())
                .count();
            let anything = matches!(sub.accepts, Accepts::Ignored)
                || sub.accepts
                    == (Accepts::Int {
                        min: i32::MIN.into(),
                        max: i32::MAX.into(),
                    });
            if !anything {
                assert!(refused > 0, "{}: no refused sample", sub.name);
                assert!(refused < samples.len(), "{}: no accepted sample", sub.name);
            }
        }
    }
}
