//! The values of memcached's options that made it exit although the operator admitted them (issue 45,
//! item 7, each tried on memcached 1.6.18), the rules between options, and their neighbours that start.

use super::validate;
use crate::api::{MemcachedConfig, MemcachedSpec};
use crate::resources::INVALID_CONFIG;

fn spec(extra: &[&str], config: MemcachedConfig) -> MemcachedSpec {
    MemcachedSpec {
        memcached: Some(Box::new(MemcachedConfig {
            extra_args: extra.iter().map(|a| (*a).to_owned()).collect(),
            ..config
        })),
        ..MemcachedSpec::default()
    }
}

fn refused(extra: &[&str], config: MemcachedConfig) -> String {
    let err = validate(&spec(extra, config)).expect_err(&format!("{extra:?} must be refused"));
    assert_eq!(err.reason, INVALID_CONFIG);
    err.message
}

fn admitted(extra: &[&str], config: MemcachedConfig) {
    validate(&spec(extra, config)).unwrap_or_else(|e| panic!("{extra:?} must be admitted: {e}"));
}

fn sized(item: &str) -> MemcachedConfig {
    MemcachedConfig {
        max_item_size: Some(item.into()),
        ..MemcachedConfig::default()
    }
}

#[test]
fn the_values_memcached_1_6_18_exits_on_are_refused_naming_the_element() {
    for (extra, element) in [
        (
            &["-o", "hash_algorithm=foo"][..],
            "extraArgs[1] \"hash_algorithm=foo\"",
        ),
        (&["-o", "hot_lru_pct=100"], "extraArgs[1]"),
        (&["-o", "warm_lru_pct=90"], "extraArgs[1]"),
        (&["-o", "slab_automove=5"], "extraArgs[1]"),
        (&["-o", "tail_repair_time=abc"], "extraArgs[1]"),
        (&["-o", "lru_crawler_sleep=99999999"], "extraArgs[1]"),
        (&["-o", "slab_sizes=abc"], "extraArgs[1]"),
        (&["-o", "worker_logbuf_size=0"], "extraArgs[1]"),
        (&["-o", "modern,slab_chunk_max=99999999"], "extraArgs[1]"),
        (&["-oslab_chunk_max=abc"], "extraArgs[0]"),
        (&["-C", "-r"], "extraArgs[1] \"-r\""),
        (&["--enable-coredumps"], "extraArgs[0]"),
    ] {
        let message = refused(extra, MemcachedConfig::default());
        assert!(
            message.starts_with(&format!("spec.memcached.{element}")),
            "{extra:?}: {message}"
        );
    }
}

#[test]
fn each_sub_option_range_has_its_edges() {
    for extra in [
        "hot_lru_pct=0",
        "hot_lru_pct=80",
        "warm_lru_pct=0",
        "slab_automove=-1",
        "slab_automove=3",
        "slab_automove_ratio=0",
        "slab_automove_ratio=1.01",
        "slab_automove_ratio=nan",
        "slab_automove_window=2",
        "slab_automove_window=1801",
        "tail_repair_time=9",
        "lru_crawler_sleep=-1",
        "lru_crawler_sleep=1000001",
        "lru_crawler_tocrawl=abc",
        "lru_crawler_tocrawl=-1",
        "hot_max_factor=0",
        "warm_max_factor=-1",
        "watcher_logbuf_size=abc",
        "read_buf_mem_limit=x",
        "ext_threads=abc",
        "ext_max_frag=abc",
        "slab_automove_freeratio=",
        "slab_chunk_max=0",
        "slab_chunk_max=3",
        "slab_chunk_max=2048",
        "slab_sizes=100-108",
        "slab_sizes=200-100",
        "slab_sizes=47-100",
        "slab_sizes=100-524289",
    ] {
        let message = refused(&["-o", extra], MemcachedConfig::default());
        assert!(
            message.starts_with("spec.memcached.extraArgs[1]"),
            "{extra}: {message}"
        );
    }
    for extra in [
        "hash_algorithm=murmur3",
        "hash_algorithm=jenkins",
        "hot_lru_pct=1",
        "hot_lru_pct=40",
        "warm_lru_pct=60",
        "slab_automove",
        "slab_automove=0",
        "slab_automove=2",
        "slab_automove_ratio=1",
        "slab_automove_window=3",
        "slab_automove_window=1800",
        "tail_repair_time=10",
        "lru_crawler_sleep=0",
        "lru_crawler_sleep=1000000",
        "lru_crawler_tocrawl=4294967295",
        "hot_max_factor=0.5",
        "watcher_logbuf_size=256",
        "read_buf_mem_limit=0",
        "ext_threads=4",
        "ext_max_frag=0.5",
        "slab_chunk_max=1",
        "slab_chunk_max=512",
        "slab_sizes=48",
        "slab_sizes=100-200-400",
        "idle_timeout=-5",
        "temporary_ttl=60",
    ] {
        admitted(&["-o", extra], MemcachedConfig::default());
    }
}

#[test]
fn options_are_checked_together_as_memcached_checks_them() {
    // hot + warm more than 80 (defaults 20 and 40), in either order or element.
    let message = refused(&["-o", "hot_lru_pct=50"], MemcachedConfig::default());
    assert!(message.contains("add up to more than 80"), "{message}");
    refused(
        &["-o", "warm_lru_pct=40", "-o", "hot_lru_pct=41"],
        MemcachedConfig::default(),
    );
    admitted(
        &["-o", "hot_lru_pct=50,warm_lru_pct=30"],
        MemcachedConfig::default(),
    );
    // temporary_ttl needs the LRU maintainer, which no_modern and no_lru_maintainer turn off.
    refused(
        &["-o", "no_lru_maintainer,temporary_ttl=60"],
        MemcachedConfig::default(),
    );
    refused(
        &["-o", "temporary_ttl=60", "-o", "no_modern"],
        MemcachedConfig::default(),
    );
    admitted(
        &["-o", "no_modern,lru_maintainer,temporary_ttl=60"],
        MemcachedConfig::default(),
    );
    // slab_sizes against -n and the chunk size (512 bytes read the 1.6.18 way).
    refused(
        &["-n", "100", "-o", "slab_sizes=64-200"],
        MemcachedConfig::default(),
    );
    refused(
        &["-o", "slab_chunk_max=512,slab_sizes=100-1000"],
        MemcachedConfig::default(),
    );
    admitted(
        &["-o", "slab_chunk_max=1024,slab_sizes=100-1000"],
        MemcachedConfig::default(),
    );
    // no_chunked_items makes 1 MiB chunks, larger than a 512k item.
    let message = refused(&["-o", "no_chunked_items"], sized("512k"));
    assert!(
        message.starts_with("spec.memcached.extraArgs[1]"),
        "{message}"
    );
    admitted(&["-o", "no_chunked_items"], sized("1m"));
    admitted(&["-o", "no_chunked_items"], sized("2m"));
    // -n 0 or negative (1.6.24 and later exit on both), -f nan, -D with a leading blank.
    refused(&["-n", "-5"], MemcachedConfig::default());
    refused(&["-f", "nan"], MemcachedConfig::default());
    refused(&["-D", " :"], MemcachedConfig::default());
    refused(&["-L"], MemcachedConfig::default());
}

#[test]
fn the_managed_sizes_memcached_exits_on_are_refused_naming_the_field() {
    // The default chunk is 512k: a smaller item, or one not a multiple of it, exits.
    for item in ["256k", "1000k", "1025k", "1k"] {
        let message = refused(&[], sized(item));
        assert!(
            message.starts_with(&format!("spec.memcached.maxItemSize \"{item}\"")),
            "{item}: {message}"
        );
    }
    for item in ["512k", "1m", "1536k", "2m", "32m"] {
        admitted(&[], sized(item));
    }
    // A smaller chunk makes small items possible (a power of two both as bytes and as kilobytes).
    admitted(&["-o", "slab_chunk_max=16"], sized("256k"));
    admitted(&["-o", "slab_chunk_max=256"], sized("256k"));
    refused(&["-o", "slab_chunk_max=512"], sized("256k"));
    // -m 1 with the default 1 MiB items exits.
    let message = refused(
        &[],
        MemcachedConfig {
            max_memory_mb: Some(1),
            ..MemcachedConfig::default()
        },
    );
    assert!(
        message.starts_with("spec.memcached.maxMemoryMB"),
        "{message}"
    );
    // Threads need open files within -c.
    let threads = |t, c| MemcachedConfig {
        threads: Some(t),
        max_connections: c,
        ..MemcachedConfig::default()
    };
    let message = refused(&[], threads(256, None));
    assert!(
        message.starts_with("spec.memcached.maxConnections"),
        "{message}"
    );
    refused(&[], threads(4, Some(20)));
    admitted(&[], threads(4, Some(36)));
    admitted(&[], threads(200, None));
    admitted(&[], threads(256, Some(1296)));
}
