//! ServiceMonitors: an API the cluster may not serve (the Prometheus Operator's). Asked once at start;
//! watched (as dynamic objects) only where served.

use std::sync::Arc;

use futures::StreamExt;
use futures::future::{BoxFuture, Shared};
use kube::api::DynamicObject;
use kube::runtime::watcher;
use kube::{Api, Client};
use tracing::{debug, info, warn};

use super::cached_watch::{Watched, cached, forgets_seen};
use super::watch_retry::{FIRST_RETRY, LONGEST_RETRY};
use crate::metrics::Metrics;
use crate::resources::service_monitor;
use crate::store::cache::Cache;
use crate::store::compact::Compact;
use crate::store::written::Written;

/// The ServiceMonitors' cache and watch, when the cluster serves their API (asked once, at start).
pub(super) async fn watch_service_monitors(
    client: &Client,
    ns: Option<&str>,
    metrics: &Arc<Metrics>,
    config: watcher::Config,
    written: &Arc<Written>,
    shutdown: Shared<BoxFuture<'static, ()>>,
) -> (
    Option<Cache<DynamicObject>>,
    Option<Watched<Compact<DynamicObject>>>,
) {
    if !service_monitors_served(client, shutdown).await {
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
    let (store, stream) = cached(metrics, "servicemonitors", api, config, observers);
    (Some(store), Some(stream.boxed()))
}

/// Whether the cluster serves the Prometheus Operator's ServiceMonitor API. Asked until it answers (an
/// operator started during an API-server outage must not decide "not served" from a refused connection),
/// or until shutdown; an error that a retry cannot fix (403, other 4xx) counts as not served.
async fn service_monitors_served(
    client: &Client,
    shutdown: Shared<BoxFuture<'static, ()>>,
) -> bool {
    let mut delay = FIRST_RETRY;
    loop {
        match client
            .list_api_group_resources("monitoring.coreos.com/v1")
            .await
        {
            Ok(list) => return list.resources.iter().any(|r| r.name == "servicemonitors"),
            Err(kube::Error::Api(status)) if status.code == 404 => return false,
            Err(kube::Error::Api(status)) if status.code < 500 => {
                warn!(error = %status.message, "cannot discover the ServiceMonitor API; ServiceMonitors are not managed");
                return false;
            }
            Err(error) => {
                debug!(%error, "cannot discover the ServiceMonitor API yet; retrying");
            }
        }
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            () = shutdown.clone() => return false,
        }
        delay = (delay * 2).min(LONGEST_RETRY);
    }
}
