//! Instances in a scenario's namespace: applying a spec, waiting for conditions, counting the operator's
//! writes in a window. Typed through the operator's own API types, so a field the server returns in a
//! shape the operator cannot read fails here too.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, ResourceExt};
use memcached_operator::api::Memcached;
use serde_json::{Value, json};

use crate::{FIELD_MANAGER, Scenario, wait_for};

/// The scenario's instances.
pub fn memcacheds(s: &Scenario) -> Api<Memcached> {
    Api::namespaced(s.client.clone(), &s.namespace)
}

/// The scenario's pods.
pub fn pods(s: &Scenario) -> Api<Pod> {
    Api::namespaced(s.client.clone(), &s.namespace)
}

/// Applies instance `name` with `spec` (server-side, as a user's `kubectl apply --server-side` would).
pub async fn apply(s: &Scenario, name: &str, spec: Value) -> Memcached {
    let object = json!({
        "apiVersion": "cache.example.com/v1alpha1",
        "kind": "Memcached",
        "metadata": {"name": name, "namespace": s.namespace},
        "spec": spec,
    });
    memcacheds(s)
        .patch(
            name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&object),
        )
        .await
        .unwrap_or_else(|e| panic!("applying Memcached {name}: {e}"))
}

/// The condition `type_` of `mc`.
pub fn condition<'a>(mc: &'a Memcached, type_: &str) -> Option<&'a Condition> {
    mc.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
}

/// `Type=Status(Reason): message` for each condition, for failure messages.
pub fn conditions(mc: &Memcached) -> String {
    mc.status
        .as_ref()
        .map(|s| {
            s.conditions
                .iter()
                .map(|c| format!("{}={}({}): {}", c.type_, c.status, c.reason, c.message))
                .collect::<Vec<_>>()
                .join("; ")
        })
        .unwrap_or_else(|| "no status".into())
}

/// Whether `mc` is settled: its status is of its current generation, `Available=True`,
/// `Progressing=False` and `Degraded=False`.
pub fn settled(mc: &Memcached) -> bool {
    let is = |t: &str, v: &str| condition(mc, t).is_some_and(|c| c.status == v);
    mc.status.as_ref().and_then(|s| s.observed_generation) == mc.metadata.generation
        && is("Available", "True")
        && is("Progressing", "False")
        && is("Degraded", "False")
}

/// Waits until instance `name` is settled (see [`settled`]); returns it.
pub async fn wait_settled(s: &Scenario, name: &str, timeout: Duration) -> Memcached {
    let api = memcacheds(s);
    wait_for(
        &format!("Memcached {name} to settle (Available, not Progressing, not Degraded)"),
        timeout,
        || async {
            let mc = api.get(name).await.map_err(|e| e.to_string())?;
            if settled(&mc) {
                Ok(mc)
            } else {
                Err(conditions(&mc))
            }
        },
    )
    .await
}

/// Waits until instance `name` carries its first statistics summary (`status.stats`). The stats
/// collector writes it at its first collection after the servers are ready (every 30 s by default), and
/// then at most once per `--stats-status-interval` (5 min): a window that counts a settled operator's
/// writes opens after it, or it may count that one legitimate write (a CI run did, when the instance
/// settled within a second, just before a collection).
pub async fn wait_summarised(s: &Scenario, name: &str, timeout: Duration) -> Memcached {
    let api = memcacheds(s);
    wait_for(
        &format!("Memcached {name}'s first statistics summary"),
        timeout,
        || async {
            let mc = api.get(name).await.map_err(|e| e.to_string())?;
            if mc.status.as_ref().is_some_and(|st| st.stats.is_some()) {
                Ok(mc)
            } else {
                Err("no status.stats yet".to_owned())
            }
        },
    )
    .await
}

/// Waits until every instance in the namespace is settled; returns how long that took.
pub async fn wait_all_settled(s: &Scenario, count: usize, timeout: Duration) -> Duration {
    let api = memcacheds(s);
    let started = Instant::now();
    wait_for(&format!("{count} instances to settle"), timeout, || async {
        let list = api
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?;
        let done = list.items.iter().filter(|mc| settled(mc)).count();
        if done >= count {
            Ok(())
        } else {
            let first = list.items.iter().find(|mc| !settled(mc));
            Err(format!(
                "{done} of {count} settled; e.g. {}: {}",
                first.map(|m| m.name_any()).unwrap_or_default(),
                first.map(conditions).unwrap_or_default()
            ))
        }
    })
    .await;
    started.elapsed()
}

/// The operator's writes in its namespace during `window`, after which the counts are read: what a
/// settled operator must keep at zero. Leader election is off in scenarios, so there are no Lease
/// renewals among them.
pub async fn writes_during(s: &Scenario, window: Duration) -> envtest::RequestCounts {
    let mark = s.env.control_plane().audit().mark().expect("audit mark");
    tokio::time::sleep(window).await;
    // The last requests' lines reach the log a moment after their answers.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let all = s.operator_requests_since(&mark);
    let writes = ["create", "update", "patch", "delete", "deletecollection"];
    envtest::RequestCounts(
        all.0
            .into_iter()
            .filter(|(k, _)| writes.contains(&k.verb.as_str()))
            .collect(),
    )
}

/// The ready pods of instance `name`, by pod name.
pub async fn ready_pods(s: &Scenario, name: &str) -> Vec<Pod> {
    let selector = format!("app.kubernetes.io/instance={name}");
    pods(s)
        .list(&ListParams::default().labels(&selector))
        .await
        .map(|l| l.items)
        .unwrap_or_default()
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| {
            p.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
        })
        .collect()
}
