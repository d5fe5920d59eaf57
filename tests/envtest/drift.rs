//! Drift correction on a real server: what others change in the operator's children is put back, and a
//! deleted child comes back, through the watches (no safety requeue needed).

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Service;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams};
use serde_json::json;

use crate::instances::{apply, wait_settled};
use crate::{Scenario, wait_for};

#[tokio::test]
async fn edits_of_the_deployment_are_reverted_and_a_deleted_service_comes_back() {
    let Some(s) = Scenario::start("drift").await else {
        return;
    };
    apply(&s, "cache", json!({"size": 2})).await;
    wait_settled(&s, "cache", Duration::from_secs(60)).await;
    let deployments: Api<Deployment> = Api::namespaced(s.client.clone(), &s.namespace);

    // Someone else scales the Deployment and swaps the image, taking the fields over.
    let edit = json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "cache"},
        "spec": {"replicas": 5, "template": {"spec": {"containers": [{"name": "memcached", "image": "memcached:evil"}]}}}
    });
    deployments
        .patch(
            "cache",
            &PatchParams::apply("someone-else").force(),
            &Patch::Apply(&edit),
        )
        .await
        .expect("the edit");
    s.step("edited the Deployment as another field manager");
    wait_for(
        "the Deployment to be put back",
        Duration::from_secs(15),
        || async {
            let d = deployments.get("cache").await.map_err(|e| e.to_string())?;
            let spec = d.spec.unwrap_or_default();
            let image = spec
                .template
                .spec
                .as_ref()
                .and_then(|p| p.containers.first())
                .and_then(|c| c.image.clone());
            if spec.replicas == Some(2) && image.as_deref() != Some("memcached:evil") {
                Ok(())
            } else {
                Err(format!("replicas {:?}, image {image:?}", spec.replicas))
            }
        },
    )
    .await;
    s.step("the Deployment is back to 2 replicas of the operator's image");

    let services: Api<Service> = Api::namespaced(s.client.clone(), &s.namespace);
    services
        .delete("cache", &DeleteParams::default())
        .await
        .expect("deleting the Service");
    wait_for(
        "the Service to come back",
        Duration::from_secs(15),
        || async {
            match services.get("cache").await {
                Ok(svc) if svc.metadata.deletion_timestamp.is_none() => Ok(()),
                Ok(_) => Err("terminating".into()),
                Err(e) => Err(e.to_string()),
            }
        },
    )
    .await;
    s.step("the deleted Service is back");
    wait_settled(&s, "cache", Duration::from_secs(30)).await;
}
