//! The README's table of the spec ("The spec"), generated from the CRD schema like the API reference
//! ([`crate::api_docs`]), so that it names every field the API serves and says what the API server says:
//! one row per field of `spec`, with its default, its description, and for an object its fields, each
//! linked to its section of `docs/api.md`. Only the part between the markers is generated; the rest of
//! the README is written by hand. `cargo xtask manifests` rewrites it and the drift check covers it.

use std::fmt::Write as _;

use serde_json::Value;

use crate::schema::{self, Property};

/// Path of the README, relative to the repository root.
pub const README_PATH: &str = "README.md";
/// The line before the generated table.
pub const BEGIN: &str = "<!-- spec table: generated from the CRD schema by `cargo xtask manifests` \
                         (make manifests); edit the doc comments in src/api, not this table -->";
/// The line after it.
pub const END: &str = "<!-- end of the generated spec table -->";

/// Why the README cannot be regenerated.
#[derive(Debug, thiserror::Error)]
#[error("{README_PATH}: {0}")]
pub struct Error(String);

/// `readme` with the table between [`BEGIN`] and [`END`] generated anew from the operator's CRD.
pub fn with_spec_table(readme: &str) -> Result<String, Error> {
    replace_between(readme, &spec_table(&schema::crd_json()))
}

/// `text` with what stands between the marker lines replaced by `table`.
fn replace_between(text: &str, table: &str) -> Result<String, Error> {
    let begin = text
        .find(BEGIN)
        .ok_or_else(|| Error(format!("no line {BEGIN:?}")))?;
    let after_begin = begin + BEGIN.len();
    let end = text[after_begin..]
        .find(END)
        .map(|i| after_begin + i)
        .ok_or_else(|| Error(format!("no line {END:?} after the table's start")))?;
    Ok(format!("{}\n{table}{}", &text[..after_begin], &text[end..]))
}

/// The table of the fields of `spec` in the served version of `crd`.
pub fn spec_table(crd: &Value) -> String {
    let spec = crd["spec"]["versions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|v| v["storage"] == true)
        .map(|v| &v["schema"]["openAPIV3Schema"]["properties"]["spec"])
        .unwrap_or(&Value::Null);
    let mut out = String::from("| Field | Default | Meaning |\n| --- | --- | --- |\n");
    for prop in schema::properties(spec) {
        let _ = writeln!(
            out,
            "| {} | {} | {} |",
            field(&prop, ".spec"),
            default(prop.schema),
            cell(&meaning(&prop, ".spec"))
        );
    }
    out
}

/// The field's name, linked to its section of the API reference when it has one.
fn field(prop: &Property<'_>, parent: &str) -> String {
    let path = format!("{parent}.{}", prop.name);
    if schema::has_properties(prop.schema) {
        format!("[`{}`](docs/api.md#{})", prop.name, anchor(&path))
    } else {
        format!("`{}`", prop.name)
    }
}

/// The schema's default, or what the description says when the API server fills in none.
fn default(schema: &Value) -> String {
    match &schema["default"] {
        Value::Null => "—".to_owned(),
        Value::String(s) => format!("`{s}`"),
        value if value.is_f64() => format!("`{}`", schema::number(value)),
        value => format!("`{value}`"),
    }
}

/// The description, and an object's fields (each linked when it has a section of its own).
fn meaning(prop: &Property<'_>, parent: &str) -> String {
    let mut text = prop
        .schema
        .get("description")
        .and_then(Value::as_str)
        .map(schema::one_line)
        .unwrap_or_default();
    let children = schema::properties(prop.schema);
    if !children.is_empty() {
        let path = format!("{parent}.{}", prop.name);
        let names: Vec<String> = children.iter().map(|c| field(c, &path)).collect();
        let _ = write!(text, " Fields: {}.", names.join(", "));
    }
    text
}

/// The anchor GitHub gives the API reference's heading of `path` (`.spec.memcached` → `specmemcached`).
fn anchor(path: &str) -> String {
    path.to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == '-' || *c == '_')
        .collect()
}

/// Text made safe for a table cell: one line, pipes escaped.
fn cell(text: &str) -> String {
    text.replace('\n', " ").replace('|', "\\|")
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn crd(spec: Value) -> Value {
        json!({"spec": {"versions": [{"name": "v1", "storage": true,
            "schema": {"openAPIV3Schema": {"properties": {"spec": spec}}}}]}})
    }

    #[test]
    fn every_field_of_spec_has_a_row_with_its_default_and_description() {
        let table = spec_table(&crd(json!({"type": "object", "properties": {
            "size": {"type": "integer", "default": 1, "description": "Number of pods."},
            "proxy": {"type": "object", "description": "A proxy | in front.", "properties": {
                "enabled": {"type": "boolean", "description": "Run it."},
                "resources": {"type": "object", "properties": {"x": {"type": "string"}}},
            }},
        }})));
        assert!(
            table.contains("| `size` | `1` | Number of pods. |"),
            "{table}"
        );
        assert!(
            table.contains(
                "| [`proxy`](docs/api.md#specproxy) | — | A proxy \\| in front. Fields: `enabled`, \
                 [`resources`](docs/api.md#specproxyresources). |"
            ),
            "{table}"
        );
    }

    #[test]
    fn only_the_part_between_the_markers_is_replaced() {
        let readme = format!("# Title\n\n{BEGIN}\nold table\n{END}\n\nMore text.\n");
        let new = replace_between(&readme, "| new |\n").unwrap();
        assert_eq!(
            new,
            format!("# Title\n\n{BEGIN}\n| new |\n{END}\n\nMore text.\n")
        );
        assert!(replace_between("no markers", "x").is_err());
        assert!(replace_between(&format!("{BEGIN} but no end"), "x").is_err());
    }
}
