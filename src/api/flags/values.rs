//! The values of allowed options that memcached cannot start with. [`super::argv`] decides which
//! options extraArgs may set; this decides whether memcached, handed the value, starts: a value it
//! exits on at once would crash-loop every pod of a rollout, so the operator refuses it instead
//! (`Degraded`, `InvalidConfig`) and leaves the running pods serving.
//!
//! Each rule is memcached 1.6.18's own check (`memcached.c` and `thread.c`), seen on the real binary
//! (`/usr/bin/memcached`, Debian's 1.6.18, with the operator's other arguments and a free port); the
//! exit code and message it gave are in each rule's doc. `tests/memcached_options.rs` runs every refused
//! sample against the binary again (it must exit) and every admitted one (it must start).
//!
//! memcached reads numbers with C's `atoi` (`strtol` then a cast to `int`) and `atof`, which take the
//! longest numeric prefix and read anything else as 0: `-R 40x` is 40 and starts, `-R -p1` is 0 and
//! exits, `-R 4294967296` wraps to 0 and exits. [`c_atoi`] and [`c_atof`] read values the same way,
//! so what the operator admits is exactly what memcached accepts.
//!
//! One rule refuses a value memcached starts with: a negative `-R`, with which it never answers (see
//! [`each`]).
//!
//! The values of the other `-o` sub-options are in [`super::suboptions`], the rules between options in
//! `super::startup`; where the supported versions differ (1.6.18 to 1.6.45, see [`super`]), only what
//! all of them start with is admitted.
//!
//! The CRD's CEL rule does not check these: CEL sees elements one by one, and whether an element is the
//! value of `-B` or `-R` depends on the getopt walk over the elements before it, and the `-B` and `-N`
//! rules on other fields (`spec.security.auth`, `spec.memcached.threads`). The operator's check runs on
//! every server.

use super::argv::{FlagError, Given, parse};
pub use super::cnum::{c_atof, c_atoi};

/// What memcached's checks of the values depend on beyond extraArgs: what the operator passes itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Managed {
    /// `-t`: `spec.memcached.threads` (default 4).
    pub threads: i32,
    /// Whether `-Y` (an ASCII auth file) is passed: `spec.security.auth`.
    pub auth: bool,
    /// The memcached container's memory limit, in bytes, when it is known.
    pub memory_limit: Option<u64>,
    /// `-I`: `spec.memcached.maxItemSize` in bytes, and as written; `None`, memcached's 1 MiB.
    pub item_size: Option<u64>,
    pub item_size_text: Option<String>,
}

/// Smallest `-o hashpower` memcached takes (`Initial hashtable multiplier of 11 is too low`).
pub const HASHPOWER_MIN: i32 = 12;
/// Largest `-o hashpower` memcached takes (`Initial hashtable multiplier of 33 is too high`).
pub const HASHPOWER_MAX: i32 = 32;

/// Walks `args` as memcached would ([`parse`]) and returns the first element whose value memcached,
/// started with `managed`, would exit on.
pub fn check(args: &[String], managed: &Managed) -> Result<(), FlagError> {
    let given = parse(args)?;
    for option in &given {
        each(option)?;
    }
    last_protocol(&given, managed)?;
    last_napi_ids(&given, managed)?;
    super::startup::check(&given, managed.item_size, managed.item_size_text.as_deref())?;
    last_hashpower(&given, managed)
}

fn refused(option: &Given<'_>, why: String) -> FlagError {
    FlagError::Value {
        index: option.index,
        arg: option.arg.to_owned(),
        why,
    }
}

/// The checks memcached makes as it reads each option (it exits at the first that fails).
fn each(option: &Given<'_>) -> Result<(), FlagError> {
    let (Some(letter), Some(value)) = (option.flag.short, option.value) else {
        return Ok(());
    };
    let why = match letter {
        // `-R 0`, `-R -p1`: exit 1, "Number of requests per event must be greater than 0".
        'R' if c_atoi(value) == 0 => format!(
            "-R {value:?} reads as 0 requests per event; memcached exits (\"Number of requests per event \
             must be greater than 0\"); give a positive number"
        ),
        // `-R -1`: memcached checks only for 0 and starts, but then yields every connection before its
        // first command: it accepts connections and never answers (seen: `version` got no reply in 2 s;
        // `-R 1` answers at once), so the probes fail and a rollout stalls on pods that never serve.
        'R' if c_atoi(value) < 0 => format!(
            "-R {value:?} reads as {} requests per event; memcached starts but answers no request (it yields \
             each connection before its first command); give a positive number",
            c_atoi(value)
        ),
        // `-D ""`: exit 1, "No delimiter specified". Since 1.6.32 memcached skips the leading blanks of
        // every option's value: `-D " "` exits there too, and `-D " :"` is `:` there, ` ` before.
        'D' if value.is_empty() => {
            "-D needs a delimiter character; memcached exits on an empty one \
             (\"No delimiter specified\")"
                .to_owned()
        }
        'D' if value.starts_with([' ', '\t', '\n', '\x0b', '\x0c', '\r']) => format!(
            "-D {value:?} starts with a blank, which memcached 1.6.32 and later skip (then exiting on \
             nothing left, \"No delimiter specified\"); give the delimiter character first"
        ),
        // `-N 0`, `-N abc`: exit 1, "Maximum number of NAPI IDs must be greater than 0".
        'N' if c_atoi(value) <= 0 => format!(
            "-N {value:?} reads as {} NAPI IDs; memcached exits (\"Maximum number of NAPI IDs must be \
             greater than 0\")",
            c_atoi(value)
        ),
        // `-B udp`: exit 64, "Invalid value for binding protocol: udp -- should be one of auto, binary,
        // or ascii".
        'B' if !matches!(value, "auto" | "binary" | "ascii") => format!(
            "-B {value:?} is not a protocol; memcached exits (\"Invalid value for binding protocol\"); use \
             ascii, binary or auto"
        ),
        // `-n 0`: exit 1, "Chunk size must be greater than 0"; `-n -5` too since 1.6.24 (1.6.18 starts).
        'n' if c_atoi(value) <= 0 => format!(
            "-n {value:?} reads as a chunk size of {}; memcached exits (\"Chunk size must be greater than \
             0\")",
            c_atoi(value)
        ),
        // `-f 1`, `-f abc`: exit 1, "Factor must be greater than 1".
        'f' if c_atof(value).is_some_and(|f| f <= 1.0) => format!(
            "-f {value:?} is a growth factor of at most 1; memcached exits (\"Factor must be greater than \
             1\")"
        ),
        // `-f nan`: memcached's `<= 1.0` lets NaN through and it dies of SIGFPE (1.6.18); `inf` and
        // hexadecimal are not read here, so refused rather than guessed.
        'f' if c_atof(value).is_none() => format!(
            "-f {value:?} is not a decimal number; memcached crashes on `nan` (SIGFPE); write the growth \
             factor in decimal, above 1"
        ),
        'o' => return sub_options(option, value),
        _ => return Ok(()),
    };
    Err(refused(option, why))
}

/// Each item of one `-o` list, against what memcached accepts of it ([`super::suboptions`]).
fn sub_options(option: &Given<'_>, list: &str) -> Result<(), FlagError> {
    hashpowers(option, list)?;
    for item in list.split(',') {
        let (name, value) = match item.split_once('=') {
            Some((name, value)) => (name, Some(value)),
            None => (item, None),
        };
        if let Some(why) = super::suboptions::refusal(name, value) {
            return Err(refused(option, why));
        }
    }
    Ok(())
}

/// `-o hashpower=N` outside 12..=32: exit 1, "Initial hashtable multiplier of 11 is too low" (11, 0,
/// -5, `abc`), "... of 33 is too high" (33, 64, 65).
fn hashpowers(option: &Given<'_>, value: &str) -> Result<(), FlagError> {
    for written in hashpower_values(value) {
        let power = c_atoi(written);
        if !(HASHPOWER_MIN..=HASHPOWER_MAX).contains(&power) {
            let reads = if written == power.to_string() {
                " is".to_owned()
            } else {
                format!(" reads as {power}, which is")
            };
            return Err(refused(
                option,
                format!(
                    "-o hashpower={written}{reads} outside {HASHPOWER_MIN}..={HASHPOWER_MAX}; memcached exits \
                     (\"Initial hashtable multiplier of {power} is too {}\")",
                    if power < HASHPOWER_MIN { "low" } else { "high" }
                ),
            ));
        }
    }
    Ok(())
}

/// The values of the `hashpower` items of one `-o` list (getsubopt's exact names).
fn hashpower_values(list: &str) -> impl Iterator<Item = &str> {
    list.split(',')
        .filter_map(|item| item.split_once('='))
        .filter(|(name, _)| *name == "hashpower")
        .map(|(_, value)| value)
}

/// With an auth file (`-Y`), the last `-B` must be `ascii`. `-B binary` or `-B auto` with `-Y`: exit 64,
/// "ERROR: You cannot allow the BINARY protocol while using ascii authentication tokens."
fn last_protocol(given: &[Given<'_>], managed: &Managed) -> Result<(), FlagError> {
    let last = given.iter().rev().find(|g| g.flag.short == Some('B'));
    match last {
        Some(option) if managed.auth && option.value != Some("ascii") => Err(refused(
            option,
            format!(
                "-B {} with spec.security.auth: memcached's auth file works with the ASCII protocol only, and \
                 memcached exits (\"You cannot allow the BINARY protocol while using ascii authentication \
                 tokens\"); leave -B out or write -B ascii",
                option.value.unwrap_or_default()
            ),
        )),
        _ => Ok(()),
    }
}

/// The last `-N` may not exceed the worker threads. `-N 5` (4 threads), `-t 2 -N 3`: exit 64, "Number of
/// napi_ids(5) cannot be greater than number of threads(4)".
fn last_napi_ids(given: &[Given<'_>], managed: &Managed) -> Result<(), FlagError> {
    let last = given.iter().rev().find(|g| g.flag.short == Some('N'));
    let Some(option) = last else {
        return Ok(());
    };
    let ids = c_atoi(option.value.unwrap_or_default());
    if ids > managed.threads {
        return Err(refused(
            option,
            format!(
                "-N {ids} is more NAPI IDs than worker threads ({}, spec.memcached.threads); memcached exits \
                 (\"Number of napi_ids({ids}) cannot be greater than number of threads({})\")",
                managed.threads, managed.threads
            ),
        ));
    }
    Ok(())
}

/// The hash table memcached starts with (the last `-o hashpower`) must be larger than its item lock table,
/// which grows with the threads, and must fit in the container.
///
/// - `-o hashpower=12` (4 threads), `-t 5 -o hashpower=13`, `-t 11 -o hashpower=14`, `-t 21 -o
///   hashpower=15`: exit 1, "Hash table power size (12) cannot be equal to or less than item lock table
///   (12)".
/// - `-o hashpower=32`: exit 1, "Failed to init hashtable." on a host of 24 GiB without swap: the table is
///   `8 << N` bytes (32 GiB), allocated at start. Smaller tables start (31, 16 GiB, did) but the pages
///   are touched as items are stored, so a table larger than the container's memory limit gets the pod
///   killed for memory as it fills: refused too, against the limit.
fn last_hashpower(given: &[Given<'_>], managed: &Managed) -> Result<(), FlagError> {
    let last = given
        .iter()
        .filter(|g| g.flag.short == Some('o'))
        .flat_map(|g| hashpower_values(g.value.unwrap_or_default()).map(move |v| (g, c_atoi(v))))
        .last();
    let Some((option, power)) = last else {
        return Ok(());
    };
    let lock_power = item_lock_power(managed.threads);
    if power <= lock_power {
        return Err(refused(
            option,
            format!(
                "-o hashpower={power} is not larger than the item lock table ({lock_power} for {} threads, \
                 spec.memcached.threads); memcached exits (\"Hash table power size ({power}) cannot be equal \
                 to or less than item lock table ({lock_power})\"); use at least {}",
                managed.threads,
                lock_power + 1
            ),
        ));
    }
    let table = 8u64 << power;
    if let Some(limit) = managed.memory_limit
        && table > limit
    {
        return Err(refused(
            option,
            format!(
                "-o hashpower={power} makes a hash table of {} MiB, more than the container's memory limit \
                 ({} MiB): memcached exits where it cannot allocate it (\"Failed to init hashtable.\") or is \
                 killed for memory as it fills; use a smaller hashpower or raise spec.resources.limits.memory",
                table >> 20,
                limit >> 20
            ),
        ));
    }
    Ok(())
}

/// The item lock table's power for `threads` worker threads (`memcached_thread_init`).
pub fn item_lock_power(threads: i32) -> i32 {
    match threads {
        ..=2 => 10,
        3 => 11,
        4 => 12,
        5..=10 => 13,
        11..=20 => 14,
        _ => 15,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_item_lock_table_grows_with_the_threads() {
        let powers: Vec<i32> = [1, 2, 3, 4, 5, 10, 11, 20, 21, 256]
            .into_iter()
            .map(item_lock_power)
            .collect();
        assert_eq!(powers, [10, 10, 11, 12, 13, 13, 14, 14, 15, 15]);
    }
}
