//! memcached's command-line options, as memcached 1.6's `main()` declares them to `getopt_long` (its
//! optstring and long-option table) and to `getsubopt` for `-o` (its `subopts_tokens`), with what the
//! operator allows of each in `spec.memcached.extraArgs`.
//!
//! This one table drives both the operator's own check ([`argv::check`], reported as `InvalidConfig`)
//! and the CEL rule the API server runs at admission ([`cel::extra_args_rule`]), so the two cannot
//! disagree about which spellings reach a managed option. Refused are: the options the operator sets
//! itself (a second value would override the spec), options that undo the operator's security
//! settings or open a path it does not expose, and options that make memcached exit or never serve
//! (a crash-looping pod is worse than a refused spec). Anything memcached does not know is refused too,
//! because memcached exits on an unknown option. Of the allowed options, the values memcached exits on
//! (`-B binary` with an auth file, `-R 0`, `-D ""`, `-N` above the threads, `-o hashpower` out of range)
//! are refused by [`values::check`], which only the operator runs.

pub mod argv;
pub mod cel;
pub mod values;

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

/// One `-o` sub-option (memcached matches them exactly, no prefixes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SubOption {
    pub name: &'static str,
    /// Whether it must be written `name=value`: memcached 1.6.18 exits without one ("Missing ...
    /// argument"), or crashes (`slab_sizes`, `sock_cookie_id`); the others ignore a value. Recorded for
    /// the allowed ones only: a refused one is refused with or without a value.
    pub needs_value: bool,
    pub policy: Policy,
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
    flag(Some('r'), Some("enable-coredumps"), No, Allowed),
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
    flag(Some('L'), Some("enable-largepages"), No, Allowed),
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

/// A sub-option written alone (`-o modern`): a value, if any, is ignored.
const fn sub(name: &'static str, policy: Policy) -> SubOption {
    SubOption {
        name,
        needs_value: false,
        policy,
    }
}

/// A sub-option that needs `=value` (`-o hashpower=20`).
const fn valued(name: &'static str, policy: Policy) -> SubOption {
    SubOption {
        name,
        needs_value: true,
        policy,
    }
}

/// memcached 1.6's `-o` sub-options (its `subopts_tokens`, plus the `ext_*` ones extstore reads), as
/// the Debian and official builds (TLS and extstore on, proxy off) accept them. Every `ssl_*` one is
/// refused because the operator manages TLS; `ext_path` because extstore needs a writable file, which
/// the read-only container does not have. The other `ext_*` options only tune extstore, which stays off
/// without `ext_path`, so they are harmless and allowed.
pub const SUB_OPTIONS: &[SubOption] = &[
    sub("maxconns_fast", Allowed),
    valued("hashpower", Allowed),
    sub("no_hashexpand", Allowed),
    sub("slab_reassign", Allowed),
    sub("slab_automove", Allowed),
    valued("slab_automove_ratio", Allowed),
    valued("slab_automove_window", Allowed),
    valued("tail_repair_time", Allowed),
    valued("hash_algorithm", Allowed),
    sub("lru_crawler", Allowed),
    valued("lru_crawler_sleep", Allowed),
    valued("lru_crawler_tocrawl", Allowed),
    sub("lru_maintainer", Allowed),
    valued("hot_lru_pct", Allowed),
    valued("warm_lru_pct", Allowed),
    valued("hot_max_factor", Allowed),
    valued("warm_max_factor", Allowed),
    valued("temporary_ttl", Allowed),
    valued("idle_timeout", Allowed),
    valued("watcher_logbuf_size", Allowed),
    valued("worker_logbuf_size", Allowed),
    valued("slab_sizes", Allowed),
    valued("slab_chunk_max", Allowed),
    sub("track_sizes", Allowed),
    sub("no_inline_ascii_resp", Allowed),
    sub("inline_ascii_resp", Allowed),
    sub("modern", Allowed),
    sub("no_modern", Allowed),
    sub("no_chunked_items", Allowed),
    sub("no_slab_reassign", Allowed),
    sub("no_slab_automove", Allowed),
    sub("no_maxconns_fast", Allowed),
    sub("no_lru_crawler", Allowed),
    sub("no_lru_maintainer", Allowed),
    sub("drop_privileges", Allowed),
    sub("no_drop_privileges", Allowed),
    sub("resp_obj_mem_limit", Allowed),
    valued("read_buf_mem_limit", Allowed),
    valued("sock_cookie_id", Allowed),
    sub("ssl_chain_cert", TLS),
    sub("ssl_key", TLS),
    sub("ssl_verify_mode", TLS),
    sub("ssl_keyformat", TLS),
    sub("ssl_ciphers", TLS),
    sub("ssl_ca_cert", TLS),
    sub("ssl_wbuf_size", TLS),
    sub("ssl_session_cache", TLS),
    sub("ssl_kernel_tls", TLS),
    sub("ssl_min_version", TLS),
    sub(
        "ext_path",
        Refused(
            "extstore needs a writable file; the container's root filesystem is read-only and the operator mounts no volume for it",
        ),
    ),
    valued("ext_page_size", Allowed),
    valued("ext_wbuf_size", Allowed),
    valued("ext_threads", Allowed),
    valued("ext_io_depth", Allowed),
    valued("ext_item_size", Allowed),
    valued("ext_item_age", Allowed),
    valued("ext_low_ttl", Allowed),
    valued("ext_recache_rate", Allowed),
    valued("ext_compact_under", Allowed),
    valued("ext_drop_under", Allowed),
    valued("ext_max_sleep", Allowed),
    valued("ext_max_frag", Allowed),
    sub("ext_drop_unread", Allowed),
    valued("slab_automove_freeratio", Allowed),
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
