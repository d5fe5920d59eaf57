//! extraArgs that the CRD's rule admits but memcached cannot start with, on a running instance: a `-o`
//! sub-option that needs a value written without one (`-o hashpower`; memcached 1.6.18 exits "Missing
//! numeric argument for hashpower"). The operator says `Degraded` `InvalidConfig` naming the element and
//! rolls nothing out, so the running servers keep serving; the spec set right again settles with no
//! rollout either. The same for every value memcached exits on (`-B binary` with auth, `-R 0`, `-D ""`,
//! `-N` above the threads, `-o hashpower` out of range), within 1 s of the apply.

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use kube::api::ListParams;
use kube::{Api, ResourceExt};
use serde_json::json;

use crate::instances::{apply, condition, conditions, memcacheds, pods, wait_settled};
use crate::secrets::auth_secret;
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

/// The configurations memcached exits on (or, for a negative `-R`, never answers with), each
/// `tests/memcached_options.rs` checks against the real binary: applied to a running instance with
/// authentication, each is `Degraded` `InvalidConfig` naming the element within 1 s of the apply, the
/// Deployment is not rolled and the servers keep running (same pod UIDs); the good spec applied again
/// settles with no rollout either.
#[tokio::test]
async fn every_configuration_memcached_exits_on_is_degraded_within_a_second_and_nothing_rolls() {
    let Some(s) = Scenario::start_with_memcached("crash-loop-args", &[]).await else {
        return;
    };
    auth_secret(&s, "cache-auth", "auth-file", "app:s3cret\n").await;
    let spec = |extra: &[&str]| {
        json!({
            "size": 2,
            "memcached": {"threads": 4, "extraArgs": extra},
            "security": {"auth": {"secretName": "cache-auth"}}
        })
    };
    let good: &[&str] = &["-o", "modern", "-B", "ascii"];
    apply(&s, "cache", spec(good)).await;
    wait_settled(&s, "cache", Duration::from_secs(90)).await;
    let deployments: Api<Deployment> = Api::namespaced(s.client.clone(), &s.namespace);
    let generation = || async {
        deployments
            .get("cache")
            .await
            .expect("the Deployment")
            .metadata
            .generation
    };
    let before_generation = generation().await;
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
    let api = memcacheds(&s);
    // (extraArgs, the element the message must name, what memcached 1.6.18 said). `-R -p1` and `-R -1`
    // are written attached here: the CRD's rule, which reads each element on its own, refuses a separate
    // `-p1` or `-1` at admission already (as options), while memcached reads them as -R's value.
    let crash_loops: &[(&[&str], &str, &str)] = &[
        (
            &["-o", "modern", "-B", "binary"],
            "extraArgs[3] \"binary\"",
            "You cannot allow the BINARY protocol",
        ),
        (
            &["-o", "modern", "-B", "auto"],
            "extraArgs[3] \"auto\"",
            "You cannot allow the BINARY protocol",
        ),
        (
            &["-o", "modern", "-R", "0"],
            "extraArgs[3] \"0\"",
            "Number of requests per event must be greater than 0",
        ),
        (
            &["-o", "modern", "-R-p1"],
            "extraArgs[2] \"-R-p1\"",
            "Number of requests per event must be greater than 0",
        ),
        (
            &["-o", "modern", "-R-1"],
            "extraArgs[2] \"-R-1\"",
            "answers no request",
        ),
        (
            &["-o", "modern", "-D", ""],
            "extraArgs[3] \"\"",
            "No delimiter specified",
        ),
        (
            &["-o", "modern", "-N", "5"],
            "extraArgs[3] \"5\"",
            "cannot be greater than number of threads(4)",
        ),
        (
            &["-o", "modern,hashpower=11"],
            "extraArgs[1] \"modern,hashpower=11\"",
            "is too low",
        ),
        (
            &["-o", "modern,hashpower=33"],
            "extraArgs[1] \"modern,hashpower=33\"",
            "is too high",
        ),
        (
            &["-o", "modern,hashpower=12"],
            "extraArgs[1] \"modern,hashpower=12\"",
            "cannot be equal to or less than item lock table (12)",
        ),
    ];
    let mut slowest = Duration::ZERO;
    for (extra, element, said) in crash_loops {
        s.step(&format!("extraArgs {extra:?}"));
        apply(&s, "cache", spec(extra)).await;
        let applied = std::time::Instant::now();
        let message = wait_for(
            &format!("Degraded=True InvalidConfig naming {element}"),
            Duration::from_secs(10),
            || async {
                let mc = api.get("cache").await.map_err(|e| e.to_string())?;
                match condition(&mc, "Degraded") {
                    Some(c)
                        if c.status == "True"
                            && c.reason == "InvalidConfig"
                            && c.message.contains(element) =>
                    {
                        Ok(c.message.clone())
                    }
                    _ => Err(conditions(&mc)),
                }
            },
        )
        .await;
        let took = applied.elapsed();
        slowest = slowest.max(took);
        s.step(&format!("Degraded after {took:?}: {message}"));
        assert!(
            message.starts_with(&format!("spec.memcached.{element}")) && message.contains(said),
            "{message}"
        );
        assert!(
            took <= Duration::from_secs(1),
            "{extra:?}: Degraded only after {took:?}"
        );
        assert_eq!(
            generation().await,
            before_generation,
            "{extra:?}: nothing rolled out"
        );
        assert_eq!(uids().await, before, "{extra:?}: the servers keep running");
        apply(&s, "cache", spec(good)).await;
        wait_settled(&s, "cache", Duration::from_secs(30)).await;
    }
    // A few seconds for a rollout that must not come.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(generation().await, before_generation, "nothing rolled out");
    assert_eq!(uids().await, before, "the servers keep running");
    s.step(&format!(
        "{} crash-loop configurations Degraded within {slowest:?} of the apply (at most 1 s), pod UIDs \
         unchanged",
        crash_loops.len()
    ));
}
