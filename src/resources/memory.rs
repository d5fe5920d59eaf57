//! How much memory memcached may use beyond its item memory (`-m`, `spec.memcached.maxMemoryMB`), which
//! sizes the container's default memory request and limit.
//!
//! `-m` does not bound memcached's memory. Measured on Debian's memcached 1.6.18: `memcached -m 64`
//! filled with values of every slab class's size (4 MiB of each, a few rounds) reached an RSS of
//! 106-108 MiB (`stats slabs`: 97 MiB malloced over 38 classes, a hash table of 4 MiB) and was
//! OOM-killed in a memory cgroup of 96 MiB, the operator's former `-m` + 32 MiB; `-m 8` in 40 MiB too.
//! Three things add up beyond `-m`:
//!
//! - every slab class gets its first page even beyond `-m`: `do_slabs_newslab` (slabs.c) refuses a page
//!   over the limit only when the class already has one. Pages are 1 MiB (`slab_page_size`, whatever
//!   `-I`), so up to one MiB per class. `slabs_init` makes the classes: the first chunk is the item
//!   header (48 bytes) + `-n` (48), aligned to 8; each next one is the last times `-f` (1.25), while
//!   below `slab_chunk_max / -f`; then a last class of `slab_chunk_max` (512 KiB); at most 63 classes
//!   (`MAX_NUMBER_OF_SLAB_CLASSES - 1`). `-o slab_sizes` lists the chunks instead. `memcached -vv`
//!   prints them: 39 with the defaults, 63 with `-f 1.05` or `-n 5 -f 1.01`;
//! - the hash table (assoc.c): 8 bytes a bucket, 2^16 buckets at first (`-o hashpower=N`: 2^N); it
//!   doubles when the items exceed 1.5 x the buckets, and while it moves the items over the old table
//!   (half the size) is still allocated. At most as many items as the item memory holds of the
//!   smallest chunk;
//! - threads, connection buffers and the rest: [`BASELINE_MB`].

use crate::api::MemcachedConfig;
use crate::api::flags::{argv, startup};

/// Threads, connection buffers and memcached's other structures: the former whole allowance, and still
/// the least a user-set memory limit must leave above `-m` (specs that met it stay valid).
pub const BASELINE_MB: i32 = 32;
/// The item header before each item's data (`sizeof(item)` on 64-bit builds).
const ITEM_HEADER: u64 = 48;
/// Chunks are aligned to 8 bytes (`CHUNK_ALIGN_BYTES`).
const CHUNK_ALIGN: u64 = 8;
/// The most slab classes memcached makes (`MAX_NUMBER_OF_SLAB_CLASSES - 1`).
pub const MAX_SLAB_CLASSES: usize = 63;
/// The hash table's bucket (a pointer) and its largest power (`HASHPOWER_MAX`).
const BUCKET_BYTES: u64 = 8;
const HASHPOWER_MAX: u32 = 32;
const MIB: u64 = 1 << 20;

/// MiB memcached may use beyond `-m` for `config`: [`BASELINE_MB`] + one slab page per class + the hash
/// table at its largest, rounded up to whole MiB. Where memcached versions read `slab_chunk_max`
/// differently, the larger. Options memcached would refuse (the spec's validation reports them) count as
/// memcached's defaults.
pub fn overhead_mb(config: &MemcachedConfig) -> i32 {
    overhead(config, true)
}

/// [`overhead_mb`] as if `-o hashpower` were not given (the table only grows with the items): the
/// container's size that a `-o hashpower` table must fit in (`api::flags::values`), since with it the
/// derived size would always make room for any table.
pub fn grown_overhead_mb(config: &MemcachedConfig) -> i32 {
    overhead(config, false)
}

fn overhead(config: &MemcachedConfig, initial_hashpower: bool) -> i32 {
    let given = argv::parse(&config.extra_args).unwrap_or_default();
    let item_size = config
        .max_item_size
        .as_deref()
        .and_then(super::quantity::memcached_size);
    let item_mb = u64::try_from(config.max_memory_mb()).unwrap_or(0);
    startup::slabs(&given, item_size)
        .into_iter()
        .map(|mut slabs| {
            if !initial_hashpower {
                slabs.hashpower = startup::DEFAULT_HASHPOWER;
            }
            slabs_overhead_mb(&slabs, item_mb)
        })
        .max()
        .unwrap_or(0)
        .saturating_add(BASELINE_MB)
}

/// The pages of the classes and the hash table, in whole MiB, for `item_mb` of item memory.
fn slabs_overhead_mb(slabs: &startup::Slabs, item_mb: u64) -> i32 {
    let sizes = class_sizes(slabs);
    let pages = sizes.len() as u64;
    let smallest = sizes.first().copied().unwrap_or(slabs.chunk_max).max(1);
    let items = (item_mb + pages) * MIB / smallest;
    let hash = hash_table_bytes(items, slabs.hashpower);
    i32::try_from(pages + hash.div_ceil(MIB)).unwrap_or(i32::MAX)
}

/// The chunk size of each slab class, as memcached's `slabs_init` makes them.
pub fn class_sizes(slabs: &startup::Slabs) -> Vec<u64> {
    let mut sizes: Vec<u64> = match &slabs.sizes {
        Some(given) => given
            .iter()
            .take(MAX_SLAB_CLASSES - 1)
            .map(|size| size.next_multiple_of(CHUNK_ALIGN))
            .collect(),
        None => grown_sizes(slabs),
    };
    sizes.push(slabs.chunk_max);
    sizes
}

/// The classes below the last that `-n` and `-f` make: memcached's size is an `unsigned int` multiplied
/// by the factor (a double) and truncated, and the loop stops once it reaches `slab_chunk_max / factor`.
fn grown_sizes(slabs: &startup::Slabs) -> Vec<u64> {
    let chunk_size = u64::try_from(slabs.chunk_size).unwrap_or(0);
    let mut size = ITEM_HEADER.saturating_add(chunk_size);
    let mut sizes = Vec::new();
    while sizes.len() < MAX_SLAB_CLASSES - 1
        && (size as f64) < slabs.chunk_max as f64 / slabs.factor
    {
        size = size.next_multiple_of(CHUNK_ALIGN);
        sizes.push(size);
        size = (size as f64 * slabs.factor) as u64;
    }
    sizes
}

/// The hash table's bytes at its largest for `items` items, starting at 2^`hashpower` buckets: doubled
/// while the items exceed 1.5 x the buckets, plus the old table of half the size during the last
/// doubling.
pub fn hash_table_bytes(items: u64, hashpower: u32) -> u64 {
    let mut power = hashpower.min(HASHPOWER_MAX);
    while power < HASHPOWER_MAX && items > (1u64 << power) * 3 / 2 {
        power += 1;
    }
    let table = BUCKET_BYTES << power;
    if power > hashpower {
        table + table / 2
    } else {
        table
    }
}

#[cfg(test)]
mod tests;
