//! The fleet rollout: an operator restarted with a changed pod template (a new `--memcached-image`, as an
//! upgrade that changes the template) rolls at most `--fleet-rollout-budget` instances at a time, each
//! once, warm, in namespace/name order, and tells the waiting ones why; an owner's change of a waiting
//! instance rolls it at once, and the operator restarted midway (as a leader change) rolls none twice
//! and forgets none.
//!
//! What rolls is observed from the API server, not from the operator: a watch of the Deployments counts,
//! after every event, those rolling (a changed template their controller has not observed yet, or pods
//! not on the current template), and each Deployment's template images in the order they came. (A
//! Deployment's generation also moves with its annotations, which roll nothing: only the generation of
//! a template change counts.)
//!
//! `ENVTEST_FLEET_INSTANCES` sets how many instances (default 40).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use kube::api::ListParams;
use kube::runtime::watcher;
use kube::{Api, ResourceExt};
use serde_json::json;

use crate::handover::{KEYS, fill, hits, notes};
use crate::instances::{apply, condition, memcacheds, wait_all_settled};
use crate::{Scenario, wait_for};

const OLD_IMAGE: &str = "memcached:1.6.38-alpine";
const NEW_IMAGE: &str = "memcached:1.6.39-alpine";
/// 10 % of the default 40 instances.
const BUDGET: &str = "10%";
/// Every this many instances declares its clients' hashing, stores keys before the rollout and reads
/// them after (warm handover is on by default).
const WITH_KEYS_EVERY: usize = 8;
const VALUE_LEN: usize = 32;

/// What the watch saw of one Deployment.
#[derive(Default)]
struct Seen {
    /// Its template's images, each change once, in order.
    images: Vec<String>,
    rolling: bool,
    /// The generation at which its template last changed.
    template_generation: Option<i64>,
    /// When its template first took the new image (since the watch started).
    rolled_at: Option<Duration>,
}

#[derive(Default)]
struct Fleet {
    deployments: BTreeMap<String, Seen>,
    /// The instance whose owner changes its spec during the fleet rollout.
    owner_changed: String,
    /// The most Deployments rolling after any one event: all, and all but the owner's.
    most_rolling: usize,
    most_rolling_for_the_operator: usize,
}

fn image(d: &Deployment) -> String {
    d.spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .and_then(|p| p.containers.first())
        .and_then(|c| c.image.clone())
        .unwrap_or_default()
}

/// Whether `d`, whose template changed at `template_generation`, rolls: that change not observed by
/// its controller yet, or pods not on the current template.
fn rolling(d: &Deployment, template_generation: Option<i64>) -> bool {
    let wanted = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    let status = d.status.clone().unwrap_or_default();
    let updated = status.updated_replicas.unwrap_or(0);
    status.observed_generation < template_generation
        || updated < wanted
        || status.replicas.unwrap_or(0) > updated
}

/// Watches the scenario's Deployments into `fleet` until the task is dropped.
fn observe(s: &Scenario, fleet: Arc<Mutex<Fleet>>) -> tokio::task::JoinHandle<()> {
    let api: Api<Deployment> = Api::namespaced(s.client.clone(), &s.namespace);
    let started = Instant::now();
    tokio::spawn(async move {
        let mut events = Box::pin(watcher(api, watcher::Config::default()));
        while let Some(event) = events.next().await {
            let (watcher::Event::Apply(d) | watcher::Event::InitApply(d)) = event.expect("watch")
            else {
                continue;
            };
            let mut fleet = fleet.lock().unwrap();
            let seen = fleet.deployments.entry(d.name_any()).or_default();
            let now = image(&d);
            if seen.images.last() != Some(&now) {
                if now == NEW_IMAGE && seen.rolled_at.is_none() {
                    seen.rolled_at = Some(started.elapsed());
                }
                seen.images.push(now);
                seen.template_generation = d.metadata.generation;
            }
            seen.rolling = rolling(&d, seen.template_generation);
            let rolling: Vec<&String> = fleet
                .deployments
                .iter()
                .filter_map(|(name, d)| d.rolling.then_some(name))
                .collect();
            let all = rolling.len();
            let operator = rolling
                .iter()
                .filter(|n| **n != &fleet.owner_changed)
                .count();
            fleet.most_rolling = fleet.most_rolling.max(all);
            fleet.most_rolling_for_the_operator = fleet.most_rolling_for_the_operator.max(operator);
        }
    })
}

/// The operator's fleet-rollout series, as `/metrics` has them now.
async fn fleet_metrics(s: &Scenario) -> BTreeMap<String, f64> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let port = s.operator.metrics_port().expect("a metrics port chosen");
    let mut conn = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connecting to /metrics");
    conn.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .await
        .expect("asking for /metrics");
    let mut text = String::new();
    conn.read_to_string(&mut text)
        .await
        .expect("reading /metrics");
    text.lines()
        .filter(|line| line.starts_with("memcached_operator_fleet_rollout"))
        .filter_map(|line| line.rsplit_once(' '))
        .map(|(series, value)| (series.to_owned(), value.parse().unwrap_or(f64::NAN)))
        .collect()
}

fn name(i: usize) -> String {
    format!("fleet-{i:03}")
}

/// The instance's published servers once it lists one.
async fn servers(s: &Scenario, name: &str) -> Vec<String> {
    let api = memcacheds(s);
    wait_for(
        &format!("{name}'s server"),
        Duration::from_secs(60),
        || async {
            let mc = api.get(name).await.map_err(|e| e.to_string())?;
            let list = mc.status.map(|st| st.server_list).unwrap_or_default();
            if list.len() == 1 {
                Ok(list)
            } else {
                Err(format!("{list:?}"))
            }
        },
    )
    .await
}

#[tokio::test]
async fn an_operator_upgrade_rolls_the_fleet_within_its_budget_once_each_and_warm() {
    let args = [
        "--memcached-image",
        OLD_IMAGE,
        "--fleet-rollout-budget",
        BUDGET,
    ];
    let Some(mut s) = Scenario::start_with_memcached("fleet-rollout", &args).await else {
        return;
    };
    let count: usize = std::env::var("ENVTEST_FLEET_INSTANCES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(40);
    let budget = (count / 10).max(1);
    for i in 0..count {
        let mut spec = json!({
            "size": 1,
            "highAvailability": {"preStopDelaySeconds": 1, "terminationGracePeriodSeconds": 5},
        });
        if i.is_multiple_of(WITH_KEYS_EVERY) {
            spec["clients"] = json!({"hashing": "jump"});
        }
        apply(&s, &name(i), spec).await;
    }
    let took = wait_all_settled(&s, count, Duration::from_secs(300)).await;
    s.step(&format!(
        "{count} instances settled in {:.1} s",
        took.as_secs_f64()
    ));
    let mut stored = BTreeMap::new();
    for i in (0..count).step_by(WITH_KEYS_EVERY) {
        let servers = servers(&s, &name(i)).await;
        fill(&servers, VALUE_LEN).await;
        assert_eq!(hits(&servers, VALUE_LEN).await, KEYS);
        stored.insert(name(i), servers);
    }
    s.step(&format!(
        "{KEYS} keys stored on each of {} instances",
        stored.len()
    ));

    let owner_changed = name(count - 2);
    let fleet = Arc::new(Mutex::new(Fleet {
        owner_changed: owner_changed.clone(),
        ..Fleet::default()
    }));
    let watch = observe(&s, fleet.clone());
    let image_arg = s
        .operator_args
        .iter()
        .position(|a| a == OLD_IMAGE)
        .expect("the image flag");
    s.operator_args[image_arg] = NEW_IMAGE.to_owned();
    let restarted = Instant::now();
    s.restart_operator().await;

    // Waiting instances say why, with their place.
    let api = memcacheds(&s);
    let last = name(count - 1);
    let waiting = wait_for(
        "the last instance to wait for its turn",
        Duration::from_secs(60),
        || async {
            let mc = api.get(&last).await.map_err(|e| e.to_string())?;
            match condition(&mc, "Progressing") {
                Some(c) if c.reason == "WaitingForFleetRollout" => Ok(c.message.clone()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
    s.step(&format!("{last}: WaitingForFleetRollout: {waiting}"));
    assert!(waiting.contains("place "), "{waiting}");

    // An owner's change of a waiting instance rolls it at once (with the operator's change).
    let mut spec = json!({
        "size": 1,
        "highAvailability": {"preStopDelaySeconds": 1, "terminationGracePeriodSeconds": 5},
        "memcached": {"maxMemoryMB": 65},
    });
    if (count - 2).is_multiple_of(WITH_KEYS_EVERY) {
        spec["clients"] = json!({"hashing": "jump"});
    }
    apply(&s, &owner_changed, spec).await;
    s.step(&format!("{owner_changed}'s owner changed its spec"));

    // The operator restarted midway (as a leader change would): none rolls twice, none is forgotten.
    let rolled = || {
        let fleet = fleet.lock().unwrap();
        let new = |d: &&Seen| d.images.last().map(String::as_str) == Some(NEW_IMAGE);
        fleet.deployments.values().filter(new).count()
    };
    wait_for(
        "a third of the fleet to roll",
        Duration::from_secs(300),
        || async {
            let done = rolled();
            if done >= count / 3 {
                Ok(())
            } else {
                Err(format!("{done} rolled"))
            }
        },
    )
    .await;
    s.step(&format!(
        "{} of {count} rolled; restarting the operator",
        rolled()
    ));
    s.restart_operator().await;

    wait_for(
        "every Deployment to run the new image, settled",
        Duration::from_secs(600),
        || async {
            let fleet = fleet.lock().unwrap();
            let done = fleet
                .deployments
                .values()
                .filter(|d| d.images.last().map(String::as_str) == Some(NEW_IMAGE) && !d.rolling)
                .count();
            let most = fleet.most_rolling;
            if done == count {
                Ok(())
            } else {
                Err(format!("{done} of {count}; at most {most} rolling"))
            }
        },
    )
    .await;
    let total = restarted.elapsed();
    wait_all_settled(&s, count, Duration::from_secs(120)).await;
    watch.abort();

    let (mut waits, most_rolling, most_for_operator, names) = {
        let fleet = fleet.lock().unwrap();
        for (name, d) in &fleet.deployments {
            assert_eq!(d.images, [OLD_IMAGE, NEW_IMAGE], "{name} rolled once");
        }
        let waits: Vec<(String, Duration)> = fleet
            .deployments
            .iter()
            .map(|(name, d)| (name.clone(), d.rolled_at.expect("rolled")))
            .collect();
        let names: Vec<String> = fleet.deployments.keys().cloned().collect();
        let most = (fleet.most_rolling, fleet.most_rolling_for_the_operator);
        (waits, most.0, most.1, names)
    };
    let lines: Vec<String> = waits
        .iter()
        .map(|(name, wait)| format!("{name} {:.1} s", wait.as_secs_f64()))
        .collect();
    s.step(&format!(
        "fleet rolled in {:.1} s, at most {most_for_operator} of {count} rolling at once for the \
         operator (budget {budget}), {most_rolling} with the owner's; each instance's wait for its \
         new template: {}",
        total.as_secs_f64(),
        lines.join(", ")
    ));
    assert!(
        most_for_operator <= budget,
        "{most_for_operator} rolling at once"
    );
    assert!(most_for_operator >= budget.min(2), "turns ran side by side");
    // The owner's rollout takes a slot: at most one more when it started as the slots were full.
    assert!(most_rolling <= budget + 1, "{most_rolling} rolling at once");
    let owner_wait = waits
        .iter()
        .find(|(n, _)| *n == owner_changed)
        .expect("rolled")
        .1;
    // `waits` is in name order here: the instance in the middle of the queue.
    let middle_wait = waits[count / 2].1;
    assert!(
        owner_wait < middle_wait,
        "{owner_changed} rolled at {owner_wait:?}, not at once"
    );
    // Turns in namespace/name order: each turn goes to the first waiting instance that a free slot
    // reaches, so the k-th instance to roll is at most `budget - 1` places behind the k-th by name.
    waits.sort_by_key(|(_, wait)| *wait);
    let order: Vec<&str> = waits.iter().map(|(name, _)| name.as_str()).collect();
    s.step(&format!("turns by time: {order:?}"));
    let order: Vec<&str> = order.into_iter().filter(|n| *n != owner_changed).collect();
    let names: Vec<&String> = names.iter().filter(|n| **n != owner_changed).collect();
    for (k, name) in order.iter().enumerate() {
        let by_name = names.iter().position(|n| n == name).expect("seen");
        assert!(
            by_name < k + budget,
            "{name} rolled {k}th, {by_name}th by name"
        );
    }

    // The last operator's view: nothing pending or rolling, and the turns it gave, completed.
    let metrics = fleet_metrics(&s).await;
    s.step(&format!("fleet metrics: {metrics:?}"));
    let series = |key: &str| metrics.get(key).copied().unwrap_or(f64::NAN);
    assert_eq!(
        series("memcached_operator_fleet_rollout_instances{state=\"pending\"}"),
        0.0
    );
    assert_eq!(
        series("memcached_operator_fleet_rollout_instances{state=\"rolling\"}"),
        0.0
    );
    assert!(
        series("memcached_operator_fleet_rollout_completed_total") >= 1.0,
        "{metrics:?}"
    );
    let started = notes(&s, "FleetRolloutStarted").await;
    assert_eq!(started.len(), count - 1, "one event per turn: {started:#?}");
    for (name, old) in &stored {
        let new = servers(&s, name).await;
        assert_ne!(&new, old, "{name} got a new server");
        let read = hits(&new, VALUE_LEN).await;
        s.step(&format!("{name}: {read} of {KEYS} keys on its new server"));
        assert_eq!(read, KEYS, "{name} rolled warm");
    }
    let list = api.list(&ListParams::default()).await.expect("instances");
    for mc in &list.items {
        let progressing = condition(mc, "Progressing").expect("Progressing");
        assert_eq!(progressing.reason, "Complete", "{}", mc.name_any());
    }
}
