//! Server-side apply, reduced to what the operator's applies need. Merge patches (RFC 7386; strategic
//! merge patches are taken as such, which is what they are for the fields the operator and the Lease
//! client write) and JSON patches (RFC 6902) are the `json-patch` crate's.
//!
//! Hand-rolled: no maintained crate implements server-side apply, whose full form needs the resource's
//! schema (list keys, atomic fields) and tracks field managers.

use serde_json::Value;

/// Server-side apply, simplified: every field the applied object sets replaces the stored one, objects
/// merged key by key, lists replaced whole, and a `null` removes the field. Fields an earlier apply set
/// and this one leaves out stay (a real server would remove those it owns): the operator applies the same
/// full objects every time, so this does not change what it sees. No field manager is tracked, so no
/// apply conflicts (409) either.
pub fn apply(target: &mut Value, applied: &Value) {
    match (target, applied) {
        (Value::Object(target), Value::Object(applied)) => {
            for (key, value) in applied {
                match target.get_mut(key) {
                    _ if value.is_null() => {
                        target.remove(key);
                    }
                    Some(existing) if existing.is_object() && value.is_object() => {
                        apply(existing, value)
                    }
                    _ => {
                        target.insert(key.clone(), value.clone());
                    }
                }
            }
        }
        (target, applied) => *target = applied.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn apply_merges_objects_replaces_lists_and_removes_nulls() {
        let mut obj = json!({"spec": {"a": 1, "list": [1, 2], "keep": true, "gone": 1}});
        apply(
            &mut obj,
            &json!({"spec": {"a": 2, "list": [3], "gone": null, "b": {"c": 1}}}),
        );
        assert_eq!(
            obj,
            json!({"spec": {"a": 2, "list": [3], "keep": true, "b": {"c": 1}}})
        );
    }
}
