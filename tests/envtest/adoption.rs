//! No adoption by name, on a real server: a Deployment and a `<name>-servers` ConfigMap that someone
//! else created before the instance are left exactly as they were (no field, label or owner reference of
//! the operator's), the instance says why it cannot proceed, and it proceeds once they are gone.

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::{DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::instances::{apply, condition, conditions, memcacheds, wait_settled};
use crate::{Scenario, wait_for};

#[tokio::test]
async fn same_named_objects_of_someone_else_are_left_alone_until_they_go() {
    let Some(s) = Scenario::start("adoption").await else {
        return;
    };
    let deployments: Api<Deployment> = Api::namespaced(s.client.clone(), &s.namespace);
    let config_maps: Api<ConfigMap> = Api::namespaced(s.client.clone(), &s.namespace);

    // Someone's own Deployment and ConfigMap, created before the instance, with the names its children
    // would have.
    let theirs: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "cache", "labels": {"app": "theirs"}},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "theirs"}},
            "template": {
                "metadata": {"labels": {"app": "theirs"}},
                "spec": {"containers": [{"name": "web", "image": "nginx:theirs"}]}
            }
        }
    }))
    .expect("a Deployment");
    let theirs = deployments
        .create(&PostParams::default(), &theirs)
        .await
        .expect("creating their Deployment");
    let list: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "other-servers"},
        "data": {"servers": "10.9.9.9:11211\n"}
    }))
    .expect("a ConfigMap");
    let list = config_maps
        .create(&PostParams::default(), &list)
        .await
        .expect("creating their ConfigMap");
    s.step("created a Deployment `cache` and a ConfigMap `other-servers` of someone else's");

    apply(&s, "cache", json!({"size": 1})).await;
    apply(&s, "other", json!({"size": 1})).await;
    for name in ["cache", "other"] {
        let mc = wait_for(
            &format!("Memcached {name} to be Degraded (OwnershipConflict)"),
            Duration::from_secs(30),
            || async {
                let mc = memcacheds(&s).get(name).await.map_err(|e| e.to_string())?;
                match condition(&mc, "Degraded") {
                    Some(c) if c.status == "True" && c.reason == "OwnershipConflict" => Ok(mc),
                    _ => Err(conditions(&mc)),
                }
            },
        )
        .await;
        let message = &condition(&mc, "Degraded").expect("Degraded").message;
        assert!(
            message.contains("not managed by this operator"),
            "{message}"
        );
    }
    s.step("both instances are Degraded with reason OwnershipConflict");

    // A few seconds more, for any write that would follow, then theirs are exactly as they were.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let now = deployments.get("cache").await.expect("their Deployment");
    assert_eq!(
        (now.metadata.generation, &now.metadata.labels),
        (theirs.metadata.generation, &theirs.metadata.labels),
        "their Deployment's spec and labels are as they were"
    );
    assert!(now.metadata.owner_references.is_none());
    let managers = managers(&now.metadata);
    assert!(
        !managers.iter().any(|m| m == "memcached-operator"),
        "{managers:?}"
    );
    let now = config_maps
        .get("other-servers")
        .await
        .expect("their ConfigMap");
    assert_eq!(
        now.metadata.resource_version, list.metadata.resource_version,
        "their ConfigMap was not written to"
    );
    assert_eq!(now.data.unwrap_or_default()["servers"], "10.9.9.9:11211\n");
    // The instance `other` wrote nothing at all: not even its workload.
    assert!(
        deployments.get_opt("other").await.expect("a get").is_none(),
        "an instance whose server list is taken creates nothing"
    );
    s.step("their objects are untouched (no field of the operator's), and `other` created nothing");

    // Theirs go: the instances proceed on their own (the operator watches unmanaged objects of those
    // names), without waiting for a retry.
    deployments
        .delete("cache", &DeleteParams::foreground())
        .await
        .expect("deleting their Deployment");
    config_maps
        .delete("other-servers", &DeleteParams::default())
        .await
        .expect("deleting their ConfigMap");
    s.step("deleted their objects");
    for name in ["cache", "other"] {
        wait_settled(&s, name, Duration::from_secs(60)).await;
    }
    let ours = deployments
        .get("cache")
        .await
        .expect("the operator's Deployment");
    assert_eq!(
        ours.metadata.labels.unwrap_or_default()["app.kubernetes.io/managed-by"],
        "memcached-operator"
    );
    s.step("both instances settled with children of their own");

    // The rule is about objects that are not the instance's: one of its own children with the label taken
    // off (its controller is still the instance) is not someone else's, and gets its label back.
    let unlabel = json!({"metadata": {"labels": {"app.kubernetes.io/managed-by": null}}});
    deployments
        .patch("cache", &PatchParams::default(), &Patch::Merge(&unlabel))
        .await
        .expect("taking the label off");
    s.step("took the managed-by label off the instance's own Deployment");
    wait_for(
        "the label to be put back",
        Duration::from_secs(30),
        || async {
            let d = deployments.get("cache").await.map_err(|e| e.to_string())?;
            let labels = d.metadata.labels.unwrap_or_default();
            match labels.get("app.kubernetes.io/managed-by") {
                Some(v) if v == "memcached-operator" => Ok(()),
                other => Err(format!("managed-by {other:?}")),
            }
        },
    )
    .await;
    let mc = wait_settled(&s, "cache", Duration::from_secs(30)).await;
    assert!(
        condition(&mc, "Degraded").is_some_and(|c| c.status == "False"),
        "{}",
        conditions(&mc)
    );
    s.step("its label is back and the instance is not Degraded");
}

/// The field managers of an object, sorted.
fn managers(meta: &ObjectMeta) -> Vec<String> {
    let mut managers: Vec<String> = meta
        .managed_fields
        .iter()
        .flatten()
        .filter_map(|entry| entry.manager.clone())
        .collect();
    managers.sort();
    managers
}
