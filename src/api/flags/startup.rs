//! The checks memcached makes once it has read every option (the end of `main()`'s option handling in
//! `memcached.c`), which tie options together: the slab chunk size against the item size (`-I`, the
//! operator's `spec.memcached.maxItemSize`), `slab_sizes` against the chunk sizes, the hot and warm LRU
//! shares together, and `temporary_ttl` against the LRU maintainer.
//!
//! `slab_chunk_max` changed unit in memcached 1.6.24 (bytes before, kilobytes since), so the walk is
//! made twice, once per reading, and a command line is admitted only if both start.

use super::argv::{FlagError, Given};
use super::cnum::{c_atof, c_atoi};
use super::suboptions::slab_sizes;

/// memcached's slab page (`slab_page_size`): chunks are cut from pages of 1 MiB.
pub const SLAB_PAGE: u64 = 1 << 20;
/// memcached's default `-I`.
pub const DEFAULT_ITEM_SIZE: u64 = 1 << 20;
/// memcached's default `-n`.
const DEFAULT_CHUNK_SIZE: i64 = 48;
/// memcached's default `-f`.
const DEFAULT_FACTOR: f64 = 1.25;
/// memcached's initial hash table size without `-o hashpower` (`HASHPOWER_DEFAULT`): 2^16 buckets.
pub const DEFAULT_HASHPOWER: u32 = 16;
/// memcached's default hot and warm LRU shares.
const DEFAULT_HOT: i64 = 20;
const DEFAULT_WARM: i64 = 40;
/// The most of the LRU the hot and warm shares may take together.
const HOT_WARM_MAX: i64 = 80;

/// Where memcached's reading of `slab_chunk_max` differs.
#[derive(Clone, Copy)]
enum Reading {
    /// 1.6.23 and older: bytes.
    Bytes,
    /// 1.6.24 and later: kilobytes.
    Kilobytes,
}

impl Reading {
    fn versions(self) -> &'static str {
        match self {
            Reading::Bytes => {
                "memcached 1.6.23 and older (Debian's 1.6.18), which read slab_chunk_max in bytes"
            }
            Reading::Kilobytes => {
                "memcached 1.6.24 and later, which read slab_chunk_max in kilobytes"
            }
        }
    }
}

/// `-I`, from `spec.memcached.maxItemSize`.
struct Item<'a> {
    bytes: u64,
    text: &'a str,
}

/// The settings the checks look at, as memcached holds them after reading the options, with the
/// element that last set each (`None`: memcached's default or the operator's own argument).
struct Settings<'a> {
    chunk_size: i64,
    factor: f64,
    hashpower: u32,
    chunk_max: (u64, Option<&'a Given<'a>>),
    chunk_max_given: bool,
    hot: (i64, Option<&'a Given<'a>>),
    warm: (i64, Option<&'a Given<'a>>),
    temporary_ttl: Option<&'a Given<'a>>,
    lru_maintainer: (bool, Option<&'a Given<'a>>),
    slab_sizes: Option<(&'a str, &'a Given<'a>)>,
}

/// memcached's checks after the options, for both readings of `slab_chunk_max`.
/// `item_size` is `-I` in bytes (`spec.memcached.maxItemSize`; `None`, memcached's 1 MiB), `item_text`
/// as written.
pub fn check(
    given: &[Given<'_>],
    item_size: Option<u64>,
    item_text: Option<&str>,
) -> Result<(), FlagError> {
    let item = Item {
        bytes: item_size.unwrap_or(DEFAULT_ITEM_SIZE),
        text: item_text.unwrap_or_default(),
    };
    for reading in [Reading::Bytes, Reading::Kilobytes] {
        let settings = walk(given, reading);
        chunk_max(&settings, &item, reading)?;
        sizes(&settings, &item, reading)?;
        lru(&settings)?;
    }
    Ok(())
}

/// The settings that shape memcached's slab classes and hash table, as it holds them after reading the
/// options (see `crate::resources::memory` for what they cost).
#[derive(Clone, Debug, PartialEq)]
pub struct Slabs {
    /// `-n`/`--slab-min-size`: the smallest item's data (48 bytes by default).
    pub chunk_size: i64,
    /// `-f`/`--slab-growth-factor`: each class's chunk is this much larger than the one before (1.25).
    pub factor: f64,
    /// The largest chunk, the last class (`slab_chunk_max`; 512 KiB by default).
    pub chunk_max: u64,
    /// `-o slab_sizes`: the classes' chunk sizes, when given instead of `-n` and `-f`.
    pub sizes: Option<Vec<u64>>,
    /// `-o hashpower`: the hash table starts with 2^hashpower buckets (16 by default).
    pub hashpower: u32,
}

/// The slab settings memcached starts with, given `given` and `-I` (`item_size`, bytes; `None`, 1 MiB):
/// one per reading of `slab_chunk_max` (bytes before 1.6.24, kilobytes since), as [`check`] walks them.
pub fn slabs(given: &[Given<'_>], item_size: Option<u64>) -> [Slabs; 2] {
    let item = item_size.unwrap_or(DEFAULT_ITEM_SIZE);
    [Reading::Bytes, Reading::Kilobytes].map(|reading| {
        let s = walk(given, reading);
        let mut chunk_max = s.chunk_max.0;
        // As in [`chunk_max`]: items larger than a page halve it unless slab_chunk_max is given.
        if item > SLAB_PAGE && !s.chunk_max_given {
            chunk_max = SLAB_PAGE / 2;
        }
        Slabs {
            chunk_size: s.chunk_size,
            factor: s.factor,
            chunk_max,
            sizes: s.slab_sizes.and_then(|(value, _)| slab_sizes(value).ok()),
            hashpower: s.hashpower,
        }
    })
}

fn walk<'a>(given: &'a [Given<'a>], reading: Reading) -> Settings<'a> {
    let mut s = Settings {
        chunk_size: DEFAULT_CHUNK_SIZE,
        factor: DEFAULT_FACTOR,
        hashpower: DEFAULT_HASHPOWER,
        chunk_max: (SLAB_PAGE / 2, None),
        chunk_max_given: false,
        hot: (DEFAULT_HOT, None),
        warm: (DEFAULT_WARM, None),
        temporary_ttl: None,
        lru_maintainer: (true, None),
        slab_sizes: None,
    };
    for option in given {
        let value = option.value.unwrap_or_default();
        match option.flag.short {
            Some('n') => s.chunk_size = i64::from(c_atoi(value)),
            // A spelling `c_atof` leaves to memcached is refused by `values`; the default stands in.
            Some('f') => s.factor = c_atof(value).unwrap_or(DEFAULT_FACTOR),
            Some('o') => {
                for item in value.split(',') {
                    let (name, v) = item.split_once('=').unwrap_or((item, ""));
                    sub_option(&mut s, option, name, v, reading);
                }
            }
            _ => {}
        }
    }
    s
}

fn sub_option<'a>(
    s: &mut Settings<'a>,
    option: &'a Given<'a>,
    name: &str,
    value: &'a str,
    reading: Reading,
) {
    match name {
        "slab_chunk_max" => {
            let n = super::suboptions::digits(value).unwrap_or(0);
            let bytes = match reading {
                Reading::Bytes => n,
                Reading::Kilobytes => n.saturating_mul(1024),
            };
            s.chunk_max = (bytes, Some(option));
            s.chunk_max_given = true;
        }
        "no_chunked_items" => s.chunk_max = (SLAB_PAGE, Some(option)),
        "no_modern" => {
            if !s.chunk_max_given {
                s.chunk_max = (SLAB_PAGE, Some(option));
            }
            s.lru_maintainer = (false, Some(option));
        }
        "lru_maintainer" => s.lru_maintainer = (true, Some(option)),
        "no_lru_maintainer" => s.lru_maintainer = (false, Some(option)),
        "hot_lru_pct" => s.hot = (i64::from(c_atoi(value)), Some(option)),
        "warm_lru_pct" => s.warm = (i64::from(c_atoi(value)), Some(option)),
        "temporary_ttl" => s.temporary_ttl = Some(option),
        "slab_sizes" => s.slab_sizes = Some((value, option)),
        // memcached keeps 0 (its "not set") and below as the default; `values` refuses them anyway.
        "hashpower" => {
            s.hashpower = u32::try_from(c_atoi(value))
                .ok()
                .filter(|&p| p > 0)
                .unwrap_or(DEFAULT_HASHPOWER)
        }
        _ => {}
    }
}

fn value_error(option: &Given<'_>, why: String) -> FlagError {
    FlagError::Value {
        index: option.index,
        arg: option.arg.to_owned(),
        why,
    }
}

/// The slab chunk size must divide the slab page and the item size, and not exceed the item size:
/// "slab_chunk_max (bytes: 524288) cannot be larger than -I (item_size_max 262144)", "-I (item_size_max:
/// 1024000) must be evenly divisible by slab_chunk_max (bytes: 524288)" (exit 64).
fn chunk_max(s: &Settings<'_>, item: &Item<'_>, reading: Reading) -> Result<(), FlagError> {
    let Item { bytes: item, text } = *item;
    let (mut chunk, mut set_by) = s.chunk_max;
    // Larger items than a page: memcached halves the page for the chunks, unless slab_chunk_max is given.
    if item > SLAB_PAGE && !s.chunk_max_given {
        (chunk, set_by) = (SLAB_PAGE / 2, None);
    }
    if chunk <= item && item.is_multiple_of(chunk) && SLAB_PAGE.is_multiple_of(chunk) {
        return Ok(());
    }
    let problem = if chunk > item {
        format!(
            "memcached exits (\"slab_chunk_max (bytes: {chunk}) cannot be larger than -I (item_size_max {item})\")"
        )
    } else {
        format!(
            "memcached exits (\"-I (item_size_max: {item}) must be evenly divisible by slab_chunk_max (bytes: {chunk})\")"
        )
    };
    match set_by {
        Some(option) => Err(value_error(
            option,
            format!(
                "sets a slab chunk size of {chunk} bytes on {}, which must divide the 1 MiB slab page and the \
                 item size (maxItemSize, {item} bytes) and not exceed it: {problem}",
                reading.versions()
            ),
        )),
        None => Err(FlagError::Field {
            field: "maxItemSize",
            value: text.to_owned(),
            why: format!(
                "memcached cuts items into chunks of {chunk} bytes by default and needs the item size to be a \
                 multiple of the chunk size, at least one chunk: {problem}; use a multiple of 512k (512k, 1m, \
                 1536k, 2m, ...) or set -o slab_chunk_max in extraArgs"
            ),
        }),
    }
}

/// `slab_sizes`: each size from the `-n` chunk size to the slab chunk size ("slab size 40 is out of
/// valid range", exit 64).
fn sizes(s: &Settings<'_>, item: &Item<'_>, reading: Reading) -> Result<(), FlagError> {
    let Some((value, option)) = s.slab_sizes else {
        return Ok(());
    };
    let item = item.bytes;
    let mut chunk = s.chunk_max.0;
    if item > SLAB_PAGE && !s.chunk_max_given {
        chunk = SLAB_PAGE / 2;
    }
    let lowest = u64::try_from(s.chunk_size).unwrap_or(u64::MAX);
    let sizes = slab_sizes(value).map_err(|why| value_error(option, why))?;
    match sizes.iter().find(|&&size| size < lowest || size > chunk) {
        None => Ok(()),
        Some(size) => Err(value_error(
            option,
            format!(
                "-o slab_sizes={value}: each size must be from the -n chunk size ({}) to the slab chunk size \
                 ({chunk} bytes on {}); memcached exits (\"slab size {size} is out of valid range\")",
                s.chunk_size,
                reading.versions()
            ),
        )),
    }
}

/// "hot_lru_pct + warm_lru_pct cannot be more than 80% combined", "temporary_ttl requires lru_maintainer
/// to be enabled" (exit 64).
fn lru(s: &Settings<'_>) -> Result<(), FlagError> {
    let ((hot, hot_by), (warm, warm_by)) = (s.hot, s.warm);
    let last = [hot_by, warm_by]
        .into_iter()
        .flatten()
        .max_by_key(|o| o.index);
    if hot + warm > HOT_WARM_MAX
        && let Some(option) = last
    {
        return Err(value_error(
            option,
            format!(
                "hot_lru_pct ({hot}) and warm_lru_pct ({warm}) add up to more than {HOT_WARM_MAX}; memcached exits \
                 (\"hot_lru_pct + warm_lru_pct cannot be more than 80% combined\"); the defaults are \
                 {DEFAULT_HOT} and {DEFAULT_WARM}"
            ),
        ));
    }
    if let (Some(option), (false, off_by)) = (s.temporary_ttl, s.lru_maintainer) {
        let off = off_by.map_or(String::new(), |o| format!(" ({:?} turns it off)", o.arg));
        return Err(value_error(
            option,
            format!(
                "temporary_ttl needs the LRU maintainer{off}; memcached exits (\"temporary_ttl requires \
                 lru_maintainer to be enabled\")"
            ),
        ));
    }
    Ok(())
}
