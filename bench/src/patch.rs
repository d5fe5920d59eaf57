//! The three ways a client changes part of an object, reduced to what the operator sends: server-side
//! apply (the applied fields merged in), JSON merge patch (RFC 7386; strategic merge patches are taken as
//! such, which is what they are for the fields the operator writes) and JSON patch (RFC 6902: `test`,
//! `add`, `replace`, `remove`, as the operator's removal of an earlier build's finalizer uses them).

use serde_json::{Map, Value};

/// Server-side apply, simplified: every field the applied object sets replaces the stored one, objects
/// merged key by key, lists replaced whole. Fields an earlier apply set and this one leaves out stay (a
/// real server would remove those it owns): the operator applies the same full objects every time, so
/// this does not change what it sees.
pub fn apply(target: &mut Value, applied: &Value) {
    match (target, applied) {
        (Value::Object(target), Value::Object(applied)) => {
            for (key, value) in applied {
                match target.get_mut(key) {
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

/// JSON merge patch: `null` removes a field, objects merge, anything else replaces.
pub fn merge(target: &mut Value, patch: &Value) {
    let Value::Object(patch) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let target = target.as_object_mut().expect("made an object above");
    for (key, value) in patch {
        if value.is_null() {
            target.remove(key);
        } else {
            merge(target.entry(key.clone()).or_insert(Value::Null), value);
        }
    }
}

/// Why a JSON patch was refused (the API server answers 422).
#[derive(Debug, PartialEq, Eq)]
pub struct Refused(pub String);

/// JSON patch, all operations or none. A `test` of a missing field against `null` passes, as on the API
/// server (a client adding the first finalizer tests `/metadata/finalizers` against `null`).
pub fn json_patch(target: &mut Value, ops: &Value) -> Result<(), Refused> {
    let ops = ops
        .as_array()
        .ok_or_else(|| Refused("a JSON patch is a list of operations".into()))?;
    let mut patched = target.clone();
    for op in ops {
        let path = op["path"]
            .as_str()
            .ok_or_else(|| Refused(format!("operation without a path: {op}")))?;
        let tokens: Vec<String> = path
            .split('/')
            .skip(1)
            .map(|t| t.replace("~1", "/").replace("~0", "~"))
            .collect();
        match op["op"].as_str() {
            Some("test") => {
                let found = patched.pointer(path).unwrap_or(&Value::Null);
                if *found != op["value"] {
                    return Err(Refused(format!("test of {path} failed: it is {found}")));
                }
            }
            Some("add") => add(&mut patched, &tokens, op["value"].clone())?,
            Some("replace") => {
                let slot = patched
                    .pointer_mut(path)
                    .ok_or_else(|| Refused(format!("{path} does not exist")))?;
                *slot = op["value"].clone();
            }
            Some("remove") => remove(&mut patched, &tokens)?,
            other => return Err(Refused(format!("unsupported operation {other:?}"))),
        }
    }
    *target = patched;
    Ok(())
}

fn parent<'a>(target: &'a mut Value, tokens: &[String]) -> Result<&'a mut Value, Refused> {
    let mut at = target;
    for token in tokens {
        at = match at {
            Value::Object(map) => map.get_mut(token),
            Value::Array(list) => token.parse::<usize>().ok().and_then(|i| list.get_mut(i)),
            _ => None,
        }
        .ok_or_else(|| Refused(format!("no {token} on the path")))?;
    }
    Ok(at)
}

fn add(target: &mut Value, tokens: &[String], value: Value) -> Result<(), Refused> {
    let Some((last, rest)) = tokens.split_last() else {
        *target = value;
        return Ok(());
    };
    match parent(target, rest)? {
        Value::Object(map) => {
            map.insert(last.clone(), value);
        }
        Value::Array(list) if last == "-" => list.push(value),
        Value::Array(list) => {
            let i = last
                .parse::<usize>()
                .ok()
                .filter(|i| *i <= list.len())
                .ok_or_else(|| Refused(format!("bad index {last}")))?;
            list.insert(i, value);
        }
        _ => return Err(Refused(format!("cannot add under {last}"))),
    }
    Ok(())
}

fn remove(target: &mut Value, tokens: &[String]) -> Result<(), Refused> {
    let (last, rest) = tokens
        .split_last()
        .ok_or_else(|| Refused("cannot remove the whole object".into()))?;
    let removed = match parent(target, rest)? {
        Value::Object(map) => map.remove(last).is_some(),
        Value::Array(list) => match last.parse::<usize>() {
            Ok(i) if i < list.len() => {
                list.remove(i);
                true
            }
            _ => false,
        },
        _ => false,
    };
    if removed {
        Ok(())
    } else {
        Err(Refused(format!("nothing to remove at {last}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn finalizer_patches_apply_all_or_nothing() {
        let mut mc = json!({"metadata": {"name": "a"}});
        let first = json!([
            {"op": "test", "path": "/metadata/finalizers", "value": null},
            {"op": "add", "path": "/metadata/finalizers", "value": ["f"]}
        ]);
        json_patch(&mut mc, &first).unwrap();
        assert_eq!(mc["metadata"]["finalizers"], json!(["f"]));
        assert!(
            json_patch(&mut mc, &first).is_err(),
            "the test guards a concurrent add"
        );
        let second = json!([
            {"op": "test", "path": "/metadata/finalizers", "value": ["f"]},
            {"op": "add", "path": "/metadata/finalizers/-", "value": "g"}
        ]);
        json_patch(&mut mc, &second).unwrap();
        assert_eq!(mc["metadata"]["finalizers"], json!(["f", "g"]));
        let remove_first = json!([
            {"op": "test", "path": "/metadata/finalizers/0", "value": "f"},
            {"op": "remove", "path": "/metadata/finalizers/0"}
        ]);
        json_patch(&mut mc, &remove_first).unwrap();
        assert_eq!(mc["metadata"]["finalizers"], json!(["g"]));
        let failing = json!([
            {"op": "remove", "path": "/metadata/finalizers/0"},
            {"op": "test", "path": "/metadata/name", "value": "other"}
        ]);
        assert!(json_patch(&mut mc, &failing).is_err());
        assert_eq!(
            mc["metadata"]["finalizers"],
            json!(["g"]),
            "all operations or none"
        );
    }

    #[test]
    fn apply_merges_objects_and_replaces_lists_while_merge_patch_removes_nulls() {
        let mut obj = json!({"spec": {"a": 1, "list": [1, 2], "keep": true}});
        apply(&mut obj, &json!({"spec": {"a": 2, "list": [3]}}));
        assert_eq!(obj, json!({"spec": {"a": 2, "list": [3], "keep": true}}));
        merge(&mut obj, &json!({"spec": {"keep": null, "b": {"c": 1}}}));
        assert_eq!(obj, json!({"spec": {"a": 2, "list": [3], "b": {"c": 1}}}));
    }
}
