//! One server pod killed (deleted with no grace period: no preStop, no drain) while a plain client reads
//! every key through the proxy again and again. Which keys each server holds is asked of each server
//! alone beforehand; the keys of the killed server's slot are the only ones that may miss or fail, the
//! others hit in every round. Failures (`SERVER_ERROR backend failure` from the proxy, while the slot's
//! address is a dead pod's) stop once the replacement pod is published and the proxy reloaded the route;
//! from then on the slot's keys miss (its new server starts empty), the others hit. Then the operator
//! settles and writes nothing more.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use kube::ResourceExt;
use kube::api::DeleteParams;
use serde_json::{Value, json};

use super::{
    KEYS, RouteWatch, VALUE_LEN, proxy_follows, reloads_in_time, same_proxy, through_proxy,
};
use crate::Scenario;
use crate::instances::{memcacheds, pods, writes_during};
use crate::real_clients::{Published, drive, published};

/// The slot whose pod is killed.
const SLOT: usize = 1;
/// How long the client reads through the proxy: the kill comes after [`BEFORE_KILL`], the replacement
/// is published within seconds.
const WATCH: Duration = Duration::from_secs(25);
const BEFORE_KILL: Duration = Duration::from_secs(3);
/// A settled operator writes nothing in this window (it reconciles every 5 s meanwhile).
const QUIET: Duration = Duration::from_secs(20);

/// The keys (indexes) each published server holds, in slot order.
async fn held(list: &Published) -> Vec<BTreeSet<usize>> {
    let answer = drive(json!({
        "op": "held", "servers": list.servers, "keys": KEYS, "value_len": VALUE_LEN,
    }))
    .await
    .unwrap_or_else(|e| panic!("reading each server alone: {e}"));
    let held: Vec<Vec<usize>> =
        serde_json::from_value(answer["held"].clone()).unwrap_or_else(|e| panic!("{answer}: {e}"));
    held.into_iter().map(BTreeSet::from_iter).collect()
}

/// What the reading client saw: the keys that missed and those whose read failed, each with the first
/// and last time it did (seconds since the Unix epoch).
struct Seen {
    rounds: u64,
    missed: BTreeMap<usize, (f64, f64)>,
    errors: BTreeMap<usize, (f64, f64)>,
    batch_errors: u64,
}

impl Seen {
    fn of(answer: &Value) -> Self {
        let started = answer["started"].as_f64().unwrap_or_default();
        let times = |table: &Value| -> BTreeMap<usize, (f64, f64)> {
            let table: BTreeMap<String, (f64, f64)> =
                serde_json::from_value(table.clone()).unwrap_or_else(|e| panic!("{table}: {e}"));
            table
                .into_iter()
                .map(|(i, (first, last))| {
                    let i = i.parse().unwrap_or_else(|e| panic!("key {i}: {e}"));
                    (i, (started + first, started + last))
                })
                .collect()
        };
        Self {
            rounds: answer["rounds"].as_u64().unwrap_or_default(),
            missed: times(&answer["missed"]),
            errors: times(&answer["errors"]),
            batch_errors: answer["batch_errors"].as_u64().unwrap_or_default(),
        }
    }

    fn keys(&self) -> BTreeSet<usize> {
        self.missed
            .keys()
            .chain(self.errors.keys())
            .copied()
            .collect()
    }

    /// The first and last failure, in seconds after `since` (seconds since the Unix epoch).
    fn error_window(&self, since: f64) -> Option<(f64, f64)> {
        let first = self.errors.values().map(|t| t.0).reduce(f64::min)?;
        let last = self.errors.values().map(|t| t.1).reduce(f64::max)?;
        Some((first - since, last - since))
    }
}

fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64()
}

/// The name and uid of the pod holding `slot`.
async fn pod_of_slot(s: &Scenario, slot: usize) -> (String, String) {
    let mc = memcacheds(s).get("cache").await.expect("instance cache");
    let servers = mc.status.map(|st| st.servers).unwrap_or_default();
    let name = servers
        .iter()
        .find(|server| usize::try_from(server.slot) == Ok(slot))
        .and_then(|server| server.pod.clone())
        .unwrap_or_else(|| panic!("no pod holds slot {slot}: {servers:?}"));
    let pod = pods(s).get(&name).await.expect("the slot's pod");
    (name, pod.uid().unwrap_or_default())
}

/// Kills the pod of [`SLOT`] of the settled pool `list` under a reading client of `proxy_pod` (address,
/// uid, restarts) whose route was loaded `reloads` times, and checks what the client saw.
pub(super) async fn one_server_killed(
    s: &Scenario,
    proxy_pod: &(String, String, i32),
    list: &Published,
    reloads: u64,
) {
    let proxy = &proxy_pod.0;
    let held = held(list).await;
    let placed: usize = held.iter().map(BTreeSet::len).sum();
    assert_eq!(placed, KEYS, "each key is on one server: {placed} placed");
    let slot_keys = &held[SLOT];
    let (victim, uid) = pod_of_slot(s, SLOT).await;
    let route = RouteWatch::start(s, proxy);
    let request = json!({
        "op": "watch", "hashing": "plain", "servers": [proxy], "keys": KEYS,
        "value_len": VALUE_LEN, "seconds": WATCH.as_secs_f64(),
    });
    let reading = tokio::spawn(drive(request));
    tokio::time::sleep(BEFORE_KILL).await;
    let killed_at = now();
    pods(s)
        .delete(&victim, &DeleteParams::default().grace_period(0))
        .await
        .unwrap_or_else(|e| panic!("killing {victim}: {e}"));
    s.step(&format!(
        "killed {victim} (slot {SLOT}, {} of {KEYS} keys) with no grace period",
        slot_keys.len()
    ));
    let replaced = published_without(s, list.servers.len(), &victim, &uid).await;
    proxy_follows(s, proxy, &replaced, reloads + 1).await;
    let recovered_at = now();
    reloads_in_time(s, "server loss", &route.stop().await, true);
    let answer = reading
        .await
        .expect("the reading client's task")
        .unwrap_or_else(|e| panic!("the reading client: {e}"));
    let seen = Seen::of(&answer);
    let window = seen.error_window(killed_at);
    s.step(&format!(
        "while {victim} was killed: {} rounds of {KEYS} reads; {} keys missed, {} failed ({} multi-gets \
         failed), failures from {window:?} s after the kill; list and proxy recovered {:.2} s after it",
        seen.rounds,
        seen.missed.len(),
        seen.errors.len(),
        seen.batch_errors,
        recovered_at - killed_at,
    ));
    let others: Vec<usize> = seen.keys().difference(slot_keys).copied().collect();
    assert!(
        others.is_empty(),
        "only slot {SLOT}'s keys miss or fail; {} others did: {:?}",
        others.len(),
        &others[..others.len().min(20)]
    );
    assert_eq!(
        seen.keys(),
        *slot_keys,
        "every key of the killed server misses or fails once it is gone"
    );
    if let Some((_, last)) = window {
        assert!(
            killed_at + last <= recovered_at,
            "no failure after the list and the proxy recovered ({last:.2} s after the kill)"
        );
    }
    let hits = through_proxy("count", proxy).await;
    s.step(&format!(
        "after the server loss: {hits} of {KEYS} keys hit through the proxy (slot {SLOT}'s {} start \
         over on its new server)",
        slot_keys.len()
    ));
    assert_eq!(hits, KEYS - slot_keys.len());
    same_proxy(s, proxy_pod, "server loss").await;
    let writes = writes_during(s, QUIET).await;
    s.step(&format!(
        "settled after the server loss: operator writes in {} s: {}",
        QUIET.as_secs(),
        writes.total()
    ));
    assert_eq!(
        writes.total(),
        0,
        "no write loop after the server loss:\n{writes}"
    );
}

/// The settled list of `size` servers once the pod `victim` (`uid`) is replaced.
async fn published_without(s: &Scenario, size: usize, victim: &str, uid: &str) -> Published {
    let started = Instant::now();
    let gone = BTreeSet::from([uid.to_owned()]);
    let list = published(s, size, &gone, Duration::from_secs(120)).await;
    s.step(&format!(
        "{victim} replaced in the list after {:.1} s: {:?}",
        started.elapsed().as_secs_f64(),
        list.servers
    ));
    list
}
