//! How the generated manifests are written: YAML documents, one per object.

use serde::Serialize;

/// YAML documents separated by `---`, each with its apiVersion and kind.
pub fn to_yaml<T: Serialize>(docs: &[T]) -> Result<String, serde_saphyr::ser_error::Error> {
    let mut out = String::new();
    for doc in docs {
        out.push_str("---\n");
        out.push_str(&serde_saphyr::to_string(doc)?);
        if !out.ends_with('\n') {
            out.push('\n');
        }
    }
    Ok(out)
}
