//! The documentation: the operations guide covers every metric, flag and condition of the operator binary,
//! and what to do about the finalizer of earlier builds, and relative links between the docs resolve.

mod common;

use common::{output_of, read, repo};
use memcached_operator::metrics::Metrics;
use memcached_operator::{api, status};

/// What the operator binary prints with `args`.
fn binary(args: &[&str]) -> String {
    output_of(env!("CARGO_BIN_EXE_memcached-operator"), args)
}

#[test]
fn operations_guide_covers_metrics_flags_conditions_and_the_legacy_finalizer() {
    let guide = read("docs/operations.md");
    // Every metric the operator registers (counters are exported with a _total suffix).
    let text = Metrics::default().encode();
    for exported in common::metric_names(&text) {
        assert!(
            guide.contains(&format!("`{exported}")),
            "docs/operations.md does not document the metric {exported}"
        );
    }
    // Every flag of `run`, and its environment variable (clap prints `[env: NAME=value]`).
    let help = binary(&["run", "--help"]);
    let words: Vec<&str> = help
        .split(|c: char| c.is_whitespace() || c == ',' || c == '[' || c == ']')
        .filter(|w| !w.is_empty())
        .collect();
    let (mut flags, mut vars) = (0, 0);
    for (i, word) in words.iter().enumerate() {
        let flag = word.split('=').next().unwrap();
        if flag.starts_with("--") && flag.len() > 2 && flag != "--help" {
            flags += 1;
            assert!(
                guide.contains(&format!("`{flag}`")),
                "docs/operations.md does not document {flag}"
            );
        }
        if *word == "env:" {
            let var = words[i + 1].split('=').next().unwrap();
            vars += 1;
            assert!(
                guide.contains(&format!("`{var}`")),
                "docs/operations.md does not document {var}"
            );
        }
    }
    assert!(
        flags >= 10 && vars >= 10,
        "read {flags} flags and {vars} variables from `run --help`"
    );
    let conditions = [
        status::AVAILABLE,
        status::PROGRESSING,
        status::DEGRADED,
        status::PROXY_AVAILABLE,
    ];
    for condition in conditions {
        assert!(guide.contains(&format!("`{condition}`")), "{condition}");
    }
    let proxy_reasons = [
        status::ALL_PROXIES_READY,
        status::SOME_PROXIES_READY,
        status::NO_PROXY_READY,
        status::PROXY_CREATING,
    ];
    for reason in proxy_reasons {
        assert!(guide.contains(&format!("`{reason}`")), "{reason}");
    }
    assert!(guide.contains(api::FINALIZER));
}

/// Relative links between the docs (and from the README) point at files that exist.
#[test]
fn doc_links_resolve() {
    for doc in [
        "README.md",
        "docs/operations.md",
        "docs/tutorial-mapping.md",
        "docs/api.md",
    ] {
        let text = read(doc);
        let base = repo(doc).parent().unwrap().to_path_buf();
        for (i, _) in text.match_indices("](") {
            let rest = &text[i + 2..];
            let target = &rest[..rest.find(')').unwrap()];
            if target.starts_with("http")
                || target.starts_with('#')
                || target.starts_with("mailto:")
            {
                continue;
            }
            let file = target.split('#').next().unwrap();
            assert!(
                base.join(file).exists(),
                "{doc} links to {target}, which does not exist"
            );
        }
    }
    let readme = read("README.md");
    for target in [
        "docs/operations.md",
        "docs/api.md",
        "docs/tutorial-mapping.md",
        "dist/install.yaml",
    ] {
        assert!(readme.contains(target), "README.md does not link {target}");
    }
}
