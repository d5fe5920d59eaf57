//! The operator's model of memcached's options (`api::flags`: each option's and `-o` sub-option's
//! accepted values, and the rules between them) against the real binary: every boundary value of every
//! option the operator models (just inside, just outside, non-numeric, empty, huge) is handed to the
//! operator's check and, with the command line the operator would give the pod, to memcached on a free
//! 127.0.0.1 port. Still running after [`SETTLE`] counts as accepted, exited as refused.
//!
//! Fails when the operator admits a configuration memcached exits on (a pod would crash-loop). The
//! other disagreement, a configuration the operator refuses that memcached starts with, is printed as
//! information: some are refused on purpose (stricter than one version because another exits, or because
//! memcached starts but never serves, or exits on other nodes).
//!
//! Runs Debian's memcached (`memcached` on PATH, 1.6.18; CI installs it) and, when set,
//! `$MEMCACHED_PROXY_BINARY` (a 1.6.4x build); skips with a message when neither is there. Spawns run in
//! parallel, so the whole run takes a few seconds per binary.

mod common;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use memcached_operator::api::flags::{Accepts, Policy, SUB_OPTIONS};
use memcached_operator::api::{MemcachedConfig, MemcachedSpec};
use memcached_operator::resources::args::args as pod_args;
use memcached_operator::resources::validate::validate;

/// How long memcached must keep running to count as having accepted its command line.
const SETTLE: Duration = Duration::from_millis(300);
/// memcached processes started at once.
const PARALLEL: usize = 24;

/// One configuration: its label and the spec it comes from.
struct Case {
    label: String,
    spec: MemcachedSpec,
}

fn case(extra: &[&str], config: MemcachedConfig) -> Case {
    Case {
        label: format!("{extra:?} {}", describe(&config)),
        spec: MemcachedSpec {
            memcached: Some(Box::new(MemcachedConfig {
                extra_args: extra.iter().map(|a| (*a).to_owned()).collect(),
                ..config
            })),
            ..MemcachedSpec::default()
        },
    }
}

fn describe(c: &MemcachedConfig) -> String {
    let mut parts = Vec::new();
    if let Some(i) = &c.max_item_size {
        parts.push(format!("maxItemSize={i}"));
    }
    if let Some(m) = c.max_memory_mb {
        parts.push(format!("maxMemoryMB={m}"));
    }
    if let Some(t) = c.threads {
        parts.push(format!("threads={t}"));
    }
    if let Some(n) = c.max_connections {
        parts.push(format!("maxConnections={n}"));
    }
    parts.join(" ")
}

fn plain(extra: &[&str]) -> Case {
    case(extra, MemcachedConfig::default())
}

/// Every allowed `-o` sub-option over its model's samples (and alone, when it may be), and the refused
/// `worker_logbuf_size`, whose values are the reason it is refused.
fn sub_option_cases(known: impl Fn(&str) -> bool) -> Vec<Case> {
    let mut cases = Vec::new();
    for sub in SUB_OPTIONS {
        if !known(sub.name) {
            eprintln!("info: this binary does not know -o {}; not tried", sub.name);
            continue;
        }
        let samples = match sub.policy {
            Policy::Allowed => sub.accepts.samples(),
            Policy::Refused(_) if sub.name == "worker_logbuf_size" => {
                ["0", "64", "abc"].map(str::to_owned).to_vec()
            }
            Policy::Refused(_) => continue,
        };
        if !sub.needs_value {
            cases.push(plain(&["-o", sub.name]));
        }
        for value in samples {
            cases.push(plain(&["-o", &format!("{}={value}", sub.name)]));
        }
    }
    cases
}

/// The options whose values the operator models, and the switches it allows or refuses.
fn flag_cases() -> Vec<Case> {
    let values: &[(&str, &[&str])] = &[
        (
            "-R",
            &[
                "0",
                "1",
                "-1",
                "40x",
                "abc",
                "",
                "4294967296",
                "99999999999",
            ],
        ),
        ("-n", &["0", "1", "-5", "48", "abc", "", "99999999"]),
        (
            "-f",
            &["1", "1.01", "0.5", "1e1", "nan", "inf", "abc", "", "1.25x"],
        ),
        ("-b", &["0", "-1", "1", "abc", "", "99999999999"]),
        ("-D", &[":", "", " :", " ", "ab"]),
        ("-N", &["0", "1", "4", "5", "abc", ""]),
        ("-B", &["ascii", "binary", "auto", "udp", "", " ascii"]),
    ];
    let mut cases = Vec::new();
    for (flag, samples) in values {
        for value in *samples {
            cases.push(plain(&[flag, value]));
        }
    }
    for switch in ["-M", "-k", "-C", "-F", "-X", "-W", "-r", "-L"] {
        cases.push(plain(&[switch]));
    }
    cases
}

/// The rules between options, and the operator's own arguments (`-I`, `-m`, `-t`, `-c`).
fn cross_cases() -> Vec<Case> {
    let sized = |item: &str| MemcachedConfig {
        max_item_size: Some(item.to_owned()),
        ..MemcachedConfig::default()
    };
    let mut cases = vec![
        plain(&["-o", "hot_lru_pct=40,warm_lru_pct=40"]),
        plain(&["-o", "hot_lru_pct=41,warm_lru_pct=40"]),
        plain(&["-o", "warm_lru_pct=61"]),
        plain(&["-o", "no_lru_maintainer,temporary_ttl=60"]),
        plain(&["-o", "no_modern,temporary_ttl=60"]),
        plain(&["-o", "no_modern,lru_maintainer,temporary_ttl=60"]),
        plain(&["-n", "100", "-o", "slab_sizes=64-200"]),
        plain(&["-n", "100", "-o", "slab_sizes=100-200"]),
        plain(&["-o", "slab_chunk_max=512,slab_sizes=100-1000"]),
        plain(&["-o", "slab_chunk_max=1024,slab_sizes=100-1000"]),
        plain(&["-o", "slab_chunk_max=1024,slab_sizes=100-1025"]),
        plain(&["-o", "no_chunked_items,slab_sizes=100-600000"]),
        plain(&["-o", "hashpower=13"]),
    ];
    for item in [
        "1k", "256k", "511k", "512k", "1000k", "1m", "1025k", "1536k", "2m", "32m", "33m",
    ] {
        cases.push(case(&[], sized(item)));
    }
    for (extra, item) in [
        ("no_chunked_items", "512k"),
        ("no_chunked_items", "1m"),
        ("no_chunked_items", "2m"),
        ("no_modern", "512k"),
        ("slab_chunk_max=256", "256k"),
        ("slab_chunk_max=512", "256k"),
        ("slab_chunk_max=16", "1000k"),
        ("slab_chunk_max=1024", "2m"),
        ("slab_chunk_max=1024", "1536k"),
    ] {
        cases.push(case(&["-o", extra], sized(item)));
    }
    for memory in [1, 2] {
        cases.push(case(
            &[],
            MemcachedConfig {
                max_memory_mb: Some(memory),
                ..MemcachedConfig::default()
            },
        ));
    }
    for (threads, connections) in [
        (1, Some(14)),
        (1, Some(20)),
        (1, Some(21)),
        (4, Some(20)),
        (4, Some(35)),
        (4, Some(36)),
        (16, Some(95)),
        (16, Some(96)),
        (64, None),
        (256, None),
        (256, Some(1296)),
    ] {
        cases.push(case(
            &[],
            MemcachedConfig {
                threads: Some(threads),
                max_connections: connections,
                ..MemcachedConfig::default()
            },
        ));
    }
    cases
}

/// How memcached took a command line.
enum Outcome {
    Running,
    Exited(String),
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// Starts `binary` with the pod's arguments for `spec`, on a free port; running after [`SETTLE`] or not.
fn run(binary: &Path, spec: &MemcachedSpec) -> Outcome {
    for _ in 0..3 {
        let mut args = pod_args(spec);
        if let Some(at) = args.iter().position(|a| a == "-p") {
            args[at + 1] = free_port().to_string();
        }
        // memcached refuses to run as root without -u; as another user it ignores -u root.
        let mut child = Command::new(binary)
            .args(["-l", "127.0.0.1", "-U", "0", "-u", "root"])
            .args(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("memcached starts");
        let started = Instant::now();
        let status = loop {
            match child.try_wait().expect("memcached's status") {
                Some(status) => break Some(status),
                None if started.elapsed() >= SETTLE => break None,
                None => std::thread::sleep(Duration::from_millis(10)),
            }
        };
        let Some(status) = status else {
            child.kill().ok();
            child.wait().ok();
            return Outcome::Running;
        };
        let mut err = String::new();
        if let Some(mut pipe) = child.stderr.take() {
            pipe.read_to_string(&mut err).ok();
        }
        // Another process took the port between the check and the bind: try another.
        if err.contains("failed to listen") || err.contains("Address already in use") {
            continue;
        }
        let first = err
            .lines()
            .find(|l| !l.starts_with("WARNING"))
            .unwrap_or("");
        return Outcome::Exited(format!("{status}: {}", first.trim()));
    }
    panic!("no free port for memcached after 3 tries");
}

/// The binaries to compare with: Debian's memcached, and `$MEMCACHED_PROXY_BINARY` when set.
fn binaries() -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = common::memcached::real_binary().into_iter().collect();
    if let Some(other) = std::env::var_os("MEMCACHED_PROXY_BINARY") {
        let other = PathBuf::from(other);
        assert!(
            other.is_file(),
            "MEMCACHED_PROXY_BINARY={} is not a file",
            other.display()
        );
        found.push(other);
    }
    found
}

/// The binary's version line (`-V`).
fn version(binary: &Path) -> String {
    let out = Command::new(binary)
        .arg("-V")
        .output()
        .expect("memcached -V");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// Whether the binary knows the sub-option (a build without extstore does not know `ext_*`).
fn knows(binary: &Path, name: &str) -> bool {
    let out = Command::new(binary)
        .args(["-o", &format!("{name}=1"), "-V"])
        .output()
        .expect("memcached -o ... -V");
    !String::from_utf8_lossy(&[out.stdout, out.stderr].concat()).contains("Illegal suboption")
}

#[test]
fn the_operator_admits_nothing_memcached_exits_on() {
    let binaries = binaries();
    if binaries.is_empty() {
        eprintln!(
            "skipped: no memcached binary (install memcached, or set MEMCACHED_PROXY_BINARY)"
        );
        return;
    }
    let started = Instant::now();
    let mut failures = Vec::new();
    for binary in &binaries {
        let version = version(binary);
        let mut cases = sub_option_cases(|name| knows(binary, name));
        cases.extend(flag_cases());
        cases.extend(cross_cases());
        let verdicts: Vec<Result<(), String>> = cases
            .iter()
            .map(|c| validate(&c.spec).map_err(|e| e.message))
            .collect();
        let outcomes = run_all(binary, &cases);
        let (mut admitted, mut refused, mut stricter) = (0, 0, Vec::new());
        for ((case, verdict), outcome) in cases.iter().zip(&verdicts).zip(&outcomes) {
            match (verdict, outcome) {
                (Ok(()), Outcome::Running) => admitted += 1,
                (Ok(()), Outcome::Exited(why)) => failures.push(format!(
                    "{version}: the operator admits {} but memcached exits: {why}",
                    case.label
                )),
                (Err(_), Outcome::Exited(_)) => refused += 1,
                (Err(message), Outcome::Running) => {
                    stricter.push(format!("{}: {message}", case.label));
                }
            }
        }
        eprintln!(
            "{version} ({}): {} configurations; {admitted} admitted and started, {refused} refused and \
             exited; {} refused although memcached starts:",
            binary.display(),
            cases.len(),
            stricter.len()
        );
        for line in &stricter {
            eprintln!("  info: {line}");
        }
    }
    eprintln!("took {:?}", started.elapsed());
    assert!(
        failures.is_empty(),
        "{} configurations the operator admits make memcached exit:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// Runs every case, [`PARALLEL`] at a time, keeping their order.
fn run_all(binary: &Path, cases: &[Case]) -> Vec<Outcome> {
    let next = Mutex::new(0usize);
    let results: Mutex<Vec<Option<Outcome>>> = Mutex::new((0..cases.len()).map(|_| None).collect());
    std::thread::scope(|scope| {
        for _ in 0..PARALLEL {
            scope.spawn(|| {
                loop {
                    let at = {
                        let mut next = next.lock().unwrap();
                        let at = *next;
                        *next += 1;
                        at
                    };
                    let Some(case) = cases.get(at) else {
                        break;
                    };
                    let outcome = run(binary, &case.spec);
                    results.lock().unwrap()[at] = Some(outcome);
                }
            });
        }
    });
    results
        .into_inner()
        .unwrap()
        .into_iter()
        .map(|o| o.expect("every case ran"))
        .collect()
}

/// The samples cover both sides of every modelled sub-option (a test of the test's inputs).
#[test]
fn every_modelled_sub_option_is_sampled() {
    let labels: Vec<String> = sub_option_cases(|_| true)
        .into_iter()
        .map(|c| c.label)
        .collect();
    for sub in SUB_OPTIONS.iter().filter(|s| s.policy == Policy::Allowed) {
        assert!(
            labels
                .iter()
                .any(|l| l.contains(&format!("\"{}", sub.name))),
            "{} is not sampled",
            sub.name
        );
        let _: Accepts = sub.accepts;
    }
}
