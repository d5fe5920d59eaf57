//! The table itself: memcached 1.6's options ([`FLAGS`]) and `-o` sub-options ([`SUB_OPTIONS`]), each
//! with what the operator allows of it, and the lookups the checks make in them. How a sub-option's value
//! is read is in [`super::suboptions`].

/// Whether an option takes a value, as in `struct option`'s `has_arg`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HasArg {
    /// A switch: `-C`, `--disable-cas`.
    No,
    /// `-pVALUE`, `-p VALUE`, `--port=VALUE`, `--port VALUE`.
    Required,
    /// Only `--name=VALUE` (getopt never takes the next element as an optional value).
    Optional,
}

/// What the operator allows of an option in extraArgs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    Allowed,
    /// Refused; the text says why, or which spec field to use instead.
    Refused(&'static str),
}

/// One option of memcached's getopt tables.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Flag {
    pub short: Option<char>,
    pub long: Option<&'static str>,
    pub has_arg: HasArg,
    pub policy: Policy,
}

impl Flag {
    /// `-p/--port`, for messages.
    pub fn display(&self) -> String {
        match (self.short, self.long) {
            (Some(s), Some(l)) => format!("-{s}/--{l}"),
            (Some(s), None) => format!("-{s}"),
            (None, Some(l)) => format!("--{l}"),
            (None, None) => String::new(),
        }
    }
}

/// What values memcached starts with, for one sub-option.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Accepts {
    /// No value; memcached ignores one.
    Ignored,
    /// An integer read with `atoi`, in `min..=max`.
    Int { min: i64, max: i64 },
    /// A number read with `atof`, above 0 and at most `max`. Spellings `atof` reads but this does
    /// not (hexadecimal, `inf`, `nan`: `nan` passes memcached's comparisons) are refused.
    Positive { max: Option<f64> },
    /// Decimal digits (`safe_strtoul`), at most `max`.
    Count { max: u64 },
    /// A decimal number, digits with an optional fraction (`safe_strtod`).
    Decimal,
    /// One of these words, exactly.
    OneOf(&'static [&'static str]),
    /// `slab_sizes`: sizes in bytes joined by `-` (the bounds depend on other options: `startup`).
    SlabSizes,
    /// `slab_chunk_max`: bytes before memcached 1.6.24, kilobytes since (at most 1024); a value both
    /// read as a chunk size dividing the 1 MiB slab page is a power of two from 1 to 1024.
    SlabChunkMax,
}

/// One `-o` sub-option (memcached matches them exactly, no prefixes).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SubOption {
    pub name: &'static str,
    /// Whether it must be written `name=value`: memcached 1.6.18 exits without one ("Missing ...
    /// argument"), or crashes (`slab_sizes`, `sock_cookie_id`); the others ignore a value. Recorded for
    /// the allowed ones only: a refused one is refused with or without a value.
    pub needs_value: bool,
    pub policy: Policy,
    /// The values memcached starts with (for the allowed ones).
    pub accepts: Accepts,
}

const fn flag(
    short: Option<char>,
    long: Option<&'static str>,
    has_arg: HasArg,
    policy: Policy,
) -> Flag {
    Flag {
        short,
        long,
        has_arg,
        policy,
    }
}

use HasArg::{No, Optional, Required};
use Policy::{Allowed, Refused};

const PORT: Policy = Refused("the operator sets it from spec.containerPort");
const TLS: Policy = Refused("the operator sets TLS from spec.security.tls");
const EXITS: Policy = Refused("memcached prints it and exits, so the pod would never serve");

/// memcached 1.6's options, in the order of its optstring
/// (`a:AZp:s:U:m:Mc:khiVrvdl:u:P:f:n:t:D:LR:Cb:B:I:SFXWY:e:o:N:`) with the long names of its
/// long-option table. `-D` has no long name; every long name has a letter.
pub const FLAGS: &[Flag] = &[
    flag(
        Some('a'),
        Some("unix-mask"),
        Required,
        Refused("the operator serves TCP only, not a UNIX socket"),
    ),
    flag(
        Some('A'),
        Some("enable-shutdown"),
        No,
        Refused("it lets any client stop the server with `shutdown`"),
    ),
    flag(Some('Z'), Some("enable-ssl"), No, TLS),
    flag(Some('p'), Some("port"), Required, PORT),
    flag(
        Some('s'),
        Some("unix-socket"),
        Required,
        Refused("a UNIX socket turns TCP off, so clients and probes could not connect"),
    ),
    flag(
        Some('U'),
        Some("udp-port"),
        Required,
        Refused("UDP is off on purpose (memcached UDP amplification, CVE-2018-1000115)"),
    ),
    flag(
        Some('m'),
        Some("memory-limit"),
        Required,
        Refused("the operator sets it from spec.memcached.maxMemoryMB"),
    ),
    flag(Some('M'), Some("disable-evictions"), No, Allowed),
    flag(
        Some('c'),
        Some("conn-limit"),
        Required,
        Refused("the operator sets it from spec.memcached.maxConnections"),
    ),
    flag(Some('k'), Some("lock-memory"), No, Allowed),
    flag(Some('h'), Some("help"), No, EXITS),
    flag(Some('i'), Some("license"), No, EXITS),
    flag(Some('V'), Some("version"), No, EXITS),
    flag(
        Some('r'),
        Some("enable-coredumps"),
        No,
        Refused(
            "memcached exits (\"failed to ensure corefile creation\") on nodes whose hard core-file limit is 0, \
             and a core file could not be written anyway: the container's root filesystem is read-only",
        ),
    ),
    // `-v` is a switch (repeated as `-vv`); only the long form takes an optional level.
    flag(
        Some('v'),
        Some("verbose"),
        Optional,
        Refused("the operator sets it from spec.memcached.verbosity"),
    ),
    flag(
        Some('d'),
        Some("daemon"),
        No,
        Refused("a daemonised memcached leaves the container's main process, which then exits"),
    ),
    flag(
        Some('l'),
        Some("listen"),
        Required,
        Refused("the pod must listen on all its addresses for the Service and probes"),
    ),
    flag(
        Some('u'),
        Some("user"),
        Required,
        Refused("the pod's securityContext sets the user"),
    ),
    flag(
        Some('P'),
        Some("pidfile"),
        Required,
        Refused("the container's root filesystem is read-only"),
    ),
    flag(Some('f'), Some("slab-growth-factor"), Required, Allowed),
    flag(Some('n'), Some("slab-min-size"), Required, Allowed),
    flag(
        Some('t'),
        Some("threads"),
        Required,
        Refused("the operator sets it from spec.memcached.threads"),
    ),
    flag(Some('D'), None, Required, Allowed),
    flag(
        Some('L'),
        Some("enable-largepages"),
        No,
        Refused(
            "memcached exits (\"Cannot enable large pages on this system\") on nodes whose transparent huge \
             pages are off (`never`), so whether the pod starts would depend on the node",
        ),
    ),
    flag(Some('R'), Some("max-reqs-per-event"), Required, Allowed),
    flag(Some('C'), Some("disable-cas"), No, Allowed),
    flag(Some('b'), Some("listen-backlog"), Required, Allowed),
    flag(Some('B'), Some("protocol"), Required, Allowed),
    flag(
        Some('I'),
        Some("max-item-size"),
        Required,
        Refused("the operator sets it from spec.memcached.maxItemSize"),
    ),
    flag(
        Some('S'),
        Some("enable-sasl"),
        No,
        Refused("the operator sets authentication from spec.security.auth"),
    ),
    flag(Some('F'), Some("disable-flush-all"), No, Allowed),
    flag(Some('X'), Some("disable-dumping"), No, Allowed),
    flag(Some('W'), Some("disable-watch"), No, Allowed),
    flag(
        Some('Y'),
        Some("auth-file"),
        Required,
        Refused("the operator sets authentication from spec.security.auth"),
    ),
    flag(
        Some('e'),
        Some("memory-file"),
        Required,
        Refused(
            "it needs a writable file; the container's root filesystem is read-only and the operator mounts no volume for it",
        ),
    ),
    flag(Some('o'), Some("extended"), Required, Allowed),
    flag(Some('N'), Some("napi-ids"), Required, Allowed),
];

/// A sub-option that takes no value (`-o modern`): memcached ignores one if given.
const fn switch(name: &'static str) -> SubOption {
    SubOption {
        name,
        needs_value: false,
        policy: Allowed,
        accepts: Accepts::Ignored,
    }
}

/// A sub-option that needs `=value` (`-o hashpower=20`), and which values memcached starts with.
const fn valued(name: &'static str, accepts: Accepts) -> SubOption {
    SubOption {
        name,
        needs_value: true,
        policy: Allowed,
        accepts,
    }
}

/// A sub-option refused whatever its value.
const fn refused(name: &'static str, why: &'static str) -> SubOption {
    SubOption {
        name,
        needs_value: false,
        policy: Refused(why),
        accepts: Accepts::Ignored,
    }
}

const SSL: &str = "the operator sets TLS from spec.security.tls";

/// A whole number written in decimal digits that fits memcached's 32-bit field (`safe_strtoul`).
const COUNT: Accepts = Accepts::Count {
    max: u32::MAX as u64,
};

/// memcached 1.6's `-o` sub-options (its `subopts_tokens`, plus the `ext_*` ones extstore reads), as
/// the Debian and official builds (TLS and extstore on, proxy off) accept them, with the values every
/// supported memcached (1.6.18 to 1.6.45) starts with: see [`suboptions`](super::suboptions) for how
/// each is read. Every `ssl_*` one is refused because the operator manages TLS; `ext_path` because
/// extstore needs a writable file, which the read-only container does not have. The other `ext_*`
/// options only tune extstore, which stays off without `ext_path`, so they are harmless and allowed.
pub const SUB_OPTIONS: &[SubOption] = &[
    switch("maxconns_fast"),
    valued("hashpower", Accepts::Int { min: 12, max: 32 }),
    switch("no_hashexpand"),
    switch("slab_reassign"),
    // `-o slab_automove` alone is 1.
    SubOption {
        needs_value: false,
        ..valued("slab_automove", Accepts::Int { min: 0, max: 2 })
    },
    valued("slab_automove_ratio", Accepts::Positive { max: Some(1.0) }),
    // 1.6.45 refuses more than 1800.
    valued("slab_automove_window", Accepts::Int { min: 3, max: 1800 }),
    valued(
        "tail_repair_time",
        Accepts::Int {
            min: 10,
            max: i32::MAX as i64,
        },
    ),
    valued(
        "hash_algorithm",
        Accepts::OneOf(&["jenkins", "murmur3", "xxh3"]),
    ),
    switch("lru_crawler"),
    valued(
        "lru_crawler_sleep",
        Accepts::Int {
            min: 0,
            max: 1_000_000,
        },
    ),
    valued("lru_crawler_tocrawl", COUNT),
    switch("lru_maintainer"),
    valued("hot_lru_pct", Accepts::Int { min: 1, max: 79 }),
    valued("warm_lru_pct", Accepts::Int { min: 1, max: 79 }),
    valued("hot_max_factor", Accepts::Positive { max: None }),
    valued("warm_max_factor", Accepts::Positive { max: None }),
    valued(
        "temporary_ttl",
        Accepts::Int {
            min: i32::MIN as i64,
            max: i32::MAX as i64,
        },
    ),
    valued(
        "idle_timeout",
        Accepts::Int {
            min: i32::MIN as i64,
            max: i32::MAX as i64,
        },
    ),
    // Kilobytes; larger sizes wrap in memcached's 32-bit byte count.
    valued(
        "watcher_logbuf_size",
        Accepts::Count {
            max: (u32::MAX / 1024) as u64,
        },
    ),
    refused(
        "worker_logbuf_size",
        "memcached before 1.6.40 (Debian's 1.6.18 among them) also reads its value as slab_sizes (a missing \
         `break` in its parser): it exits on most sizes (\"slab size 0 is out of valid range\") and replaces \
         the slab classes with one class of that many bytes on the others",
    ),
    valued("slab_sizes", Accepts::SlabSizes),
    valued("slab_chunk_max", Accepts::SlabChunkMax),
    switch("track_sizes"),
    switch("no_inline_ascii_resp"),
    switch("inline_ascii_resp"),
    switch("modern"),
    switch("no_modern"),
    switch("no_chunked_items"),
    switch("no_slab_reassign"),
    switch("no_slab_automove"),
    switch("no_maxconns_fast"),
    switch("no_lru_crawler"),
    switch("no_lru_maintainer"),
    switch("drop_privileges"),
    switch("no_drop_privileges"),
    switch("resp_obj_mem_limit"),
    // Megabytes; larger sizes wrap in memcached's 32-bit byte count.
    valued(
        "read_buf_mem_limit",
        Accepts::Count {
            max: (u32::MAX >> 20) as u64,
        },
    ),
    valued("sock_cookie_id", COUNT),
    refused("ssl_chain_cert", SSL),
    refused("ssl_key", SSL),
    refused("ssl_verify_mode", SSL),
    refused("ssl_keyformat", SSL),
    refused("ssl_ciphers", SSL),
    refused("ssl_ca_cert", SSL),
    refused("ssl_wbuf_size", SSL),
    refused("ssl_session_cache", SSL),
    refused("ssl_kernel_tls", SSL),
    refused("ssl_min_version", SSL),
    refused(
        "ext_path",
        "extstore needs a writable file; the container's root filesystem is read-only and the operator mounts no volume for it",
    ),
    valued("ext_page_size", COUNT),
    valued("ext_wbuf_size", COUNT),
    valued("ext_threads", COUNT),
    valued("ext_io_depth", COUNT),
    valued("ext_item_size", COUNT),
    valued("ext_item_age", COUNT),
    valued("ext_low_ttl", COUNT),
    valued("ext_recache_rate", COUNT),
    valued("ext_compact_under", COUNT),
    valued("ext_drop_under", COUNT),
    valued("ext_max_sleep", COUNT),
    valued("ext_max_frag", Accepts::Decimal),
    switch("ext_drop_unread"),
    valued("slab_automove_freeratio", Accepts::Decimal),
];

/// The option whose letter is `c`.
pub fn by_short(c: char) -> Option<&'static Flag> {
    FLAGS.iter().find(|f| f.short == Some(c))
}

/// The `-o` sub-option called `name`.
pub fn sub_option(name: &str) -> Option<&'static SubOption> {
    SUB_OPTIONS.iter().find(|s| s.name == name)
}

/// Long options `--name` means, as getopt_long resolves it: an exact name wins; otherwise every long
/// name it is a prefix of (one is a match, several are ambiguous, none is unknown).
pub fn by_long_prefix(name: &str) -> Vec<&'static Flag> {
    if let Some(exact) = FLAGS.iter().find(|f| f.long == Some(name)) {
        return vec![exact];
    }
    if name.is_empty() {
        return Vec::new();
    }
    FLAGS
        .iter()
        .filter(|f| f.long.is_some_and(|l| l.starts_with(name)))
        .collect()
}
