//! Warm scale handover under a declared client hashing, on real memcached servers (issue 23): a client
//! fills 20 000 keys over the published list, the instance scales, and the client reads every key back
//! over the list published after. With `clients.hashing: jump` the operator copies the keys that change
//! server, so at least 95 % hit; with `unknown` it copies nothing, and a scale-down 4 -> 3 loses the
//! removed server's quarter (about 75 % hit), a scale-up 3 -> 5 the two fifths jump moves to the new
//! servers (about 60 %).
//!
//! The client is the rollout scenarios' (`handover.rs`): it places keys as a client of the declared scheme
//! does (jump where none is declared), through the operator's `hashing::Placement`, which tests/hashing.rs
//! checks against vectors the real libraries produced, so the operator reproduces the client, not itself.
//! Jump runs in both workloads; ketama, rendezvous and modula, which place keys by the published entries'
//! text, run in Deployments, whose published entries (pod IPs) the test reaches as they are.
//!
//! Also: a Deployment rollout under ketama and under rendezvous, whose new pod IPs move keys between
//! servers as a scale does: every key hits afterwards.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use serde_json::{Value, json};

use memcached_operator::hashing::Scheme;

use crate::handover::{Access, KEYS, fill, fill_placed, hits, hits_placed, notes};
use crate::instances::{apply, condition, conditions, memcacheds, settled};
use crate::{Scenario, wait_for};

/// Value bytes of the keys of most scenarios.
const VALUE_LEN: usize = 100;
/// A short drain: the scale-down's copies run within it.
const DRAIN_SECONDS: u64 = 5;

/// The published entries as addresses the test can connect to: a StatefulSet's stable DNS names
/// (`<pod>.<headless>.<ns>.svc:port`, which nothing resolves here) become their pods' IPs. Jump places
/// keys by index, so the order is all that counts.
async fn reachable(s: &Scenario, list: &[String]) -> Vec<String> {
    let pods: Api<Pod> = Api::namespaced(s.client.clone(), &s.namespace);
    let mut out = Vec::new();
    for entry in list {
        let (host, port) = entry.rsplit_once(':').expect("host:port");
        if host.parse::<std::net::IpAddr>().is_ok() {
            out.push(entry.clone());
            continue;
        }
        let pod = host.split('.').next().unwrap_or_default();
        let ip = pods
            .get(pod)
            .await
            .ok()
            .and_then(|p| p.status?.pod_ip)
            .unwrap_or_else(|| panic!("pod {pod} of {entry} has an IP"));
        out.push(format!("{ip}:{port}"));
    }
    out
}

/// `status.serverList`, once the instance is settled with `size` servers.
async fn settled_servers(s: &Scenario, size: usize, timeout: Duration) -> Vec<String> {
    let api = memcacheds(s);
    wait_for(
        &format!("the instance to settle with {size} servers"),
        timeout,
        || async {
            let mc = api.get("cache").await.map_err(|e| e.to_string())?;
            let list = mc
                .status
                .as_ref()
                .map(|st| st.server_list.clone())
                .unwrap_or_default();
            if settled(&mc) && list.len() == size && mc.status.as_ref().unwrap().drain.is_none() {
                Ok(list)
            } else {
                Err(format!("{list:?}; {}", conditions(&mc)))
            }
        },
    )
    .await
}

fn spec(size: usize, workload: &str, hashing: &str) -> Value {
    spec_with(size, workload, hashing, json!({}))
}

fn spec_with(size: usize, workload: &str, hashing: &str, handover: Value) -> Value {
    json!({
        "size": size, "workload": workload,
        "memcached": {"maxMemoryMB": 64},
        "clients": {"hashing": hashing},
        "scaling": {"drainSeconds": DRAIN_SECONDS},
        "handover": handover,
        "highAvailability": {"preStopDelaySeconds": 1, "terminationGracePeriodSeconds": 5},
    })
}

/// What a scale did to the keys.
struct Scaled {
    read: usize,
    took: Duration,
    handed: Vec<String>,
    failed: Vec<String>,
    saw_handing_over: bool,
}

/// The client's placement for `spec.clients.hashing` (jump where none is declared).
fn client_scheme(hashing: &str) -> Scheme {
    match hashing {
        "ketama" => Scheme::Ketama,
        "rendezvous" => Scheme::Rendezvous,
        "modula" => Scheme::Modula,
        _ => Scheme::Jump,
    }
}

/// Settles `from` servers, fills them, scales to `to` and reads every key back once settled.
async fn scale(s: &Scenario, workload: &str, hashing: &str, from: usize, to: usize) -> Scaled {
    let scheme = client_scheme(hashing);
    apply(s, "cache", spec(from, workload, hashing)).await;
    let old = settled_servers(s, from, Duration::from_secs(90)).await;
    let old = reachable(s, &old).await;
    fill_placed(scheme, &Access::plain(), &old, VALUE_LEN).await;
    let stored = hits_placed(scheme, &Access::plain(), &old, VALUE_LEN).await;
    assert_eq!(stored, KEYS, "every key is stored before the scale");
    s.step(&format!(
        "{workload}: {stored} keys on {old:?}; scaling {from} -> {to} (hashing {hashing})"
    ));
    apply(s, "cache", spec(to, workload, hashing)).await;
    let started = Instant::now();
    // Whether Progressing=HandingOver shows while the copies run (polled; a fast copy may be missed).
    let api = memcacheds(s);
    let mut saw_handing_over = false;
    let deadline = Instant::now() + Duration::from_secs(180);
    let new = loop {
        let mc = api.get("cache").await.expect("the instance");
        if condition(&mc, "Progressing").is_some_and(|c| c.reason == "HandingOver") {
            saw_handing_over = true;
        }
        let status = mc.status.clone().unwrap_or_default();
        if settled(&mc) && status.server_list.len() == to && status.drain.is_none() {
            break status.server_list;
        }
        assert!(
            Instant::now() < deadline,
            "the scale did not settle: {}",
            conditions(&mc)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let took = started.elapsed();
    let new = reachable(s, &new).await;
    let read = hits_placed(scheme, &Access::plain(), &new, VALUE_LEN).await;
    let (handed, failed) = (
        notes(s, "HandedOver").await,
        notes(s, "HandoverFailed").await,
    );
    s.step(&format!(
        "{workload} {from} -> {to} (hashing {hashing}) settled in {:.1} s on {new:?}: {read} of {KEYS} \
         keys hit ({:.1} %); HandedOver: {handed:#?}; HandoverFailed: {failed:#?}",
        took.as_secs_f64(),
        read as f64 * 100.0 / KEYS as f64
    ));
    Scaled {
        read,
        took,
        handed,
        failed,
        saw_handing_over,
    }
}

fn assert_warm(scaled: &Scaled, targets: usize) {
    assert!(
        scaled.read * 100 >= KEYS * 95,
        "{} of {KEYS} keys hit after the scale",
        scaled.read
    );
    assert_eq!(
        scaled.handed.len(),
        targets,
        "one HandedOver event per target server: {:#?}",
        scaled.handed
    );
    assert!(scaled.failed.is_empty(), "{:#?}", scaled.failed);
}

/// One scale that keeps the keys warm: the scenario's name, the workload, the declared hashing, the
/// sizes before and after, how many servers take keys (one `HandedOver` each), and whether the drain's
/// wait is checked too.
struct WarmScale {
    scenario: &'static str,
    workload: &'static str,
    hashing: &'static str,
    from: usize,
    to: usize,
    targets: usize,
    drain_waited: bool,
}

async fn keeps_the_keys_warm(case: WarmScale) {
    let Some(s) = Scenario::start_with_memcached(case.scenario, &[]).await else {
        return;
    };
    let scaled = scale(&s, case.workload, case.hashing, case.from, case.to).await;
    assert_warm(&scaled, case.targets);
    if case.drain_waited {
        assert!(
            scaled.took >= Duration::from_secs(DRAIN_SECONDS),
            "the drain was waited for"
        );
    }
}

/// A test per row, so the scenarios run in parallel and each can be run by its name.
macro_rules! warm_scales {
    ($($(#[doc = $doc:literal])* $test:ident: $case:expr;)*) => {$(
        $(#[doc = $doc])*
        #[tokio::test]
        async fn $test() {
            keeps_the_keys_warm($case).await;
        }
    )*};
}

warm_scales! {
    a_deployment_scale_down_keeps_the_keys_warm: WarmScale {
        scenario: "scale-down-warm", workload: "Deployment", hashing: "jump",
        from: 4, to: 3, targets: 3, drain_waited: true,
    };
    a_deployment_scale_up_keeps_the_keys_warm: WarmScale {
        scenario: "scale-up-warm", workload: "Deployment", hashing: "jump",
        from: 3, to: 5, targets: 2, drain_waited: false,
    };
    a_statefulset_scale_up_keeps_the_keys_warm: WarmScale {
        scenario: "scale-up-warm-sts", workload: "StatefulSet", hashing: "jump",
        from: 3, to: 5, targets: 2, drain_waited: false,
    };
    a_statefulset_scale_down_keeps_the_keys_warm: WarmScale {
        scenario: "scale-down-warm-sts", workload: "StatefulSet", hashing: "jump",
        from: 4, to: 3, targets: 3, drain_waited: false,
    };
    /// Ketama (libmemcached's consistent hashing) between 4 and 3 servers: 160 points per server both, so
    /// only the leaving server's keys move, from it to the servers that own them after.
    a_scale_down_under_ketama_keeps_the_keys_warm: WarmScale {
        scenario: "scale-down-ketama", workload: "Deployment", hashing: "ketama",
        from: 4, to: 3, targets: 3, drain_waited: false,
    };
    /// Rendezvous (pymemcache's `HashClient`): a scale-up moves to each new server the keys it wins.
    a_scale_up_under_rendezvous_keeps_the_keys_warm: WarmScale {
        scenario: "scale-up-rendezvous", workload: "Deployment", hashing: "rendezvous",
        from: 3, to: 5, targets: 2, drain_waited: false,
    };
    /// Modula (libmemcached's default) moves most keys on any scale: every server copies to every other
    /// one.
    a_scale_down_under_modula_keeps_the_keys_warm: WarmScale {
        scenario: "scale-down-modula", workload: "Deployment", hashing: "modula",
        from: 4, to: 3, targets: 3, drain_waited: false,
    };
}

/// A Deployment rollout under a hashing of the addresses: every new server has a new pod IP, so the
/// clients move keys between servers as on a scale (kept 33 % under ketama, 31 % under rendezvous when
/// the copies went slot to slot). Each takeover copies every key that changes server under the list with
/// the new pod's address at the old one's slot, from its owner before: 20 000 of 20 000 keys hit.
async fn rollout(s: &Scenario, hashing: &str) {
    let scheme = client_scheme(hashing);
    apply(s, "cache", spec(4, "Deployment", hashing)).await;
    let old = settled_servers(s, 4, Duration::from_secs(90)).await;
    fill_placed(scheme, &Access::plain(), &old, VALUE_LEN).await;
    let stored = hits_placed(scheme, &Access::plain(), &old, VALUE_LEN).await;
    assert_eq!(stored, KEYS, "every key is stored before the rollout");
    s.step(&format!(
        "{stored} keys on {old:?} (hashing {hashing}); changing -m (a rollout)"
    ));
    let mut changed = spec(4, "Deployment", hashing);
    changed["memcached"]["maxMemoryMB"] = json!(65);
    apply(s, "cache", changed).await;
    let started = Instant::now();
    let api = memcacheds(s);
    let new = wait_for(
        "the rollout to settle on 4 new servers",
        Duration::from_secs(240),
        || async {
            let mc = api.get("cache").await.map_err(|e| e.to_string())?;
            let list = mc
                .status
                .as_ref()
                .map(|st| st.server_list.clone())
                .unwrap_or_default();
            if settled(&mc) && list.len() == 4 && list.iter().all(|a| !old.contains(a)) {
                Ok(list)
            } else {
                Err(format!("{list:?}; {}", conditions(&mc)))
            }
        },
    )
    .await;
    let took = started.elapsed();
    let read = hits_placed(scheme, &Access::plain(), &new, VALUE_LEN).await;
    let (handed, failed) = (
        notes(s, "HandedOver").await,
        notes(s, "HandoverFailed").await,
    );
    s.step(&format!(
        "Deployment rollout (hashing {hashing}) settled in {:.1} s on {new:?}: {read} of {KEYS} keys hit \
         ({:.1} %); HandedOver: {handed:#?}; HandoverFailed: {failed:#?}",
        took.as_secs_f64(),
        read as f64 * 100.0 / KEYS as f64
    ));
    assert_eq!(read, KEYS, "every key hit after the rollout");
    assert_eq!(handed.len(), 4, "one HandedOver event per replaced server");
    assert!(failed.is_empty(), "{failed:#?}");
}

/// A rollout test per row: the scenario's name, the declared hashing.
macro_rules! warm_rollouts {
    ($($test:ident: $scenario:literal, $hashing:literal;)*) => {$(
        #[tokio::test]
        async fn $test() {
            let Some(s) = Scenario::start_with_memcached($scenario, &[]).await else {
                return;
            };
            rollout(&s, $hashing).await;
        }
    )*};
}

warm_rollouts! {
    a_deployment_rollout_under_ketama_keeps_every_key_warm: "rollout-ketama", "ketama";
    a_deployment_rollout_under_rendezvous_keeps_every_key_warm: "rollout-rendezvous", "rendezvous";
}

/// The same scales without a declared hashing copy nothing: the figures the handover improves on.
#[tokio::test]
async fn scales_without_a_declared_hashing_go_cold() {
    let Some(down) = Scenario::start_with_memcached("scale-down-cold", &[]).await else {
        return;
    };
    let scaled = scale(&down, "Deployment", "unknown", 4, 3).await;
    assert!(scaled.handed.is_empty() && !scaled.saw_handing_over);
    assert!(
        scaled.read * 100 < KEYS * 85,
        "{} of {KEYS} hit without copies",
        scaled.read
    );
    drop(down);
    let Some(up) = Scenario::start_with_memcached("scale-up-cold", &[]).await else {
        return;
    };
    let scaled = scale(&up, "Deployment", "unknown", 3, 5).await;
    assert!(scaled.handed.is_empty());
    assert!(
        scaled.read * 100 < KEYS * 70,
        "{} of {KEYS} hit without copies",
        scaled.read
    );
}

/// An operator restarted while a scale-down's copies run starts them again (the list before is in
/// `status.drain.servers`), and the drained pod goes once they ended.
#[tokio::test]
async fn an_operator_restart_mid_scale_down_copies_again_and_the_scale_ends() {
    let Some(mut s) = Scenario::start_with_memcached("scale-restart", &[]).await else {
        return;
    };
    // 20 000 items of 400 bytes: about 670 kB to each of 3 targets from the one removed server, 10 s
    // per copy at 64 KiB/s, one after the other; well within the 90 s bound.
    let (len, handover) = (
        400,
        json!({"maxBytesPerSecond": 65536, "timeoutSeconds": 90}),
    );
    apply(
        &s,
        "cache",
        spec_with(4, "Deployment", "jump", handover.clone()),
    )
    .await;
    let old = settled_servers(&s, 4, Duration::from_secs(90)).await;
    fill(&old, len).await;
    apply(&s, "cache", spec_with(3, "Deployment", "jump", handover)).await;
    let api = memcacheds(&s);
    let copying = wait_for(
        "Progressing=HandingOver",
        Duration::from_secs(60),
        || async {
            let mc = api.get("cache").await.map_err(|e| e.to_string())?;
            match condition(&mc, "Progressing") {
                Some(c) if c.reason == "HandingOver" => Ok(c.message.clone()),
                _ => Err(conditions(&mc)),
            }
        },
    )
    .await;
    s.step(&format!("copying: {copying}; restarting the operator"));
    let started = Instant::now();
    s.restart_operator().await;
    let new = settled_servers(&s, 3, Duration::from_secs(180)).await;
    let read = hits(&new, len).await;
    let (handed, failed) = (
        notes(&s, "HandedOver").await,
        notes(&s, "HandoverFailed").await,
    );
    s.step(&format!(
        "settled {:.1} s after the restart on {new:?}: {read} of {KEYS} keys hit; HandedOver: \
         {handed:#?}; HandoverFailed: {failed:#?}",
        started.elapsed().as_secs_f64()
    ));
    assert!(read * 100 >= KEYS * 95, "{read} of {KEYS} keys hit");
    assert!(failed.is_empty(), "{failed:#?}");
    assert!(
        handed.len() >= 3,
        "each target handed over (again) by the restarted operator: {handed:#?}"
    );
}
