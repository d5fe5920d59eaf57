//! ServiceMonitors: an API the cluster may not serve (the Prometheus Operator's). Asked once at start;
//! watched (as dynamic objects) only where served.

use std::sync::Arc;

use futures::StreamExt;
use futures::future::{BoxFuture, Shared};
use kube::api::DynamicObject;
use kube::runtime::watcher;
use kube::{Api, Client};
use tracing::info;

use super::cached_watch::{Watched, cached, forgets_seen};
use super::discovery::served;
use super::watch_retry::Retries;
use crate::resources::service_monitor;
use crate::store::cache::Cache;
use crate::store::compact::Compact;
use crate::store::written::Written;

/// The ServiceMonitors' cache and watch, when the cluster serves their API (asked once, at start).
pub(super) async fn watch_service_monitors(
    client: &Client,
    ns: Option<&str>,
    retries: &Retries,
    config: watcher::Config,
    written: &Arc<Written>,
    shutdown: Shared<BoxFuture<'static, ()>>,
) -> (
    Option<Cache<DynamicObject>>,
    Option<Watched<Compact<DynamicObject>>>,
) {
    let (api_version, plural) = ("monitoring.coreos.com/v1", "servicemonitors");
    if !served(client, api_version, plural, "ServiceMonitor", shutdown).await {
        info!(
            "the cluster does not serve monitoring.coreos.com/v1 ServiceMonitor; not watching them"
        );
        return (None, None);
    }
    let service_monitor = service_monitor::api_resource();
    let api = match ns {
        Some(ns) => {
            Api::<Compact<DynamicObject>>::namespaced_with(client.clone(), ns, &service_monitor)
        }
        None => Api::<Compact<DynamicObject>>::all_with(client.clone(), &service_monitor),
    };
    let observers = forgets_seen(written, &service_monitor);
    let (store, stream) = cached(retries, "servicemonitors", api, config, observers);
    (Some(store), Some(stream.boxed()))
}
