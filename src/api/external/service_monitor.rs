//! The Prometheus Operator's ServiceMonitor (`monitoring.coreos.com/v1`), a CRD the cluster may not
//! serve: the fields the operator sets (`resources::service_monitor`), which are all the drift check
//! compares. Fields others set are left out of what the operator reads, and kept by server-side apply.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use serde::ser::SerializeStruct;
use serde::{Deserialize, Serialize, Serializer};

/// A ServiceMonitor: its metadata and the part of its spec the operator writes.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct ServiceMonitor {
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: ServiceMonitorSpec,
}

/// Which Services' endpoints Prometheus scrapes, and how.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServiceMonitorSpec {
    /// The Services, by their labels.
    #[serde(default)]
    pub selector: LabelSelector,
    /// The namespaces the Services are looked for in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_selector: Option<NamespaceSelector>,
    /// The ports scraped on each selected Service.
    #[serde(default)]
    pub endpoints: Vec<Endpoint>,
}

/// The namespaces, by name.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NamespaceSelector {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub match_names: Vec<String>,
}

/// One scraped port: its name on the Service, the HTTP path, and how often.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Endpoint {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// A Prometheus duration (`30s`); Prometheus' scrape interval when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval: Option<String>,
}

/// With its `apiVersion` and `kind`, as k8s-openapi's types write theirs: an apply names what it applies.
impl Serialize for ServiceMonitor {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use k8s_openapi::Resource;
        let mut object = serializer.serialize_struct(Self::KIND, 4)?;
        object.serialize_field("apiVersion", Self::API_VERSION)?;
        object.serialize_field("kind", Self::KIND)?;
        object.serialize_field("metadata", &self.metadata)?;
        object.serialize_field("spec", &self.spec)?;
        object.end()
    }
}

impl k8s_openapi::Resource for ServiceMonitor {
    const API_VERSION: &'static str = "monitoring.coreos.com/v1";
    const GROUP: &'static str = "monitoring.coreos.com";
    const KIND: &'static str = "ServiceMonitor";
    const VERSION: &'static str = "v1";
    const URL_PATH_SEGMENT: &'static str = "servicemonitors";
    type Scope = k8s_openapi::NamespaceResourceScope;
}

impl k8s_openapi::Metadata for ServiceMonitor {
    type Ty = ObjectMeta;

    fn metadata(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn metadata_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// What the operator reads of a live ServiceMonitor is what it writes; the fields others set (the
    /// Prometheus Operator's defaults, a user's relabelings) are not kept in the value.
    #[test]
    fn reads_what_it_writes_and_leaves_the_rest() {
        let live = json!({
            "apiVersion": "monitoring.coreos.com/v1", "kind": "ServiceMonitor",
            "metadata": {"name": "cache", "namespace": "ns"},
            "spec": {"selector": {"matchLabels": {"app": "cache"}},
                     "namespaceSelector": {"matchNames": ["ns"]},
                     "endpoints": [{"port": "metrics", "path": "/metrics", "interval": "30s",
                                    "relabelings": [{"action": "keep"}]}],
                     "jobLabel": "app"}
        });
        let monitor: ServiceMonitor = serde_json::from_value(live).unwrap();
        assert_eq!(monitor.spec.endpoints[0].interval.as_deref(), Some("30s"));
        assert_eq!(
            serde_json::to_value(&monitor).unwrap()["spec"],
            json!({"selector": {"matchLabels": {"app": "cache"}},
                   "namespaceSelector": {"matchNames": ["ns"]},
                   "endpoints": [{"port": "metrics", "path": "/metrics", "interval": "30s"}]})
        );
    }
}
