//! The tutorial's sample converges on a real API server: applied into an empty namespace, the instance
//! becomes Available, with its Deployment and Service created and owned by it. The proof that the
//! harness works end to end (CRD, RBAC under the operator's ServiceAccount, built-in controllers,
//! scheduler, stand-in kubelet), and a record of what it costs in requests.

use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use kube::{Api, ResourceExt};
use serde_json::Value;

use crate::{Scenario, wait_for};

const SAMPLE: &str = "config/samples/cache_v1alpha1_memcached.yaml";

#[tokio::test]
async fn the_tutorial_sample_becomes_available_with_owned_children() {
    let Some(s) = Scenario::start("convergence").await else {
        return;
    };
    let applied_at = Instant::now();
    let mark = s.env.control_plane().audit().mark().expect("audit mark");
    let instance = s.apply_file(SAMPLE).await;
    let name = instance.name_any();
    let uid = instance.uid().expect("uid");
    s.step(&format!("applied {SAMPLE} as {}/{name}", s.namespace));

    let memcacheds: Api<DynamicObject> = Api::namespaced_with(
        s.client.clone(),
        &s.namespace,
        &ApiResource::from_gvk(&GroupVersionKind::gvk(
            "cache.example.com",
            "v1alpha1",
            "Memcached",
        )),
    );
    let status = wait_for(
        "the instance's Available condition to be True",
        Duration::from_secs(60),
        || async {
            let mc = memcacheds.get(&name).await.map_err(|e| e.to_string())?;
            let status = mc.data.get("status").cloned().unwrap_or(Value::Null);
            let available = status["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == "Available" && c["status"] == "True");
            if available {
                Ok(status)
            } else {
                Err(status.to_string())
            }
        },
    )
    .await;
    let converged_in = applied_at.elapsed();
    s.step(&format!(
        "Available after {:.2}s: readyReplicas {}, conditions {}",
        converged_in.as_secs_f64(),
        status["readyReplicas"],
        summary(&status["conditions"])
    ));

    let deployment = Api::<Deployment>::namespaced(s.client.clone(), &s.namespace)
        .get(&name)
        .await
        .expect("the instance's Deployment");
    assert_owned(deployment.owner_references(), &name, &uid, "Deployment");
    let service = Api::<Service>::namespaced(s.client.clone(), &s.namespace)
        .get(&name)
        .await
        .expect("the instance's Service");
    assert_owned(service.owner_references(), &name, &uid, "Service");
    s.step(&format!(
        "Deployment {name} ({} ready of {}) and Service {name} ({}) are controlled by the instance",
        deployment
            .status
            .as_ref()
            .and_then(|st| st.ready_replicas)
            .unwrap_or(0),
        deployment
            .spec
            .as_ref()
            .and_then(|sp| sp.replicas)
            .unwrap_or(0),
        service
            .spec
            .as_ref()
            .and_then(|sp| sp.type_.clone())
            .unwrap_or_default(),
    ));

    // Give the last requests time to reach the log (see envtest::audit), then report what converging
    // cost, and what the operator did in all since it started.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let converging = s.operator_requests_since(&mark);
    s.step(&format!(
        "operator requests from apply to Available: {} ({} writes)\n{converging}",
        converging.total(),
        converging.writes()
    ));
    let all = s.operator_requests();
    s.step(&format!(
        "operator requests since it started: {} ({} writes)\n{all}",
        all.total(),
        all.writes()
    ));
    assert!(
        converging.writes() > 0,
        "the audit log shows no write by the operator ({}) while it converged",
        s.credentials.user
    );
}

fn assert_owned(owners: &[OwnerReference], name: &str, uid: &str, what: &str) {
    let controller = owners
        .iter()
        .find(|o| o.controller == Some(true))
        .unwrap_or_else(|| panic!("the {what} has no controller owner reference: {owners:?}"));
    assert_eq!(
        (
            controller.api_version.as_str(),
            controller.kind.as_str(),
            controller.name.as_str(),
            controller.uid.as_str()
        ),
        ("cache.example.com/v1alpha1", "Memcached", name, uid),
        "the {what}'s controller owner reference"
    );
}

/// `Type=Status(Reason)` for each condition.
fn summary(conditions: &Value) -> String {
    conditions
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            format!(
                "{}={}({})",
                c["type"].as_str().unwrap_or("?"),
                c["status"].as_str().unwrap_or("?"),
                c["reason"].as_str().unwrap_or("")
            )
        })
        .collect::<Vec<_>>()
        .join(" ")
}
