//! The finalizer older versions of the operator put on every instance, removed wherever it is still found.
//!
//! The finalizer did nothing that owner references and garbage collection do not already do (its clean-up
//! only published an event and a "finalizing" status), yet it cost a write when an instance was created and
//! another when it was deleted, and with the operator uninstalled first it held the deletion of every
//! instance, and so of their namespaces and of the CRD, forever. The operator no longer adds it. An
//! instance created by an older version still carries it: the next reconcile removes it, whether the
//! instance is live or already being deleted, with a JSON patch that `test`s the finalizer is still where
//! it was seen, so a concurrent change of the finalizer list makes the patch fail (and retry) instead of
//! removing someone else's entry.

use kube::api::{Patch, PatchParams};
use kube::{Api, ResourceExt};
use serde_json::json;

use super::error::Error;
use crate::api::{FINALIZER, Memcached};

/// The JSON patch that removes the legacy finalizer, testing that it is still where it was seen; `None`
/// when the instance does not carry it. Pure.
pub fn remove_patch(mc: &Memcached) -> Option<serde_json::Value> {
    let index = mc.finalizers().iter().position(|f| f == FINALIZER)?;
    let path = format!("/metadata/finalizers/{index}");
    Some(json!([
        {"op": "test", "path": path, "value": FINALIZER},
        {"op": "remove", "path": path},
    ]))
}

/// Sends `patch` (from [`remove_patch`]) and returns the instance as stored after it, or `None` when the
/// instance is gone (404): there is nothing left to do then, as after a leader hand-over where the
/// previous leader removed the finalizer of a deleted instance just before.
pub async fn remove(
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

    fn mc(finalizers: Option<Vec<&str>>) -> Memcached {
        let mut mc = Memcached::new("cache", Default::default());
        mc.metadata.finalizers = finalizers.map(|f| f.into_iter().map(str::to_owned).collect());
        mc
    }

    #[test]
    fn the_removal_tests_the_finalizer_where_it_was_seen() {
        assert_eq!(
            remove_patch(&mc(Some(vec!["other", FINALIZER]))),
            Some(
                json!([{"op": "test", "path": "/metadata/finalizers/1", "value": FINALIZER},
                        {"op": "remove", "path": "/metadata/finalizers/1"}])
            )
        );
        assert_eq!(
            remove_patch(&mc(Some(vec![FINALIZER]))),
            Some(
                json!([{"op": "test", "path": "/metadata/finalizers/0", "value": FINALIZER},
                        {"op": "remove", "path": "/metadata/finalizers/0"}])
            )
        );
    }

    #[test]
    fn an_instance_without_the_legacy_finalizer_needs_no_patch() {
        assert_eq!(remove_patch(&mc(None)), None);
        assert_eq!(remove_patch(&mc(Some(vec![]))), None);
        assert_eq!(
            remove_patch(&mc(Some(vec!["someone.else/finalizer"]))),
            None
        );
    }
}
