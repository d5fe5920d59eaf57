//! The longest instance names the API admits, per workload, run on the real control plane: a 52-character
//! StatefulSet instance (its pods carry `controller-revision-hash=<name>-<hash>`, at most 63 characters;
//! the 53- and 54-character names admitted before got no pod from the StatefulSet controller,
//! kubernetes/kubernetes#64023) and a 54-character Deployment instance (`<name>-headless`) become
//! Available; a name one character longer is refused at admission with a message naming the limit.

use std::time::Duration;

use kube::ResourceExt;
use kube::api::{Patch, PatchParams};
use memcached_operator::resources::{MAX_NAME_LEN, MAX_STATEFULSET_NAME_LEN};
use serde_json::json;

use crate::instances::{apply, memcacheds, ready_pods, wait_settled};
use crate::{FIELD_MANAGER, Scenario};

/// What the API server says to a Memcached `name` of `spec`, applied for real.
async fn refusal(s: &Scenario, name: &str, spec: serde_json::Value) -> String {
    let object = json!({
        "apiVersion": "cache.example.com/v1alpha1",
        "kind": "Memcached",
        "metadata": {"name": name, "namespace": s.namespace},
        "spec": spec,
    });
    match memcacheds(s)
        .patch(
            name,
            &PatchParams::apply(FIELD_MANAGER),
            &Patch::Apply(&object),
        )
        .await
    {
        Ok(_) => panic!("a {}-character name {spec} must be refused", name.len()),
        Err(kube::Error::Api(status)) => status.message,
        Err(e) => panic!("{e}"),
    }
}

#[tokio::test]
async fn the_longest_admitted_name_of_each_workload_becomes_available() {
    let Some(s) = Scenario::start("long-names").await else {
        return;
    };
    let statefulset = format!("s{}", "0".repeat(MAX_STATEFULSET_NAME_LEN - 1));
    let deployment = format!("d{}", "0".repeat(MAX_NAME_LEN - 1));
    apply(
        &s,
        &statefulset,
        json!({"size": 2, "workload": "StatefulSet"}),
    )
    .await;
    apply(&s, &deployment, json!({"size": 2})).await;
    for (name, workload) in [(&statefulset, "StatefulSet"), (&deployment, "Deployment")] {
        wait_settled(&s, name, Duration::from_secs(120)).await;
        let pods = ready_pods(&s, name).await;
        assert_eq!(pods.len(), 2, "{workload} {name}");
        let revision = pods[0]
            .labels()
            .get("controller-revision-hash")
            .cloned()
            .unwrap_or_default();
        s.step(&format!(
            "{workload} instance of {} characters Available, pods {:?}{}",
            name.len(),
            pods.iter().map(|p| p.name_any()).collect::<Vec<_>>(),
            if revision.is_empty() {
                String::new()
            } else {
                format!(
                    ", controller-revision-hash {revision:?} ({} characters)",
                    revision.len()
                )
            }
        ));
        if workload == "StatefulSet" {
            assert!(!revision.is_empty() && revision.len() <= 63, "{revision}");
        }
    }

    let too_long = format!("{statefulset}0");
    let message = refusal(&s, &too_long, json!({"workload": "StatefulSet"})).await;
    assert!(
        message.contains("StatefulSet instance")
            && message.contains(&format!("at most {MAX_STATEFULSET_NAME_LEN} characters"))
            && message.contains("controller-revision-hash"),
        "{message}"
    );
    s.step(&format!(
        "a {}-character StatefulSet name is refused: {message}",
        too_long.len()
    ));
    let too_long = format!("{deployment}0");
    let message = refusal(&s, &too_long, json!({})).await;
    assert!(
        message.contains(&format!("at most {MAX_NAME_LEN} characters")),
        "{message}"
    );
    s.step(&format!(
        "a {}-character Deployment name is refused: {message}",
        too_long.len()
    ));
}
