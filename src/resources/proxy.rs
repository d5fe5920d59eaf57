//! The proxy tier (`spec.proxy`): a Deployment `<name>-proxy` of memcached in proxy mode, the Service
//! `<name>-proxy` clients connect to, its PodDisruptionBudget, and its route configuration
//! ([`routes`]).
//!
//! How the proxy learns of a changed server list without a restart: the route configuration lives in the
//! ConfigMap `<name>-proxy`, which no pod mounts (the kubelet refreshes a mounted ConfigMap only after up
//! to a minute). Each proxy pod runs the operator's own binary twice beside memcached ([`access`] gives it
//! the right to read that one ConfigMap and nothing else): as an init container that writes the
//! configuration into a directory the pod shares (an `emptyDir`) before memcached starts, and as a
//! sidecar that watches the ConfigMap, writes each new configuration there and sends memcached `SIGHUP`
//! (the pod shares its process namespace; memcached writes its pid file into the same directory).
//! memcached reloads the configuration at its next clock tick (within a second). The pod template names
//! the ConfigMap, not its content, so a change of the list rolls no proxy pod.
//!
//! With `spec.security.tls` the proxy serves its clients over TLS with the servers' certificate (the
//! instance's TLS Secret, its `tls.crt` and `tls.key` only) and reaches the servers over TLS ([`routes`]).
//! memcached reads the certificate at start, so the template carries the hash of those two keys
//! ([`SECRET_HASH_ANNOTATION`], `Instance::proxy_secret_hash`): a rotated certificate rolls the proxy
//! pods, which hold no cache.

pub mod access;
pub mod identities;
mod metadata;
pub mod routes;

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{
    Deployment, DeploymentSpec, DeploymentStrategy, RollingUpdateDeployment,
};
use k8s_openapi::api::core::v1::{
    Container, ContainerPort, EmptyDirVolumeSource, EnvVar, EnvVarSource, ObjectFieldSelector,
    PodSecurityContext, PodSpec, PodTemplateSpec, ResourceRequirements, SeccompProfile,
    SecretVolumeSource, Service, ServicePort, ServiceSpec, TopologySpreadConstraint, Volume,
    VolumeMount,
};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::instance::Instance;
use super::pod::{
    PORT_NAME, RUN_AS_USER, SECRET_HASH_ANNOTATION, files, mount, requirements, restricted,
    tcp_probe,
};
use super::{args, labels};
use crate::api::Proxy;

pub use crate::api::names::{PROXY_SUFFIX, proxy_name};
pub(crate) use metadata::meta;

/// Name of the proxy's memcached container.
pub const PROXY_CONTAINER: &str = "proxy";
/// Name of the configuration writer: the init container and the sidecar (the operator's binary).
pub const CONFIG_CONTAINER: &str = "proxy-config";
/// The operator's subcommand the configuration writer runs.
pub const CONFIG_SUBCOMMAND: &str = "proxy-config";
/// Where the configuration, and memcached's pid file, are shared between the containers.
pub const CONFIG_DIR: &str = "/etc/memcached-proxy";
/// The file memcached's pid goes to, in [`CONFIG_DIR`].
pub const PID_FILE: &str = "memcached.pid";
const CONFIG_VOLUME: &str = "config";
const TLS_VOLUME: &str = "tls";
/// The keys of the TLS Secret the proxy reads: its certificate and key, never the CA.
pub const TLS_KEYS: [&str; 2] = ["tls.crt", "tls.key"];

/// The proxy Deployment of `instance`, or `None` when the proxy is off. Its template depends on the
/// spec (and the hash of the TLS Secret's keys it reads) only, never on the server list: a scale or a
/// server's new address rolls no proxy pod. An operator's change of it waits for the instance's fleet
/// turn (`Instance::proxy_fleet`: the live template kept, the cause recorded).
pub fn deployment(instance: &Instance<'_>) -> Option<Deployment> {
    let proxy = instance.spec.proxy()?;
    let trust = instance.proxy_access.as_ref().map(|access| &access.trust);
    let mut metadata = meta(instance);
    if let Some(trust) = trust {
        metadata.annotations = Some(BTreeMap::from([(
            identities::TRUSTED_ANNOTATION.to_owned(),
            trust.trusted.clone(),
        )]));
    }
    let mut annotations = BTreeMap::new();
    if let Some(hash) = &instance.proxy_secret_hash {
        annotations.insert(SECRET_HASH_ANNOTATION.to_owned(), hash.clone());
    }
    if let Some(trust) = trust {
        annotations.insert(identities::EPOCH_ANNOTATION.to_owned(), trust.epoch.clone());
    }
    let mut template = PodTemplateSpec {
        metadata: Some(ObjectMeta {
            labels: Some(labels::proxy_labels(instance.name)),
            annotations: (!annotations.is_empty()).then_some(annotations),
            ..ObjectMeta::default()
        }),
        spec: Some(pod_spec(instance, proxy)),
    };
    if let Some(held) = &instance.proxy_fleet {
        held.apply(&mut metadata, &mut template);
    }
    Some(Deployment {
        metadata,
        spec: Some(DeploymentSpec {
            replicas: Some(proxy.replicas()),
            selector: selector(instance),
            // A new proxy pod is ready before an old one goes: the Service never loses capacity.
            strategy: Some(DeploymentStrategy {
                type_: Some("RollingUpdate".to_owned()),
                rolling_update: Some(RollingUpdateDeployment {
                    max_unavailable: Some(IntOrString::Int(0)),
                    max_surge: Some(IntOrString::Int(1)),
                }),
            }),
            template,
            ..DeploymentSpec::default()
        }),
        status: None,
    })
}

/// The Service `<name>-proxy`: the address clients of the proxy use, on the memcached port.
pub fn service(instance: &Instance<'_>) -> Option<Service> {
    instance.spec.proxy()?;
    Some(Service {
        metadata: meta(instance),
        spec: Some(ServiceSpec {
            selector: Some(labels::proxy_selector_labels(instance.name)),
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
    })
}

/// The proxy's PodDisruptionBudget, while it runs more than one pod: one proxy pod down at a time.
pub fn pdb(instance: &Instance<'_>) -> Option<PodDisruptionBudget> {
    let proxy = instance.spec.proxy()?;
    (proxy.replicas() > 1).then(|| PodDisruptionBudget {
        metadata: meta(instance),
        spec: Some(PodDisruptionBudgetSpec {
            selector: Some(selector(instance)),
            max_unavailable: Some(IntOrString::Int(1)),
            ..PodDisruptionBudgetSpec::default()
        }),
        status: None,
    })
}

fn selector(instance: &Instance<'_>) -> LabelSelector {
    LabelSelector {
        match_labels: Some(labels::proxy_selector_labels(instance.name)),
        ..LabelSelector::default()
    }
}

/// Restricted security, one process namespace (the sidecar signals memcached, as the same user), the
/// API token only in the configuration writer's containers, spread over nodes.
fn pod_spec(instance: &Instance<'_>, proxy: &Proxy) -> PodSpec {
    let spec = instance.spec;
    let mut volumes = vec![
        Volume {
            name: CONFIG_VOLUME.to_owned(),
            empty_dir: Some(EmptyDirVolumeSource::default()),
            ..Volume::default()
        },
        access::token_volume(),
    ];
    volumes.extend(tls_volume(instance));
    PodSpec {
        init_containers: Some(vec![config_container(instance, true)]),
        containers: vec![
            proxy_container(instance, proxy),
            config_container(instance, false),
        ],
        share_process_namespace: Some(true),
        service_account_name: Some(proxy_name(instance.name)),
        automount_service_account_token: Some(false),
        enable_service_links: Some(false),
        security_context: Some(PodSecurityContext {
            run_as_non_root: Some(true),
            run_as_user: Some(RUN_AS_USER),
            run_as_group: Some(RUN_AS_USER),
            // The TLS Secret's files are group-readable (0440) by this group only.
            fs_group: spec.tls().is_some().then_some(RUN_AS_USER),
            seccomp_profile: Some(SeccompProfile {
                type_: "RuntimeDefault".to_owned(),
                ..SeccompProfile::default()
            }),
            ..PodSecurityContext::default()
        }),
        topology_spread_constraints: Some(vec![TopologySpreadConstraint {
            max_skew: 1,
            topology_key: "kubernetes.io/hostname".to_owned(),
            when_unsatisfiable: "ScheduleAnyway".to_owned(),
            label_selector: Some(selector(instance)),
            ..TopologySpreadConstraint::default()
        }]),
        node_selector: spec.node_selector.clone(),
        tolerations: spec.tolerations.clone(),
        priority_class_name: spec.priority_class_name.clone(),
        volumes: Some(volumes),
        ..PodSpec::default()
    }
}

/// memcached in proxy mode, with routelib (built into memcached) reading the generated configuration.
fn proxy_container(instance: &Instance<'_>, proxy: &Proxy) -> Container {
    let port = instance.spec.container_port;
    let access = instance.proxy_access.is_some();
    let mut mounts = vec![config_mount()];
    if instance.spec.tls().is_some() {
        mounts.push(mount(TLS_VOLUME, args::TLS_DIR));
    }
    let mut ports = vec![ContainerPort {
        name: Some(PORT_NAME.to_owned()),
        container_port: port,
        protocol: Some("TCP".to_owned()),
        ..ContainerPort::default()
    }];
    if access {
        ports.push(ContainerPort {
            name: Some(OPS_PORT_NAME.to_owned()),
            container_port: ops_port(port),
            protocol: Some("TCP".to_owned()),
            ..ContainerPort::default()
        });
    }
    Container {
        name: PROXY_CONTAINER.to_owned(),
        image: Some(proxy.image_or(instance.default_image).to_owned()),
        image_pull_policy: Some("IfNotPresent".to_owned()),
        command: Some(vec!["memcached".to_owned()]),
        args: Some(proxy_args(port, instance.spec.tls().is_some(), access)),
        ports: Some(ports),
        readiness_probe: Some(tcp_probe(PORT_NAME, 1, 5, 2)),
        liveness_probe: Some(tcp_probe(PORT_NAME, 10, 10, 5)),
        resources: Some(proxy_resources(proxy)),
        security_context: Some(restricted()),
        volume_mounts: Some(mounts),
        ..Container::default()
    }
}

/// With TLS on, the proxy's plain-text listener on the pod's loopback, for `stats` only.
pub const LOOPBACK_STATS_PORT: i32 = 11299;

/// Name of the proxy container's port for the operator's `stats` with access control on.
pub const OPS_PORT_NAME: &str = "ops";

/// The port of the operator's `stats` listener with access control on: [`identities::OPS_PORT`], or the
/// next one when the instance's port is that one.
pub fn ops_port(port: i32) -> i32 {
    if port == identities::OPS_PORT {
        identities::OPS_PORT + 1
    } else {
        identities::OPS_PORT
    }
}

/// The port where the operator reads a proxy pod's `stats`: the clients' port, or with access control on
/// the operator's own ([`ops_port`]).
pub fn stats_port(spec: &crate::api::MemcachedSpec) -> i32 {
    match spec.proxy().and_then(|proxy| proxy.access.as_ref()) {
        Some(_) if spec.tls().is_some() => ops_port(spec.container_port),
        _ => spec.container_port,
    }
}

/// `-p <port> -o proxy_config=routelib,proxy_arg=<config> -P <pid file>`, in [`CONFIG_DIR`]; with
/// `tls`, the certificate and key the servers serve too (`ssl_chain_cert`, `ssl_key`, in
/// [`args::TLS_DIR`]) and `-Z`: clients must speak TLS; with `access` (which needs `tls`), client
/// certificates too ([`identities`]).
pub fn proxy_args(port: i32, tls: bool, access: bool) -> Vec<String> {
    proxy_args_in(port, CONFIG_DIR, tls.then_some(args::TLS_DIR), access)
}

/// The proxy's arguments with the configuration and the pid file in `dir` (the pod's is [`CONFIG_DIR`];
/// the bench of the hop runs the same arguments in a directory of its own), and with TLS the
/// certificate and key in `tls_dir`.
pub fn proxy_args_in(port: i32, dir: &str, tls_dir: Option<&str>, access: bool) -> Vec<String> {
    let access = access && tls_dir.is_some();
    let library = match access {
        true => format!(":{dir}/{}", identities::LIBRARY_FILE),
        false => String::new(),
    };
    let mut options = format!(
        "proxy_config=routelib{library},proxy_arg={dir}/{}",
        routes::CONFIG_KEY
    );
    if let Some(tls_dir) = tls_dir {
        options.push_str(&format!(
            ",ssl_chain_cert={tls_dir}/tls.crt,ssl_key={tls_dir}/tls.key"
        ));
    }
    if access {
        // The session cache gives resumed sessions a context: without one, OpenSSL refuses a client that
        // resumes a session on a listener that verifies certificates (memcached 1.6.45 answers with an
        // `internal_error` alert), which rustls, Go and Java clients do by default.
        options.push_str(&format!(
            ",ssl_ca_cert={dir}/{},ssl_session_cache",
            identities::CA_FILE
        ));
    }
    let mut proxy_args = vec![
        "-p".to_owned(),
        port.to_string(),
        "-o".to_owned(),
        options,
        "-P".to_owned(),
        format!("{dir}/{PID_FILE}"),
    ];
    if tls_dir.is_some() {
        // Every address as without `-l` (`*`), over TLS; and the loopback in the clear on a port of its
        // own, for the configuration writer's `stats` (it confirms reloads there and holds no certificate).
        // With access control, the clients' listener requires a client certificate and is tagged for
        // the access hooks, and the operator reads `stats` on a listener of its own.
        let loopback = loopback_stats_port(port);
        let listeners = match access {
            true => format!(
                "mtls:tag[{}]:*:{port},btls:*:{},notls:127.0.0.1:{loopback}",
                identities::CLIENT_TAG,
                ops_port(port)
            ),
            false => format!("*,notls:127.0.0.1:{loopback}"),
        };
        proxy_args.extend(["-Z".to_owned(), "-l".to_owned(), listeners]);
    }
    proxy_args
}

/// The port of the proxy's plain-text loopback listener with TLS on: [`LOOPBACK_STATS_PORT`], or the
/// next one when the instance's port is that one.
pub fn loopback_stats_port(port: i32) -> i32 {
    if port == LOOPBACK_STATS_PORT {
        LOOPBACK_STATS_PORT + 1
    } else {
        LOOPBACK_STATS_PORT
    }
}

/// The address where the configuration writer reads memcached's `stats`: the proxy's port, or with TLS
/// on its plain-text loopback listener (a TLS port resets a plain connection).
fn stats_address(port: i32, tls: bool) -> String {
    let port = if tls { loopback_stats_port(port) } else { port };
    format!("127.0.0.1:{port}")
}

/// The TLS Secret's certificate and key (not its CA), read-only to the pod's group, with TLS on.
fn tls_volume(instance: &Instance<'_>) -> Option<Volume> {
    let tls = instance.spec.tls()?;
    Some(Volume {
        name: TLS_VOLUME.to_owned(),
        secret: Some(SecretVolumeSource {
            secret_name: Some(tls.secret_name.clone()),
            default_mode: Some(0o440),
            items: Some(files(&TLS_KEYS)),
            ..SecretVolumeSource::default()
        }),
        ..Volume::default()
    })
}

/// The configuration writer: `once` as the init container (writes the configuration and exits), else
/// the sidecar (watches, writes, signals memcached).
fn config_container(instance: &Instance<'_>, once: bool) -> Container {
    let mut args = vec![
        CONFIG_SUBCOMMAND.to_owned(),
        format!("--config-map={}", proxy_name(instance.name)),
        format!("--dir={CONFIG_DIR}"),
    ];
    if once {
        args.push("--once".to_owned());
        if let Some(access) = &instance.proxy_access {
            args.push(format!("--trust-epoch={}", access.trust.epoch));
        }
    } else {
        args.push(format!("--pid-file={CONFIG_DIR}/{PID_FILE}"));
    }
    Container {
        name: if once {
            format!("{CONFIG_CONTAINER}-init")
        } else {
            CONFIG_CONTAINER.to_owned()
        },
        image: Some(instance.operator_image.to_owned()),
        image_pull_policy: Some("IfNotPresent".to_owned()),
        args: Some(args),
        env: Some(vec![
            EnvVar {
                name: "POD_NAMESPACE".to_owned(),
                value_from: Some(EnvVarSource {
                    field_ref: Some(ObjectFieldSelector {
                        field_path: "metadata.namespace".to_owned(),
                        ..ObjectFieldSelector::default()
                    }),
                    ..EnvVarSource::default()
                }),
                ..EnvVar::default()
            },
            EnvVar {
                name: "PROXY_STATS_ADDRESS".to_owned(),
                value: Some(stats_address(
                    instance.spec.container_port,
                    instance.spec.tls().is_some(),
                )),
                ..EnvVar::default()
            },
        ]),
        resources: Some(requirements("10m", "16Mi", "64Mi")),
        security_context: Some(restricted()),
        volume_mounts: Some(vec![config_mount(), access::token_mount()]),
        ..Container::default()
    }
}

/// The shared directory, writable by both: the writer puts the configuration there, memcached its pid.
fn config_mount() -> VolumeMount {
    VolumeMount {
        name: CONFIG_VOLUME.to_owned(),
        mount_path: CONFIG_DIR.to_owned(),
        ..VolumeMount::default()
    }
}

/// Requests of 100m CPU and 64Mi memory and a 256Mi memory limit, with the keys of
/// `spec.proxy.resources` replacing them one by one.
pub fn proxy_resources(proxy: &Proxy) -> ResourceRequirements {
    let mut resources = requirements("100m", "64Mi", "256Mi");
    if let Some(given) = proxy.resources.as_deref() {
        if let Some(requests) = &given.requests {
            resources
                .requests
                .get_or_insert_with(Default::default)
                .extend(requests.clone());
        }
        if let Some(limits) = &given.limits {
            resources
                .limits
                .get_or_insert_with(Default::default)
                .extend(limits.clone());
        }
        resources.claims = given.claims.clone();
    }
    resources
}

#[cfg(test)]
mod tests;
