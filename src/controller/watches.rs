//! The watches that feed the caches and trigger reconciles, and the controller loop itself.
//!
//! - `Memcached`: all of them (in the watched namespace), the reconciled kind.
//! - Deployments and Services: only those labelled `app.kubernetes.io/managed-by=memcached-operator`; a
//!   change or deletion triggers the owning instance through its controller owner reference.
//! - Pods: same label scope, trimmed to metadata and status (the spec is the largest part of a pod and
//!   is never read); a change triggers the instance named by the `app.kubernetes.io/instance` label.
//!
//! `managedFields` are dropped from everything cached. Watches restart with backoff on errors, and a
//! watch that expired (410 Gone) is re-listed by the watcher.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::runtime::controller::{Config as ControllerConfig, Controller};
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use std::fmt::Debug;
use tracing::{info, warn};

use super::{Context, Settings, Stores, error_policy, reconcile, system_clock};
use crate::api::Memcached;
use crate::metrics::Metrics;
use crate::resources::labels;

/// Where and how to run the controller.
pub struct RunOptions {
    /// Watch only this namespace; all namespaces when `None`.
    pub namespace: Option<String>,
    /// Most reconciles running at once.
    pub concurrency: u16,
    /// Reconciler tunables.
    pub settings: Settings,
    /// Identity of this replica in the events it records (the pod name).
    pub reporter_instance: Option<String>,
}

fn api<K>(client: &Client, namespace: Option<&str>) -> Api<K>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// Removes what the operator never reads from a cached object.
pub fn trim_meta<K: Resource>(obj: &mut K) {
    obj.meta_mut().managed_fields = None;
}

/// Keeps of a pod only what status computation reads: identity, labels, deletion, and status.
pub fn trim_pod(pod: &mut Pod) {
    pod.metadata.managed_fields = None;
    pod.metadata.annotations = None;
    pod.spec = None;
}

/// Runs the controller until `shutdown` resolves; in-flight reconciles finish first.
/// `synced` turns true once every cache has its initial list.
pub async fn run(
    client: Client,
    metrics: Arc<Metrics>,
    options: RunOptions,
    synced: Arc<AtomicBool>,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let ns = options.namespace.as_deref();
    let children = watcher::Config::default()
        .labels(&labels::managed_selector())
        .any_semantic();

    let (memcacheds, mc_writer) = reflector::store::<Memcached>();
    let mc_stream = watcher(
        api::<Memcached>(&client, ns),
        watcher::Config::default().any_semantic(),
    )
    .default_backoff()
    .modify(trim_meta)
    .reflect(mc_writer)
    .applied_objects();

    let (deployments, deployment_stream) =
        cached(api::<Deployment>(&client, ns), children.clone(), trim_meta);
    let (services, service_stream) =
        cached(api::<Service>(&client, ns), children.clone(), trim_meta);
    let (pods, pod_stream) = cached(api::<Pod>(&client, ns), children, trim_pod);

    let stores = Stores {
        memcacheds: memcacheds.clone(),
        deployments,
        services,
        pods,
    };
    tokio::spawn(mark_synced(stores.clone(), synced));
    let ctx = Arc::new(Context::new(
        client,
        options.settings,
        stores,
        metrics,
        options.reporter_instance,
        system_clock(),
    ));

    info!(
        namespace = ns.unwrap_or("<all>"),
        concurrency = options.concurrency,
        "starting controller"
    );
    Controller::for_stream(mc_stream, memcacheds)
        .owns_stream(deployment_stream)
        .owns_stream(service_stream)
        .watches_stream(pod_stream, pod_owner)
        .with_config(ControllerConfig::default().concurrency(options.concurrency))
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            if let Err(error) = result {
                // Reconcile failures are logged by reconcile itself; these are queue or watch problems.
                match error {
                    kube::runtime::controller::Error::ReconcilerFailed(..) => {}
                    kube::runtime::controller::Error::ObjectNotFound(obj) => {
                        tracing::debug!(%obj, "object gone before its reconcile ran")
                    }
                    other => warn!(error = %other, "controller error"),
                }
            }
        })
        .await;
    info!("controller stopped");
}

/// A label-scoped, trimmed, cached watch of children: its store, and the stream of touched objects
/// (deletions included, so a deleted child triggers its owner and is recreated).
fn cached<K>(
    api: Api<K>,
    config: watcher::Config,
    trim: fn(&mut K),
) -> (
    reflector::Store<K>,
    impl futures::Stream<Item = Result<K, watcher::Error>> + Send + 'static,
)
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    let (store, writer) = reflector::store::<K>();
    let stream = watcher(api, config)
        .default_backoff()
        .modify(trim)
        .reflect(writer)
        .touched_objects();
    (store, stream)
}

/// The instance a pod belongs to, from its labels.
pub fn pod_owner(pod: Pod) -> Option<ObjectRef<Memcached>> {
    let labels = pod.labels();
    if labels.get(labels::NAME_KEY).map(String::as_str) != Some(labels::APP_NAME) {
        return None;
    }
    let name = labels.get(labels::INSTANCE_KEY)?;
    let namespace = pod.namespace()?;
    Some(ObjectRef::new(name).within(&namespace))
}

async fn mark_synced(stores: Stores, synced: Arc<AtomicBool>) {
    let ready = futures::future::try_join4(
        stores.memcacheds.wait_until_ready(),
        stores.deployments.wait_until_ready(),
        stores.services.wait_until_ready(),
        stores.pods.wait_until_ready(),
    )
    .await;
    if ready.is_ok() {
        info!("caches synced");
        synced.store(true, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn pods_map_to_their_instance_by_label() {
        let pod: Pod = serde_json::from_value(json!({"metadata": {"name": "cache-x", "namespace": "ns",
            "labels": {"app.kubernetes.io/name": "memcached", "app.kubernetes.io/instance": "cache"}}}))
        .unwrap();
        assert_eq!(pod_owner(pod), Some(ObjectRef::new("cache").within("ns")));
        let foreign: Pod =
            serde_json::from_value(json!({"metadata": {"name": "x", "namespace": "ns",
            "labels": {"app.kubernetes.io/name": "redis", "app.kubernetes.io/instance": "cache"}}}))
            .unwrap();
        assert_eq!(pod_owner(foreign), None);
    }

    #[test]
    fn pods_are_trimmed_to_what_status_reads() {
        let mut pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p", "annotations": {"a": "b"}, "managedFields": [{"manager": "kubelet"}]},
            "spec": {"containers": [{"name": "memcached"}]},
            "status": {"phase": "Running"}
        }))
        .unwrap();
        trim_pod(&mut pod);
        assert!(
            pod.spec.is_none()
                && pod.metadata.annotations.is_none()
                && pod.metadata.managed_fields.is_none()
        );
        assert_eq!(pod.status.unwrap().phase.as_deref(), Some("Running"));
    }
}
