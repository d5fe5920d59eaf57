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
