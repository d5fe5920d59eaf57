//! The fleet rollout: an operator restarted with a changed pod template (a new `--memcached-image`, as an
//! upgrade that changes the template) rolls at most `--fleet-rollout-budget` instances at a time, each
//! once, warm, in namespace/name order, and tells the waiting ones why; an instance's proxy rolls in the
//! instance's turn (its Deployment runs the operator's default image too); an owner's change of a waiting
//! instance rolls it at once, so does a waiting instance's workload edited by hand (its turn puts the
//! operator's template in place of the edit); and the operator restarted midway (as a leader change)
//! rolls none twice and forgets none.
//!
//! What rolls is observed from the API server, not from the operator: a watch of the Deployments and
//! StatefulSets (one instance in ten runs one, one in eight has a proxy) counts, after every event, the
//! instances rolling (one of their workloads with a changed template its controller has not observed
//! yet, or pods not on the current template), and each workload's template images in the order they
//! came. (A Deployment's generation also moves with its annotations, which roll nothing: only the
//! generation of a template change counts.)
//!
//! `ENVTEST_FLEET_INSTANCES` sets how many instances (default 40).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use kube::api::{ListParams, Patch, PatchParams};
use kube::runtime::watcher;
use kube::{Api, ResourceExt};
use serde_json::json;

use crate::handover::{KEYS, fill, hits, notes, operator_metrics};
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
/// Every this many instances, one (the 5th, 15th, ...) runs a StatefulSet.
const STATEFULSET_EVERY: usize = 10;
/// Every this many instances, one (the 3rd, 11th, ...) runs a proxy, which runs the default image.
const PROXY_EVERY: usize = 8;
/// The grace period every instance asks for, and the one a hand edit puts on a workload instead.
const GRACE_SECONDS: i64 = 5;
const EDITED_GRACE_SECONDS: i64 = 7;

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
    workloads: BTreeMap<String, Seen>,
    /// The most instances rolling after any one event: all, and all but those rolled by someone else.
    most_rolling: usize,
    most_rolling_for_the_operator: usize,
    /// The operator's rollouts at that moment.
    at_most: Vec<String>,
}

/// What the watch reads of a workload of either kind, at the API server's revision `version`.
#[derive(Clone)]
struct Workload {
    version: u64,
    name: String,
    generation: Option<i64>,
    image: String,
    wanted: i64,
    observed_generation: Option<i64>,
    replicas: i64,
    updated: i64,
}

impl Workload {
    fn of<K: serde::Serialize>(object: &K) -> Self {
        let v = serde_json::to_value(object).expect("a workload");
        let number = |v: &serde_json::Value| v.as_i64();
        Workload {
            // The etcd revision the object was written at: one order over both kinds (an integer on
            // every etcd-backed API server, though clients are told to treat it as opaque).
            version: v["metadata"]["resourceVersion"]
                .as_str()
                .and_then(|v| v.parse().ok())
                .expect("a numeric resourceVersion"),
            name: v["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            generation: number(&v["metadata"]["generation"]),
            image: v["spec"]["template"]["spec"]["containers"][0]["image"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            wanted: number(&v["spec"]["replicas"]).unwrap_or(1),
            observed_generation: number(&v["status"]["observedGeneration"]),
            replicas: number(&v["status"]["replicas"]).unwrap_or(0),
            updated: number(&v["status"]["updatedReplicas"]).unwrap_or(0),
        }
    }

    /// Whether it rolls, its template having changed at `template_generation`: that change not
    /// observed by its controller yet, or pods not on the current template.
    fn rolling(&self, template_generation: Option<i64>) -> bool {
        self.observed_generation < template_generation
            || self.updated < self.wanted
            || self.replicas > self.updated
    }
}

/// Every event the watches saw (a workload of an instance, and when since the watches started).
type Events = Arc<Mutex<Vec<(Duration, Workload)>>>;

/// The instance a workload is of: a proxy's Deployment (`<name>-proxy`) is its instance's.
fn instance_of(workload: &str) -> &str {
    workload.strip_suffix("-proxy").unwrap_or(workload)
}

/// The fleet as the API server committed `events`, replayed in its order (two watches, one per kind,
/// deliver each kind in order but not the two in one): `others` are the instances someone else rolled
/// (their owner changed the spec, or someone edited the workload).
fn replay(events: &Events, others: &[&str]) -> Fleet {
    let mut events = events.lock().unwrap().clone();
    events.sort_by_key(|(_, workload)| workload.version);
    let mut fleet = Fleet::default();
    for (at, workload) in &events {
        let seen = fleet.workloads.entry(workload.name.clone()).or_default();
        if seen.images.last() != Some(&workload.image) {
            if workload.image == NEW_IMAGE && seen.rolled_at.is_none() {
                seen.rolled_at = Some(*at);
            }
            seen.images.push(workload.image.clone());
            seen.template_generation = workload.generation;
        }
        seen.rolling = workload.rolling(seen.template_generation);
        let rolling: BTreeSet<&str> = fleet
            .workloads
            .iter()
            .filter_map(|(name, d)| d.rolling.then_some(instance_of(name)))
            .collect();
        let operator: Vec<String> = rolling
            .iter()
            .filter(|n| !others.contains(n))
            .map(|n| (*n).to_owned())
            .collect();
        fleet.most_rolling = fleet.most_rolling.max(rolling.len());
        if operator.len() > fleet.most_rolling_for_the_operator {
            fleet.most_rolling_for_the_operator = operator.len();
            fleet.at_most = operator;
        }
    }
    fleet
}

/// Watches the scenario's workloads of kind `K` (those of the instances `names`) into `events` until the
/// task is dropped.
fn observe<K>(
    s: &Scenario,
    names: Vec<String>,
    events: Events,
    started: Instant,
) -> tokio::task::JoinHandle<()>
where
    K: kube::Resource<Scope = kube::core::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + serde::Serialize
        + Send
        + 'static,
{
    let api: Api<K> = Api::namespaced(s.client.clone(), &s.namespace);
    tokio::spawn(async move {
        let mut stream = Box::pin(watcher(api, watcher::Config::default()));
        while let Some(event) = stream.next().await {
            let (watcher::Event::Apply(object) | watcher::Event::InitApply(object)) =
                event.expect("watch")
            else {
                continue;
            };
            let workload = Workload::of(&object);
            if names.contains(&workload.name) {
                events.lock().unwrap().push((started.elapsed(), workload));
            }
        }
    })
}

/// The operator's fleet-rollout series, as `/metrics` has them now.
async fn fleet_metrics(s: &Scenario) -> BTreeMap<String, f64> {
    let text = operator_metrics(s).await;
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
            "highAvailability": {
                "preStopDelaySeconds": 1,
                "terminationGracePeriodSeconds": GRACE_SECONDS,
            },
        });
        if i.is_multiple_of(WITH_KEYS_EVERY) {
            spec["clients"] = json!({"hashing": "jump"});
        }
        if i % STATEFULSET_EVERY == STATEFULSET_EVERY / 2 {
            spec["workload"] = json!("StatefulSet");
        }
        if i % PROXY_EVERY == 3 {
            spec["proxy"] = json!({"enabled": true});
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
    // A Deployment's instance near the end of the queue.
    let edited = (0..count - 2)
        .rev()
        .find(|i| i % STATEFULSET_EVERY != STATEFULSET_EVERY / 2)
        .map(name)
        .expect("a Deployment's instance");
    let others = [owner_changed.as_str(), edited.as_str()];
    let events = Events::default();
    let proxies: Vec<String> = (3..count)
        .step_by(PROXY_EVERY)
        .map(|i| format!("{}-proxy", name(i)))
        .collect();
    let names: Vec<String> = (0..count).map(name).chain(proxies.clone()).collect();
    let started = Instant::now();
    let watches = [
        observe::<Deployment>(&s, names.clone(), events.clone(), started),
        observe::<StatefulSet>(&s, names, events.clone(), started),
    ];
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
        "highAvailability": {
                "preStopDelaySeconds": 1,
                "terminationGracePeriodSeconds": GRACE_SECONDS,
            },
        "memcached": {"maxMemoryMB": 65},
    });
    if (count - 2).is_multiple_of(WITH_KEYS_EVERY) {
        spec["clients"] = json!({"hashing": "jump"});
    }
    apply(&s, &owner_changed, spec).await;
    s.step(&format!("{owner_changed}'s owner changed its spec"));

    // A waiting instance's workload edited by hand: its controller rolls the edit, so the instance takes
    // its turn, and the operator's template replaces the edit.
    let deployments: Api<Deployment> = Api::namespaced(s.client.clone(), &s.namespace);
    let edit = json!({"spec": {"template": {"spec": {"terminationGracePeriodSeconds": EDITED_GRACE_SECONDS}}}});
    deployments
        .patch(&edited, &PatchParams::default(), &Patch::Merge(&edit))
        .await
        .expect("a hand edit");
    s.step(&format!("{edited}'s Deployment edited by hand"));

    // The operator restarted midway (as a leader change would): none rolls twice, none is forgotten.
    let rolled = || {
        let fleet = replay(&events, &others);
        let new = |d: &&Seen| d.images.last().map(String::as_str) == Some(NEW_IMAGE);
        fleet.workloads.values().filter(new).count()
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
        "every workload to run the new image, settled",
        Duration::from_secs(600),
        || async {
            let fleet = replay(&events, &others);
            let done = fleet
                .workloads
                .values()
                .filter(|d| d.images.last().map(String::as_str) == Some(NEW_IMAGE) && !d.rolling)
                .count();
            let most = fleet.most_rolling;
            let all = count + proxies.len();
            if done == all {
                Ok(())
            } else {
                Err(format!("{done} of {all}; at most {most} instances rolling"))
            }
        },
    )
    .await;
    let total = restarted.elapsed();
    wait_all_settled(&s, count, Duration::from_secs(120)).await;
    for watch in watches {
        watch.abort();
    }

    let (mut waits, most_rolling, most_for_operator, names) = {
        let fleet = replay(&events, &others);
        for (name, d) in &fleet.workloads {
            assert_eq!(d.images, [OLD_IMAGE, NEW_IMAGE], "{name} rolled once");
        }
        // Each proxy rolled in its instance's turn: after the instance's workload took the new template,
        // before the next turns could have started and ended.
        for proxy in &proxies {
            let rolled = |name: &str| fleet.workloads[name].rolled_at.expect("rolled");
            let (proxy_at, workload_at) = (rolled(proxy), rolled(instance_of(proxy)));
            s.step(&format!(
                "{proxy} took the new template {:+.1} s after its instance's workload",
                proxy_at.as_secs_f64() - workload_at.as_secs_f64()
            ));
            assert!(
                proxy_at.abs_diff(workload_at) < Duration::from_secs(10),
                "{proxy} rolled at {proxy_at:?}, its instance at {workload_at:?}"
            );
        }
        let waits: Vec<(String, Duration)> = fleet
            .workloads
            .iter()
            .filter(|(name, _)| instance_of(name) == name.as_str())
            .map(|(name, d)| (name.clone(), d.rolled_at.expect("rolled")))
            .collect();
        let names: Vec<String> = waits.iter().map(|(name, _)| name.clone()).collect();
        s.step(&format!(
            "the most of the operator's rollouts at once: {:?}",
            fleet.at_most
        ));
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
    // The owner's and the hand edit's rollouts take slots: at most one more each when they started as
    // the slots were full.
    assert!(most_rolling <= budget + 2, "{most_rolling} rolling at once");
    // `waits` is in name order here: the instance in the middle of the queue.
    let middle_wait = waits[count / 2].1;
    for other in others {
        let wait = waits.iter().find(|(n, _)| *n == other).expect("rolled").1;
        assert!(
            wait < middle_wait,
            "{other} rolled at {wait:?}, not at once"
        );
    }
    let live = deployments
        .get(&edited)
        .await
        .expect("the edited Deployment");
    let grace = live
        .spec
        .and_then(|s| s.template.spec)
        .and_then(|s| s.termination_grace_period_seconds);
    assert_eq!(grace, Some(GRACE_SECONDS), "{edited}'s hand edit put back");
    // Turns in namespace/name order: each turn goes to the first waiting instance that a free slot
    // reaches, so the k-th instance to roll is at most `budget - 1` places behind the k-th by name.
    waits.sort_by_key(|(_, wait)| *wait);
    let order: Vec<&str> = waits.iter().map(|(name, _)| name.as_str()).collect();
    s.step(&format!("turns by time: {order:?}"));
    let order: Vec<&str> = order.into_iter().filter(|n| !others.contains(n)).collect();
    let names: Vec<&String> = names
        .iter()
        .filter(|n| !others.contains(&n.as_str()))
        .collect();
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
    // Every instance but the owner's and the edited one took its turn from the fleet.
    assert_eq!(started.len(), count - 2, "one event per turn: {started:#?}");
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
