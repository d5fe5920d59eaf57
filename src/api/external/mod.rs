//! The Rust types of the kinds of children whose API k8s-openapi does not carry (a CRD's: the cluster may
//! not serve it, see `store::kinds::Served`). Each is the subset of its object the operator writes and
//! reads, with the identity (`k8s_openapi::Resource`) that lets it be an entry of the kinds table.

mod service_monitor;
#[cfg(test)]
mod vertical_pod_autoscaler;

pub use service_monitor::{Endpoint, NamespaceSelector, ServiceMonitor, ServiceMonitorSpec};
#[cfg(test)]
pub use vertical_pod_autoscaler::VerticalPodAutoscaler;
