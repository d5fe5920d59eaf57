//! Warm handovers as the real client libraries see them: for each declared `spec.clients.hashing` and
//! each workload, the library docs/clients.md names, configured as it tells users to (`clients.py` next to
//! this file: pylibmc over libmemcached with `ketama_weighted` for `ketama` and its defaults for `modula`,
//! pymemcache's `HashClient` for `rendezvous`, jump-consistent-hash picking a plain pymemcache client for
//! `jump`), fills 20 000 keys over the list the operator publishes (the `cache-servers` ConfigMap, read as
//! a client reads it), and the instance goes through a scale-up 3 -> 5, a scale-down 5 -> 3 and a rollout
//! (`memcached.maxMemoryMB` changed: every pod replaced). After each, once the operator says it settled,
//! the client is rebuilt from the list published then and reads every key back through the library:
//! every key must hit but the few a copy cannot see (at most [`MOST_UNLISTED`], 0.1 %: memcached's
//! `lru_crawler metadump` can skip an item the server moves between LRUs as the walk passes, see
//! docs/clients.md; seen as 1 key of 20 000 in 1 of 3 runs of a Deployment rollout under jump, 0 in every
//! other run), against about a third kept by a copy that goes to the wrong servers. The keys are written again (same values) before each operation, so each figure
//! is that operation's own.
//!
//! Unlike `scale_handover.rs` and `handover.rs`, nothing here places keys with the operator's own code:
//! a library that hashes differently from what the operator copies for shows as misses. pylibmc also
//! marks a `str` value with client flags (16) and returns `bytes` for one without them, so its hits also
//! say the copies kept the flags.
//!
//! A StatefulSet publishes `<pod>.cache-headless.<ns>.svc:11211`, names only the cluster's DNS resolves:
//! the client process gets an /etc/hosts of its own (a private mount namespace) mapping each name to its
//! pod's loopback address, so the libraries hash the names as published and resolve them through the
//! system resolver, as in a cluster. Without python3, one of the libraries, or a mount namespace (for the
//! StatefulSet's names), a scenario prints `envtest: skipped <scenario>: <reason>` and passes; `.ci/run`
//! installs the libraries.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::net::IpAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::ListParams;
use kube::{Api, ResourceExt};
use serde_json::{Value, json};

use crate::handover::notes;
use crate::instances::{apply, conditions, memcacheds, pods, settled};
use crate::{REPO_ROOT, Scenario, wait_for};

const KEYS: usize = 20_000;
/// The keys a warm operation may miss: items the source's dump did not list (see the module doc).
const MOST_UNLISTED: usize = KEYS / 1000;
const VALUE_LEN: usize = 100;
/// A short drain: the scale-down's copies run within it.
const DRAIN_SECONDS: u64 = 5;
/// The client driver, relative to the repository.
const SCRIPT: &str = "tests/envtest/clients.py";

fn spec(size: usize, workload: &str, hashing: &str, memory: i64) -> Value {
    json!({
        "size": size, "workload": workload,
        "memcached": {"maxMemoryMB": memory},
        "clients": {"hashing": hashing},
        "scaling": {"drainSeconds": DRAIN_SECONDS},
        "highAvailability": {"preStopDelaySeconds": 1, "terminationGracePeriodSeconds": 5},
    })
}

/// Runs `clients.py` with `request` on its stdin; its JSON answer, or why it gave none.
fn python(request: &Value) -> Result<Value, String> {
    let mut child = Command::new("python3")
        .arg(Path::new(REPO_ROOT).join(SCRIPT))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("python3: {e}"))?;
    child
        .stdin
        .take()
        .expect("a piped stdin")
        .write_all(request.to_string().as_bytes())
        .map_err(|e| format!("writing to {SCRIPT}: {e}"))?;
    let output = child
        .wait_with_output()
        .map_err(|e| format!("{SCRIPT}: {e}"))?;
    if !output.status.success() {
        return Err(format!(
            "{SCRIPT} {}: {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        ));
    }
    serde_json::from_slice(&output.stdout).map_err(|e| {
        format!(
            "{SCRIPT} answered {:?}: {e}",
            String::from_utf8_lossy(&output.stdout)
        )
    })
}

/// [`python`] off the runtime's threads.
pub(crate) async fn drive(request: Value) -> Result<Value, String> {
    tokio::task::spawn_blocking(move || python(&request))
        .await
        .expect("the client driver's thread")
}

/// The library behind `hashing` as `clients.py` names it, or why it cannot run here (the names of a
/// StatefulSet need a mount namespace for the client's /etc/hosts).
pub(crate) async fn probe(hashing: &str, names: bool) -> Result<String, String> {
    let hosts = match names {
        true => json!({"probe.cache-headless.envtest.svc": "127.0.0.1"}),
        false => json!({}),
    };
    let answer = drive(json!({"op": "probe", "hashing": hashing, "hosts": hosts})).await?;
    if let Some(why) = answer["unavailable"].as_str() {
        return Err(format!(
            "the {hashing} client cannot run ({why}; .ci/run installs the libraries)"
        ));
    }
    Ok(answer["library"].as_str().unwrap_or_default().to_owned())
}

/// The list the operator publishes, as a client reads it, and where its names point.
#[derive(Debug, Clone)]
pub(crate) struct Published {
    /// The ConfigMap's `servers`, one `host:port` a line, in slot order.
    pub servers: Vec<String>,
    /// Each published host that is not an address (a StatefulSet's DNS name), to its pod's IP.
    pub hosts: BTreeMap<String, String>,
    /// The uids of the pods holding the slots.
    pub uids: BTreeSet<String>,
}

/// Waits until instance `cache` settled with `size` ready servers, no drain under way, no spare server,
/// none of its slots held by a pod of `replaced` (uids), and the ConfigMap lists the servers of
/// `status.servers`; returns that list.
pub(crate) async fn published(
    s: &Scenario,
    size: usize,
    replaced: &BTreeSet<String>,
    timeout: Duration,
) -> Published {
    let api = memcacheds(s);
    let pods = pods(s);
    let maps: Api<ConfigMap> = Api::namespaced(s.client.clone(), &s.namespace);
    wait_for(
        &format!("instance cache to settle on {size} published servers, none of pods {replaced:?}"),
        timeout,
        || async {
            let mc = api.get("cache").await.map_err(|e| e.to_string())?;
            let status = mc.status.clone().unwrap_or_default();
            if !settled(&mc) || status.drain.is_some() || status.servers.len() != size {
                return Err(format!(
                    "{} servers, drain {:?}; {}",
                    status.servers.len(),
                    status.drain,
                    conditions(&mc)
                ));
            }
            let listed = pods
                .list(&ListParams::default().labels("app.kubernetes.io/instance=cache"))
                .await
                .map_err(|e| e.to_string())?
                .items;
            if listed.iter().any(|p| p.name_any() == "cache-handover") {
                return Err("the spare server is still there".into());
            }
            let mut servers = status.servers.clone();
            servers.sort_by_key(|server| server.slot);
            let (mut addresses, mut hosts, mut uids) =
                (Vec::new(), BTreeMap::new(), BTreeSet::new());
            for server in &servers {
                let address = server
                    .address
                    .clone()
                    .filter(|_| server.ready)
                    .ok_or_else(|| format!("slot {} is not ready: {server:?}", server.slot))?;
                let pod = listed
                    .iter()
                    .find(|p| Some(p.name_any()) == server.pod)
                    .ok_or_else(|| format!("no pod for slot {}: {server:?}", server.slot))?;
                let uid = pod.uid().unwrap_or_default();
                if replaced.contains(&uid) {
                    return Err(format!("{} is not replaced yet", pod.name_any()));
                }
                let (host, _) = address
                    .rsplit_once(':')
                    .ok_or_else(|| format!("{address} is not host:port"))?;
                let host = host.trim_start_matches('[').trim_end_matches(']');
                if host.parse::<IpAddr>().is_err() {
                    let ip = pod
                        .status
                        .as_ref()
                        .and_then(|st| st.pod_ip.clone())
                        .ok_or_else(|| format!("{} has no IP", pod.name_any()))?;
                    hosts.insert(host.to_owned(), ip);
                }
                addresses.push(address);
                uids.insert(uid);
            }
            let map = maps
                .get("cache-servers")
                .await
                .map_err(|e| format!("ConfigMap cache-servers: {e}"))?;
            let text = map
                .data
                .as_ref()
                .and_then(|d| d.get("servers"))
                .cloned()
                .unwrap_or_default();
            let servers: Vec<String> = text.lines().map(str::to_owned).collect();
            if servers != addresses {
                return Err(format!(
                    "the ConfigMap lists {servers:?}, status.servers {addresses:?}"
                ));
            }
            Ok(Published {
                servers,
                hosts,
                uids,
            })
        },
    )
    .await
}

/// What the library did over `list`: (keys stored or hit, seconds it took).
async fn through_library(op: &str, hashing: &str, list: &Published) -> (usize, f64) {
    let answer = drive(json!({
        "op": op, "hashing": hashing, "servers": list.servers, "hosts": list.hosts,
        "keys": KEYS, "value_len": VALUE_LEN,
    }))
    .await
    .unwrap_or_else(|e| panic!("the {hashing} client's {op} over {:?}: {e}", list.servers));
    let hits = answer["hits"]
        .as_u64()
        .unwrap_or_else(|| panic!("{answer}"));
    (
        hits as usize,
        answer["seconds"].as_f64().unwrap_or(f64::NAN),
    )
}

/// One operation's figures.
struct Outcome {
    operation: &'static str,
    hits: usize,
    settled_in: Duration,
    read_in: f64,
    handed_over: usize,
    failed: Vec<String>,
}

/// An instance of `workload` declaring `hashing`, 3 servers filled through the real client, scaled up to
/// 5, down to 3 and rolled out; every key read back through the client after each. Fails unless every
/// operation kept all 20 000 keys.
async fn keeps_the_library_warm(name: &str, workload: &str, hashing: &str) {
    if envtest::assets().is_none() {
        envtest::skip(name);
        return;
    }
    let library = match probe(hashing, workload == "StatefulSet").await {
        Ok(library) => library,
        Err(reason) => return envtest::skip_because(name, &reason),
    };
    let Some(s) = Scenario::start_with_memcached(name, &[]).await else {
        return;
    };
    apply(&s, "cache", spec(3, workload, hashing, 64)).await;
    let mut list = published(&s, 3, &BTreeSet::new(), Duration::from_secs(120)).await;
    s.step(&format!(
        "{workload} under {hashing}, client {library}: published {:?} ({:?})",
        list.servers, list.hosts
    ));
    // (what, size after, maxMemoryMB after, whether it replaces every pod)
    let operations: [(&str, usize, i64, bool); 3] = [
        ("scale-up 3 -> 5", 5, 64, false),
        ("scale-down 5 -> 3", 3, 64, false),
        ("rollout (maxMemoryMB 64 -> 65)", 3, 65, true),
    ];
    let mut outcomes = Vec::new();
    for (operation, size, memory, replaces) in operations {
        let (stored, fill_seconds) = through_library("fill", hashing, &list).await;
        let (before, _) = through_library("count", hashing, &list).await;
        assert_eq!(
            (stored, before),
            (KEYS, KEYS),
            "the {hashing} client stores and reads back every key over {:?}",
            list.servers
        );
        let (handed_before, failed_before) = (
            notes(&s, "HandedOver").await.len(),
            notes(&s, "HandoverFailed").await.len(),
        );
        s.step(&format!(
            "{KEYS} keys stored through {library} in {fill_seconds:.2} s; {operation}"
        ));
        apply(&s, "cache", spec(size, workload, hashing, memory)).await;
        let started = Instant::now();
        // A rollout replaces every pod; a scale keeps the pods of the slots it keeps.
        let replaced = match replaces {
            true => list.uids.clone(),
            false => BTreeSet::new(),
        };
        list = published(&s, size, &replaced, Duration::from_secs(240)).await;
        let settled_in = started.elapsed();
        let (hits, read_in) = through_library("count", hashing, &list).await;
        let handed_over = notes(&s, "HandedOver").await.len() - handed_before;
        let failed: Vec<String> = notes(&s, "HandoverFailed")
            .await
            .into_iter()
            .skip(failed_before)
            .collect();
        s.step(&format!(
            "{workload} {hashing} {operation}: settled in {:.1} s on {:?}; hits {hits} of {KEYS} \
             ({:.1} %) read through {library} in {read_in:.2} s; HandedOver events {handed_over}; \
             HandoverFailed {failed:?}",
            settled_in.as_secs_f64(),
            list.servers,
            hits as f64 * 100.0 / KEYS as f64
        ));
        outcomes.push(Outcome {
            operation,
            hits,
            settled_in,
            read_in,
            handed_over,
            failed,
        });
    }
    let figures: Vec<String> = outcomes
        .iter()
        .map(|o| {
            format!(
                "{workload} {hashing} {}: hits {} of {KEYS}, settled in {:.1} s, read in {:.2} s, \
                 {} HandedOver, {} HandoverFailed",
                o.operation,
                o.hits,
                o.settled_in.as_secs_f64(),
                o.read_in,
                o.handed_over,
                o.failed.len()
            )
        })
        .collect();
    for line in &figures {
        eprintln!("real-clients: {line}");
    }
    let cold: Vec<&String> = figures
        .iter()
        .zip(&outcomes)
        .filter(|(_, o)| o.hits + MOST_UNLISTED < KEYS)
        .map(|(line, _)| line)
        .collect();
    assert!(
        cold.is_empty(),
        "the {hashing} client ({library}) missed keys after: {cold:#?}"
    );
}

#[tokio::test]
async fn a_deployment_under_ketama_keeps_pylibmc_warm() {
    keeps_the_library_warm("real-clients-deploy-ketama", "Deployment", "ketama").await;
}

#[tokio::test]
async fn a_deployment_under_rendezvous_keeps_pymemcache_warm() {
    keeps_the_library_warm("real-clients-deploy-rendezvous", "Deployment", "rendezvous").await;
}

#[tokio::test]
async fn a_deployment_under_modula_keeps_pylibmc_warm() {
    keeps_the_library_warm("real-clients-deploy-modula", "Deployment", "modula").await;
}

#[tokio::test]
async fn a_deployment_under_jump_keeps_the_jump_client_warm() {
    keeps_the_library_warm("real-clients-deploy-jump", "Deployment", "jump").await;
}

#[tokio::test]
async fn a_statefulset_under_ketama_keeps_pylibmc_warm() {
    keeps_the_library_warm("real-clients-sts-ketama", "StatefulSet", "ketama").await;
}

#[tokio::test]
async fn a_statefulset_under_rendezvous_keeps_pymemcache_warm() {
    keeps_the_library_warm("real-clients-sts-rendezvous", "StatefulSet", "rendezvous").await;
}

#[tokio::test]
async fn a_statefulset_under_modula_keeps_pylibmc_warm() {
    keeps_the_library_warm("real-clients-sts-modula", "StatefulSet", "modula").await;
}

#[tokio::test]
async fn a_statefulset_under_jump_keeps_the_jump_client_warm() {
    keeps_the_library_warm("real-clients-sts-jump", "StatefulSet", "jump").await;
}
