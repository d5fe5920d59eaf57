//! The Services: the client Service (`<name>`) and the headless Service (`<name>-headless`) that gives
//! every pod a DNS record for clients that address servers one by one.

use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::deployment::{METRICS_PORT, METRICS_PORT_NAME, PORT_NAME};
use super::instance::Instance;
use super::labels;

pub use crate::api::names::{HEADLESS_SUFFIX, headless_name};

fn port(name: &str, port: i32) -> ServicePort {
    ServicePort {
        name: Some(name.to_owned()),
        port,
        target_port: Some(IntOrString::String(name.to_owned())),
        protocol: Some("TCP".to_owned()),
        ..ServicePort::default()
    }
}

/// The client Service: `spec.service.port` (default `spec.containerPort`) routed to the memcached port,
/// plus the exporter's metrics port when the exporter runs.
pub fn service(instance: &Instance<'_>) -> Service {
    let config = instance.spec.service();
    let mut metadata = instance.child_meta();
    if !config.annotations.is_empty() {
        metadata.annotations = Some(config.annotations.clone());
    }
    let mut ports = vec![port(
        PORT_NAME,
        config.port.unwrap_or(instance.spec.container_port),
    )];
    if instance.spec.exporter().is_some() {
        ports.push(port(METRICS_PORT_NAME, METRICS_PORT));
    }
    Service {
        metadata,
        spec: Some(ServiceSpec {
            type_: Some(config.type_.unwrap_or_default().as_str().to_owned()),
            selector: Some(labels::selector_labels(instance.name)),
            ports: Some(ports),
            ..ServiceSpec::default()
        }),
        status: None,
    }
}

/// The headless Service: one DNS A record per ready pod, on the container port.
pub fn headless(instance: &Instance<'_>) -> Service {
    let mut metadata = instance.child_meta();
    metadata.name = Some(headless_name(instance.name));
    Service {
        metadata,
        spec: Some(ServiceSpec {
            cluster_ip: Some("None".to_owned()),
            selector: Some(labels::selector_labels(instance.name)),
            ports: Some(vec![port(PORT_NAME, instance.spec.container_port)]),
            ..ServiceSpec::default()
        }),
        status: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{ExporterConfig, MemcachedSpec, Monitoring, ServiceConfig, ServiceType};
    use crate::resources::Defaults;
    use crate::resources::testing::memcached;

    fn build(spec: MemcachedSpec) -> (Service, Service) {
        let mc = memcached("cache", spec);
        let defaults = Defaults::default();
        let instance = Instance::new(&mc, &defaults).unwrap();
        (service(&instance), headless(&instance))
    }

    #[test]
    fn client_service_exposes_the_container_port_by_default() {
        let (svc, _) = build(MemcachedSpec {
            container_port: 12345,
            ..MemcachedSpec::default()
        });
        let spec = svc.spec.unwrap();
        assert_eq!(spec.type_.as_deref(), Some("ClusterIP"));
        assert_eq!(spec.selector.unwrap(), labels::selector_labels("cache"));
        let ports = spec.ports.unwrap();
        assert_eq!(ports.len(), 1);
        assert_eq!(ports[0].port, 12345);
        assert_eq!(
            ports[0].target_port,
            Some(IntOrString::String("memcached".into()))
        );
        assert_eq!(
            svc.metadata.owner_references.unwrap()[0].controller,
            Some(true)
        );
        assert!(svc.metadata.annotations.is_none());
    }

    #[test]
    fn service_settings_and_metrics_port() {
        let (svc, headless) = build(MemcachedSpec {
            service: Some(ServiceConfig {
                type_: Some(ServiceType::LoadBalancer),
                annotations: [("lb".to_owned(), "internal".to_owned())].into(),
                port: Some(11311),
            }),
            monitoring: Some(Box::new(Monitoring {
                exporter: Some(ExporterConfig {
                    enabled: true,
                    ..ExporterConfig::default()
                }),
                service_monitor: None,
            })),
            ..MemcachedSpec::default()
        });
        assert_eq!(svc.metadata.annotations.unwrap()["lb"], "internal");
        let spec = svc.spec.unwrap();
        assert_eq!(spec.type_.as_deref(), Some("LoadBalancer"));
        let ports = spec.ports.unwrap();
        assert_eq!((ports[0].port, ports[1].port), (11311, 9150));
        assert_eq!(ports[1].name.as_deref(), Some("metrics"));

        let hspec = headless.spec.unwrap();
        assert_eq!(headless.metadata.name.as_deref(), Some("cache-headless"));
        assert_eq!(hspec.cluster_ip.as_deref(), Some("None"));
        assert_eq!(
            hspec.ports.unwrap()[0].port,
            11211,
            "headless exposes the pods' own port"
        );
    }
}
