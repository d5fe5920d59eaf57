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

/// `text` with every inline code span (between single backticks on one line) blanked: a regular
/// expression in one (`[a-z]([-a-z]*)`) is no link.
fn without_code_spans(text: &str) -> String {
    text.lines()
        .map(|line| {
            let mut inside = false;
            line.chars()
                .map(|c| {
                    if c == '`' {
                        inside = !inside;
                    }
                    if inside { ' ' } else { c }
                })
                .collect::<String>()
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Relative links between the docs (and from the README) point at files that exist, and a link to a
/// section of a markdown file at a heading it has.
#[test]
fn doc_links_resolve() {
    for doc in [
        "README.md",
        "docs/operations.md",
        "docs/tutorial-mapping.md",
        "docs/api.md",
        "docs/clients.md",
        "docs/architecture.md",
        "charts/memcached-operator/README.md",
    ] {
        let text = without_code_spans(&read(doc));
        let base = repo(doc).parent().unwrap().to_path_buf();
        for (i, _) in text.match_indices("](") {
            let rest = &text[i + 2..];
            let target = &rest[..rest.find(')').unwrap()];
            if target.starts_with("http") || target.starts_with("mailto:") {
                continue;
            }
            let (file, section) = target.split_once('#').unwrap_or((target, ""));
            let path = if file.is_empty() {
                repo(doc)
            } else {
                base.join(file)
            };
            assert!(
                path.exists(),
                "{doc} links to {target}, which does not exist"
            );
            if !section.is_empty() && path.extension().is_some_and(|e| e == "md") {
                let headings = anchors(&std::fs::read_to_string(&path).unwrap());
                assert!(
                    headings.iter().any(|a| a == section),
                    "{doc} links to {target}: no such section"
                );
            }
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

/// The anchors GitHub gives the headings of a markdown text: lower case, punctuation but `-` and `_`
/// dropped, spaces as dashes, `-1`, `-2`, ... appended to repeats (fenced code is not a heading).
fn anchors(text: &str) -> Vec<String> {
    let mut seen: Vec<String> = Vec::new();
    let mut in_block = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_block = !in_block;
        }
        let hashes = line.len() - line.trim_start_matches('#').len();
        if in_block || hashes == 0 || !line[hashes..].starts_with(' ') {
            continue;
        }
        let base: String = line[hashes + 1..]
            .trim()
            .to_lowercase()
            .chars()
            .filter_map(|c| match c {
                ' ' => Some('-'),
                c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
                _ => None,
            })
            .collect();
        let repeats = seen
            .iter()
            .filter(|a| {
                **a == base
                    || a.strip_prefix(&format!("{base}-"))
                        .is_some_and(|n| n.parse::<u32>().is_ok())
            })
            .count();
        seen.push(if repeats == 0 {
            base
        } else {
            format!("{base}-{repeats}")
        });
    }
    seen
}

/// The documents a newcomer reads, whose commands and names the tests below hold to the code.
const DOCS: [&str; 7] = [
    "README.md",
    "docs/operations.md",
    "docs/clients.md",
    "docs/tutorial-mapping.md",
    "docs/architecture.md",
    "charts/memcached-operator/README.md",
    "config/prometheus/kustomization.yaml",
];

/// The places a document runs the binary: each inline code span, and each line of a fenced code
/// block, that starts with `memcached-operator ` (after a `$ ` prompt, if any), up to the span's end or
/// the line's comment.
fn binary_invocations(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut in_block = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_block = !in_block;
            continue;
        }
        if in_block {
            let command = line.trim_start().trim_start_matches("$ ");
            let command = command.split(" #").next().unwrap_or_default();
            if command.starts_with("memcached-operator ") {
                found.push(command.trim().to_owned());
            }
            continue;
        }
        for (i, span) in line.split('`').enumerate() {
            if i % 2 == 1 && span.starts_with("memcached-operator ") {
                found.push(span.to_owned());
            }
        }
    }
    found
}

/// Every `memcached-operator <command>` the docs name is a command of the binary (`--help` lists it),
/// and every `--flag` written with it is one of that command's flags.
#[test]
fn every_command_and_flag_the_docs_name_exists() {
    let help = binary(&["--help"]);
    let commands: Vec<&str> = help
        .split("Commands:")
        .nth(1)
        .and_then(|rest| rest.split("Options:").next())
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert!(commands.contains(&"run"), "{help}");
    let mut checked = 0;
    for doc in DOCS {
        for invocation in binary_invocations(&read(doc)) {
            let mut words = invocation.split_whitespace().skip(1);
            let command = words.next().unwrap_or_default();
            assert!(
                commands.contains(&command),
                "{doc}: `{invocation}`: the binary has no command {command:?} (it has {commands:?})"
            );
            let flags = binary(&[command, "--help"]);
            for flag in words.filter(|w| w.starts_with("--")) {
                let name = flag.split('=').next().unwrap();
                assert!(
                    flags.contains(&format!("{name} ")) || flags.contains(&format!("{name}\n")),
                    "{doc}: `{invocation}`: `memcached-operator {command}` has no flag {name}"
                );
            }
            checked += 1;
        }
    }
    assert!(checked >= 5, "only {checked} invocations found in the docs");
}

/// Every kind of failed reconcile the metric `memcached_operator_reconcile_errors_total{kind}` can carry
/// is named in the README's and the operations guide's metric tables and in the runbook of
/// `MemcachedOperatorReconcileErrors`.
#[test]
fn every_reconcile_error_kind_is_documented() {
    let kinds: Vec<String> = ["src/controller/error.rs", "src/store/writer.rs"]
        .iter()
        .flat_map(|file| kinds_of(&read(file)))
        .collect();
    assert!(kinds.len() >= 9, "{kinds:?}");
    let guide = read("docs/operations.md");
    let runbook = section(&guide, "#### MemcachedOperatorReconcileErrors");
    let row = |text: &str| {
        text.lines()
            .find(|l| l.starts_with("| `memcached_operator_reconcile_errors_total"))
            .unwrap()
            .to_owned()
    };
    for (place, text) in [
        ("README.md's metric table", row(&read("README.md"))),
        ("docs/operations.md's metric table", row(&guide)),
        ("the runbook of MemcachedOperatorReconcileErrors", runbook),
    ] {
        for kind in &kinds {
            assert!(
                text.contains(&format!("`{kind}`")),
                "{place} lacks `{kind}`"
            );
        }
    }
}

/// The strings a `fn kind(&self)` of `source` returns (`Self::Apply { .. } => "apply",`).
fn kinds_of(source: &str) -> Vec<String> {
    let body = source.split("fn kind(&self)").nth(1).unwrap();
    let body = &body[..body.find("\n    }\n").unwrap()];
    body.split("=> \"")
        .skip(1)
        .map(|rest| rest[..rest.find('"').unwrap()].to_owned())
        .collect()
}

/// The text of the section that starts with the heading line `heading`, up to the next heading of the
/// same or a higher level.
fn section(text: &str, heading: &str) -> String {
    let level = heading.split(' ').next().unwrap().len();
    let start = text
        .find(&format!("\n{heading}\n"))
        .unwrap_or_else(|| panic!("no section {heading}"));
    let rest = &text[start + heading.len() + 2..];
    let end = rest
        .lines()
        .position(|l| {
            let hashes = l.len() - l.trim_start_matches('#').len();
            hashes > 0 && hashes <= level && l[hashes..].starts_with(' ')
        })
        .map(|n| rest.lines().take(n).map(|l| l.len() + 1).sum())
        .unwrap_or(rest.len());
    rest[..end].to_owned()
}

/// Every metric a runbook of the operations guide tells the reader to look at is one the operator
/// exports (its own series, warm handover's and operand telemetry's).
#[test]
fn every_metric_a_runbook_names_is_exported() {
    let guide = read("docs/operations.md");
    let alerts = section(&guide, "### Alerts");
    let known = memcached_operator::metrics::exported_series();
    let mut named = 0;
    for word in alerts.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
        if word.starts_with("memcached_") && !word.ends_with('_') {
            named += 1;
            let base = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| word.strip_suffix(s))
                .filter(|b| known.iter().any(|k| k == b))
                .unwrap_or(word);
            assert!(
                known.iter().any(|k| k == base),
                "a runbook names {word}, which the operator does not export"
            );
        }
    }
    assert!(
        named >= 10,
        "only {named} metric names found in the runbooks"
    );
}
