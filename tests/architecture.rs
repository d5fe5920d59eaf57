//! The structure the code must keep, checked from the source text of every crate of the workspace:
//!
//! - no import cycles between the modules of any crate: a module that uses another must not be used by it,
//!   directly or through others. A cycle means neither can be read, tested or moved without the other;
//!   each one found was broken by moving the shared piece to where both can use it (events into
//!   `store::events`, the instance trimming into `store::compact`, the spec-check error into `resources`,
//!   the children's names into `api::names`, the fake API server's responses into `response`);
//! - the operator's layers only look down: `docs/architecture.md` lists the library's top-level modules
//!   by layer, and a module may use modules of lower layers only (and its own module's parts); two
//!   modules of one layer are peers that do not use each other. A top-level module missing from the
//!   list fails too, so every new one is placed;
//! - no file of a folder module imports from its folder's front file (`mod.rs`, or the `x.rs` beside
//!   `x/`) or the front file of a folder further up: a child names the sibling that defines an item
//!   (`super::instance::Instance`), never the front file's own item or re-export (`super::Instance`). The
//!   front file keeps the docs, the `mod` lines and the `pub use` paths the rest of the crate imports.
//!
//! Read from the source text: every `crate::`, `super::` and `self::` path in code (comments and tests
//! left out), `use` groups (`use super::{a, b::c}`) expanded, resolved to the deepest module file it
//! names. For the layers and cycles, a path to an enclosing module is not an edge (the front-file rule
//! above is what keeps children off their front files).

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::Path;

type Module = Vec<String>;

/// The source folders of the workspace's crates.
const CRATES: [&str; 5] = [
    "src",
    "fake-apiserver/src",
    "envtest/src",
    "bench/src",
    "xtask/src",
];

#[test]
fn no_crate_of_the_workspace_has_import_cycles() {
    for krate in CRATES {
        let modules = modules(&Path::new(env!("CARGO_MANIFEST_DIR")).join(krate));
        assert!(modules.len() > 5, "{krate}: read {} modules", modules.len());
        let edges = edges(&modules);
        let cycles = cycles(&edges);
        assert!(
            cycles.is_empty(),
            "import cycles between modules of {krate}:\n{}",
            cycles
                .iter()
                .map(|cycle| cycle.join(" -> "))
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
}

#[test]
fn the_operators_modules_only_use_lower_layers() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let layers = layers(&fs::read_to_string(root.join("docs/architecture.md")).unwrap());
    let modules = modules(&root.join("src"));
    let mut unplaced = BTreeSet::new();
    let mut upward = Vec::new();
    for (module, targets) in edges(&modules) {
        let Some(&from) = layers.get(&module[0]) else {
            unplaced.insert(module[0].clone());
            continue;
        };
        for target in targets {
            let to = layers.get(&target[0]).copied().unwrap_or(usize::MAX);
            if target[0] != module[0] && to >= from {
                upward.push(format!(
                    "{} (layer {from}) uses {}",
                    module.join("::"),
                    target.join("::")
                ));
            }
        }
    }
    assert!(
        unplaced.is_empty(),
        "top-level modules missing from docs/architecture.md's layers: {unplaced:?}"
    );
    assert!(
        upward.is_empty(),
        "imports of a module of the same or a higher layer:\n{}",
        upward.join("\n")
    );
}

#[test]
fn no_child_file_imports_from_its_front_file() {
    let modules = modules(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    let mut offenders = Vec::new();
    for (module, code) in &modules {
        if is_test(module) {
            continue;
        }
        for path in front_file_imports(module, code, &modules) {
            offenders.push(format!("{}: {path}", module.join("::")));
        }
    }
    assert!(
        offenders.is_empty(),
        "child files naming an item of their folder's front file (`mod.rs`, or the `x.rs` beside `x/`) \
         instead of the sibling file that defines it:\n{}",
        offenders.join("\n")
    );
}

#[test]
fn an_item_of_a_front_file_is_found_and_a_sibling_module_is_not() {
    let modules: BTreeMap<Module, String> = [
        vec!["a".to_owned()],
        vec!["a".to_owned(), "b".to_owned()],
        vec!["a".to_owned(), "c".to_owned()],
        vec!["a".to_owned(), "c".to_owned(), "d".to_owned()],
        vec!["a".to_owned(), "c".to_owned(), "e".to_owned()],
    ]
    .into_iter()
    .map(|module| (module, String::new()))
    .collect();
    let d = vec!["a".to_owned(), "c".to_owned(), "d".to_owned()];
    let code = code(
        "use super::{Front, e};\nuse super::super::{b::Aunts, Grand};\nuse super::*;\n\
         fn f() { crate::a::c::g(); crate::a::b::h(); self::i() }\n// super::InAComment",
    );
    assert_eq!(
        front_file_imports(&d, &code, &modules),
        [
            "super::Front",
            "super::super::Grand",
            "super::*",
            "crate::a::c::g"
        ]
    );
}

/// Whether `module` is a test module of its parent (`tests.rs`, `option_tests.rs`, or a file under a
/// `tests/` folder): those are part of the module they test and see its private items.
fn is_test(module: &Module) -> bool {
    module
        .iter()
        .any(|segment| segment == "tests" || segment.ends_with("_tests"))
}

/// The paths in `code` that name an item (not a module) of a module enclosing `module`: of its own
/// folder's front file, or of the front file of a folder further up. The crate root is not a front file.
fn front_file_imports(
    module: &Module,
    code: &str,
    modules: &BTreeMap<Module, String>,
) -> Vec<String> {
    paths(code)
        .into_iter()
        .filter(|path| {
            resolve(module, path, modules).is_some_and(|(target, item)| {
                !target.is_empty()
                    && target.len() < module.len()
                    && module.starts_with(&target)
                    && !item.is_empty()
            })
        })
        .collect()
}

#[test]
fn the_layers_are_read_from_the_table() {
    let doc = "## Layers\n\n| Layer | Modules | What |\n|---|---|---|\n| 1 | `api` | types |\n\
               | 2 | `resources`, `status` | pure |\n\n## Next\n| 9 | `not` | read |\n";
    let layers = layers(doc);
    assert_eq!(
        layers,
        BTreeMap::from([
            ("api".to_owned(), 1),
            ("resources".to_owned(), 2),
            ("status".to_owned(), 2)
        ])
    );
}

/// Top-level module → layer, from the table under the `## Layers` heading: a row per layer, its number
/// first and its modules in backquotes in the second column.
fn layers(doc: &str) -> BTreeMap<String, usize> {
    let section = doc.split("## Layers").nth(1).unwrap_or_default();
    let section = section.split("\n## ").next().unwrap_or_default();
    let mut layers = BTreeMap::new();
    for row in section.lines().filter(|line| line.starts_with('|')) {
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        let Some(Ok(layer)) = cells.get(1).map(|cell| cell.parse::<usize>()) else {
            continue;
        };
        let names = cells.get(2).copied().unwrap_or_default();
        for name in names.split('`').skip(1).step_by(2) {
            layers.insert(name.to_owned(), layer);
        }
    }
    layers
}

fn edges(modules: &BTreeMap<Module, String>) -> BTreeMap<Module, BTreeSet<Module>> {
    modules
        .iter()
        .map(|(module, source)| (module.clone(), uses(module, source, modules)))
        .collect()
}

#[test]
fn a_cycle_is_found_through_use_groups_and_paths() {
    let modules: BTreeMap<Module, String> = [
        (vec!["a".into()], "use super::{b::{One, Two}, c};".into()),
        (vec!["b".into()], "fn f() { crate::a::g() }".into()),
        (vec!["c".into()], "// crate::a::g() in a comment".into()),
    ]
    .into_iter()
    .map(|(module, source): (Module, String)| (module, code(&source)))
    .collect();
    let edges = edges(&modules);
    assert_eq!(
        edges[&vec!["a".to_owned()]],
        BTreeSet::from([vec!["b".to_owned()], vec!["c".to_owned()]])
    );
    assert_eq!(cycles(&edges), [vec!["a".to_owned(), "b".to_owned()]]);
}

/// Every module file under `src` (the binary's `main.rs` and the crate root left out), by path, with its
/// code: comments and the `#[cfg(test)]` tail removed.
fn modules(src: &Path) -> BTreeMap<Module, String> {
    let mut found = BTreeMap::new();
    let mut dirs = vec![src.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            // `tests.rs` files are the test modules of their parent (`#[cfg(test)] mod tests;`), left
            // out as a `#[cfg(test)]` tail is.
            if path.extension().is_none_or(|e| e != "rs") || path.ends_with("tests.rs") {
                continue;
            }
            let relative = path.strip_prefix(src).unwrap().with_extension("");
            let mut module: Module = relative
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            if module.last().is_some_and(|last| last == "mod") {
                module.pop();
            }
            if module == ["lib"] || module == ["main"] {
                continue;
            }
            found.insert(module, code(&fs::read_to_string(&path).unwrap()));
        }
    }
    found
}

fn code(source: &str) -> String {
    let source = source.split("#[cfg(test)]").next().unwrap_or_default();
    source
        .lines()
        .map(|line| match line.find("//") {
            // A `//` inside a string literal ("https://...") cuts the rest of a line, never a path.
            Some(at) => &line[..at],
            None => line,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The modules `module` uses, resolved against the known ones.
fn uses(module: &Module, code: &str, modules: &BTreeMap<Module, String>) -> BTreeSet<Module> {
    let mut targets = BTreeSet::new();
    for path in paths(code) {
        if let Some((target, _)) = resolve(module, &path, modules)
            && &target != module
            && !module.starts_with(&target)
        {
            targets.insert(target);
        }
    }
    targets
}

/// The deepest module `path` (written in `module`) names, and the segments after it: empty when the path
/// names a module, an item of that module (`Instance`, `Problem::Down`) otherwise. `None` for a path
/// that does not start at `crate`, `super` or `self`.
fn resolve<'p>(
    module: &Module,
    path: &'p str,
    modules: &BTreeMap<Module, String>,
) -> Option<(Module, Vec<&'p str>)> {
    let mut segments = path.split("::").map(str::trim);
    let mut base: Module = match segments.next() {
        Some("crate") => Vec::new(),
        Some("self") => module.clone(),
        Some("super") => module[..module.len().saturating_sub(1)].to_vec(),
        _ => return None,
    };
    let mut segments = segments.peekable();
    while segments.peek() == Some(&"super") {
        segments.next();
        base.pop();
    }
    while let Some(&segment) = segments.peek() {
        base.push(segment.to_owned());
        if !modules.contains_key(&base) {
            base.pop();
            break;
        }
        segments.next();
    }
    Some((base, segments.collect()))
}

/// The paths in `code` that start at `crate`, `super` or `self`, with `use` groups expanded.
fn paths(code: &str) -> Vec<String> {
    let mut paths = Vec::new();
    let bytes = code.as_bytes();
    let mut at = 0;
    while at < code.len() {
        let rest = &code[at..];
        let starts = ["crate::", "super::", "self::"]
            .iter()
            .any(|root| rest.starts_with(root))
            && (at == 0 || !(bytes[at - 1].is_ascii_alphanumeric() || bytes[at - 1] == b'_'));
        if !starts {
            at += rest.chars().next().map_or(1, char::len_utf8);
            continue;
        }
        let end = path_end(rest);
        expand(&rest[..end], &mut paths);
        at += end.max(1);
    }
    paths
}

/// Where the path at the start of `text` ends: after its last segment, or after its `{...}` group.
fn path_end(text: &str) -> usize {
    let mut depth = 0usize;
    for (i, c) in text.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth > 0 => {
                depth -= 1;
                if depth == 0 {
                    return i + 1;
                }
            }
            c if depth > 0 || c.is_alphanumeric() || c == '_' || c == ':' => {}
            // A glob, `super::*`: every item of the module.
            '*' if text[..i].ends_with("::") => return i + 1,
            _ => return i,
        }
    }
    text.len()
}

/// `a::{b, c::{d, e}}` as `a::b`, `a::c::d`, `a::c::e`.
fn expand(path: &str, out: &mut Vec<String>) {
    let Some(open) = path.find('{') else {
        out.push(path.trim_end_matches(':').to_owned());
        return;
    };
    let prefix = path[..open].trim_end_matches(':');
    let inner = &path[open + 1..path.rfind('}').unwrap_or(path.len())];
    let mut depth = 0usize;
    let mut start = 0;
    for (i, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                item(prefix, &inner[start..i], out);
                start = i + 1;
            }
            _ => {}
        }
    }
    item(prefix, &inner[start..], out);
}

fn item(prefix: &str, item: &str, out: &mut Vec<String>) {
    let item = item.split(" as ").next().unwrap_or_default().trim();
    if !item.is_empty() && item != "self" {
        expand(&format!("{prefix}::{item}"), out);
    } else if item == "self" {
        out.push(prefix.to_owned());
    }
}

/// The strongly connected groups of more than one module (Tarjan), each as module names in order.
fn cycles(edges: &BTreeMap<Module, BTreeSet<Module>>) -> Vec<Vec<String>> {
    struct Search<'a> {
        edges: &'a BTreeMap<Module, BTreeSet<Module>>,
        index: BTreeMap<&'a Module, usize>,
        low: BTreeMap<&'a Module, usize>,
        stack: Vec<&'a Module>,
        found: Vec<Vec<String>>,
    }
    impl<'a> Search<'a> {
        fn visit(&mut self, v: &'a Module) {
            let n = self.index.len();
            self.index.insert(v, n);
            self.low.insert(v, n);
            self.stack.push(v);
            for w in &self.edges[v] {
                let Some((w, _)) = self.edges.get_key_value(w) else {
                    continue;
                };
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let low = self.low[v].min(self.low[w]);
                    self.low.insert(v, low);
                } else if self.stack.contains(&w) {
                    let low = self.low[v].min(self.index[w]);
                    self.low.insert(v, low);
                }
            }
            if self.low[v] == self.index[v] {
                let mut group = Vec::new();
                while let Some(w) = self.stack.pop() {
                    group.push(w.join("::"));
                    if w == v {
                        break;
                    }
                }
                if group.len() > 1 {
                    group.sort();
                    self.found.push(group);
                }
            }
        }
    }
    let mut search = Search {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        found: Vec::new(),
    };
    for v in edges.keys() {
        if !search.index.contains_key(v) {
            search.visit(v);
        }
    }
    search.found
}
