//! The metadata every child of the proxy carries.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::super::instance::Instance;
use crate::api::names::proxy_name;

/// The metadata of the proxy's children: named `<name>-proxy`, labelled and owned as every child.
pub(crate) fn meta(instance: &Instance<'_>) -> ObjectMeta {
    ObjectMeta {
        name: Some(proxy_name(instance.name)),
        ..instance.child_meta()
    }
}
