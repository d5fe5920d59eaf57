//! `memcached-operator check`: whether an installed operator answers, as the Helm chart's `helm test` pod
//! runs it (`charts/memcached-operator/templates/tests/`), from the operator's own image, under a
//! ServiceAccount that may read the operator's Deployment, its Lease and the pods of its namespace, and
//! create, read and delete one Memcached instance.
//!
//! In order, within one deadline (`--timeout`), reading through the API server only:
//! 1. the operator's Deployment has an available replica, for its current generation;
//! 2. with leader election, its Lease is held by a live leader: a ready pod of that Deployment (not a pod of
//!    another release that uses the same Lease name) that renews it while the check watches — a renewal is
//!    seen, not inferred from timestamps, so clock skew between nodes cannot pass a dead holder;
//! 3. a sample `Memcached` (size 1) it creates becomes `Available` for its generation, which only a
//!    reconciling operator and a ready memcached pod bring about.
//!
//! The sample instance is deleted at the end, whether the check passed or not; one left by an earlier,
//! interrupted run is deleted before. Each step prints one line; the first failure ends the check with
//! its reason (exit status 1).

use std::collections::BTreeMap;
use std::fmt::Display;
use std::future::Future;
use std::time::{Duration, Instant};

use anyhow::{Context as _, anyhow, bail};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{DeleteParams, PostParams};
use kube::{Api, Client, Config, ResourceExt};
use serde_json::json;

use crate::api::Memcached;
use crate::status::AVAILABLE;

/// What to check, from the command line (`cli::CheckArgs`).
#[derive(Clone, Debug)]
pub struct Check {
    /// Namespace of the Deployment and the Lease; `None`: the client's default namespace.
    pub namespace: Option<String>,
    pub deployment: String,
    /// The leader-election Lease; `None` when the operator runs without leader election.
    pub lease: Option<String>,
    /// Namespace of the sample instance; `None`: `namespace`.
    pub instance_namespace: Option<String>,
    pub instance: String,
    /// The whole check's deadline.
    pub timeout: Duration,
}

/// How often each step reads what it waits for.
const POLL: Duration = Duration::from_secs(1);
/// Longest wait for the sample instance to be gone after its deletion (it has no finalizer).
const DELETE_WAIT: Duration = Duration::from_secs(30);
/// The field manager of the sample instance.
const FIELD_MANAGER: &str = "memcached-operator-check";

/// Runs the check, printing a line per step on stdout; an error says which step failed and why.
pub async fn run(check: Check) -> anyhow::Result<()> {
    let client = client().await?;
    let namespace = check
        .namespace
        .clone()
        .unwrap_or_else(|| client.default_namespace().to_owned());
    let instance_namespace = check
        .instance_namespace
        .clone()
        .unwrap_or_else(|| namespace.clone());
    let deadline = Instant::now() + check.timeout;

    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &namespace);
    let deployment = until(deadline, || async {
        let deployment = deployments
            .get_opt(&check.deployment)
            .await
            .map_err(|e| e.to_string())?
            .ok_or_else(|| "it does not exist".to_owned())?;
        deployment_available(&deployment).map(|summary| (deployment, summary))
    })
    .await
    .map_err(|why| {
        anyhow!(
            "the operator's Deployment {namespace}/{}: {why}",
            check.deployment
        )
    })?;
    println!(
        "ok: Deployment {namespace}/{}: {}",
        check.deployment, deployment.1
    );

    if let Some(lease) = &check.lease {
        let holder = live_leader(&client, &namespace, lease, &deployment.0, deadline)
            .await
            .map_err(|why| anyhow!("the leader Lease {namespace}/{lease}: {why}"))?;
        println!("ok: Lease {namespace}/{lease}: held and renewed by pod {holder}, which is ready");
    }

    let instances: Api<Memcached> = Api::namespaced(client, &instance_namespace);
    let started = Instant::now();
    let outcome = sample_available(&instances, &check.instance, deadline).await;
    let deleted = delete_sample(&instances, &check.instance).await;
    let summary = outcome.map_err(|why| {
        anyhow!(
            "the sample Memcached {instance_namespace}/{}: {why}",
            check.instance
        )
    })?;
    println!(
        "ok: Memcached {instance_namespace}/{}: Available after {:.1}s ({summary})",
        check.instance,
        started.elapsed().as_secs_f64()
    );
    deleted.with_context(|| {
        format!(
            "the sample Memcached {instance_namespace}/{} was not deleted",
            check.instance
        )
    })?;
    println!(
        "ok: Memcached {instance_namespace}/{} deleted",
        check.instance
    );
    Ok(())
}

/// A client from the kubeconfig (`KUBECONFIG`) or, in a pod, the in-cluster configuration.
async fn client() -> anyhow::Result<Client> {
    let mut config = Config::infer()
        .await
        .context("no Kubernetes configuration found (KUBECONFIG, ~/.kube/config or in-cluster)")?;
    config.connect_timeout = Some(Duration::from_secs(10));
    config.read_timeout = Some(Duration::from_secs(30));
    Client::try_from(config).context("cannot build the Kubernetes client")
}

/// Calls `attempt` every [`POLL`] until it succeeds or `deadline` passes; the error is the last reason
/// `attempt` gave.
async fn until<T, E: Display, F: Future<Output = Result<T, E>>>(
    deadline: Instant,
    mut attempt: impl FnMut() -> F,
) -> Result<T, String> {
    loop {
        match attempt().await {
            Ok(value) => return Ok(value),
            Err(why) if Instant::now() + POLL > deadline => {
                return Err(format!("{why} (waited until the check's timeout)"));
            }
            Err(_) => tokio::time::sleep(POLL).await,
        }
    }
}

/// How many replicas of the Deployment are available, or why none counts yet: its controller has not
/// seen the current generation, or no replica is available.
pub fn deployment_available(deployment: &Deployment) -> Result<String, String> {
    let generation = deployment.metadata.generation.unwrap_or(0);
    let status = deployment.status.clone().unwrap_or_default();
    if status.observed_generation.unwrap_or(0) < generation {
        return Err(format!(
            "its controller has not observed generation {generation} yet"
        ));
    }
    let wanted = deployment
        .spec
        .as_ref()
        .and_then(|s| s.replicas)
        .unwrap_or(1);
    let available = status.available_replicas.unwrap_or(0);
    if available < 1 {
        return Err(format!("0 of {wanted} replicas available"));
    }
    Ok(format!("{available} of {wanted} replicas available"))
}

/// The Lease's holder and the renewal time it last wrote, when someone holds it.
pub fn holder(lease: &Lease) -> Option<(String, Option<MicroTime>)> {
    let spec = lease.spec.as_ref()?;
    let holder = spec.holder_identity.clone().filter(|h| !h.is_empty())?;
    Some((holder, spec.renew_time.clone()))
}

/// Whether `pod` is a ready replica of the Deployment whose pod labels are `selector`: its labels match,
/// it is not being deleted, and its `Ready` condition is `True`.
pub fn ready_replica(pod: &Pod, selector: &BTreeMap<String, String>) -> Result<(), String> {
    let labels = pod.labels();
    if let Some((key, value)) = selector.iter().find(|(k, v)| labels.get(*k) != Some(*v)) {
        return Err(format!(
            "it is not a pod of the operator's Deployment (label {key}={value} missing)"
        ));
    }
    if pod.metadata.deletion_timestamp.is_some() {
        return Err("it is being deleted".into());
    }
    let ready = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    if ready {
        Ok(())
    } else {
        Err("it is not ready".into())
    }
}

/// Waits for a ready pod of `deployment` to hold the Lease and to renew it while watched; its name.
async fn live_leader(
    client: &Client,
    namespace: &str,
    name: &str,
    deployment: &Deployment,
    deadline: Instant,
) -> Result<String, String> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), namespace);
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let selector = deployment
        .spec
        .as_ref()
        .and_then(|s| s.selector.match_labels.clone())
        .unwrap_or_default();
    // The holder and renewal first seen; a renewal is a later read with the same holder and another
    // renewal time.
    let mut first: Option<(String, Option<MicroTime>)> = None;
    loop {
        let why = match ready_holder(&leases, &pods, name, &selector).await {
            Ok((holder, renewed)) => match &first {
                Some((was, at)) if *was == holder && *at != renewed => return Ok(holder),
                Some((was, _)) if *was == holder => {
                    format!("{holder} holds it but has not renewed it")
                }
                _ => {
                    let why = format!("{holder} holds it but has not renewed it");
                    first = Some((holder, renewed));
                    why
                }
            },
            Err(why) => why,
        };
        if Instant::now() + POLL > deadline {
            return Err(format!("{why} (waited until the check's timeout)"));
        }
        tokio::time::sleep(POLL).await;
    }
}

/// The Lease's holder and renewal time, when a ready pod of the Deployment (its pods' labels `selector`)
/// holds it.
async fn ready_holder(
    leases: &Api<Lease>,
    pods: &Api<Pod>,
    name: &str,
    selector: &BTreeMap<String, String>,
) -> Result<(String, Option<MicroTime>), String> {
    let lease = leases
        .get_opt(name)
        .await
        .map_err(|e| e.to_string())?
        .ok_or_else(|| "it does not exist (no replica has led yet)".to_owned())?;
    let (holder, renewed) = holder(&lease).ok_or_else(|| "nobody holds it".to_owned())?;
    let pod = pods
        .get_opt(&holder)
        .await
        .map_err(|e| e.to_string())?
        .ok_or_else(|| format!("its holder {holder} is not a pod of this namespace"))?;
    ready_replica(&pod, selector).map_err(|why| format!("its holder {holder}: {why}"))?;
    Ok((holder, renewed))
}

/// Creates the sample instance (after deleting one left by an earlier run) and waits until it is
/// `Available`; a summary of its status.
async fn sample_available(
    api: &Api<Memcached>,
    name: &str,
    deadline: Instant,
) -> Result<String, String> {
    let sample: Memcached = serde_json::from_value(json!({
        "apiVersion": "cache.example.com/v1alpha1",
        "kind": "Memcached",
        "metadata": {
            "name": name,
            "labels": {"app.kubernetes.io/created-by": FIELD_MANAGER},
        },
        "spec": {"size": 1},
    }))
    .map_err(|e| e.to_string())?;
    let params = PostParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..PostParams::default()
    };
    let created = match api.create(&params, &sample).await {
        Err(kube::Error::Api(status)) if status.code == 409 => {
            delete_sample(api, name)
                .await
                .map_err(|e| format!("one left by an earlier run cannot be deleted: {e:#}"))?;
            api.create(&params, &sample).await
        }
        other => other,
    }
    .map_err(|e| format!("cannot be created: {e}"))?;
    let generation = created.metadata.generation.unwrap_or(1);
    until(deadline, || async {
        let mc = api.get(name).await.map_err(|e| e.to_string())?;
        available(&mc, generation)
    })
    .await
}

/// Whether the instance is `Available` for `generation` (or a later one), with its ready pods; else its
/// conditions as they are.
pub fn available(mc: &Memcached, generation: i64) -> Result<String, String> {
    let Some(status) = mc.status.as_ref() else {
        return Err("no status yet (is the operator reconciling this namespace?)".into());
    };
    if status.observed_generation.unwrap_or(0) < generation {
        return Err(format!("its status is not for generation {generation} yet"));
    }
    let condition = status.conditions.iter().find(|c| c.type_ == AVAILABLE);
    match condition {
        Some(c) if c.status == "True" => Ok(format!(
            "{} of {} pods ready",
            status.ready_replicas, mc.spec.size
        )),
        Some(c) => Err(format!(
            "Available is {} ({}: {})",
            c.status, c.reason, c.message
        )),
        None => Err("no Available condition yet".into()),
    }
}

/// Deletes the sample instance and waits until it is gone (at most [`DELETE_WAIT`]).
async fn delete_sample(api: &Api<Memcached>, name: &str) -> anyhow::Result<()> {
    match api.delete(name, &DeleteParams::background()).await {
        Ok(_) => {}
        Err(kube::Error::Api(status)) if status.code == 404 => return Ok(()),
        Err(e) => return Err(e.into()),
    }
    let deadline = Instant::now() + DELETE_WAIT;
    loop {
        if api.get_opt(name).await?.is_none() {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("still there {}s after its deletion", DELETE_WAIT.as_secs());
        }
        tokio::time::sleep(POLL).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deployment(generation: i64, observed: i64, available: i32) -> Deployment {
        serde_json::from_value(json!({
            "metadata": {"name": "op", "generation": generation},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "op"}}, "template": {}},
            "status": {"observedGeneration": observed, "availableReplicas": available},
        }))
        .unwrap()
    }

    #[test]
    fn a_deployment_answers_with_an_available_replica_of_its_generation() {
        assert_eq!(
            deployment_available(&deployment(2, 2, 1)),
            Ok("1 of 1 replicas available".into())
        );
        let stale = deployment_available(&deployment(3, 2, 1)).unwrap_err();
        assert!(stale.contains("generation 3"), "{stale}");
        let none = deployment_available(&deployment(2, 2, 0)).unwrap_err();
        assert!(none.contains("0 of 1"), "{none}");
    }

    fn pod(labels: serde_json::Value, ready: &str, deleting: bool) -> Pod {
        let mut pod = json!({
            "metadata": {"name": "op-1", "labels": labels},
            "status": {"conditions": [{"type": "Ready", "status": ready}]},
        });
        if deleting {
            pod["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        }
        serde_json::from_value(pod).unwrap()
    }

    #[test]
    fn the_leader_must_be_a_ready_pod_of_the_deployment() {
        let selector = BTreeMap::from([("app".to_owned(), "op".to_owned())]);
        assert_eq!(
            ready_replica(
                &pod(json!({"app": "op", "x": "y"}), "True", false),
                &selector
            ),
            Ok(())
        );
        let other = ready_replica(&pod(json!({"app": "other"}), "True", false), &selector);
        assert!(other.unwrap_err().contains("app=op"));
        let unready = ready_replica(&pod(json!({"app": "op"}), "False", false), &selector);
        assert!(unready.unwrap_err().contains("not ready"));
        let deleting = ready_replica(&pod(json!({"app": "op"}), "True", true), &selector);
        assert!(deleting.unwrap_err().contains("deleted"));
    }

    #[test]
    fn a_released_lease_has_no_holder() {
        let lease = |holder: Option<&str>| -> Lease {
            serde_json::from_value(json!({
                "metadata": {"name": "l"},
                "spec": {"holderIdentity": holder, "renewTime": "2026-01-01T00:00:00.000000Z"},
            }))
            .unwrap()
        };
        assert_eq!(holder(&lease(Some("op-1"))).unwrap().0, "op-1");
        assert!(holder(&lease(Some(""))).is_none(), "released");
        assert!(holder(&lease(None)).is_none());
    }

    fn instance(observed: i64, condition: Option<(&str, &str)>) -> Memcached {
        let conditions: Vec<serde_json::Value> = condition
            .into_iter()
            .map(|(status, reason)| {
                json!({"type": "Available", "status": status, "reason": reason,
                       "message": "m", "lastTransitionTime": "2026-01-01T00:00:00Z"})
            })
            .collect();
        serde_json::from_value(json!({
            "apiVersion": "cache.example.com/v1alpha1",
            "kind": "Memcached",
            "metadata": {"name": "s", "generation": 1},
            "spec": {"size": 1},
            "status": {"observedGeneration": observed, "readyReplicas": 1, "conditions": conditions},
        }))
        .unwrap()
    }

    #[test]
    fn the_sample_passes_when_available_for_its_generation() {
        assert_eq!(
            available(&instance(1, Some(("True", "AllReplicasReady"))), 1),
            Ok("1 of 1 pods ready".into())
        );
        let stale = available(&instance(0, Some(("True", "AllReplicasReady"))), 1);
        assert!(stale.unwrap_err().contains("generation 1"));
        let waiting = available(&instance(1, Some(("False", "Waiting"))), 1).unwrap_err();
        assert!(waiting.contains("Waiting"), "{waiting}");
        assert!(available(&instance(1, None), 1).is_err());
    }
}
