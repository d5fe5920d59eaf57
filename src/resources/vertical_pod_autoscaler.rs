//! The builder of the test-only VerticalPodAutoscaler kind (see `api::external`): what a new kind of a
//! CRD brings beside its entry in the kinds table.

use serde_json::json;

use super::instance::Instance;
use crate::api::external::VerticalPodAutoscaler;

/// The suffix of the names of the instances that ask for one: no spec field asks for this test-only kind,
/// and no other test names an instance so.
pub const ASKED_BY_SUFFIX: &str = "-vpa";

/// A VerticalPodAutoscaler that only recommends (`updateMode: Off`) for the instance's StatefulSet, where
/// the instance asks for one.
pub fn vertical_pod_autoscaler(instance: &Instance<'_>) -> Option<VerticalPodAutoscaler> {
    if !instance.name.ends_with(ASKED_BY_SUFFIX) {
        return None;
    }
    Some(VerticalPodAutoscaler {
        metadata: instance.child_meta(),
        spec: Some(json!({
            "targetRef": {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": instance.name},
            "updatePolicy": {"updateMode": "Off"},
        })),
    })
}
