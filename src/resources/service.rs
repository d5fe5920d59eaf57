//! The ClusterIP Service clients use to reach an instance.

use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::deployment::PORT_NAME;
use super::{Instance, labels};

/// The Service for `instance`: `spec.containerPort` on a ClusterIP, routed to the named container port.
pub fn service(instance: &Instance<'_>) -> Service {
    Service {
        metadata: instance.child_meta(),
        spec: Some(ServiceSpec {
            type_: Some("ClusterIP".to_owned()),
            selector: Some(labels::selector_labels(instance.name)),
            ports: Some(vec![ServicePort {
                name: Some(PORT_NAME.to_owned()),
                port: instance.spec.container_port,
                target_port: Some(IntOrString::String(PORT_NAME.to_owned())),
                protocol: Some("TCP".to_owned()),
                ..ServicePort::default()
            }]),
            ..ServiceSpec::default()
        }),
        status: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::MemcachedSpec;
    use crate::resources::Defaults;
    use crate::resources::testing::memcached;

    #[test]
    fn exposes_the_container_port_to_the_instance_pods() {
        let mc = memcached(
            "cache",
            MemcachedSpec {
                container_port: 12345,
                ..MemcachedSpec::default()
            },
        );
        let defaults = Defaults::default();
        let svc = service(&Instance::new(&mc, &defaults).unwrap());
        let spec = svc.spec.unwrap();
        assert_eq!(spec.type_.as_deref(), Some("ClusterIP"));
        assert_eq!(spec.selector.unwrap(), labels::selector_labels("cache"));
        let port = &spec.ports.unwrap()[0];
        assert_eq!(port.port, 12345);
        assert_eq!(port.name.as_deref(), Some("memcached"));
        assert_eq!(
            port.target_port,
            Some(IntOrString::String("memcached".into()))
        );
        assert_eq!(
            svc.metadata.owner_references.unwrap()[0].controller,
            Some(true)
        );
    }
}
