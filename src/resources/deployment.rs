//! The Deployment that runs an instance's memcached pods.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec};
use k8s_openapi::api::core::v1::{
    Capabilities, Container, ContainerPort, PodSecurityContext, PodSpec, PodTemplateSpec, Probe,
    ResourceRequirements, SeccompProfile, SecurityContext, TCPSocketAction,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::{Instance, args, labels};

/// Name of the memcached container (and of its port).
pub const CONTAINER_NAME: &str = "memcached";
/// Name of the memcached port on the container and the Service.
pub const PORT_NAME: &str = "memcached";
/// UID and GID of the `memcache` user in the official memcached images. Set explicitly because the
/// images name their user instead of numbering it, and `runAsNonRoot` needs a number to verify.
pub const RUN_AS_USER: i64 = 11211;

/// The Deployment for `instance`: `spec.size` replicas of memcached in a pod that meets the `restricted`
/// Pod Security Standard.
pub fn deployment(instance: &Instance<'_>) -> Deployment {
    Deployment {
        metadata: instance.child_meta(),
        spec: Some(DeploymentSpec {
            replicas: Some(instance.spec.size),
            selector: LabelSelector {
                match_labels: Some(labels::selector_labels(instance.name)),
                ..LabelSelector::default()
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels::common_labels(instance.name)),
                    ..ObjectMeta::default()
                }),
                spec: Some(pod_spec(instance)),
            },
            ..DeploymentSpec::default()
        }),
        status: None,
    }
}

fn pod_spec(instance: &Instance<'_>) -> PodSpec {
    PodSpec {
        containers: vec![memcached_container(instance)],
        // memcached never talks to the API server, and the Service env vars are noise for it.
        automount_service_account_token: Some(false),
        enable_service_links: Some(false),
        security_context: Some(PodSecurityContext {
            run_as_non_root: Some(true),
            run_as_user: Some(RUN_AS_USER),
            run_as_group: Some(RUN_AS_USER),
            seccomp_profile: Some(SeccompProfile {
                type_: "RuntimeDefault".to_owned(),
                ..SeccompProfile::default()
            }),
            ..PodSecurityContext::default()
        }),
        ..PodSpec::default()
    }
}

fn memcached_container(instance: &Instance<'_>) -> Container {
    let port = IntOrString::String(PORT_NAME.to_owned());
    let tcp_probe = |initial_delay, period, timeout| Probe {
        tcp_socket: Some(TCPSocketAction {
            port: port.clone(),
            ..TCPSocketAction::default()
        }),
        initial_delay_seconds: Some(initial_delay),
        period_seconds: Some(period),
        timeout_seconds: Some(timeout),
        failure_threshold: Some(3),
        ..Probe::default()
    };
    Container {
        name: CONTAINER_NAME.to_owned(),
        image: Some(instance.image.to_owned()),
        image_pull_policy: Some("IfNotPresent".to_owned()),
        command: Some(args::command()),
        args: Some(args::args(instance.spec)),
        ports: Some(vec![ContainerPort {
            name: Some(PORT_NAME.to_owned()),
            container_port: instance.spec.container_port,
            protocol: Some("TCP".to_owned()),
            ..ContainerPort::default()
        }]),
        readiness_probe: Some(tcp_probe(2, 5, 2)),
        liveness_probe: Some(tcp_probe(10, 10, 5)),
        resources: Some(resources()),
        security_context: Some(SecurityContext {
            allow_privilege_escalation: Some(false),
            read_only_root_filesystem: Some(true),
            run_as_non_root: Some(true),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".to_owned()]),
                ..Capabilities::default()
            }),
            ..SecurityContext::default()
        }),
        ..Container::default()
    }
}

/// Requests and limits sized from memcached's item memory: the limit leaves room for its overhead so the
/// kernel never kills a full cache, and requests equal limits for memory (a cache should not be evicted).
fn resources() -> ResourceRequirements {
    let memory = Quantity(format!(
        "{}Mi",
        args::MAX_MEMORY_MB + args::MEMORY_OVERHEAD_MB
    ));
    ResourceRequirements {
        requests: Some(BTreeMap::from([
            ("cpu".to_owned(), Quantity("100m".to_owned())),
            ("memory".to_owned(), memory.clone()),
        ])),
        limits: Some(BTreeMap::from([("memory".to_owned(), memory)])),
        ..ResourceRequirements::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::MemcachedSpec;
    use crate::resources::Defaults;
    use crate::resources::testing::memcached;

    fn build(spec: MemcachedSpec) -> Deployment {
        let mc = memcached("cache", spec);
        let defaults = Defaults::default();
        deployment(&Instance::new(&mc, &defaults).unwrap())
    }

    fn container(d: &Deployment) -> &Container {
        &d.spec
            .as_ref()
            .unwrap()
            .template
            .spec
            .as_ref()
            .unwrap()
            .containers[0]
    }

    #[test]
    fn replicas_follow_size_including_zero() {
        for size in [0, 1, 3, 64] {
            let d = build(MemcachedSpec {
                size,
                ..MemcachedSpec::default()
            });
            assert_eq!(d.spec.unwrap().replicas, Some(size));
        }
    }

    #[test]
    fn selector_is_only_the_stable_labels_and_matches_the_template() {
        let d = build(MemcachedSpec::default());
        let spec = d.spec.unwrap();
        let selector = spec.selector.match_labels.unwrap();
        assert_eq!(selector, labels::selector_labels("cache"));
        let template_labels = spec.template.metadata.unwrap().labels.unwrap();
        for (k, v) in &selector {
            assert_eq!(template_labels.get(k), Some(v));
        }
        assert_eq!(
            template_labels
                .get(labels::MANAGED_BY_KEY)
                .map(String::as_str),
            Some(labels::MANAGER_NAME)
        );
    }

    #[test]
    fn container_runs_memcached_with_the_spec_port_and_image() {
        let d = build(MemcachedSpec {
            container_port: 11311,
            image: Some("memcached:1.6.38-alpine".into()),
            ..MemcachedSpec::default()
        });
        let c = container(&d);
        assert_eq!(c.name, "memcached");
        assert_eq!(c.image.as_deref(), Some("memcached:1.6.38-alpine"));
        assert_eq!(c.command.as_ref().unwrap(), &["memcached"]);
        assert_eq!(
            c.args.as_ref().unwrap().join(" "),
            "-p 11311 -m 64 -o modern"
        );
        let port = &c.ports.as_ref().unwrap()[0];
        assert_eq!(
            (port.name.as_deref(), port.container_port),
            (Some("memcached"), 11311)
        );
        for probe in [&c.readiness_probe, &c.liveness_probe] {
            let tcp = probe.as_ref().unwrap().tcp_socket.as_ref().unwrap();
            assert_eq!(tcp.port, IntOrString::String("memcached".into()));
        }
    }

    /// The `restricted` Pod Security Standard, checked field by field.
    #[test]
    fn pod_meets_the_restricted_pod_security_standard() {
        let d = build(MemcachedSpec::default());
        let pod = d.spec.unwrap().template.spec.unwrap();
        let psc = pod.security_context.as_ref().unwrap();
        assert_eq!(psc.run_as_non_root, Some(true));
        assert_ne!(psc.run_as_user, Some(0));
        assert_eq!(
            psc.seccomp_profile.as_ref().unwrap().type_,
            "RuntimeDefault"
        );
        assert!(pod.host_network.is_none() && pod.host_pid.is_none() && pod.host_ipc.is_none());
        assert!(pod.volumes.is_none(), "no hostPath or other volume types");
        for c in &pod.containers {
            let sc = c.security_context.as_ref().unwrap();
            assert_eq!(sc.allow_privilege_escalation, Some(false));
            assert_eq!(sc.read_only_root_filesystem, Some(true));
            assert_eq!(sc.privileged, None);
            assert_eq!(
                sc.capabilities.as_ref().unwrap().drop.as_deref(),
                Some(&["ALL".to_owned()][..])
            );
            assert_eq!(sc.capabilities.as_ref().unwrap().add, None);
            assert!(c.ports.iter().flatten().all(|p| p.host_port.is_none()));
        }
    }

    #[test]
    fn memory_limit_leaves_room_above_item_memory() {
        let d = build(MemcachedSpec::default());
        let resources = container(&d).resources.clone().unwrap();
        assert_eq!(resources.limits.unwrap()["memory"], Quantity("96Mi".into()));
        assert_eq!(
            resources.requests.unwrap()["memory"],
            Quantity("96Mi".into())
        );
    }

    #[test]
    fn status_is_never_applied() {
        assert!(build(MemcachedSpec::default()).status.is_none());
    }
}
