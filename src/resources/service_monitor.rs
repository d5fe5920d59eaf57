//! The Prometheus Operator ServiceMonitor for the exporter. Its API (`monitoring.coreos.com/v1`) is a
//! CRD's, so the kinds table applies it only where the cluster serves that API (`Served::IfInstalled`).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use super::deployment::METRICS_PORT_NAME;
use super::instance::Instance;
use super::labels;
use crate::api::external::{Endpoint, NamespaceSelector, ServiceMonitor, ServiceMonitorSpec};

/// The ServiceMonitor for `instance`, or `None` when none is wanted. It selects the instance's client
/// Service (the only one with the metrics port) in the instance's namespace.
pub fn service_monitor(instance: &Instance<'_>) -> Option<ServiceMonitor> {
    let config = instance.spec.service_monitor()?;
    let mut metadata = instance.child_meta();
    let mut all_labels = config.labels.clone();
    all_labels.extend(labels::common_labels(instance.name));
    metadata.labels = Some(all_labels);
    Some(ServiceMonitor {
        metadata,
        spec: ServiceMonitorSpec {
            selector: LabelSelector {
                match_labels: Some(labels::selector_labels(instance.name)),
                ..LabelSelector::default()
            },
            namespace_selector: Some(NamespaceSelector {
                match_names: vec![instance.namespace.to_owned()],
            }),
            endpoints: vec![Endpoint {
                port: Some(METRICS_PORT_NAME.to_owned()),
                path: Some("/metrics".to_owned()),
                interval: config.interval.clone(),
            }],
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{ExporterConfig, MemcachedSpec, Monitoring, ServiceMonitorConfig};
    use crate::resources::Defaults;
    use crate::resources::testing::memcached;
    use serde_json::json;

    #[test]
    fn selects_the_client_service_metrics_port() {
        let mc = memcached(
            "cache",
            MemcachedSpec {
                monitoring: Some(Box::new(Monitoring {
                    exporter: Some(ExporterConfig {
                        enabled: true,
                        ..ExporterConfig::default()
                    }),
                    service_monitor: Some(ServiceMonitorConfig {
                        enabled: true,
                        interval: Some("15s".into()),
                        labels: [("release".to_owned(), "prom".to_owned())].into(),
                    }),
                })),
                ..MemcachedSpec::default()
            },
        );
        let defaults = Defaults::default();
        let sm = service_monitor(&Instance::new(&mc, &defaults).unwrap()).unwrap();
        let json = serde_json::to_value(&sm).unwrap();
        assert_eq!(json["apiVersion"], "monitoring.coreos.com/v1");
        assert_eq!(json["kind"], "ServiceMonitor");
        assert_eq!(json["metadata"]["labels"]["release"], "prom");
        assert_eq!(json["metadata"]["ownerReferences"][0]["controller"], true);
        assert_eq!(
            json["spec"]["endpoints"][0],
            json!({"port": "metrics", "path": "/metrics", "interval": "15s"})
        );
        assert_eq!(
            json["spec"]["namespaceSelector"]["matchNames"][0],
            "default"
        );
    }

    #[test]
    fn none_unless_enabled() {
        let mc = memcached("cache", MemcachedSpec::default());
        let defaults = Defaults::default();
        assert!(service_monitor(&Instance::new(&mc, &defaults).unwrap()).is_none());
    }
}
