//! What the proxy's configuration writer may do: read one ConfigMap, its instance's route configuration
//! `<name>-proxy`, and nothing else.
//!
//! A ServiceAccount `<name>-proxy` per instance, bound to a Role `<name>-proxy` that allows `list` and
//! `watch` on `configmaps` with `resourceNames: [<name>-proxy]` (a list or watch is allowed by it when
//! it selects that one name with `metadata.name=<name>-proxy`, as the writer's watch does; it never
//! reads by `get`, which the operator itself does not hold on ConfigMaps and so could not grant). Its
//! token is mounted into the writer's containers only (the pod does not automount it): memcached never
//! gets it.

use k8s_openapi::api::core::v1::{
    ConfigMapProjection, DownwardAPIProjection, DownwardAPIVolumeFile, ObjectFieldSelector,
    ProjectedVolumeSource, ServiceAccount, ServiceAccountTokenProjection, Volume, VolumeMount,
    VolumeProjection,
};
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};

use super::super::instance::Instance;
use super::super::pod::files;
use super::metadata::meta;
use crate::api::names::proxy_name;

/// Where the writer's containers find their token, the cluster's CA and their namespace: where every
/// Kubernetes client looks in a pod.
pub const TOKEN_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
const TOKEN_VOLUME: &str = "api-access";
/// Lifetime the kubelet gives the projected token (it renews it at 80 %).
const TOKEN_SECONDS: i64 = 3607;

/// The writer's ServiceAccount, or `None` when the proxy is off. It mounts no token of its own.
pub fn service_account(instance: &Instance<'_>) -> Option<ServiceAccount> {
    instance.spec.proxy()?;
    Some(ServiceAccount {
        metadata: meta(instance),
        automount_service_account_token: Some(false),
        ..ServiceAccount::default()
    })
}

/// Read access to the route configuration, by name.
pub fn role(instance: &Instance<'_>) -> Option<Role> {
    instance.spec.proxy()?;
    Some(Role {
        metadata: meta(instance),
        rules: Some(vec![PolicyRule {
            api_groups: Some(vec![String::new()]),
            resources: Some(vec!["configmaps".to_owned()]),
            resource_names: Some(vec![proxy_name(instance.name)]),
            verbs: ["list", "watch"].map(String::from).to_vec(),
            ..PolicyRule::default()
        }]),
    })
}

/// The Role bound to the ServiceAccount.
pub fn role_binding(instance: &Instance<'_>) -> Option<RoleBinding> {
    instance.spec.proxy()?;
    let name = proxy_name(instance.name);
    Some(RoleBinding {
        metadata: meta(instance),
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".to_owned(),
            kind: "Role".to_owned(),
            name: name.clone(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".to_owned(),
            name,
            namespace: Some(instance.namespace.to_owned()),
            ..Subject::default()
        }]),
    })
}

/// The projected volume of the ServiceAccount's token, the cluster's CA and the namespace, as the
/// kubelet's automount builds it.
pub(super) fn token_volume() -> Volume {
    Volume {
        name: TOKEN_VOLUME.to_owned(),
        projected: Some(ProjectedVolumeSource {
            sources: Some(vec![
                VolumeProjection {
                    service_account_token: Some(ServiceAccountTokenProjection {
                        path: "token".to_owned(),
                        expiration_seconds: Some(TOKEN_SECONDS),
                        ..ServiceAccountTokenProjection::default()
                    }),
                    ..VolumeProjection::default()
                },
                VolumeProjection {
                    config_map: Some(ConfigMapProjection {
                        name: "kube-root-ca.crt".to_owned(),
                        items: Some(files(&["ca.crt"])),
                        ..ConfigMapProjection::default()
                    }),
                    ..VolumeProjection::default()
                },
                VolumeProjection {
                    downward_api: Some(DownwardAPIProjection {
                        items: Some(vec![DownwardAPIVolumeFile {
                            path: "namespace".to_owned(),
                            field_ref: Some(ObjectFieldSelector {
                                field_path: "metadata.namespace".to_owned(),
                                ..ObjectFieldSelector::default()
                            }),
                            ..DownwardAPIVolumeFile::default()
                        }]),
                    }),
                    ..VolumeProjection::default()
                },
            ]),
            ..ProjectedVolumeSource::default()
        }),
        ..Volume::default()
    }
}

pub(super) fn token_mount() -> VolumeMount {
    VolumeMount {
        name: TOKEN_VOLUME.to_owned(),
        mount_path: TOKEN_DIR.to_owned(),
        read_only: Some(true),
        ..VolumeMount::default()
    }
}
