//! The instance's finalizer: added before anything is created, removed after the deletion is recorded.
//!
//! kube's `finalizer` helper ends the reconcile that adds the finalizer and waits for the watch to bring the
//! patched object back, which costs every new instance a full watch round trip before its children are
//! created. Here the reconcile that adds the finalizer goes on to apply the children: the patch answers
//! with the object as stored, and nothing in the spec changed. Both patches are JSON patches with a `test`
//! of what they change, so a concurrent change of the finalizer list makes them fail (and retry) instead
//! of clobbering it.

use kube::api::{Patch, PatchParams};
use kube::{Api, ResourceExt};
use serde_json::json;

use super::Error;
use crate::api::{FINALIZER, Memcached};

/// What the reconcile does with an instance, from its deletion mark and finalizers.
#[derive(Debug, PartialEq, Eq)]
pub enum Phase {
    /// Live, without the finalizer yet: add it, then apply.
    AddThenApply,
    /// Live, finalizer in place: apply.
    Apply,
    /// Being deleted with the finalizer on: record the deletion, then remove the finalizer.
    Cleanup,
    /// Being deleted, finalizer already gone: nothing left to do.
    Gone,
}

/// The phase of `mc`. Pure.
pub fn phase(mc: &Memcached) -> Phase {
    let has = mc.finalizers().iter().any(|f| f == FINALIZER);
    match (mc.metadata.deletion_timestamp.is_some(), has) {
        (false, false) => Phase::AddThenApply,
        (false, true) => Phase::Apply,
        (true, true) => Phase::Cleanup,
        (true, false) => Phase::Gone,
    }
}

/// The JSON patch that adds the finalizer, testing the list it extends.
pub fn add_patch(mc: &Memcached) -> serde_json::Value {
    match mc.metadata.finalizers.as_deref() {
        None | Some([]) => json!([
            {"op": "test", "path": "/metadata/finalizers", "value": mc.metadata.finalizers},
            {"op": "add", "path": "/metadata/finalizers", "value": [FINALIZER]},
        ]),
        Some(existing) => json!([
            {"op": "test", "path": "/metadata/finalizers", "value": existing},
            {"op": "add", "path": "/metadata/finalizers/-", "value": FINALIZER},
        ]),
    }
}

/// The JSON patch that removes the finalizer, testing that it is still where it was seen; `None` when it is
/// not there.
pub fn remove_patch(mc: &Memcached) -> Option<serde_json::Value> {
    let index = mc.finalizers().iter().position(|f| f == FINALIZER)?;
    let path = format!("/metadata/finalizers/{index}");
    Some(json!([
        {"op": "test", "path": path, "value": FINALIZER},
        {"op": "remove", "path": path},
    ]))
}

/// Sends a finalizer patch and returns the instance as stored after it, or `None` when the instance is
/// gone (404): there is nothing left to do then.
pub async fn send(
    api: &Api<Memcached>,
    mc: &Memcached,
    patch: serde_json::Value,
) -> Result<Option<Memcached>, Error> {
    let patch: json_patch::Patch = serde_json::from_value(patch)
        .map_err(|e| Error::Malformed(format!("finalizer patch: {e}")))?;
    match api
        .patch(
            &mc.name_any(),
            &PatchParams::default(),
            &Patch::<()>::Json(patch),
        )
        .await
    {
        Ok(mut patched) => {
            patched.metadata.managed_fields = None;
            Ok(Some(patched))
        }
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(None),
        Err(error) => Err(Error::Finalizer(error)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::Timestamp;

    fn mc(finalizers: Option<Vec<&str>>, deleting: bool) -> Memcached {
        let mut mc = Memcached::new("cache", Default::default());
        mc.metadata.finalizers = finalizers.map(|f| f.into_iter().map(str::to_owned).collect());
        if deleting {
            mc.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
        }
        mc
    }

    #[test]
    fn phases_follow_the_deletion_mark_and_the_finalizer() {
        assert_eq!(phase(&mc(None, false)), Phase::AddThenApply);
        assert_eq!(phase(&mc(Some(vec!["other"]), false)), Phase::AddThenApply);
        assert_eq!(phase(&mc(Some(vec![FINALIZER]), false)), Phase::Apply);
        assert_eq!(
            phase(&mc(Some(vec!["other", FINALIZER]), true)),
            Phase::Cleanup
        );
        assert_eq!(phase(&mc(Some(vec!["other"]), true)), Phase::Gone);
        assert_eq!(phase(&mc(None, true)), Phase::Gone);
    }

    #[test]
    fn patches_test_what_they_change() {
        assert_eq!(
            add_patch(&mc(None, false)),
            json!([{"op": "test", "path": "/metadata/finalizers", "value": null},
                   {"op": "add", "path": "/metadata/finalizers", "value": [FINALIZER]}])
        );
        assert_eq!(
            add_patch(&mc(Some(vec!["other"]), false)),
            json!([{"op": "test", "path": "/metadata/finalizers", "value": ["other"]},
                   {"op": "add", "path": "/metadata/finalizers/-", "value": FINALIZER}])
        );
        assert_eq!(
            remove_patch(&mc(Some(vec!["other", FINALIZER]), true)),
            Some(
                json!([{"op": "test", "path": "/metadata/finalizers/1", "value": FINALIZER},
                        {"op": "remove", "path": "/metadata/finalizers/1"}])
            )
        );
        assert_eq!(remove_patch(&mc(Some(vec!["other"]), true)), None);
    }
}
