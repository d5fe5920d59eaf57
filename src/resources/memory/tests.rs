use super::*;

fn config(max_memory_mb: i32, extra_args: &[&str]) -> MemcachedConfig {
    MemcachedConfig {
        max_memory_mb: Some(max_memory_mb),
        extra_args: extra_args.iter().map(|a| (*a).to_owned()).collect(),
        ..MemcachedConfig::default()
    }
}

/// The classes for `extra_args`, one list per reading of `slab_chunk_max` (bytes, kilobytes).
fn classes(extra_args: &[&str]) -> [Vec<u64>; 2] {
    let args: Vec<String> = extra_args.iter().map(|a| (*a).to_owned()).collect();
    let given = argv::parse(&args).expect("valid options");
    startup::slabs(&given, None).map(|slabs| class_sizes(&slabs))
}

#[test]
fn defaults_make_memcached_s_39_classes() {
    let [bytes, kilobytes] = classes(&[]);
    assert_eq!(bytes, kilobytes);
    // `memcached -vv` on 1.6.18: "slab class 1: chunk size 96" ... "slab class 39: chunk size 524288".
    assert_eq!(bytes.len(), 39);
    assert_eq!(&bytes[..8], [96, 120, 152, 192, 240, 304, 384, 480]);
    assert_eq!(&bytes[36..], [315_872, 394_840, 524_288]);
}

#[test]
fn small_factors_reach_the_63_class_cap() {
    for args in [
        &["-f", "1.05"][..],
        &["-n", "5", "-f", "1.01"],
        &["--slab-growth-factor=1.05"],
    ] {
        let [bytes, _] = classes(args);
        assert_eq!(bytes.len(), MAX_SLAB_CLASSES, "{args:?}");
        assert_eq!(bytes.last(), Some(&524_288), "{args:?}");
    }
}

#[test]
fn min_size_and_factor_shape_the_classes() {
    // 48 + 100 = 148, aligned to 152; then x2 while below 512k / 2: 152 x 2^10 = 155 648 is the last,
    // then the 512k class.
    let [bytes, _] = classes(&["-n", "100", "-f", "2"]);
    assert_eq!(bytes[..3], [152, 304, 608]);
    assert_eq!(bytes[10..], [155_648, 524_288]);
    // The long spelling and an attached value read the same.
    assert_eq!(classes(&["--slab-min-size=100", "-f2"])[0], bytes);
}

#[test]
fn slab_chunk_max_ends_the_classes_in_either_reading() {
    // 256 bytes (memcached 1.6.23 and older) or 256 KiB (1.6.24 and later).
    let [bytes, kilobytes] = classes(&["-o", "slab_chunk_max=256"]);
    assert_eq!(bytes, [96, 120, 152, 192, 256]);
    assert_eq!(kilobytes.len(), 36);
    assert_eq!(kilobytes.last(), Some(&262_144));
    // The larger of the two counts.
    let wide = overhead_mb(&config(64, &["-o", "slab_chunk_max=256"]));
    assert_eq!(wide, overhead_mb(&config(64, &[])) - 3);
}

#[test]
fn slab_sizes_replace_the_grown_classes() {
    let [bytes, _] = classes(&["-o", "slab_sizes=100-200-300"]);
    assert_eq!(bytes, [104, 200, 304, 524_288]);
}

#[test]
fn default_overhead_is_the_classes_and_a_grown_hash_table() {
    // -m 64: 39 pages; (64 + 39) MiB / 96 bytes = 1 125 013 items > 1.5 x 2^19, so 2^20 buckets (8 MiB)
    // and the old 4 MiB table while it grows.
    assert_eq!(overhead_mb(&config(64, &[])), 32 + 39 + 12);
    // -m 8: (8 + 39) MiB / 96 = 513 365 items: 2^19 buckets (4 MiB) + 2 MiB.
    assert_eq!(overhead_mb(&config(8, &[])), 32 + 39 + 6);
    assert_eq!(overhead_mb(&MemcachedConfig::default()), 83);
    // 63 classes of smaller chunks: 56 bytes first.
    let dense = overhead_mb(&config(64, &["-n", "5", "-f", "1.01"]));
    assert_eq!(dense, 32 + 63 + ((8 << 21) + (4 << 21)) / (1 << 20));
}

#[test]
fn hash_table_grows_with_the_items_and_keeps_the_old_one() {
    assert_eq!(hash_table_bytes(0, 16), 8 << 16);
    assert_eq!(hash_table_bytes(98_304, 16), 8 << 16); // exactly 1.5 x 2^16: no growth yet
    assert_eq!(hash_table_bytes(98_305, 16), (8 << 17) + (8 << 16));
    assert_eq!(hash_table_bytes(u64::MAX, 16), (8 << 32) + (8 << 31));
}

#[test]
fn an_initial_hashpower_larger_than_growth_is_the_table() {
    // 2^24 buckets (128 MiB) hold 1.5 x 2^24 items before growing: more than -m 64 stores.
    assert_eq!(
        overhead_mb(&config(64, &["-o", "hashpower=24"])),
        32 + 39 + 128
    );
    // A small initial table grows as the default does.
    assert_eq!(overhead_mb(&config(64, &["-o", "modern,hashpower=13"])), 83);
}

#[test]
fn refused_options_count_as_the_defaults() {
    assert_eq!(overhead_mb(&config(64, &["-p", "1"])), 83);
}
