//! Warm handover of a Deployment rollout, on real memcached servers: each new server waits behind the
//! handover readiness gate while the operator copies the items of the server it replaces, so a client
//! hashing keys over the published list finds them after the rollout (issue 23: 0 % before).
//!
//! The client places keys as a jump-hash client does over the published list in slot order (the
//! operator's own `hashing::Placement`, checked against the real library in tests/hashing.rs) and speaks
//! the text protocol (`set` with `noreply`, multi-key `get`), pipelined per server.
//!
//! Also: a rollout of servers that require TLS (with client certificates) and authentication, a rollout
//! changed again midway, a copy out of time, a target that refuses connections (both end cold and the
//! rollout goes on), an operator restart mid-copy.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::events::v1::Event;
use kube::Api;
use kube::api::ListParams;
use memcached_operator::connection::{Credentials, ServerNames, Stream, Target, TlsClient, open};
use memcached_operator::hashing::{Placement, Scheme};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

use crate::instances::{apply, conditions, memcacheds, settled};
use crate::secrets::{auth_secret, client_tls, tls_secrets};
use crate::{Scenario, wait_for};

const SIZE: usize = 4;
pub const KEYS: usize = 20_000;
/// Keys per pipelined write or multi-key `get`.
const BATCH: usize = 200;

fn key(i: usize) -> String {
    format!("handover-key-{i:05}")
}

/// The key repeated to `len` bytes (built by `repeat`: a byte iterator is slow in a debug build, and a
/// gibibyte goes through here twice).
fn value(i: usize, len: usize) -> Vec<u8> {
    let key = key(i);
    let mut value = key.repeat(len / key.len() + 1).into_bytes();
    value.truncate(len);
    value
}

/// The keys of `0..KEYS` by the index of their server in `servers` (`scheme` over the list).
fn placed(scheme: Scheme, servers: &[String]) -> BTreeMap<usize, Vec<usize>> {
    let placement = Placement::new(scheme, servers).expect("host:port entries");
    let mut by_server: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for i in 0..KEYS {
        let server = placement.server(key(i).as_bytes()).expect("a server");
        by_server.entry(server).or_default().push(i);
    }
    by_server
}

/// How the test client reaches the servers: plain TCP, or over TLS and authenticated, as the operator
/// does (the same connection code, so a server the operator could not reach fails the test here too).
#[derive(Clone, Default)]
pub struct Access {
    tls: Option<(TlsClient, ServerNames)>,
    credentials: Option<Arc<Credentials>>,
}

impl Access {
    /// Plain TCP, no authentication.
    pub fn plain() -> Self {
        Self::default()
    }

    fn target(&self, address: &str) -> Target {
        let address: SocketAddr = address.parse().unwrap_or_else(|e| panic!("{address}: {e}"));
        let mut target = Target::plain(address);
        if let Some((tls, names)) = &self.tls {
            target.tls = Some(tls.clone());
            target.names = names.clone();
        }
        target.credentials = self.credentials.clone();
        target
    }
}

async fn connect(access: &Access, address: &str) -> BufReader<Stream> {
    open(&access.target(address))
        .await
        .unwrap_or_else(|e| panic!("connecting to {address}: {e}"))
        .stream
}

/// Stores every key on its server under jump hash (values of `len` bytes, no expiry).
pub async fn fill(servers: &[String], len: usize) {
    fill_placed(Scheme::Jump, &Access::plain(), servers, len).await;
}

/// Stores every key on its server under `scheme` (values of `len` bytes, no expiry).
pub async fn fill_placed(scheme: Scheme, access: &Access, servers: &[String], len: usize) {
    for (server, keys) in placed(scheme, servers) {
        let mut conn = connect(access, &servers[server]).await;
        for batch in keys.chunks(BATCH) {
            let mut out = Vec::new();
            for &i in batch {
                out.extend_from_slice(format!("set {} 0 0 {len} noreply\r\n", key(i)).as_bytes());
                out.extend_from_slice(&value(i, len));
                out.extend_from_slice(b"\r\n");
            }
            conn.write_all(&out).await.expect("set");
        }
        // `noreply` sends no answers: one that does tells that every set before it was read.
        conn.write_all(b"version\r\n").await.expect("version");
        conn.flush().await.expect("sent");
        let mut line = String::new();
        conn.read_line(&mut line).await.expect("answer");
        assert!(line.starts_with("VERSION"), "{line:?}");
    }
}

/// How many keys their server under `servers` (jump hash) holds with the value they were stored with.
pub async fn hits(servers: &[String], len: usize) -> usize {
    hits_placed(Scheme::Jump, &Access::plain(), servers, len).await
}

/// How many keys their server under `servers` (`scheme`) holds with the value they were stored with.
pub async fn hits_placed(scheme: Scheme, access: &Access, servers: &[String], len: usize) -> usize {
    let mut hits = 0;
    for (server, keys) in placed(scheme, servers) {
        let mut conn = connect(access, &servers[server]).await;
        for batch in keys.chunks(BATCH) {
            let names: Vec<String> = batch.iter().map(|&i| key(i)).collect();
            let request = format!("get {}\r\n", names.join(" "));
            conn.write_all(request.as_bytes()).await.expect("get");
            conn.flush().await.expect("sent");
            loop {
                let mut line = String::new();
                conn.read_line(&mut line).await.expect("answer");
                if line == "END\r\n" {
                    break;
                }
                // VALUE <key> <flags> <bytes>
                let parts: Vec<&str> = line.split_whitespace().collect();
                assert_eq!(parts.first(), Some(&"VALUE"), "{line:?}");
                let bytes: usize = parts[3].parse().expect("a length");
                let mut data = vec![0; bytes + 2];
                conn.read_exact(&mut data).await.expect("a value");
                let i: usize = parts[1]["handover-key-".len()..]
                    .parse()
                    .expect("a key of ours");
                if data[..bytes] == value(i, len)[..] {
                    hits += 1;
                }
            }
        }
    }
    hits
}

/// `status.serverList`, once the instance is settled with `size` servers none of which is in `not`.
async fn settled_servers(
    s: &Scenario,
    size: usize,
    not: &[String],
    timeout: Duration,
) -> Vec<String> {
    let api = memcacheds(s);
    wait_for(
        &format!("the instance to settle with {size} servers not in {not:?}"),
        timeout,
        || async {
            let mc = api.get("cache").await.map_err(|e| e.to_string())?;
            let list = mc
                .status
                .as_ref()
                .map(|st| st.server_list.clone())
                .unwrap_or_default();
            let fresh = list.len() == size && list.iter().all(|a| !not.contains(a));
            if settled(&mc) && fresh {
                Ok(list)
            } else {
                Err(format!("{list:?}; {}", conditions(&mc)))
            }
        },
    )
    .await
}

/// The operator's events about the instance with `reason`: their notes.
pub async fn notes(s: &Scenario, reason: &str) -> Vec<String> {
    let events: Api<Event> = Api::namespaced(s.client.clone(), &s.namespace);
    events
        .list(&ListParams::default())
        .await
        .map(|list| list.items)
        .unwrap_or_default()
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .filter_map(|e| e.note)
        .collect()
}

/// The operator's `/metrics` answer (plain HTTP, as the scenarios run it), headers and all.
pub async fn operator_metrics(s: &Scenario) -> String {
    let port = s.operator.metrics_port().expect("a metrics port chosen");
    let mut conn = TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connecting to /metrics");
    conn.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .await
        .expect("asking for /metrics");
    let mut text = String::new();
    conn.read_to_string(&mut text)
        .await
        .expect("reading /metrics");
    text
}

/// The operator's `memcached_operator_handover*` series for the scenario's namespace, from its
/// `/metrics` (plain HTTP here): keyed by name and the labels other than `namespace` and `memcached`,
/// e.g. `memcached_operator_handover_items_total{outcome="copied"}`.
pub async fn handover_metrics(s: &Scenario) -> BTreeMap<String, f64> {
    let text = operator_metrics(s).await;
    let namespace = format!("namespace=\"{}\"", s.namespace);
    let mut series = BTreeMap::new();
    for line in text.lines() {
        // name{label="value",...} value
        let Some((name, rest)) = line
            .strip_prefix("memcached_operator_handover")
            .and_then(|rest| rest.split_once('{'))
        else {
            continue;
        };
        let Some((labels, value)) = rest.rsplit_once("} ") else {
            continue;
        };
        if !labels.split(',').any(|l| l == namespace) {
            continue;
        }
        let others: Vec<&str> = labels
            .split(',')
            .filter(|l| !l.starts_with("namespace=") && !l.starts_with("memcached="))
            .collect();
        let key = match others.is_empty() {
            true => format!("memcached_operator_handover{name}"),
            false => format!("memcached_operator_handover{name}{{{}}}", others.join(",")),
        };
        series.insert(key, value.trim().parse().unwrap_or(f64::NAN));
    }
    series
}

/// Waits until the instance `cache` says `Progressing=HandingOver` (a copy runs), then restarts the
/// operator mid-copy.
pub async fn restart_while_handing_over(s: &mut Scenario) {
    let api = memcacheds(s);
    let copying = wait_for(
        "Progressing=HandingOver",
        Duration::from_secs(60),
        || async {
            let mc = api.get("cache").await.map_err(|e| e.to_string())?;
            match crate::instances::condition(&mc, "Progressing") {
                Some(c) if c.reason == "HandingOver" => Ok(c.message.clone()),
                _ => Err(conditions(&mc)),
            }
        },
    )
    .await;
    s.step(&format!("copying: {copying}; restarting the operator"));
    s.restart_operator().await;
}

fn spec(size: usize, memory: i64, handover: Value) -> Value {
    json!({
        "size": size, "workload": "Deployment",
        "memcached": {"maxMemoryMB": memory},
        "highAvailability": {"preStopDelaySeconds": 1, "terminationGracePeriodSeconds": 5},
        "handover": handover,
    })
}

/// Fills a settled pool, changes a memcached flag, and reads every key back once the rollout settled.
async fn rollout(
    s: &Scenario,
    handover: Value,
    value_len: usize,
) -> (Vec<String>, usize, Duration) {
    apply(s, "cache", spec(SIZE, 64, handover.clone())).await;
    let old = settled_servers(s, SIZE, &[], Duration::from_secs(90)).await;
    fill(&old, value_len).await;
    let stored = hits(&old, value_len).await;
    s.step(&format!(
        "{stored} of {KEYS} keys stored on {old:?}; changing -m (a rollout)"
    ));
    assert_eq!(stored, KEYS, "every key is stored before the rollout");
    apply(s, "cache", spec(SIZE, 65, handover)).await;
    let started = Instant::now();
    let new = settled_servers(s, SIZE, &old, Duration::from_secs(240)).await;
    let took = started.elapsed();
    let read = hits(&new, value_len).await;
    (new, read, took)
}

#[tokio::test]
async fn a_deployment_rollout_keeps_the_keys_warm() {
    let Some(s) = Scenario::start_with_memcached("handover-rollout", &[]).await else {
        return;
    };
    let (new, read, took) = rollout(&s, json!({}), 100).await;
    let ratio = read as f64 / KEYS as f64;
    s.step(&format!(
        "rollout settled in {:.1} s on {new:?}: {read} of {KEYS} keys hit ({:.1} %)",
        took.as_secs_f64(),
        ratio * 100.0
    ));
    let handed = notes(&s, "HandedOver").await;
    s.step(&format!("HandedOver events: {handed:#?}"));
    assert!(
        ratio >= 0.95,
        "{read} of {KEYS} keys hit after the rollout ({:.1} %)",
        ratio * 100.0
    );
    assert_eq!(
        handed.len(),
        SIZE,
        "one HandedOver event per replaced server: {handed:#?}"
    );
    let failed = notes(&s, "HandoverFailed").await;
    assert!(failed.is_empty(), "{failed:#?}");
    let metrics = handover_metrics(&s).await;
    s.step(&format!("handover metrics: {metrics:#?}"));
    let series = |key: &str| metrics.get(key).copied().unwrap_or(0.0);
    assert_eq!(
        series("memcached_operator_handovers_total"),
        SIZE as f64,
        "one copy per replaced server"
    );
    assert!(
        series("memcached_operator_handover_items_total{outcome=\"copied\"}") >= read as f64,
        "every key hit was copied: {metrics:#?}"
    );
    assert!(
        series("memcached_operator_handover_bytes_total") >= (read * 100) as f64,
        "{metrics:#?}"
    );
    assert!(
        !metrics
            .keys()
            .any(|k| k.starts_with("memcached_operator_handover_failures_total")),
        "{metrics:#?}"
    );
}

/// The client's way to the servers of instance `cache` when they require TLS and authentication: the
/// instance's CA `ca`, the client certificate of Secret `cache-client` (mutual TLS), the auth file's user.
async fn secured_access(
    s: &Scenario,
    ca: &rcgen::CertifiedIssuer<'static, rcgen::KeyPair>,
) -> Access {
    let tls = client_tls(s, "cache-client", ca).await;
    // The Services' names: what the certificate is for, whichever pod answers.
    let names = ServerNames::for_pod("cache", &s.namespace, "cache", "cluster.local");
    Access {
        tls: Some((tls, names)),
        credentials: Some(Arc::new(
            Credentials::from_auth_file(b"app:s3cret\n").expect("credentials"),
        )),
    }
}

/// The copies reach the servers as the stats collector does: over TLS, verifying the server's
/// certificate, presenting the instance's client certificate, and authenticated.
#[tokio::test]
async fn a_rollout_of_servers_requiring_tls_and_authentication_keeps_the_keys_warm() {
    let Some(s) = Scenario::start_with_memcached("handover-secured", &[]).await else {
        return;
    };
    let ns = s.namespace.clone();
    let names = vec![
        format!("cache.{ns}.svc"),
        format!("*.cache-headless.{ns}.svc"),
    ];
    let ca = tls_secrets(&s, "cache-tls", names, Some("cache-client")).await;
    auth_secret(&s, "cache-auth", "auth-file", "app:s3cret\n").await;
    let spec = |memory: i64| {
        let mut spec = spec(2, memory, json!({}));
        spec["security"] = json!({
            "tls": {"secretName": "cache-tls", "clientAuth": true, "clientSecretName": "cache-client"},
            "auth": {"secretName": "cache-auth"}
        });
        spec
    };
    apply(&s, "cache", spec(64)).await;
    let old = settled_servers(&s, 2, &[], Duration::from_secs(90)).await;
    let access = secured_access(&s, &ca).await;
    // Plain TCP reaches nothing: every server requires TLS.
    assert!(
        plain_text_unanswered(&old[0]).await,
        "{} answers plain text",
        old[0]
    );
    fill_placed(Scheme::Jump, &access, &old, 100).await;
    let stored = hits_placed(Scheme::Jump, &access, &old, 100).await;
    assert_eq!(stored, KEYS, "every key is stored before the rollout");
    s.step(&format!(
        "{stored} of {KEYS} keys stored over TLS + auth on {old:?}; changing -m (a rollout)"
    ));
    apply(&s, "cache", spec(65)).await;
    let started = Instant::now();
    let new = settled_servers(&s, 2, &old, Duration::from_secs(240)).await;
    let took = started.elapsed();
    let read = hits_placed(Scheme::Jump, &access, &new, 100).await;
    let handed = notes(&s, "HandedOver").await;
    let failed = notes(&s, "HandoverFailed").await;
    s.step(&format!(
        "rollout settled in {:.1} s on {new:?}: {read} of {KEYS} keys hit; HandedOver: {handed:#?}",
        took.as_secs_f64()
    ));
    assert!(failed.is_empty(), "{failed:#?}");
    assert_eq!(
        handed.len(),
        2,
        "one HandedOver event per server: {handed:#?}"
    );
    assert!(
        read as f64 >= 0.95 * KEYS as f64,
        "{read} of {KEYS} keys hit after the rollout"
    );
}

/// Whether a plain-text `version` to `address` goes unanswered (a TLS listener takes it for a broken
/// handshake and closes).
async fn plain_text_unanswered(address: &str) -> bool {
    let Ok(mut conn) = TcpStream::connect(address).await else {
        return true;
    };
    if conn.write_all(b"version\r\n").await.is_err() {
        return true;
    }
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), conn.read_to_end(&mut answer)).await;
    !matches!(read, Ok(Ok(_))) || !answer.starts_with(b"VERSION")
}

/// The note of the instance's first `HandedOver` event, once there is one: a rollout is under way.
pub async fn first_handed_over(s: &Scenario) -> String {
    wait_for(
        "the first server handed over",
        Duration::from_secs(120),
        || async {
            let handed = notes(s, "HandedOver").await;
            handed.first().cloned().ok_or_else(|| "none yet".to_owned())
        },
    )
    .await
}

/// Says how a rollout changed again midway ended (`read` keys hit on `new` after `took`), and requires
/// at least 95 % of the keys.
pub async fn after_both_rollouts(s: &Scenario, new: &[String], read: usize, took: Duration) {
    let handed = notes(s, "HandedOver").await;
    let failed = notes(s, "HandoverFailed").await;
    s.step(&format!(
        "both rollouts settled in {:.1} s on {new:?}: {read} of {KEYS} keys hit; HandedOver: \
         {handed:#?}; HandoverFailed: {failed:#?}",
        took.as_secs_f64()
    ));
    assert!(
        read as f64 >= 0.95 * KEYS as f64,
        "{read} of {KEYS} keys hit after the interrupted rollout"
    );
}

/// A template changed again mid-rollout leaves two old ReplicaSets, and the Deployment controller removes
/// the oldest one's pods first: each copy must read the pod that goes next, or a new server takes the slot
/// of a pod nobody copied.
#[tokio::test]
async fn a_rollout_changed_again_midway_keeps_the_keys_warm() {
    let Some(s) = Scenario::start_with_memcached("handover-interrupted", &[]).await else {
        return;
    };
    // About 5 000 items of 100 bytes per server at 64 KiB/s: each copy takes about 8 s, so the second
    // change lands while the first rollout is under way.
    let handover = json!({"maxBytesPerSecond": 65536});
    apply(&s, "cache", spec(SIZE, 64, handover.clone())).await;
    let old = settled_servers(&s, SIZE, &[], Duration::from_secs(90)).await;
    fill(&old, 100).await;
    assert_eq!(hits(&old, 100).await, KEYS, "every key is stored first");
    apply(&s, "cache", spec(SIZE, 65, handover.clone())).await;
    let started = Instant::now();
    let first = first_handed_over(&s).await;
    s.step(&format!(
        "{first}; changing -m again (a second rollout over the first)"
    ));
    apply(&s, "cache", spec(SIZE, 66, handover)).await;
    let new = settled_servers(&s, SIZE, &old, Duration::from_secs(400)).await;
    let took = started.elapsed();
    let read = hits(&new, 100).await;
    after_both_rollouts(&s, &new, read, took).await;
}

#[tokio::test]
async fn a_handover_out_of_time_ends_cold_and_the_rollout_proceeds() {
    let Some(s) = Scenario::start_with_memcached("handover-timeout", &[]).await else {
        return;
    };
    // 20 000 items of 1 kB at 64 KiB/s is over a minute per server; each copy has 1 s.
    let handover = json!({"timeoutSeconds": 1, "maxBytesPerSecond": 65536});
    let (new, read, took) = rollout(&s, handover, 1000).await;
    s.step(&format!(
        "rollout settled in {:.1} s on {new:?}: {read} of {KEYS} keys hit",
        took.as_secs_f64()
    ));
    let failed = notes(&s, "HandoverFailed").await;
    s.step(&format!("HandoverFailed events: {failed:#?}"));
    assert_eq!(
        failed.len(),
        SIZE,
        "one Warning per replaced server: {failed:#?}"
    );
    assert!(
        failed
            .iter()
            .all(|note| note.contains("(timeout)") && note.contains("not finished within 1s")),
        "{failed:#?}"
    );
    // Each copy ends within its second (plus its turn and the pods' own start): nothing waits for the
    // minute a full copy would take.
    assert!(
        took < Duration::from_secs(60),
        "the rollout took {took:?} with 1 s handovers"
    );
    assert!(
        read < KEYS / 2,
        "most keys were not copied in time ({read} of {KEYS} hit)"
    );
}

#[tokio::test]
async fn an_operator_restart_mid_copy_starts_a_fresh_copy() {
    let Some(mut s) = Scenario::start_with_memcached("handover-restart", &[]).await else {
        return;
    };
    // 2 servers of 10 000 items of 100 bytes at 64 KiB/s: about 15 s per copy, well within its 60 s.
    let handover = json!({"maxBytesPerSecond": 65536, "timeoutSeconds": 60});
    apply(&s, "cache", spec(2, 64, handover.clone())).await;
    let old = settled_servers(&s, 2, &[], Duration::from_secs(90)).await;
    fill(&old, 100).await;
    apply(&s, "cache", spec(2, 65, handover)).await;
    restart_while_handing_over(&mut s).await;
    let mark = s.control_plane().audit().mark().expect("the audit log");
    let new = settled_servers(&s, 2, &old, Duration::from_secs(180)).await;
    let window = mark
        .at()
        .duration_until(k8s_openapi::jiff::Timestamp::now());
    let writes: Vec<(String, String)> = s
        .control_plane()
        .audit()
        .read_since(&mark)
        .expect("the audit log")
        .into_iter()
        .filter(|e| e.user == s.credentials.user && e.namespace == s.namespace && e.verb == "patch")
        .map(|e| (e.resource, e.subresource))
        .collect();
    let count = |resource: &str, subresource: &str| {
        writes
            .iter()
            .filter(|(r, sub)| r == resource && sub == subresource)
            .count()
    };
    let (status_writes, gates) = (count("memcacheds", "status"), count("pods", "status"));
    s.step(&format!(
        "after the restart: {status_writes} status writes and {gates} gate conditions in {:.1} s",
        window.as_secs_f64()
    ));
    assert_eq!(gates, 2, "one gate opened per new server");
    // Progress is shown at most once a second; a published server or a spec change is written at once.
    assert!(
        status_writes as f64 <= window.as_secs_f64() + 4.0,
        "{status_writes} status writes in {window:?}"
    );
    assert_eq!(s.refused_requests(), Vec::<String>::new());
    let read = hits(&new, 100).await;
    let handed = notes(&s, "HandedOver").await;
    s.step(&format!(
        "settled on {new:?}: {read} of {KEYS} keys hit; HandedOver events: {handed:#?}"
    ));
    assert_eq!(
        handed.len(),
        2,
        "each new server handed over once, the interrupted one by the restarted operator: {handed:#?}"
    );
    assert!(
        read * 100 >= KEYS * 95,
        "{read} of {KEYS} keys hit after a restart mid-copy"
    );
}

/// The new servers refuse connections (their image is one the stand-in kubelet runs no server for, see
/// `envtest::kubelet::image`): each copy fails at once on the target, says so in a Warning event, and
/// the rollout goes on without waiting for the copies' time bound.
///
/// Each new server either had a copy, which failed (gate reason `Failed`, one Warning each), or took a
/// slot its old server had left before any copy began (`NothingToCopy`: the ReplicaSet controller
/// removes an old pod it sees not ready before the one marked as the copy's source). Before vacant slots
/// went to ready pods first (`resources::servers::assign_deployment`), a surge pod still waiting could
/// also take the slot a copy had just been made for: 3 and 2 Warnings in 2 of 8 runs under load.
#[tokio::test]
async fn a_handover_whose_target_refuses_connections_ends_cold_and_the_rollout_proceeds() {
    let Some(s) = Scenario::start_with_memcached("handover-refused", &[]).await else {
        return;
    };
    const TIMEOUT: u64 = 60;
    let handover = json!({"timeoutSeconds": TIMEOUT});
    apply(&s, "cache", spec(SIZE, 64, handover.clone())).await;
    let old = settled_servers(&s, SIZE, &[], Duration::from_secs(90)).await;
    fill(&old, 100).await;
    s.step(&format!(
        "{KEYS} keys stored on {old:?}; rolling out an image that serves nothing"
    ));
    let mut refusing = spec(SIZE, 64, handover);
    refusing["image"] = json!("no-server.test/memcached:1.6");
    apply(&s, "cache", refusing).await;
    let started = Instant::now();
    let new = settled_servers(&s, SIZE, &old, Duration::from_secs(120)).await;
    let took = started.elapsed();
    let failed = notes(&s, "HandoverFailed").await;
    s.step(&format!(
        "rollout settled in {:.1} s on {new:?}; HandoverFailed events: {failed:#?}",
        took.as_secs_f64()
    ));
    let selector = ListParams::default().labels("app.kubernetes.io/instance=cache");
    let gates: Vec<String> = crate::instances::pods(&s)
        .list(&selector)
        .await
        .expect("the pods")
        .items
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter_map(|p| {
            let conditions = p.status.as_ref()?.conditions.as_ref()?;
            let gate = conditions
                .iter()
                .find(|c| c.type_ == memcached_operator::handover::GATE)?;
            Some(gate.reason.clone().unwrap_or_default())
        })
        .collect();
    s.step(&format!("the new pods' gate reasons: {gates:?}"));
    assert_eq!(
        gates.len(),
        SIZE,
        "every new pod passed its gate: {gates:?}"
    );
    let copied = gates.iter().filter(|r| *r == "Failed").count();
    assert!(
        gates.iter().all(|r| r == "Failed" || r == "NothingToCopy") && copied >= 1,
        "each new server's copy failed, or it took a vacant slot: {gates:?}"
    );
    assert_eq!(
        failed.len(),
        copied,
        "one Warning per failed copy: {failed:#?}"
    );
    assert!(
        failed.iter().all(
            |note| note.contains("target server: cannot connect") && note.contains("(connect)")
        ),
        "each Warning says the target refused: {failed:#?}"
    );
    // Each copy ends when its target refuses, not when its time bound passes: the whole rollout of four
    // servers takes less than one copy's bound.
    assert!(
        took < Duration::from_secs(TIMEOUT),
        "the rollout took {took:?}; a copy's bound is {TIMEOUT} s"
    );
    let handed = notes(&s, "HandedOver").await;
    assert!(handed.is_empty(), "nothing was handed over: {handed:#?}");
}

/// The operator's resident memory, from `/proc/<pid>/status`: (`VmRSS`, `VmHWM`) in KiB.
fn resident_kib(pid: u32) -> (u64, u64) {
    let status =
        std::fs::read_to_string(format!("/proc/{pid}/status")).expect("the operator's status");
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .unwrap_or_else(|| panic!("{name} in /proc/{pid}/status"))
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// Handing over a 1 GiB cache (4 servers of 256 MiB, 20 000 items of about 52 KiB) grows the operator's
/// peak RSS by less than 10 MiB: a copy is streamed, one batch at a time, whatever the cache size.
#[tokio::test]
async fn handing_over_a_gibibyte_grows_the_operator_by_less_than_10_mib() {
    let Some(s) = Scenario::start_with_memcached("handover-memory", &[]).await else {
        return;
    };
    const VALUE: usize = (1 << 30) / KEYS + 1;
    apply(&s, "cache", spec(SIZE, 400, json!({}))).await;
    let old = settled_servers(&s, SIZE, &[], Duration::from_secs(90)).await;
    fill(&old, VALUE).await;
    let stored = hits(&old, VALUE).await;
    let gib = (stored * VALUE) as f64 / f64::from(1 << 30);
    assert_eq!(stored, KEYS, "every key is stored before the rollout");
    let pid = s.operator.pid();
    // Writing 5 to clear_refs resets the peak (VmHWM) to the current RSS (proc(5)).
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").expect("resetting the peak RSS");
    let (before, _) = resident_kib(pid);
    s.step(&format!(
        "{gib:.2} GiB stored on {old:?}; operator RSS {:.1} MiB; changing -m (a rollout)",
        before as f64 / 1024.0
    ));
    apply(&s, "cache", spec(SIZE, 401, json!({}))).await;
    let started = Instant::now();
    let new = settled_servers(&s, SIZE, &old, Duration::from_secs(240)).await;
    let took = started.elapsed();
    let (_, peak) = resident_kib(pid);
    let read = hits(&new, VALUE).await;
    let grew = peak.saturating_sub(before) as f64 / 1024.0;
    s.step(&format!(
        "rollout settled in {:.1} s: {read} of {KEYS} keys hit; operator peak RSS {:.1} MiB (+{grew:.1} MiB)",
        took.as_secs_f64(),
        peak as f64 / 1024.0
    ));
    assert!(
        read as f64 >= KEYS as f64 * 0.95,
        "{read} of {KEYS} keys hit after the rollout"
    );
    assert!(
        grew < 10.0,
        "the operator's peak RSS grew by {grew:.1} MiB handing over {gib:.2} GiB"
    );
}
