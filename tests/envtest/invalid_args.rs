//! extraArgs that the CRD's rule admits but memcached cannot start with, on a running instance: a `-o`
//! sub-option that needs a value written without one (`-o hashpower`; memcached 1.6.18 exits "Missing
//! numeric argument for hashpower"). The operator says `Degraded` `InvalidConfig` naming the element and
//! rolls nothing out, so the running servers keep serving; the spec set right again settles with no
//! rollout either.

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use kube::api::ListParams;
use kube::{Api, ResourceExt};
use serde_json::json;

use crate::instances::{apply, condition, conditions, memcacheds, pods, wait_settled};
use crate::{Scenario, wait_for};

#[tokio::test]
async fn a_sub_option_without_its_value_is_degraded_and_the_servers_keep_running() {
    let Some(s) = Scenario::start_with_memcached("invalid-args", &[]).await else {
        return;
    };
    let spec = |extra: &[&str]| json!({"size": 2, "memcached": {"extraArgs": extra}});
    apply(&s, "cache", spec(&["-o", "modern"])).await;
    wait_settled(&s, "cache", Duration::from_secs(60)).await;
    let deployments: Api<Deployment> = Api::namespaced(s.client.clone(), &s.namespace);
    let generation = deployments
        .get("cache")
        .await
        .expect("the Deployment")
        .metadata
        .generation;
    let selector = ListParams::default().labels("app.kubernetes.io/instance=cache");
    let uids = || async {
        let mut uids: Vec<String> = pods(&s)
            .list(&selector)
            .await
            .expect("pods")
            .items
            .iter()
            .filter_map(|p| p.uid())
            .collect();
        uids.sort();
        uids
    };
    let before = uids().await;
    assert_eq!(before.len(), 2);

    s.step("extraArgs [-o, modern,hashpower]: admitted, memcached could not start");
    apply(&s, "cache", spec(&["-o", "modern,hashpower"])).await;
    let api = memcacheds(&s);
    let message = wait_for(
        "Degraded=True InvalidConfig",
        Duration::from_secs(30),
        || async {
            let mc = api.get("cache").await.map_err(|e| e.to_string())?;
            match condition(&mc, "Degraded") {
                Some(c) if c.status == "True" && c.reason == "InvalidConfig" => {
                    Ok(c.message.clone())
                }
                _ => Err(conditions(&mc)),
            }
        },
    )
    .await;
    s.step(&format!("Degraded: {message}"));
    assert!(
        message.contains("extraArgs[1]") && message.contains("hashpower needs a value"),
        "{message}"
    );
    // A few seconds for a rollout that must not come.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let now = deployments.get("cache").await.expect("the Deployment");
    assert_eq!(now.metadata.generation, generation, "nothing rolled out");
    assert_eq!(uids().await, before, "the servers keep running");

    s.step("extraArgs [-o, modern,hashpower=16]: settles without a rollout of the bad spec");
    apply(&s, "cache", spec(&["-o", "modern,hashpower=16"])).await;
    wait_settled(&s, "cache", Duration::from_secs(90)).await;
    let pods = pods(&s).list(&selector).await.expect("pods").items;
    let args: Vec<String> = pods
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .flat_map(|p| {
            p.spec
                .iter()
                .flat_map(|s| s.containers[0].args.clone().unwrap_or_default())
        })
        .collect();
    assert!(
        args.iter().any(|a| a == "modern,hashpower=16"),
        "the servers run the corrected spec: {args:?}"
    );
}
