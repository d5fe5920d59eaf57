//! The API reference: the committed `docs/api.md` is what `cargo xtask api-docs` prints, and it covers
//! every field of the CRD.

mod common;

use common::{STALE, read, xtask};
use memcached_operator::manifests;
use serde_json::Value;
use xtask::api_docs;

#[test]
fn committed_api_docs_match_xtask() {
    assert!(
        read(api_docs::API_DOCS_PATH) == api_docs::api_markdown(),
        "{} {STALE}",
        api_docs::API_DOCS_PATH
    );
    assert!(
        xtask(&["api-docs"]) == read(api_docs::API_DOCS_PATH),
        "`cargo xtask api-docs` must print {}",
        api_docs::API_DOCS_PATH
    );
}

/// Every field at every depth has a row, and every nested structure a section.
#[test]
fn api_docs_cover_every_field() {
    fn walk(schema: &Value, path: &str, md: &str) {
        for (name, field) in schema["properties"].as_object().into_iter().flatten() {
            assert!(
                md.contains(&format!("| `{name}` |")),
                "docs/api.md lacks {path}.{name}"
            );
            let child = format!("{path}.{name}");
            let (node, section) = if field["type"] == "array" {
                (&field["items"], format!("{child}[]"))
            } else {
                (field, child)
            };
            if node["properties"]
                .as_object()
                .is_some_and(|p| !p.is_empty())
            {
                assert!(
                    md.contains(&format!("### `{section}`")),
                    "docs/api.md lacks a section for {section}"
                );
                walk(node, &section, md);
            }
        }
    }
    let md = read(api_docs::API_DOCS_PATH);
    let crd = serde_json::to_value(manifests::crd()).unwrap();
    for version in crd["spec"]["versions"].as_array().unwrap() {
        walk(&version["schema"]["openAPIV3Schema"], "", &md);
    }
}
