//! The table of child kinds (`src/store/kinds.rs`) is the only list of them: the fake API server, the
//! scripted mock, the smoke tests' world and paths, and the benchmark take theirs from it (`each_kind`,
//! `kind_names`). This test fails when a file lists the kinds by hand again.
//!
//! What a list looks like: a file that names many of the table's kinds the way a fake, a mock or a path
//! must, by their collections, in a path or a string (`"/apis/apps/v1/.../deployments"`, `"deployments"`,
//! `"deployments.apps"`). A file that names a few (a scenario the workloads it drives, the kubelet of the
//! benchmark the objects it plays) is not a list; one that names more than [`MOST_KINDS_PER_FILE`] is,
//! and would miss the next kind added to the table. The names looked for come from the table itself, so
//! a new kind is looked for too.

mod common;

use std::collections::BTreeSet;
use std::path::Path;

use memcached_operator::store::{KindName, kind_names};

/// The most kinds of child a file may name before it counts as a list of them.
const MOST_KINDS_PER_FILE: usize = 3;

/// The table itself, the one place that names every kind.
const TABLE: &str = "src/store/kinds.rs";

/// Where fakes, mocks, scenarios and the benchmark live.
const SCANNED: [&str; 4] = ["src", "tests", "fake-apiserver", "bench"];

/// Recorded API answers (data, not code).
const NOT_CODE: &str = "tests/fixtures";

/// The kinds of the table that `text` names as the API does, outside comments.
fn kinds_named(text: &str, kinds: &[KindName]) -> BTreeSet<&'static str> {
    let mut named = BTreeSet::new();
    for line in text.lines() {
        let code = line.trim_start();
        if code.starts_with("//") {
            continue;
        }
        for kind in kinds {
            if names_plural(code, kind.plural) {
                named.insert(kind.plural);
            }
        }
    }
    named
}

/// Whether `line` has `plural` as a path segment or at the start of a string: after `/` or `"`, and not
/// followed by a letter, digit or `_` (`services` is not `servicemonitors`).
fn names_plural(line: &str, plural: &str) -> bool {
    line.match_indices(plural).any(|(at, _)| {
        let before = line[..at].chars().next_back();
        let after = line[at + plural.len()..].chars().next();
        matches!(before, Some('/' | '"'))
            && !after.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
    })
}

fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            if path.file_name().is_some_and(|n| n == "target") {
                continue;
            }
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Every file under [`SCANNED`] but the table that names more than [`MOST_KINDS_PER_FILE`] kinds, with
/// the kinds it names.
fn hand_written_lists(root: &Path) -> Vec<(String, BTreeSet<&'static str>)> {
    let kinds = kind_names();
    let mut files = Vec::new();
    for dir in SCANNED {
        rust_files(&root.join(dir), &mut files);
    }
    let mut lists = Vec::new();
    for file in files {
        let relative = file
            .strip_prefix(root)
            .unwrap()
            .to_string_lossy()
            .replace('\\', "/");
        if relative == TABLE || relative.starts_with(NOT_CODE) {
            continue;
        }
        let text = std::fs::read_to_string(&file).unwrap();
        let named = kinds_named(&text, &kinds);
        if named.len() > MOST_KINDS_PER_FILE {
            lists.push((relative, named));
        }
    }
    lists.sort();
    lists
}

#[test]
fn no_file_but_the_table_lists_the_kinds_of_children() {
    let lists = hand_written_lists(&common::repo(""));
    assert!(
        lists.is_empty(),
        "these files list kinds of children by hand; derive them from the table ({TABLE}: each_kind, \
         kind_names) instead:\n{lists:#?}"
    );
}

#[test]
fn the_table_is_found_as_a_list() {
    // The check sees a list where there is one: the table's own file names every kind.
    let text = common::read(TABLE);
    assert_eq!(
        kinds_named(&text, &kind_names()).len(),
        kind_names().len(),
        "{TABLE} no longer names its kinds as the API does: the check above would see no list at all"
    );
}

#[test]
fn a_hand_written_list_is_caught_and_a_few_mentions_are_not() {
    let kinds = kind_names();
    let paths: Vec<String> = kinds
        .iter()
        .map(|k| {
            format!(
                "const P: &str = \"/apis/{}/namespaces/default/{}\";",
                k.api_version, k.plural
            )
        })
        .collect();
    assert_eq!(kinds_named(&paths.join("\n"), &kinds).len(), kinds.len());
    let quoted: Vec<String> = kinds
        .iter()
        .map(|k| format!("(\"{}\", self.{}),", k.plural, k.kind))
        .collect();
    assert_eq!(kinds_named(&quoted.join("\n"), &kinds).len(), kinds.len());
    // Comments, words inside other names, and English are not mentions.
    let prose = kinds
        .iter()
        .map(|k| {
            format!(
                "// \"{}\"\nlet my_{} = 1; // the {} we make",
                k.plural, k.plural, k.plural
            )
        })
        .collect::<Vec<_>>()
        .join("\n");
    assert!(kinds_named(&prose, &kinds).is_empty(), "{prose}");
}
