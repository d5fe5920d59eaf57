//! Answers shared by the fake's routes: API `Status` objects, and the Lease's patch semantics.

use axum::http::StatusCode;
use serde_json::{Value, json};

use crate::fake_api::Answer;

/// Merges a patch's `spec` into the Lease's: `null` removes a field (strategic merge), anything else
/// replaces it. Lease spec fields are all scalars, so this is what both patch kinds do to them.
pub fn merge_spec(lease: &mut Value, patch: &Value) {
    let Some(patch) = patch.as_object() else {
        return;
    };
    if !lease["spec"].is_object() {
        lease["spec"] = json!({});
    }
    let spec = lease["spec"].as_object_mut().unwrap();
    for (key, value) in patch {
        if value.is_null() {
            spec.remove(key);
        } else {
            spec.insert(key.clone(), value.clone());
        }
    }
}

pub fn status(code: StatusCode, reason: &str, message: &str) -> Answer {
    Answer::Json(
        code,
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
               "message": message, "reason": reason, "code": code.as_u16()}),
    )
}

pub fn not_found(what: &str, path: &str) -> Answer {
    let name = path.rsplit('/').next().unwrap_or_default();
    status(
        StatusCode::NOT_FOUND,
        "NotFound",
        &format!("{what} \"{name}\" not found"),
    )
}

/// `name` when `path` is `{collection}/{name}`.
pub fn child_name<'a>(path: &'a str, collection: &str) -> Option<&'a str> {
    path.strip_prefix(collection)?
        .strip_prefix('/')
        .filter(|name| !name.is_empty() && !name.contains('/'))
}
