//! Deciding whether a child needs to be applied at all.
//!
//! Server-side apply of an unchanged object is harmless but is still a write request; at scale those
//! add up, so the reconciler applies a child only when the cached live object differs from what it would
//! apply. Two checks together make that exact:
//! - every field the operator sets must be present in the live object with the same value, which catches
//!   edits and deletions made by others (drift);
//! - the live object must carry the hash of the operator's whole desired object, which catches fields a
//!   newer operator version stopped setting (a subset check alone would keep them forever).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use serde::Serialize;
use serde_json::Value;
use sha2::{Digest, Sha256};

/// Annotation holding the hash of the desired object the operator last applied.
pub const DESIRED_HASH_ANNOTATION: &str = "cache.example.com/desired-hash";

/// Stamps `obj` with the hash of its own content, so a later change of the desired object is visible on the
/// live one.
pub fn stamp<K: Resource + Serialize>(mut obj: K) -> K {
    let hash = hash_of(&obj);
    annotations(obj.meta_mut()).insert(DESIRED_HASH_ANNOTATION.to_owned(), hash);
    obj
}

/// Whether `live` already holds everything in `desired` (a stamped object), i.e. whether applying
/// `desired` would change nothing. A ConfigMap's `data` must match exactly: a key someone added to the
/// published server list is drift too.
pub fn is_up_to_date<K: Serialize>(live: &K, desired: &K) -> bool {
    match (serde_json::to_value(live), serde_json::to_value(desired)) {
        (Ok(live), Ok(desired)) => {
            contains(&live, &desired)
                && desired
                    .get("data")
                    .is_none_or(|data| live.get("data") == Some(data))
        }
        // Unserializable objects cannot be compared: applying is the safe answer.
        _ => false,
    }
}

/// Hex SHA-256 of the object's JSON form.
pub fn hash_of<T: Serialize>(value: &T) -> String {
    let bytes = serde_json::to_vec(value).unwrap_or_default();
    Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn annotations(meta: &mut ObjectMeta) -> &mut std::collections::BTreeMap<String, String> {
    meta.annotations.get_or_insert_with(Default::default)
}

/// `desired ⊆ live`: objects by key (extra live keys, e.g. server defaults, are fine), lists element-wise
/// with equal length (an extra list item is drift the operator must not ignore), scalars by equality.
/// A desired zero value (`0`, `false`, `""`, `{}`, `[]`, `null`) matches an absent live field: the API
/// server does not return zero-valued `omitempty` fields (a Deployment applied with `minReadySeconds: 0`
/// comes back without it), so comparing them with what was sent would re-apply the object forever.
/// Resource quantities (values under `requests` and `limits`) compare by amount, because the API server
/// stores them in canonical form (`1024Mi` comes back as `1Gi`).
pub fn contains(live: &Value, desired: &Value) -> bool {
    contains_in(live, desired, false)
}

fn contains_in(live: &Value, desired: &Value, quantities: bool) -> bool {
    match (live, desired) {
        (Value::Object(live), Value::Object(desired)) => {
            desired.iter().all(|(key, want)| match live.get(key) {
                Some(have) => {
                    let quantities = quantities || matches!(key.as_str(), "requests" | "limits");
                    contains_in(have, want, quantities)
                }
                None => is_empty(want),
            })
        }
        (Value::Array(live), Value::Array(desired)) => {
            live.len() == desired.len()
                && live
                    .iter()
                    .zip(desired)
                    .all(|(have, want)| contains_in(have, want, false))
        }
        (Value::String(have), Value::String(want)) if quantities && have != want => {
            match (super::quantity::parse(have), super::quantity::parse(want)) {
                (Some(a), Some(b)) => (a - b).abs() <= 1e-9 * a.abs().max(b.abs()),
                _ => false,
            }
        }
        (live, desired) => live == desired,
    }
}

/// Zero values, which the server drops from `omitempty` fields: absent from the live object, they are not
/// drift. (A field whose zero value the server keeps, such as a pointer, comes back and is compared.)
fn is_empty(value: &Value) -> bool {
    match value {
        Value::Null => true,
        Value::Bool(b) => !b,
        Value::Number(n) => n.as_f64() == Some(0.0),
        Value::String(s) => s.is_empty(),
        Value::Object(map) => map.is_empty(),
        Value::Array(items) => items.is_empty(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use serde_json::json;

    #[test]
    fn server_defaults_and_foreign_fields_are_not_drift() {
        let desired = json!({"spec": {"replicas": 3, "template": {"containers": [{"name": "m", "image": "x"}]}}});
        let live = json!({
            "spec": {"replicas": 3, "progressDeadlineSeconds": 600,
                     "template": {"containers": [{"name": "m", "image": "x", "terminationMessagePath": "/dev/t"}]}},
            "status": {"readyReplicas": 3}
        });
        assert!(contains(&live, &desired));
    }

    #[test]
    fn changed_missing_or_extra_items_are_drift() {
        let desired = json!({"spec": {"replicas": 3, "args": ["-m", "64"]}});
        assert!(!contains(
            &json!({"spec": {"replicas": 1, "args": ["-m", "64"]}}),
            &desired
        ));
        assert!(!contains(
            &json!({"spec": {"args": ["-m", "64"]}}),
            &desired
        ));
        assert!(!contains(
            &json!({"spec": {"replicas": 3, "args": ["-m", "64", "-v"]}}),
            &desired
        ));
        assert!(!contains(
            &json!({"spec": {"replicas": 3, "args": ["-m", "65"]}}),
            &desired
        ));
    }

    #[test]
    fn quantities_compare_by_amount_as_the_server_canonicalises_them() {
        let desired = json!({"resources": {"limits": {"memory": "1024Mi", "cpu": "0.5"}, "requests": {"cpu": "1000m"}}});
        let live = json!({"resources": {"limits": {"memory": "1Gi", "cpu": "500m"}, "requests": {"cpu": "1"}}});
        assert!(contains(&live, &desired));
        let smaller = json!({"resources": {"limits": {"memory": "1000Mi", "cpu": "500m"}, "requests": {"cpu": "1"}}});
        assert!(!contains(&smaller, &desired));
        // Only under requests/limits: elsewhere "1" and "1.0" are different strings.
        assert!(!contains(&json!({"image": "1"}), &json!({"image": "1.0"})));
    }

    #[test]
    fn empty_desired_values_match_absent_live_ones() {
        assert!(contains(&json!({}), &json!({"emptyDir": {}, "list": []})));
    }

    #[test]
    fn zero_values_the_server_drops_match_absent_live_ones() {
        // What a v1.28 API server returns for a Deployment applied with `minReadySeconds: 0`.
        let desired =
            json!({"spec": {"minReadySeconds": 0, "paused": false, "hostname": "", "replicas": 1}});
        assert!(contains(&json!({"spec": {"replicas": 1}}), &desired));
        // A zero value that is present must still be equal, and a non-zero one must be present.
        assert!(!contains(
            &json!({"spec": {"minReadySeconds": 5, "replicas": 1}}),
            &desired
        ));
        assert!(!contains(
            &json!({"spec": {}}),
            &json!({"spec": {"minReadySeconds": 5}})
        ));
        assert!(!contains(
            &json!({"spec": {"paused": true, "replicas": 1}}),
            &desired
        ));
    }

    #[test]
    fn stamp_changes_when_the_desired_object_changes() {
        let mut a = ConfigMap::default();
        a.metadata.name = Some("a".into());
        let mut b = a.clone();
        b.data = Some([("k".to_owned(), "v".to_owned())].into());
        let (a, b) = (stamp(a), stamp(b));
        let hash = |c: &ConfigMap| {
            c.metadata.annotations.as_ref().unwrap()[DESIRED_HASH_ANNOTATION].clone()
        };
        assert_ne!(hash(&a), hash(&b));
        assert_eq!(
            hash(&a),
            hash(&stamp(ConfigMap {
                metadata: ObjectMeta {
                    name: Some("a".into()),
                    ..Default::default()
                },
                ..Default::default()
            }))
        );
        // A live object stamped by an older desired object is out of date even if it holds every field.
        let mut live = b.clone();
        live.metadata.annotations = a.metadata.annotations.clone();
        assert!(!is_up_to_date(&live, &b));
        assert!(is_up_to_date(&b, &b));
    }

    #[test]
    fn config_map_data_compares_exactly() {
        let desired = stamp(ConfigMap {
            data: Some([("servers".to_owned(), "a:1\n".to_owned())].into()),
            ..ConfigMap::default()
        });
        let mut extra = desired.clone();
        extra
            .data
            .as_mut()
            .unwrap()
            .insert("other".into(), "x".into());
        assert!(!is_up_to_date(&extra, &desired));
        assert!(is_up_to_date(&desired.clone(), &desired));
    }
}
