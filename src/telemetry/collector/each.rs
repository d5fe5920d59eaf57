//! One read per pod, servers' or proxies' alike: each in its own task under the collector's bound on reads
//! in flight, counted by result, and gathered by pod with a problem naming those that failed; and which
//! pods are read: the ready ones with an address ([`addresses`]).

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use tokio::task::JoinSet;
use tracing::debug;

use super::state::Collector;
use crate::resources::servers;
use crate::telemetry::client::ReadError;

/// What is read: the words of the log line and of the problem.
pub(super) struct Subject {
    /// What a read gets, in "cannot read {stats}".
    pub stats: &'static str,
    /// What the pods are, in "2 of 3 {pods} could not be read".
    pub pods: &'static str,
}

/// The readings by pod (`None`: not read) and, when some failed, which and why.
pub(super) struct Gathered<R> {
    pub readings: BTreeMap<String, Option<R>>,
    pub problem: Option<String>,
}

impl Collector {
    /// Runs `reads` (one per pod, not started yet), each in its own task once a permit is free.
    pub(super) async fn read_each<R: Send + 'static>(
        &self,
        reads: Vec<(String, BoxFuture<'static, Result<R, ReadError>>)>,
        subject: Subject,
    ) -> Gathered<R> {
        let pods: Vec<String> = reads.iter().map(|(pod, _)| pod.clone()).collect();
        let mut tasks = JoinSet::new();
        for (pod, read) in reads {
            let permits = self.permits.clone();
            tasks.spawn(async move {
                // The semaphore is never closed; without a permit there is nothing to read with.
                let Ok(_permit) = permits.acquire_owned().await else {
                    return (pod, None);
                };
                (pod, Some(read.await))
            });
        }
        let mut readings = BTreeMap::new();
        let mut failures = Vec::new();
        while let Some(joined) = tasks.join_next().await {
            let Ok((pod, result)) = joined else { continue };
            let reading = match result {
                Some(Ok(reading)) => {
                    self.metrics.count_read("ok");
                    Some(reading)
                }
                Some(Err(error)) => {
                    self.metrics.count_read(error.reason());
                    debug!(%pod, %error, "cannot read {}", subject.stats);
                    failures.push(format!("{pod}: {}", error.reason()));
                    None
                }
                None => None,
            };
            readings.insert(pod, reading);
        }
        // A read task that panicked leaves its pod out: count it as unread.
        for pod in &pods {
            readings.entry(pod.clone()).or_insert(None);
        }
        failures.sort();
        let problem = (!failures.is_empty()).then(|| {
            let (failed, of, pods) = (failures.len(), pods.len(), subject.pods);
            format!(
                "{failed} of {of} {pods} could not be read ({})",
                failures.join(", ")
            )
        });
        Gathered { readings, problem }
    }
}

/// Of `pods`, the ready, non-terminating ones with an address: (pod name, podIP:port), by name.
pub(super) fn addresses(pods: &[Arc<Pod>], port: u16) -> Vec<(String, SocketAddr)> {
    let mut addresses: Vec<_> = pods.iter().filter_map(|pod| address(pod, port)).collect();
    addresses.sort();
    addresses
}

/// `podIP:port` of a ready, non-terminating pod with an address.
fn address(pod: &Pod, port: u16) -> Option<(String, SocketAddr)> {
    if pod.metadata.deletion_timestamp.is_some() || !servers::is_ready(pod) {
        return None;
    }
    let ip: IpAddr = pod.status.as_ref()?.pod_ip.as_deref()?.parse().ok()?;
    Some((pod.name_any(), SocketAddr::new(ip, port)))
}
