//! The NetworkPolicies that admit only the listed clients to an instance's pods: `<name>` for its
//! servers and, with the proxy on (`spec.proxy`), `<name>-proxy` for the proxy's pods.
//!
//! With the proxy on, the listed clients are admitted to the proxy's pods only, and the servers admit on
//! the memcached port the proxy's pods (and the operator's, as below) instead of the listed clients:
//! clients that skip the proxy are cut off, which is the point of putting the proxy in front. The proxy's
//! pods admit the operator's too while it reads their stats (with `spec.proxy.access`, on the port of its
//! own stats listener only: clients never reach it).
//!
//! Ingress only: egress is left alone, so pods keep DNS and whatever else a sidecar needs. The instance's
//! own pods get no rule of their own: memcached servers never talk to each other (clients hash keys
//! across them), and the exporter reaches memcached over the pod's loopback, which no policy filters.
//! Kubelet probes come from the pod's node, which NetworkPolicy always admits. The operator itself
//! connects to memcached, to read its stats (operand telemetry) and to copy items in warm handovers: while
//! it does either, its own pods are admitted to the memcached port too, or every read and copy would time
//! out. The policy selects the spare server of a StatefulSet rollout's handover as well (it carries
//! another `app.kubernetes.io/name`, see [`super::spare`]): the operator copies to and from it, and a
//! namespace-wide default-deny would otherwise cut it off.

use k8s_openapi::api::networking::v1::{
    NetworkPolicy, NetworkPolicyIngressRule, NetworkPolicyPeer, NetworkPolicyPort,
    NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::deployment::METRICS_PORT;
use super::instance::Instance;
use super::invalid_spec::InvalidSpec;
use super::{labels, proxy, spare};
use crate::api::{AllowedClient, MemcachedSpec, NetworkPolicyConfig};

/// The policy for `instance`, or `None` when none is wanted.
///
/// Rule 1 admits the memcached port (`containerPort`: a policy matches the pod's port, not the Service's)
/// from `allowedClients`, or from every pod of the instance's namespace when the list is empty (with the
/// proxy on: from the instance's proxy pods instead, see [`proxy_network_policy`]), and from
/// the operator's pods when it connects to the servers (see [`operator_connects`]). Rule 2,
/// with the exporter on, admits the metrics port from the monitoring namespaces, or from the instance's
/// namespace when none are selected.
pub fn network_policy(instance: &Instance<'_>) -> Option<NetworkPolicy> {
    let config = instance.spec.network_policy()?;
    let mut clients = match instance.spec.proxy() {
        Some(_) => vec![NetworkPolicyPeer {
            pod_selector: Some(LabelSelector {
                match_labels: Some(labels::proxy_selector_labels(instance.name)),
                ..LabelSelector::default()
            }),
            ..NetworkPolicyPeer::default()
        }],
        None => allowed_clients(config),
    };
    clients.extend(operator(instance, operator_connects(instance)));
    let mut ingress = vec![rule(instance.spec.container_port, clients)];
    if instance.spec.exporter().is_some() {
        let scrapers = match &config.monitoring_namespace_selector {
            Some(selector) => NetworkPolicyPeer {
                namespace_selector: Some(selector.clone()),
                ..NetworkPolicyPeer::default()
            },
            None => same_namespace(),
        };
        ingress.push(rule(METRICS_PORT, vec![scrapers]));
    }
    Some(NetworkPolicy {
        metadata: instance.child_meta(),
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(servers_and_spare(instance.name)),
            policy_types: Some(vec!["Ingress".to_owned()]),
            ingress: Some(ingress),
            egress: None,
        }),
    })
}

/// The policy `<name>-proxy` for the proxy's pods, with both the policy and the proxy on: the memcached
/// port from `allowedClients` (from every pod of the namespace when the list is empty), as the servers'
/// policy admits them without the proxy, and from the operator's pods while it reads the proxies' stats
/// (operand telemetry, `--stats-interval` not 0: on that port, over TLS with TLS on). Nothing else
/// reaches the proxy over the network: its configuration writer reads its stats over the pod's loopback,
/// and kubelet probes come from the node.
pub fn proxy_network_policy(instance: &Instance<'_>) -> Option<NetworkPolicy> {
    let config = instance.spec.network_policy()?;
    let proxy_spec = instance.spec.proxy()?;
    let mut clients = allowed_clients(config);
    let port = instance.spec.container_port;
    let stats_port = proxy::stats_port(instance.spec);
    // With access control the operator reads stats on a port of its own, which only it may reach.
    let ingress = match proxy_spec.access.is_some() && stats_port != port {
        true => {
            let operator: Vec<_> = operator(instance, instance.stats_collected)
                .into_iter()
                .collect();
            let mut rules = vec![rule(port, clients)];
            if !operator.is_empty() {
                rules.push(rule(stats_port, operator));
            }
            rules
        }
        false => {
            clients.extend(operator(instance, instance.stats_collected));
            vec![rule(port, clients)]
        }
    };
    Some(NetworkPolicy {
        metadata: proxy::meta(instance),
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(LabelSelector {
                match_labels: Some(labels::proxy_selector_labels(instance.name)),
                ..LabelSelector::default()
            }),
            policy_types: Some(vec!["Ingress".to_owned()]),
            ingress: Some(ingress),
            egress: None,
        }),
    })
}

/// The listed clients as peers, or every pod of the namespace when none is listed.
fn allowed_clients(config: &NetworkPolicyConfig) -> Vec<NetworkPolicyPeer> {
    if config.allowed_clients.is_empty() {
        vec![same_namespace()]
    } else {
        config.allowed_clients.iter().map(peer).collect()
    }
}

/// The operator's pods as a peer, when it runs in a pod and `connects`.
fn operator(instance: &Instance<'_>, connects: bool) -> Option<NetworkPolicyPeer> {
    let operator = instance.operator_pods.filter(|_| connects)?;
    let (key, value) = labels::OPERATOR_POD_LABEL;
    Some(NetworkPolicyPeer {
        pod_selector: Some(match_labels(key, value)),
        namespace_selector: Some(match_labels(NAMESPACE_NAME_LABEL, &operator.namespace)),
        ip_block: None,
    })
}

/// Whether the operator connects to the instance's servers: it reads their stats (`--stats-interval` not
/// 0), or copies items between them in warm handovers (`spec.handover.enabled`, the default).
fn operator_connects(instance: &Instance<'_>) -> bool {
    instance.stats_collected || instance.spec.handover().enabled()
}

/// The instance's servers (its selector labels) and its spare server: its `app.kubernetes.io/instance`,
/// with `app.kubernetes.io/name` either [`labels::APP_NAME`] or [`spare::SPARE_APP_NAME`].
fn servers_and_spare(instance: &str) -> LabelSelector {
    let mut match_labels = labels::selector_labels(instance);
    match_labels.remove(labels::NAME_KEY);
    LabelSelector {
        match_labels: Some(match_labels),
        match_expressions: Some(vec![LabelSelectorRequirement {
            key: labels::NAME_KEY.to_owned(),
            operator: "In".to_owned(),
            values: Some(vec![
                labels::APP_NAME.to_owned(),
                spare::SPARE_APP_NAME.to_owned(),
            ]),
        }]),
    }
}

/// The label every namespace carries with its own name (set by the API server since Kubernetes 1.22).
const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";

fn match_labels(key: &str, value: &str) -> LabelSelector {
    LabelSelector {
        match_labels: Some([(key.to_owned(), value.to_owned())].into()),
        ..LabelSelector::default()
    }
}

/// Every pod in the policy's own namespace: a pod selector that matches everything.
fn same_namespace() -> NetworkPolicyPeer {
    NetworkPolicyPeer {
        pod_selector: Some(LabelSelector::default()),
        ..NetworkPolicyPeer::default()
    }
}

fn peer(client: &AllowedClient) -> NetworkPolicyPeer {
    NetworkPolicyPeer {
        pod_selector: client.pod_selector.clone(),
        namespace_selector: client.namespace_selector.clone(),
        ip_block: client.ip_block.clone(),
    }
}

fn rule(port: i32, from: Vec<NetworkPolicyPeer>) -> NetworkPolicyIngressRule {
    NetworkPolicyIngressRule {
        from: Some(from),
        ports: Some(vec![NetworkPolicyPort {
            port: Some(IntOrString::Int(port)),
            protocol: Some("TCP".to_owned()),
            end_port: None,
        }]),
    }
}

/// The check the CEL rule on each allowed client makes, for servers without CEL: a NetworkPolicy peer
/// takes selectors or an ipBlock, not both, and not nothing (the API server would refuse the policy).
/// Like the CEL rule it holds whether or not the policy is enabled, so both agree on every spec.
pub fn validate(spec: &MemcachedSpec) -> Result<(), InvalidSpec> {
    let Some(config) = spec
        .security
        .as_ref()
        .and_then(|s| s.network_policy.as_ref())
    else {
        return Ok(());
    };
    for (i, client) in config.allowed_clients.iter().enumerate() {
        let selectors = client.pod_selector.is_some() || client.namespace_selector.is_some();
        let valid = if client.ip_block.is_some() {
            !selectors
        } else {
            selectors
        };
        if !valid {
            return Err(InvalidSpec::config(format!(
                "spec.security.networkPolicy.allowedClients[{i}] must set podSelector and/or \
                 namespaceSelector, or ipBlock alone"
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
