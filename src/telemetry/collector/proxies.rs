//! The collector's reads of the proxy pods (`spec.proxy`): the same transport, timeout and bound on reads
//! in flight as the servers', `stats` and `stats proxybe` on one connection ([`super::super::proxy`]);
//! with access control (`spec.proxy.access`, read on the operator's own listener), `stats proxy` too, for
//! the counters of the spec's identities ([`access_names`]).

use std::collections::BTreeMap;
use std::net::SocketAddr;

use super::each::{Gathered, Subject, addresses};
use super::state::{Collector, READ_TIMEOUT};
use crate::api::Memcached;
use crate::api::MemcachedSpec;
use crate::connection::ServerNames;
use crate::resources::proxy::{proxy_name, stats_port};
use crate::store::pod_index::still_at;
use crate::store::secrets::Transport;
use crate::telemetry::client::{ProxyReading, Target};
use crate::telemetry::metrics::{InstanceKey, ProxySamples};
use crate::telemetry::proxy::{AccessNames, ProxySample, backends};

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
    /// instance publishes (`status.servers`), which the proxy's route configuration is made of.
    pub fn samples(self, mc: &Memcached) -> ProxySamples {
        let published = mc
            .status
            .as_ref()
            .map(|status| status.servers.as_slice())
            .unwrap_or_default();
        self.readings
            .into_iter()
            .map(|(pod, reading)| {
                let sample = reading.map(|reading| ProxySample {
                    backends: backends(published, &reading.down),
                    counters: reading.counters,
                    access: reading.access,
                });
                (pod, sample)
            })
            .collect()
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
        mc: &Memcached,
        proxies: &[(String, SocketAddr)],
        transport: &Transport,
    ) -> ProxyReads {
        let service = proxy_name(name);
        let domain = &self.settings.cluster_domain;
        let access = access_names(&mc.spec);
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
            let read = self.reader.read_proxy(target, READ_TIMEOUT, access.clone());
            reads.push((pod.clone(), read));
        }
        let subject = Subject {
            stats: "memcached proxy stats",
            pods: "proxy pods",
        };
        let Gathered { readings, problem } = self.read_each(reads, subject).await;
        ProxyReads { readings, problem }
    }
}

/// The identities whose counters to read, when the instance's proxy has access control: as
/// [`stats_port`] decides to read the operator's own listener (access needs TLS), the spec's identities
/// and `unknown`. `None` otherwise: no `stats proxy` is sent.
pub(super) fn access_names(spec: &MemcachedSpec) -> Option<AccessNames> {
    let access = spec.proxy()?.access.as_ref()?;
    spec.tls()?;
    Some(AccessNames::of(access))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(value: serde_json::Value) -> MemcachedSpec {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn stats_proxy_is_read_only_with_access_control() {
        let access = serde_json::json!({
            "clientCA": {"secretName": "clients"},
            "identities": [{"name": "orders", "prefixes": ["o:"]}, {"name": "reports", "prefixes": ["r:"]}],
        });
        let tls = serde_json::json!({"tls": {"secretName": "cache-tls"}});
        assert_eq!(
            access_names(&spec(serde_json::json!({"proxy": {"enabled": true}}))),
            None
        );
        assert_eq!(
            access_names(&spec(
                serde_json::json!({"proxy": {"enabled": false, "access": access}, "security": tls})
            )),
            None,
            "the proxy off"
        );
        let names = access_names(&spec(
            serde_json::json!({"proxy": {"enabled": true, "access": access}, "security": tls}),
        ))
        .expect("access control on");
        assert_eq!(
            names.names().collect::<Vec<_>>(),
            ["orders", "reports", "unknown"]
        );
    }
}
