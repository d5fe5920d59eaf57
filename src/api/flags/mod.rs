//! memcached's command-line options, as memcached 1.6's `main()` declares them to `getopt_long` (its
//! optstring and long-option table) and to `getsubopt` for `-o` (its `subopts_tokens`), with what the
//! operator allows of each in `spec.memcached.extraArgs`.
//!
//! This one table (`table.rs`) drives both the operator's own check ([`argv::check`], reported as
//! `InvalidConfig`) and the CEL rule the API server runs at admission ([`cel::extra_args_rule`]), so
//! the two cannot disagree about which spellings reach a managed option. Refused are: the options the
//! operator sets itself (a second value would override the spec), options that undo the operator's
//! security settings or open a path it does not expose, and options that make memcached exit or never
//! serve (a crash-looping pod is worse than a refused spec). Anything memcached does not know is
//! refused too, because memcached exits on an unknown option. Of the allowed options, the values
//! memcached exits on (`-B binary` with an auth file, `-R 0`, `-D ""`, `-N` above the threads, each
//! `-o` sub-option's range in [`suboptions`], and the rules between options in `startup`) are refused
//! by [`values::check`], which only the operator runs.
//!
//! The versions modelled are those the operator runs: memcached 1.6, from Debian's 1.6.18 to the
//! official images' 1.6.45 (`memcached:1.6-alpine`, the default image). Where they differ, only what
//! every one of them starts with is admitted (e.g. `-n -5` starts on 1.6.18 and exits since 1.6.24).

pub mod argv;
pub mod cel;
mod cnum;
pub mod startup;
pub mod suboptions;
mod table;
pub mod values;

pub use table::{
    Accepts, FLAGS, Flag, HasArg, Policy, SUB_OPTIONS, SubOption, by_long_prefix, by_short,
    sub_option,
};
