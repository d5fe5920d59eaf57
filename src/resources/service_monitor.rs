//! The Prometheus Operator ServiceMonitor for the exporter. Its API (`monitoring.coreos.com/v1`) is not
//! part of Kubernetes, so the object is dynamic and only applied where that API is served.

use kube::api::{ApiResource, DynamicObject};
use serde_json::json;

use super::deployment::METRICS_PORT_NAME;
use super::instance::Instance;
use super::labels;

/// The ServiceMonitor resource.
pub fn api_resource() -> ApiResource {
    ApiResource {
        group: "monitoring.coreos.com".to_owned(),
        version: "v1".to_owned(),
        api_version: "monitoring.coreos.com/v1".to_owned(),
        kind: "ServiceMonitor".to_owned(),
        plural: "servicemonitors".to_owned(),
    }
}

/// The ServiceMonitor for `instance`, or `None` when none is wanted. It selects the instance's client
/// Service (the only one with the metrics port) in the instance's namespace.
pub fn service_monitor(instance: &Instance<'_>) -> Option<DynamicObject> {
    let config = instance.spec.service_monitor()?;
    let mut obj = DynamicObject::new(instance.name, &api_resource()).within(instance.namespace);
    let mut meta = instance.child_meta();
    let mut all_labels = config.labels.clone();
    all_labels.extend(labels::common_labels(instance.name));
    meta.labels = Some(all_labels);
    obj.metadata = meta;
    let mut endpoint = json!({"port": METRICS_PORT_NAME, "path": "/metrics"});
    if let Some(interval) = &config.interval {
        endpoint["interval"] = json!(interval);
    }
    obj.data = json!({
        "spec": {
            "selector": {"matchLabels": labels::selector_labels(instance.name)},
            "namespaceSelector": {"matchNames": [instance.namespace]},
            "endpoints": [endpoint],
        }
    });
    Some(obj)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{ExporterConfig, MemcachedSpec, Monitoring, ServiceMonitorConfig};
    use crate::resources::Defaults;
    use crate::resources::testing::memcached;

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
