//! The proxy's part of the status (`spec.proxy`): `status.proxy` and the `ProxyAvailable` condition, from
//! the counts of its Deployment `<name>-proxy`. Both are there only while the proxy is on.
//!
//! The proxy serves as soon as one of its pods is ready (the Service `<name>-proxy` has an endpoint), so
//! `ProxyAvailable` is true from the first ready pod; the reason tells whether all are.

use super::workload::WorkloadStatus;
use crate::api::ProxyStatus;

/// `ProxyAvailable` reason while the proxy Deployment does not exist yet or its controller has not
/// reported on it.
pub const PROXY_CREATING: &str = "ProxyCreating";
/// `ProxyAvailable` reason while no proxy pod is ready.
pub const NO_PROXY_READY: &str = "NoProxyReady";
/// `ProxyAvailable` reason while some, not all, of the desired proxy pods are ready.
pub const SOME_PROXIES_READY: &str = "SomeProxiesReady";
/// `ProxyAvailable` reason once every desired proxy pod is ready.
pub const ALL_PROXIES_READY: &str = "AllProxiesReady";

/// What the status reads of the proxy while it is on.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ObservedProxy {
    /// `spec.proxy.replicas`, or its default.
    pub desired: i32,
    /// The Service its clients connect to, `<name>-proxy`.
    pub service: String,
    /// The Service's port (the memcached port).
    pub port: i32,
    /// The proxy Deployment as last seen; `None` while it does not exist.
    pub deployment: Option<WorkloadStatus>,
}

/// `status.proxy`.
pub(super) fn status(proxy: &ObservedProxy) -> ProxyStatus {
    let deployment = proxy.deployment.as_ref();
    ProxyStatus {
        replicas: deployment.map_or(0, |d| d.replicas),
        ready_replicas: deployment.map_or(0, |d| d.ready),
        service: proxy.service.clone(),
    }
}

/// The `ProxyAvailable` condition: (status, reason, message).
pub(super) fn available(proxy: &ObservedProxy) -> (bool, &'static str, String) {
    let desired = proxy.desired;
    // The same words whether the Deployment is missing or not yet reported on: the first status (written
    // before the proxy exists) stays the one written once it does.
    let Some(deployment) = proxy
        .deployment
        .as_ref()
        .filter(|d| d.observed_generation.is_some())
    else {
        let message = format!(
            "waiting for the proxy Deployment {} to start its pods (0 of {desired} ready)",
            proxy.service
        );
        return (false, PROXY_CREATING, message);
    };
    let (ready, exist) = (deployment.ready, deployment.replicas);
    if ready < 1 {
        let message = format!(
            "0 of {desired} proxy pods ready ({exist} exist); clients of the proxy cannot connect"
        );
        return (false, NO_PROXY_READY, message);
    }
    let reason = if ready >= desired {
        ALL_PROXIES_READY
    } else {
        SOME_PROXIES_READY
    };
    let message = format!(
        "{ready} of {desired} proxy pods ready; clients connect to {}:{}",
        proxy.service, proxy.port
    );
    (true, reason, message)
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::apps::v1::Deployment;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
    use k8s_openapi::jiff::Timestamp;
    use serde_json::json;

    use super::*;
    use crate::api::MemcachedStatus;
    use crate::status::{AVAILABLE, Observed, PROXY_AVAILABLE, compute, find};

    fn at(secs: i64) -> Time {
        Time(Timestamp::from_second(secs).unwrap())
    }

    /// The proxy Deployment `cache-proxy`: `None` for a status its controller has not reported yet.
    fn deployment(counts: Option<(i32, i32)>) -> WorkloadStatus {
        let status = counts.map(|(replicas, ready)| {
            json!({"observedGeneration": 1, "replicas": replicas, "readyReplicas": ready,
                   "updatedReplicas": replicas})
        });
        let deployment: Deployment = serde_json::from_value(json!({
            "metadata": {"name": "cache-proxy", "namespace": "default", "generation": 1},
            "status": status,
        }))
        .unwrap();
        WorkloadStatus::from(&deployment)
    }

    /// An instance of one ready server; with the proxy on (2 desired) when `proxy` is given, its
    /// Deployment as given.
    fn observed(proxy: Option<Option<WorkloadStatus>>) -> Observed<'static> {
        let servers: Deployment = serde_json::from_value(json!({
            "metadata": {"name": "cache", "generation": 1},
            "status": {"observedGeneration": 1, "replicas": 1, "readyReplicas": 1, "updatedReplicas": 1}
        }))
        .unwrap();
        Observed {
            generation: Some(1),
            size: 1,
            workload: Some(WorkloadStatus::from(&servers)),
            proxy: proxy.map(|deployment| ObservedProxy {
                desired: 2,
                service: "cache-proxy".into(),
                port: 11211,
                deployment,
            }),
            ..Observed::default()
        }
    }

    fn proxy_condition(status: &MemcachedStatus) -> Option<&Condition> {
        find(Some(status), PROXY_AVAILABLE)
    }

    /// (status, reason, message) of `ProxyAvailable`, and `status.proxy`'s (replicas, readyReplicas).
    fn summary(status: &MemcachedStatus) -> (&str, &str, &str, i32, i32) {
        let condition = proxy_condition(status).expect("a ProxyAvailable condition");
        let proxy = status.proxy.as_ref().expect("status.proxy");
        assert_eq!(proxy.service, "cache-proxy");
        (
            &condition.status,
            &condition.reason,
            &condition.message,
            proxy.replicas,
            proxy.ready_replicas,
        )
    }

    #[test]
    fn an_instance_without_the_proxy_has_neither_condition_nor_status() {
        let status = compute(&observed(None), None, &at(0));
        assert_eq!(proxy_condition(&status), None);
        assert_eq!(status.proxy, None);
        assert_eq!(status.conditions.len(), 3);
        // Turned off: both go with the next status.
        let on = compute(
            &observed(Some(Some(deployment(Some((2, 2)))))),
            None,
            &at(0),
        );
        let off = compute(&observed(None), Some(&on), &at(10));
        assert_eq!((proxy_condition(&off), &off.proxy), (None, &None));
    }

    #[test]
    fn the_proxy_is_available_from_its_first_ready_pod() {
        let waiting =
            "waiting for the proxy Deployment cache-proxy to start its pods (0 of 2 ready)";
        let cases = [
            (None, ("False", PROXY_CREATING, waiting, 0, 0)),
            (Some(None), ("False", PROXY_CREATING, waiting, 0, 0)),
            (
                Some(Some((2, 0))),
                (
                    "False",
                    NO_PROXY_READY,
                    "0 of 2 proxy pods ready (2 exist); clients of the proxy cannot connect",
                    2,
                    0,
                ),
            ),
            (
                Some(Some((2, 1))),
                (
                    "True",
                    SOME_PROXIES_READY,
                    "1 of 2 proxy pods ready; clients connect to cache-proxy:11211",
                    2,
                    1,
                ),
            ),
            (
                Some(Some((2, 2))),
                (
                    "True",
                    ALL_PROXIES_READY,
                    "2 of 2 proxy pods ready; clients connect to cache-proxy:11211",
                    2,
                    2,
                ),
            ),
            (
                Some(Some((3, 3))),
                (
                    "True",
                    ALL_PROXIES_READY,
                    "3 of 2 proxy pods ready; clients connect to cache-proxy:11211",
                    3,
                    3,
                ),
            ),
        ];
        for (proxy_deployment, want) in cases {
            // None: the Deployment does not exist; Some(None): its controller has not reported on it.
            let deployment = proxy_deployment.map(deployment);
            let status = compute(&observed(Some(deployment)), None, &at(0));
            assert_eq!(summary(&status), want, "{proxy_deployment:?}");
            // The servers' own condition does not depend on the proxy.
            assert_eq!(find(Some(&status), AVAILABLE).unwrap().status, "True");
        }
    }

    #[test]
    fn the_transition_time_moves_only_when_the_proxy_starts_or_stops_serving() {
        let proxy = |counts| observed(Some(Some(deployment(Some(counts)))));
        let time = |s: &MemcachedStatus| proxy_condition(s).unwrap().last_transition_time.clone();
        let none = compute(&proxy((2, 0)), None, &at(10));
        let again = compute(&proxy((2, 0)), Some(&none), &at(20));
        assert_eq!(again, none, "the same observation is the same status");
        let one = compute(&proxy((2, 1)), Some(&again), &at(30));
        assert_eq!(time(&one), at(30));
        let both = compute(&proxy((2, 2)), Some(&one), &at(40));
        assert_eq!((time(&both), summary(&both).1), (at(30), ALL_PROXIES_READY));
        let lost = compute(&proxy((2, 0)), Some(&both), &at(50));
        assert_eq!(time(&lost), at(50));
    }
}
