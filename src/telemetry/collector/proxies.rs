//! The collector's reads of the proxy pods (`spec.proxy`): the same transport, timeout and bound on reads
//! in flight as the servers', `stats` and `stats proxybe` on one connection ([`super::super::proxy`]).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;

use super::each::{Gathered, Subject, addresses};
use super::state::{Collector, READ_TIMEOUT};
use crate::api::Memcached;
use crate::connection::ServerNames;
use crate::resources::proxy::{proxy_name, stats_port};
use crate::resources::servers::{entry, is_ready};
use crate::store::pod_index::still_at;
use crate::store::secrets::Transport;
use crate::telemetry::client::{ProxyReading, Target};
use crate::telemetry::metrics::{InstanceKey, ProxySamples};
use crate::telemetry::proxy::{ProxySample, backends};

/// What the reads of one instance's proxy pods gave.
#[derive(Default)]
pub(super) struct ProxyReads {
    /// By pod: what it said, or `None` when it could not be read.
    pub readings: BTreeMap<String, Option<ProxyReading>>,
    /// Which could not be read, and why.
    pub problem: Option<String>,
}

impl ProxyReads {
    /// Every pod unreadable (the instance's Secrets do not give what is needed).
    pub fn unreadable(proxies: &[(String, SocketAddr)]) -> Self {
        Self {
            readings: proxies.iter().map(|(pod, _)| (pod.clone(), None)).collect(),
            problem: None,
        }
    }

    /// The samples of the metrics and the summary: each reading's backends matched to the list the
    /// instance publishes (`status.servers`), which the proxy's route configuration is made of, a slot by
    /// its published address or by its address in `routed` (see [`remember_routed`]: a StatefulSet's
    /// route lists the pods' addresses).
    pub fn samples(self, mc: &Memcached, routed: &BTreeMap<i32, String>) -> ProxySamples {
        let published = mc
            .status
            .as_ref()
            .map(|status| status.servers.as_slice())
            .unwrap_or_default();
        self.readings
            .into_iter()
            .map(|(pod, reading)| {
                let sample = reading.map(|reading| ProxySample {
                    backends: backends(published, routed, &reading.down),
                    counters: reading.counters,
                });
                (pod, sample)
            })
            .collect()
    }
}

/// Keeps in `routed`, for each slot of `mc`'s `status.servers`, the address (`ip:port`) of the slot's pod
/// as last seen ready among `pods`, as the operator keeps it in the proxy's route for a StatefulSet; slots
/// no longer listed are forgotten.
pub(super) fn remember_routed(
    routed: &mut BTreeMap<i32, String>,
    mc: &Memcached,
    pods: &[Arc<Pod>],
) {
    let servers = mc
        .status
        .as_ref()
        .map(|status| status.servers.as_slice())
        .unwrap_or_default();
    routed.retain(|slot, _| servers.iter().any(|s| s.slot == *slot));
    for server in servers {
        let Some(name) = server.pod.as_deref() else {
            continue;
        };
        let pod = pods
            .iter()
            .find(|p| p.metadata.name.as_deref() == Some(name));
        let ip = pod
            .filter(|p| p.metadata.deletion_timestamp.is_none() && is_ready(p))
            .and_then(|p| p.status.as_ref()?.pod_ip.as_deref());
        if let Some(ip) = ip.filter(|ip| !ip.is_empty()) {
            routed.insert(server.slot, entry(ip, mc.spec.container_port));
        }
    }
}

impl Collector {
    /// The instance's ready, non-terminating proxy pods with an address, when its proxy is on.
    pub(super) fn proxies(
        &self,
        (namespace, name): &InstanceKey,
        mc: &Memcached,
    ) -> Vec<(String, SocketAddr)> {
        let Ok(port) = u16::try_from(stats_port(&mc.spec)) else {
            return Vec::new();
        };
        if mc.spec.proxy().is_none() {
            return Vec::new();
        }
        let pods = self
            .pods
            .index
            .proxy_pods(&self.pods.store, namespace, name);
        addresses(&pods, port)
    }

    /// Reads every proxy pod, each in its own task, with the servers' transport; over TLS the proxy's
    /// certificate is checked against the proxy Service's names, and never asked to reload.
    pub(super) async fn read_proxies(
        &self,
        (namespace, name): &InstanceKey,
        proxies: &[(String, SocketAddr)],
        transport: &Transport,
    ) -> ProxyReads {
        let service = proxy_name(name);
        let domain = &self.settings.cluster_domain;
        let mut reads = Vec::new();
        for (pod, address) in proxies {
            let names = match transport.tls {
                Some(_) => ServerNames::new([
                    format!("{service}.{namespace}.svc"),
                    format!("{service}.{namespace}.svc.{domain}"),
                ]),
                None => ServerNames::default(),
            };
            let target = Target {
                address: *address,
                tls: transport.tls.clone(),
                names,
                credentials: transport.credentials.clone(),
                still_the_pod: Some(still_at(&self.pods.store, namespace, pod, address.ip())),
                certificate: None,
            };
            reads.push((pod.clone(), self.reader.read_proxy(target, READ_TIMEOUT)));
        }
        let subject = Subject {
            stats: "memcached proxy stats",
            pods: "proxy pods",
        };
        let Gathered { readings, problem } = self.read_each(reads, subject).await;
        ProxyReads { readings, problem }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{MemcachedSpec, MemcachedStatus, Server};
    use crate::resources::testing::memcached;

    fn pod(name: &str, ip: &str, ready: bool) -> Arc<Pod> {
        let status = if ready { "True" } else { "False" };
        Arc::new(
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": name},
                "status": {"podIP": ip, "conditions": [{"type": "Ready", "status": status}]},
            }))
            .unwrap(),
        )
    }

    #[test]
    fn a_slot_keeps_the_address_its_pod_last_had_while_ready() {
        let mut mc = memcached("cache", MemcachedSpec::default());
        let server = |slot: i32| Server {
            slot,
            pod: Some(format!("cache-{slot}")),
            address: Some(format!("cache-{slot}.cache-headless.default.svc:11211")),
            ready: true,
        };
        mc.status = Some(MemcachedStatus {
            servers: vec![server(0), server(1)],
            ..MemcachedStatus::default()
        });
        let mut routed = BTreeMap::from([(7, "10.0.0.7:11211".to_owned())]);
        remember_routed(
            &mut routed,
            &mc,
            &[
                pod("cache-0", "10.0.0.1", true),
                pod("cache-1", "10.0.0.2", true),
            ],
        );
        let expected = BTreeMap::from([
            (0, "10.0.0.1:11211".to_owned()),
            (1, "10.0.0.2:11211".to_owned()),
        ]);
        assert_eq!(routed, expected, "an unlisted slot is forgotten");
        // Slot 0's pod replaced and not ready yet, slot 1's gone: both keep their last address.
        remember_routed(&mut routed, &mc, &[pod("cache-0", "10.0.0.9", false)]);
        assert_eq!(routed, expected);
        remember_routed(&mut routed, &mc, &[pod("cache-0", "10.0.0.9", true)]);
        assert_eq!(routed[&0], "10.0.0.9:11211");
    }
}
