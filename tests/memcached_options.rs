//! The option table the operator checks extraArgs against (`api::flags`) agrees with the real
//! memcached: every option and `-o` sub-option its `--help` lists is in the table, and every option in
//! the table is one the binary accepts under that name. Needs the `memcached` binary (CI installs it;
//! elsewhere the tests skip with a message when it is absent).

mod common;

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use memcached_operator::api::flags::{FLAGS, HasArg, SUB_OPTIONS};

fn run(binary: &Path, args: &[&str]) -> String {
    let out = Command::new(binary)
        .args(args)
        .output()
        .expect("memcached runs");
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// What `--help` lists: option letters, long names, and `-o` sub-option names.
fn help_listing(help: &str) -> (BTreeSet<char>, BTreeSet<String>, BTreeSet<String>) {
    let (mut letters, mut longs, mut subs) = (BTreeSet::new(), BTreeSet::new(), BTreeSet::new());
    for line in help.lines() {
        if let Some(rest) = line.strip_prefix('-') {
            // `-p, --port=<num>`, `-W  --disable-watch`, `-D <char>`, `-vv`.
            if let Some(letter) = rest.chars().next() {
                letters.insert(letter);
            }
            if let Some((_, long)) = rest.split_once("--") {
                let name: String = long
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
                    .collect();
                longs.insert(name);
            }
        } else if let Some(rest) = line.trim_start().strip_prefix("- ") {
            // `   - hashpower:  ...` (the `ext_*` heading line has no colon right after a name).
            if let Some((name, _)) = rest.split_once(':')
                && name.chars().all(|c| c.is_ascii_lowercase() || c == '_')
            {
                subs.insert(name.to_owned());
            }
        }
    }
    (letters, longs, subs)
}

/// Whether the binary's getopt took `args` (then `-V` exits): any other complaint, about a value, is fine.
fn accepted(binary: &Path, args: &[&str]) -> Result<(), String> {
    let mut with_version = args.to_vec();
    with_version.push("-V");
    let out = run(binary, &with_version);
    let refused = [
        "unrecognized option",
        "invalid option",
        "ambiguous",
        "Illegal suboption",
        "Illegal argument",
    ];
    match refused.iter().find(|r| out.contains(*r)) {
        Some(_) => Err(out),
        None => Ok(()),
    }
}

#[test]
fn every_option_memcached_lists_is_in_the_table() {
    let Some(binary) = common::memcached::real_binary() else {
        return;
    };
    let (letters, longs, subs) = help_listing(&run(&binary, &["--help"]));
    assert!(
        letters.len() > 30 && subs.len() > 40,
        "parsed too little of --help: {letters:?} {subs:?}"
    );
    let table_letters: BTreeSet<char> = FLAGS.iter().filter_map(|f| f.short).collect();
    assert_eq!(
        letters, table_letters,
        "option letters: --help vs the table"
    );
    for long in &longs {
        // 1.6's --help spells `--napi_ids`, its long-option table `napi-ids` (the binary refuses the
        // former: checked below), so the help's underscores are read as dashes.
        let name = long.replace('_', "-");
        assert!(
            FLAGS.iter().any(|f| f.long == Some(name.as_str())),
            "--{long} (from --help) is not in the table"
        );
    }
    let table_longs: BTreeSet<String> = FLAGS
        .iter()
        .filter_map(|f| f.long)
        .map(|l| l.replace('-', "_"))
        .collect();
    let help_longs: BTreeSet<String> = longs.iter().map(|l| l.replace('-', "_")).collect();
    assert_eq!(help_longs, table_longs, "long names: --help vs the table");
    for sub in &subs {
        assert!(
            SUB_OPTIONS.iter().any(|s| s.name == sub),
            "-o {sub} (from --help) is not in the table"
        );
    }
}

#[test]
fn the_binary_accepts_every_option_of_the_table_under_its_names() {
    let Some(binary) = common::memcached::real_binary() else {
        return;
    };
    for flag in FLAGS {
        let letter = flag.short.expect("every option has a letter");
        // A value getopt accepts; whether memcached likes it later does not matter here.
        let value = if letter == 'o' { "modern" } else { "1" };
        let short = format!("-{letter}");
        let mut args = vec![short.as_str()];
        if flag.has_arg == HasArg::Required {
            args.push(value);
        }
        if !matches!(letter, 'h' | 'i') {
            accepted(&binary, &args).unwrap_or_else(|out| panic!("{args:?}: {out}"));
        }
        if let Some(long) = flag.long {
            let long = match flag.has_arg {
                HasArg::Required => format!("--{long}={value}"),
                _ => format!("--{long}"),
            };
            if !matches!(letter, 'h' | 'i') {
                accepted(&binary, &[long.as_str()]).unwrap_or_else(|out| panic!("{long}: {out}"));
            }
        }
    }
    assert!(
        accepted(&binary, &["--napi_ids=1"]).is_err(),
        "--help's spelling of --napi-ids"
    );
    for sub in SUB_OPTIONS {
        accepted(&binary, &["-o", sub.name]).unwrap_or_else(|out| panic!("-o {}: {out}", sub.name));
    }
    assert!(accepted(&binary, &["-o", "no_such_option"]).is_err());
    assert!(accepted(&binary, &["-q"]).is_err());
}

/// What the operator's walk admits, memcached's own getopt parses without complaint (the walk is not
/// stricter about spelling than memcached, only about which options may be set).
#[test]
fn what_the_check_admits_memcached_parses() {
    use memcached_operator::api::flags::argv::check;
    let Some(binary) = common::memcached::real_binary() else {
        return;
    };
    for list in [
        &["-o", "lru_crawler"][..],
        &["-o", "modern,idle_timeout=600,hash_algorithm=xxh3"],
        &["-olru_crawler"],
        &["-R40", "--max-reqs-per-event=40", "--max-reqs", "40"],
        &["-B", "ascii", "--protocol=binary"],
        &["-CFXWM"],
        &["-CFo", "lru_crawler"],
        &["--listen-backlog=2048", "--listen-", "2048"],
        &["-D", ":", "-D-"],
        &["--disable-c", "--disable-f", "--lo"],
    ] {
        let args: Vec<String> = list.iter().map(|s| (*s).to_owned()).collect();
        assert_eq!(check(&args), Ok(()), "{list:?}");
        accepted(&binary, list).unwrap_or_else(|out| panic!("{list:?}: {out}"));
    }
}

/// The table says which `-o` sub-options need `name=value` exactly as the binary behaves: without a value
/// those exit ("Missing ... argument") or crash, the others start (here: reach `-V`, print and exit 0).
#[test]
fn a_sub_option_needs_a_value_exactly_when_memcached_stops_without_one() {
    let Some(binary) = common::memcached::real_binary() else {
        return;
    };
    for sub in SUB_OPTIONS
        .iter()
        .filter(|s| s.policy == memcached_operator::api::flags::Policy::Allowed)
    {
        let out = Command::new(&binary)
            .args(["-o", sub.name, "-V"])
            .output()
            .expect("memcached runs");
        let started =
            out.status.success() && String::from_utf8_lossy(&out.stdout).contains("memcached ");
        assert_eq!(
            !started,
            sub.needs_value,
            "-o {} without a value: exit {:?}, {}{}",
            sub.name,
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

// ---- Values memcached exits on (`api::flags::values`) ------------------------------------------------

/// The binary these tests run: `$MEMCACHED_BIN`, else `memcached` on PATH (Debian's is /usr/bin/memcached).
fn memcached_binary() -> Option<std::path::PathBuf> {
    if let Some(bin) = std::env::var_os("MEMCACHED_BIN") {
        let bin = std::path::PathBuf::from(bin);
        assert!(
            bin.is_file(),
            "MEMCACHED_BIN={} is not a file",
            bin.display()
        );
        return Some(bin);
    }
    common::memcached::real_binary()
}

/// An instance's spec with `extra` extraArgs, `threads` and, when `auth`, an auth Secret.
fn spec(
    extra: &[&str],
    threads: Option<i32>,
    auth: bool,
) -> memcached_operator::api::MemcachedSpec {
    use memcached_operator::api::{AuthConfig, MemcachedConfig, MemcachedSpec, Security};
    MemcachedSpec {
        memcached: Some(Box::new(MemcachedConfig {
            threads,
            extra_args: extra.iter().map(|a| (*a).to_owned()).collect(),
            ..MemcachedConfig::default()
        })),
        security: auth.then(|| {
            Box::new(Security {
                auth: Some(AuthConfig {
                    secret_name: "auth".into(),
                    key: None,
                    allow_plaintext_stats: false,
                }),
                ..Security::default()
            })
        }),
        ..MemcachedSpec::default()
    }
}

/// How the real memcached took a command line.
enum Outcome {
    /// Exited within the wait, with its status and output.
    Exited(std::process::ExitStatus, String),
    /// Answered a command on its port.
    Serves,
    /// Still running after the wait, and never answered.
    Silent,
}

/// Runs `binary` with the arguments the operator gives the pod of `spec` (`resources::args`), on a free
/// 127.0.0.1 port and with the auth file written to `dir`; waits up to 3 s for it to exit or to answer
/// `version`.
fn start(binary: &Path, spec: &memcached_operator::api::MemcachedSpec, dir: &Path) -> Outcome {
    use std::io::{BufReader, Read, Write};
    use std::time::{Duration, Instant};
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let auth_file = dir.join("auth-file");
    std::fs::write(&auth_file, "app:s3cret\n").expect("the auth file");
    let mut args = memcached_operator::resources::args::args(spec);
    for (i, arg) in args.clone().iter().enumerate() {
        match arg.as_str() {
            "-p" => args[i + 1] = port.to_string(),
            "-Y" => args[i + 1] = auth_file.display().to_string(),
            _ => {}
        }
    }
    // memcached refuses to run as root without -u; as another user it ignores -u root.
    let child = Command::new(binary)
        .args(["-l", "127.0.0.1", "-U", "0", "-u", "root"])
        .args(&args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("memcached starts");
    // Stopped however this ends (an assertion too).
    struct Stop(std::process::Child);
    impl Drop for Stop {
        fn drop(&mut self) {
            self.0.kill().ok();
            self.0.wait().ok();
        }
    }
    let mut child = Stop(child);
    let child = &mut child.0;
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        if let Some(status) = child.try_wait().expect("memcached's status") {
            let mut out = String::new();
            for pipe in [
                child.stdout.take().map(|p| Box::new(p) as Box<dyn Read>),
                child.stderr.take().map(|p| Box::new(p) as Box<dyn Read>),
            ]
            .into_iter()
            .flatten()
            {
                BufReader::new(pipe).read_to_string(&mut out).ok();
            }
            break Outcome::Exited(status, out);
        }
        // `version` in the ASCII protocol, else in the binary one (a `-B binary` server closes on the
        // first): any answer is a server that started.
        let ascii: &[u8] = b"version\r\n";
        let mut binary_version = [0u8; 24];
        binary_version[0] = 0x80;
        binary_version[1] = 0x0b;
        let answered = [ascii, &binary_version].into_iter().any(|request| {
            std::net::TcpStream::connect(("127.0.0.1", port)).is_ok_and(|mut conn| {
                conn.set_read_timeout(Some(Duration::from_secs(1))).ok();
                let mut answer = [0u8; 1];
                conn.write_all(request).is_ok() && conn.read(&mut answer).is_ok_and(|n| n > 0)
            })
        });
        if answered {
            break Outcome::Serves;
        }
        if Instant::now() > deadline {
            break Outcome::Silent;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Each configuration the operator refuses as one memcached exits on is one the real memcached exits on,
/// at once, with the message the operator quotes (and a negative `-R` one it never answers with); their
/// neighbours the operator admits start and serve.
#[test]
fn values_the_operator_refuses_make_memcached_exit_and_those_it_admits_start() {
    use memcached_operator::resources::validate::validate;
    let Some(binary) = memcached_binary() else {
        eprintln!("skipped: no memcached binary (set MEMCACHED_BIN or install memcached)");
        return;
    };
    let dir = std::env::temp_dir().join(format!("memcached-options-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a test directory");
    // (extraArgs, spec.memcached.threads, spec.security.auth)
    let mut refused: Vec<(&[&str], Option<i32>, bool)> = vec![
        (&["-B", "binary"], None, true),
        (&["-B", "auto"], None, true),
        (&["--protocol=binary"], None, true),
        (&["-B", "ascii", "-Bbinary"], None, true),
        (&["-B", "udp"], None, false),
        (&["-R", "0"], None, false),
        (&["-R", "-p1"], None, false),
        (&["-R4294967296"], None, false),
        (&["-R", "-99999999999999999999"], None, false),
        (&["-D", ""], None, false),
        (&["-N", "5"], None, false),
        (&["-N", "3"], Some(2), false),
        (&["-N", "0"], None, false),
        (&["-o", "hashpower=11"], None, false),
        (&["-o", "hashpower=33"], None, false),
        (&["-o", "modern,hashpower=abc"], None, false),
        (&["-o", "hashpower=12"], None, false),
        (&["-o", "hashpower=13"], Some(5), false),
        (&["-o", "hashpower=14"], Some(11), false),
        (&["-o", "hashpower=15"], Some(21), false),
        (&["-n", "0"], None, false),
        (&["-f", "1"], None, false),
        (&["-f", ".5"], None, false),
    ];
    // A 32 GiB table: memcached cannot allocate it where memory and swap are smaller ("Failed to init
    // hashtable."), unless the kernel overcommits whatever is asked (vm.overcommit_memory=1: the table's
    // pages are only reserved, and a container is killed for memory as they fill). The operator refuses
    // it anywhere (it exceeds the container's limit).
    if host_memory_bytes().is_some_and(|bytes| bytes < 32 << 30) && !always_overcommits() {
        refused.push((&["-o", "hashpower=32"], None, false));
    }
    for (extra, threads, auth) in &refused {
        let spec = spec(extra, *threads, *auth);
        let message = validate(&spec)
            .expect_err(&format!(
                "{extra:?} threads {threads:?} auth {auth}: refused"
            ))
            .message;
        assert!(
            message.starts_with("spec.memcached.extraArgs["),
            "{extra:?}: {message}"
        );
        let quoted = message
            .split_once("(\"")
            .and_then(|(_, rest)| rest.split_once("\")"))
            .map(|(quote, _)| quote)
            .unwrap_or_else(|| panic!("{extra:?}: the message quotes memcached: {message}"));
        match start(&binary, &spec, &dir) {
            Outcome::Exited(status, out) => {
                assert!(!status.success(), "{extra:?}: {status}: {out}");
                assert!(
                    out.contains(quoted),
                    "{extra:?}: memcached said {out:?}, the operator quotes {quoted:?}"
                );
            }
            other => panic!(
                "{extra:?} (refused: {message}) did not exit: {}",
                match other {
                    Outcome::Serves => "it serves",
                    _ => "it runs",
                }
            ),
        }
    }
    // Refused although memcached starts: it never answers.
    let silent: &[(&[&str], Option<i32>, bool)] = &[
        (&["-R", "-1"], None, false),
        (&["-R", "99999999999999999999"], None, false),
    ];
    for (extra, threads, auth) in silent {
        let spec = spec(extra, *threads, *auth);
        let message = validate(&spec)
            .expect_err(&format!("{extra:?}: refused"))
            .message;
        assert!(
            message.contains("answers no request"),
            "{extra:?}: {message}"
        );
        match start(&binary, &spec, &dir) {
            Outcome::Silent => {}
            Outcome::Serves => panic!("{extra:?} (refused: {message}) serves"),
            Outcome::Exited(status, out) => panic!("{extra:?}: exited {status}: {out}"),
        }
    }
    let admitted: &[(&[&str], Option<i32>, bool)] = &[
        (&[], None, true),
        (&["-B", "ascii"], None, true),
        (&["-B", "binary", "-B", "ascii"], None, true),
        (&["-B", "binary"], None, false),
        (&["-B", "auto"], None, false),
        (&["-R", "40x"], None, false),
        (&["-R", "1"], None, false),
        (&["-D", ":"], None, false),
        (&["-N", "4"], None, false),
        (&["-N", "8"], Some(8), false),
        (&["-N", "4294967297"], None, false),
        (&["-o", "hashpower=13"], None, false),
        (&["-o", "hashpower=12"], Some(3), false),
        (&["-o", "hashpower=16"], Some(21), false),
        (&["-o", "modern,hashpower=23"], None, false),
        (&["-o", "hashpower=13x"], None, false),
        (&["-f", "1.25"], None, false),
        (&["-f", "1.25x"], None, false),
        (&["-f", "1e1"], None, false),
        (&["-o", "lru_crawler", "-R", "40"], None, false),
    ];
    for (extra, threads, auth) in admitted {
        let spec = spec(extra, *threads, *auth);
        validate(&spec)
            .unwrap_or_else(|e| panic!("{extra:?} threads {threads:?} auth {auth}: {e}"));
        match start(&binary, &spec, &dir) {
            Outcome::Serves => {}
            Outcome::Silent => panic!("{extra:?} (admitted) never answered"),
            Outcome::Exited(status, out) => panic!("{extra:?} (admitted) exited: {status}: {out}"),
        }
    }
    std::fs::remove_dir_all(&dir).ok();
    eprintln!(
        "{} refused configurations exit, {} never answer; {} admitted ones serve",
        refused.len(),
        silent.len(),
        admitted.len()
    );
}

/// Memory and swap of this host (`/proc/meminfo`), where it can be read.
/// Whether the kernel grants every allocation (`vm.overcommit_memory` = 1), so that a table larger
/// than memory allocates.
fn always_overcommits() -> bool {
    std::fs::read_to_string("/proc/sys/vm/overcommit_memory").is_ok_and(|mode| mode.trim() == "1")
}

fn host_memory_bytes() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kib = |key: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|n| n.parse::<u64>().ok())
    };
    Some((kib("MemTotal:")? + kib("SwapTotal:").unwrap_or(0)) * 1024)
}
