//! The pod template every memcached server runs in, shared by the Deployment and the StatefulSet so
//! that everything that applies to pods (memcached settings, TLS/auth, exporter, anti-affinity, restricted
//! security, Secret-hash rollouts) applies to both.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Affinity, Capabilities, Container, ContainerPort, ExecAction, KeyToPath, Lifecycle,
    LifecycleHandler, PodAffinityTerm, PodAntiAffinity, PodSecurityContext, PodSpec,
    PodTemplateSpec, Probe, ResourceRequirements, SeccompProfile, SecretVolumeSource,
    SecurityContext, TCPSocketAction, Volume, VolumeMount, WeightedPodAffinityTerm,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::instance::Instance;
use super::{args, labels};
use crate::api::names::served_auth_name;
use crate::api::{AntiAffinity, DEFAULT_EXPORTER_IMAGE, MemcachedSpec};

/// Name of the memcached container (and of its port).
pub const CONTAINER_NAME: &str = "memcached";
/// Name of the memcached port on the container and the Services.
pub const PORT_NAME: &str = "memcached";
/// Name of the exporter container.
pub const EXPORTER_NAME: &str = "exporter";
/// Name of the exporter's port on the container and the client Service.
pub const METRICS_PORT_NAME: &str = "metrics";
/// Port of the exporter.
pub const METRICS_PORT: i32 = 9150;
/// UID and GID of the `memcache` user in the official memcached images. Set explicitly because the
/// images name their user instead of numbering it, and `runAsNonRoot` needs a number to verify.
pub const RUN_AS_USER: i64 = 11211;
/// Pod-template annotation carrying the hash of the referenced Secrets' content: a change rolls the pods.
pub const SECRET_HASH_ANNOTATION: &str = "cache.example.com/secret-hash";
/// Node label the anti-affinity spreads across.
const HOSTNAME_TOPOLOGY: &str = "kubernetes.io/hostname";

const TLS_VOLUME: &str = "tls";
/// The exporter's own view of the TLS Secret: only the keys it reads.
const EXPORTER_TLS_VOLUME: &str = "exporter-tls";
const EXPORTER_TLS_DIR: &str = "/etc/memcached-exporter/tls";
const AUTH_VOLUME: &str = "auth";

/// The pod template for `instance`. `secret_hash` is the hash of the referenced Secrets' content (when
/// any are referenced): carried as an annotation, so a changed Secret rolls the pods.
pub fn template(instance: &Instance<'_>, secret_hash: Option<&str>) -> PodTemplateSpec {
    let annotations = secret_hash
        .map(|hash| BTreeMap::from([(SECRET_HASH_ANNOTATION.to_owned(), hash.to_owned())]));
    PodTemplateSpec {
        metadata: Some(ObjectMeta {
            labels: Some(labels::common_labels(instance.name)),
            annotations,
            ..ObjectMeta::default()
        }),
        spec: Some(pod_spec(instance)),
    }
}

/// Whether the pods must never share a node (hard anti-affinity from `highAvailability`, not overridden
/// by a podAntiAffinity of the spec's own).
pub fn hard_anti_affinity(spec: &MemcachedSpec) -> bool {
    spec.high_availability().anti_affinity() == AntiAffinity::Hard
        && spec
            .affinity
            .as_ref()
            .and_then(|a| a.pod_anti_affinity.as_ref())
            .is_none()
}

fn pod_spec(instance: &Instance<'_>) -> PodSpec {
    let spec = instance.spec;
    let mut containers = vec![memcached_container(instance)];
    if spec.exporter().is_some() {
        containers.push(exporter_container(instance));
    }
    let volumes = volumes(instance.name, spec);
    PodSpec {
        containers,
        // memcached never talks to the API server, and the Service env vars are noise for it.
        automount_service_account_token: Some(false),
        enable_service_links: Some(false),
        security_context: Some(PodSecurityContext {
            run_as_non_root: Some(true),
            run_as_user: Some(RUN_AS_USER),
            run_as_group: Some(RUN_AS_USER),
            // Secret files are group-readable (0440) by this group only.
            fs_group: (!volumes.is_empty()).then_some(RUN_AS_USER),
            seccomp_profile: Some(SeccompProfile {
                type_: "RuntimeDefault".to_owned(),
                ..SeccompProfile::default()
            }),
            ..PodSecurityContext::default()
        }),
        termination_grace_period_seconds: Some(
            spec.high_availability().termination_grace_period_seconds(),
        ),
        affinity: affinity(instance),
        node_selector: spec.node_selector.clone(),
        tolerations: spec.tolerations.clone(),
        topology_spread_constraints: spec.topology_spread_constraints.clone(),
        priority_class_name: spec.priority_class_name.clone(),
        volumes: (!volumes.is_empty()).then_some(volumes),
        ..PodSpec::default()
    }
}

/// The spec's affinity, plus the anti-affinity of `highAvailability.antiAffinity` unless the spec brings
/// its own podAntiAffinity.
fn affinity(instance: &Instance<'_>) -> Option<Affinity> {
    let mut affinity = instance
        .spec
        .affinity
        .as_deref()
        .cloned()
        .unwrap_or_default();
    if affinity.pod_anti_affinity.is_none() {
        let term = PodAffinityTerm {
            label_selector: Some(LabelSelector {
                match_labels: Some(labels::selector_labels(instance.name)),
                ..LabelSelector::default()
            }),
            topology_key: HOSTNAME_TOPOLOGY.to_owned(),
            ..PodAffinityTerm::default()
        };
        affinity.pod_anti_affinity = match instance.spec.high_availability().anti_affinity() {
            AntiAffinity::None => None,
            AntiAffinity::Soft => Some(PodAntiAffinity {
                preferred_during_scheduling_ignored_during_execution: Some(vec![
                    WeightedPodAffinityTerm {
                        weight: 100,
                        pod_affinity_term: term,
                    },
                ]),
                ..PodAntiAffinity::default()
            }),
            AntiAffinity::Hard => Some(PodAntiAffinity {
                required_during_scheduling_ignored_during_execution: Some(vec![term]),
                ..PodAntiAffinity::default()
            }),
        };
    }
    (affinity != Affinity::default()).then_some(affinity)
}

fn volumes(name: &str, spec: &MemcachedSpec) -> Vec<Volume> {
    let secret = |name: &str, secret_name: &str| Volume {
        name: name.to_owned(),
        secret: Some(SecretVolumeSource {
            secret_name: Some(secret_name.to_owned()),
            default_mode: Some(0o440),
            ..SecretVolumeSource::default()
        }),
        ..Volume::default()
    };
    let mut volumes = Vec::new();
    if let Some(tls) = spec.tls() {
        volumes.push(secret(TLS_VOLUME, &tls.secret_name));
        if spec.exporter().is_some() {
            let mut only = secret(EXPORTER_TLS_VOLUME, &tls.secret_name);
            if let Some(source) = only.secret.as_mut() {
                source.items = Some(files(exporter_tls_keys(tls.client_auth)));
            }
            volumes.push(only);
        }
    }
    if spec.auth().is_some() {
        // The operator's copy of the user's file with its own entry added (`auth_file::served`).
        volumes.push(secret(AUTH_VOLUME, &served_auth_name(name)));
    }
    volumes
}

/// The volume items that project each of `keys` to a file of the same name.
pub(super) fn files(keys: &[&str]) -> Vec<KeyToPath> {
    let file = |key: &&str| KeyToPath {
        key: (*key).to_owned(),
        path: (*key).to_owned(),
        mode: None,
    };
    keys.iter().map(file).collect()
}

pub(super) fn mount(name: &str, path: &str) -> VolumeMount {
    VolumeMount {
        name: name.to_owned(),
        mount_path: path.to_owned(),
        read_only: Some(true),
        ..VolumeMount::default()
    }
}

/// The exporter's TLS flags. It dials memcached over loopback and verifies it all the same, by the name
/// the operator also requires of a server's certificate (`<name>.<namespace>.svc`): against the CA
/// (`ca.crt`) when the servers ask for client certificates (the Secret has one then), else against the
/// server's own certificate (`tls.crt`), which the exporter reads at start (so a rotated certificate rolls
/// the pods when the exporter runs: see [`super::secrets::tls_reload`]). Its volume holds only the keys
/// it reads: the private key only when it must present a client certificate.
fn exporter_tls_args(instance: &Instance<'_>, client_auth: bool) -> Vec<String> {
    let trusted = if client_auth { "ca.crt" } else { "tls.crt" };
    let mut flags = vec![
        "--memcached.tls.enable".to_owned(),
        format!(
            "--memcached.tls.server-name={}.{}.svc",
            instance.name, instance.namespace
        ),
        format!("--memcached.tls.ca-file={EXPORTER_TLS_DIR}/{trusted}"),
    ];
    if client_auth {
        flags.push(format!(
            "--memcached.tls.cert-file={EXPORTER_TLS_DIR}/tls.crt"
        ));
        flags.push(format!(
            "--memcached.tls.key-file={EXPORTER_TLS_DIR}/tls.key"
        ));
    }
    flags
}

/// The keys of the TLS Secret the exporter reads (see [`exporter_tls_args`]).
fn exporter_tls_keys(client_auth: bool) -> &'static [&'static str] {
    if client_auth {
        &["ca.crt", "tls.crt", "tls.key"]
    } else {
        &["tls.crt"]
    }
}

/// The auth file alone, as a `subPath` mount: the kubelet binds the file as it is when the container
/// starts and does not follow it while the container runs (a directory mount follows every change of the
/// Secret). A real kubelet (1.19+) binds it again to the current file when the container restarts, so what
/// a restarted memcached reads is whatever the mounted Secret holds then: the operator's copy
/// (`auth_file::served_secret`), which it writes only from a file it has checked.
fn auth_file_mount(key: &str) -> VolumeMount {
    VolumeMount {
        sub_path: Some(key.to_owned()),
        ..mount(AUTH_VOLUME, &format!("{}/{key}", args::AUTH_DIR))
    }
}

/// The restricted-profile container security context every container gets.
pub(super) fn restricted() -> SecurityContext {
    SecurityContext {
        allow_privilege_escalation: Some(false),
        read_only_root_filesystem: Some(true),
        run_as_non_root: Some(true),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".to_owned()]),
            ..Capabilities::default()
        }),
        ..SecurityContext::default()
    }
}

pub(super) fn tcp_probe(port: &str, initial_delay: i32, period: i32, timeout: i32) -> Probe {
    Probe {
        tcp_socket: Some(TCPSocketAction {
            port: IntOrString::String(port.to_owned()),
            ..TCPSocketAction::default()
        }),
        initial_delay_seconds: Some(initial_delay),
        period_seconds: Some(period),
        timeout_seconds: Some(timeout),
        failure_threshold: Some(3),
        ..Probe::default()
    }
}

fn memcached_container(instance: &Instance<'_>) -> Container {
    let spec = instance.spec;
    let mut mounts = Vec::new();
    if spec.tls().is_some() {
        mounts.push(mount(TLS_VOLUME, args::TLS_DIR));
    }
    if let Some(auth) = spec.auth() {
        mounts.push(auth_file_mount(auth.key()));
    }
    let delay = spec.high_availability().pre_stop_delay_seconds();
    // Endpoints are removed when the pod starts terminating; sleeping first lets clients and kube-proxy
    // catch up before memcached gets SIGTERM.
    let lifecycle = (delay > 0).then(|| Lifecycle {
        pre_stop: Some(LifecycleHandler {
            exec: Some(ExecAction {
                command: Some(vec!["sleep".to_owned(), delay.to_string()]),
            }),
            ..LifecycleHandler::default()
        }),
        ..Lifecycle::default()
    });
    Container {
        name: CONTAINER_NAME.to_owned(),
        image: Some(instance.image.to_owned()),
        image_pull_policy: Some("IfNotPresent".to_owned()),
        command: Some(args::command()),
        args: Some(args::args(spec)),
        ports: Some(vec![ContainerPort {
            name: Some(PORT_NAME.to_owned()),
            container_port: spec.container_port,
            protocol: Some("TCP".to_owned()),
            ..ContainerPort::default()
        }]),
        readiness_probe: Some(tcp_probe(PORT_NAME, 2, 5, 2)),
        liveness_probe: Some(tcp_probe(PORT_NAME, 10, 10, 5)),
        lifecycle,
        resources: Some(memcached_resources(spec)),
        security_context: Some(restricted()),
        volume_mounts: (!mounts.is_empty()).then_some(mounts),
        ..Container::default()
    }
}

/// The exporter sidecar. It has no readiness probe on purpose: an exporter problem must not take the
/// memcached pod out of the Service.
fn exporter_container(instance: &Instance<'_>) -> Container {
    let spec = instance.spec;
    let exporter = spec.exporter().cloned().unwrap_or_default();
    let mut container_args = vec![
        format!("--memcached.address=localhost:{}", spec.container_port),
        format!("--web.listen-address=:{METRICS_PORT}"),
    ];
    let mut mounts = Vec::new();
    if let Some(tls) = spec.tls() {
        container_args.extend(exporter_tls_args(instance, tls.client_auth));
        mounts.push(mount(EXPORTER_TLS_VOLUME, EXPORTER_TLS_DIR));
    }
    Container {
        name: EXPORTER_NAME.to_owned(),
        image: Some(
            exporter
                .image
                .unwrap_or_else(|| DEFAULT_EXPORTER_IMAGE.to_owned()),
        ),
        image_pull_policy: Some("IfNotPresent".to_owned()),
        args: Some(container_args),
        ports: Some(vec![ContainerPort {
            name: Some(METRICS_PORT_NAME.to_owned()),
            container_port: METRICS_PORT,
            protocol: Some("TCP".to_owned()),
            ..ContainerPort::default()
        }]),
        liveness_probe: Some(tcp_probe(METRICS_PORT_NAME, 10, 20, 5)),
        resources: Some(
            exporter
                .resources
                .unwrap_or_else(|| requirements("10m", "32Mi", "64Mi")),
        ),
        security_context: Some(restricted()),
        volume_mounts: (!mounts.is_empty()).then_some(mounts),
        ..Container::default()
    }
}

pub(super) fn requirements(
    cpu: &str,
    memory_request: &str,
    memory_limit: &str,
) -> ResourceRequirements {
    ResourceRequirements {
        requests: Some(BTreeMap::from([
            ("cpu".to_owned(), Quantity(cpu.to_owned())),
            ("memory".to_owned(), Quantity(memory_request.to_owned())),
        ])),
        limits: Some(BTreeMap::from([(
            "memory".to_owned(),
            Quantity(memory_limit.to_owned()),
        )])),
        ..ResourceRequirements::default()
    }
}

/// Requests and limits for memcached: derived from its item memory and what memcached may use beyond it
/// (`memory::overhead_mb`: slab pages past `-m`, the hash table, threads and connections; memory requests
/// equal limits because a cache should not be evicted), with the keys of `spec.resources` replacing the
/// derived ones one by one.
pub fn memcached_resources(spec: &MemcachedSpec) -> ResourceRequirements {
    let config = spec.memcached();
    let memory = format!(
        "{}Mi",
        config
            .max_memory_mb()
            .saturating_add(super::memory::overhead_mb(&config))
    );
    let mut resources = requirements("100m", &memory, &memory);
    if let Some(user) = &spec.resources {
        let overlay = |derived: &mut Option<BTreeMap<String, Quantity>>,
                       given: &Option<BTreeMap<String, Quantity>>| {
            if let Some(given) = given {
                derived
                    .get_or_insert_with(BTreeMap::new)
                    .extend(given.clone());
            }
        };
        overlay(&mut resources.requests, &user.requests);
        overlay(&mut resources.limits, &user.limits);
        resources.claims = user.claims.clone();
    }
    resources
}
