//! `--handovers`: what the operator's warm handovers keep, what they cost, and how long they take, on a
//! real control plane from `$KUBEBUILDER_ASSETS` whose stand-in kubelet runs Debian's memcached for each
//! pod. For each [`Operation`] (a rollout of either workload, a scale-down, a scale-up, a rollout to
//! servers that refuse connections, a rollout of a 1 GiB cache), in a namespace of its own: an instance
//! is created and settles; a client fills [`KEYS`] keys over the published list in slot order with jump
//! hash (the instances declare `clients.hashing: jump`); the change is applied; once the instance has
//! settled again, the client reads every key back over the new list.
//!
//! The refusing rollout's new pods come from an image of the registry `no-server.test`, for which the
//! stand-in kubelet starts no memcached: every copy's target refuses the connection, so its row shows how
//! long the rollout took against the copies' time bound, and one `HandoverFailed` per server.
//!
//! Each row says how many keys hit, how long the operation took (from the change to the settled
//! instance), the operator's requests meanwhile (from the API server's audit log; all of them, writes
//! separately), the `HandedOver` and `HandoverFailed` events, and how much the operator's peak RSS grew
//! over its RSS before the change (`VmHWM` reset through `/proc/<pid>/clear_refs`).
//!
//! The client speaks the text protocol itself and places keys as the operator's `hashing` module does for
//! `jump` (MD5 of the key, its low 64 bits, Lamping and Veach's jump hash over the slots), written out
//! here and checked against the PyPI package's placements, so that this table does not rest on the
//! operator's own code. (The operand run's client, [`crate::cache_client`], places keys with the operator's
//! `hashing` module, which tests/hashing.rs holds to the client libraries.)

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use envtest::{AuditEvent, Env};
use k8s_openapi::api::core::v1::{Event as CoreEvent, Pod};
use kube::api::{DynamicObject, ListParams, Patch, PatchParams};
use kube::{Api, Client};
use md5::{Digest, Md5};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

use crate::Options;
use crate::process::Operator;
use crate::real::{memcached_resource, start_with_memcached};

/// Keys the client fills before each operation and reads after it.
pub const KEYS: usize = 20_000;
/// Bytes of each value, but in the 1 GiB rollout.
const VALUE_BYTES: usize = 100;
/// Bytes of each value in the 1 GiB rollout: [`KEYS`] of them make a gibibyte.
const GIB_VALUE_BYTES: usize = (1 << 30) / KEYS + 1;
/// Keys per pipelined write or multi-key `get`, at most.
const BATCH: usize = 200;
/// Bytes of values per pipelined write, at most: the bench's own memory stays small when values are large.
const BATCH_BYTES: usize = 1 << 20;
/// The copies' time bound in the refusing rollout (`spec.handover.timeoutSeconds`).
const REFUSED_TIMEOUT_SECONDS: u64 = 60;
/// The instance of each operation.
pub const INSTANCE: &str = "cache";
const FIELD_MANAGER: &str = "bench-handovers";
/// Verbs that change something, as the audit log names them.
const WRITES: [&str; 5] = ["create", "update", "patch", "delete", "deletecollection"];

/// One change to a settled instance.
#[derive(Clone, Debug)]
pub struct Operation {
    pub name: &'static str,
    /// The instance's spec before, and after the change.
    pub before: Value,
    pub after: Value,
    /// Bytes of each of the [`KEYS`] values the client stores.
    pub value_bytes: usize,
    /// Whether the servers after the change serve anything to read the keys back from.
    pub serves: bool,
}

/// The operations: a rollout of each workload, a scale-down and a scale-up of a Deployment pool, a
/// rollout whose new servers refuse connections, and a rollout of a 1 GiB cache.
pub fn operations() -> Vec<Operation> {
    let spec = |workload: &str, size: i32, memory: i32, image: &str| {
        json!({
            "size": size, "workload": workload, "image": image,
            "memcached": {"maxMemoryMB": memory},
            "clients": {"hashing": "jump"},
            "scaling": {"drainSeconds": 5},
            "handover": {"timeoutSeconds": REFUSED_TIMEOUT_SECONDS},
            "highAvailability": {"preStopDelaySeconds": 1, "terminationGracePeriodSeconds": 5},
        })
    };
    let image = "memcached:1.6.18";
    let operation = |name, before, after| Operation {
        name,
        before,
        after,
        value_bytes: VALUE_BYTES,
        serves: true,
    };
    vec![
        operation(
            "Deployment rollout, 4 servers (-m changed)",
            spec("Deployment", 4, 64, image),
            spec("Deployment", 4, 65, image),
        ),
        operation(
            "StatefulSet rollout, 4 servers (image changed)",
            spec("StatefulSet", 4, 64, image),
            spec("StatefulSet", 4, 64, "memcached:1.6.19"),
        ),
        operation(
            "scale-down 4 -> 3 (Deployment)",
            spec("Deployment", 4, 64, image),
            spec("Deployment", 3, 64, image),
        ),
        operation(
            "scale-up 3 -> 5 (Deployment)",
            spec("Deployment", 3, 64, image),
            spec("Deployment", 5, 64, image),
        ),
        Operation {
            serves: false,
            ..operation(
                "Deployment rollout, 4 servers, to servers refusing connections (copies bounded at 60 s)",
                spec("Deployment", 4, 64, image),
                spec("Deployment", 4, 64, "no-server.test/memcached:1.6.18"),
            )
        },
        Operation {
            value_bytes: GIB_VALUE_BYTES,
            ..operation(
                "Deployment rollout, 4 servers holding 1 GiB (-m changed)",
                spec("Deployment", 4, 400, image),
                spec("Deployment", 4, 401, image),
            )
        },
    ]
}

/// What one operation kept and cost.
#[derive(Clone, Debug)]
pub struct Row {
    pub operation: &'static str,
    /// Keys read back after the change; none where the servers after it serve nothing.
    pub hits: Option<usize>,
    pub seconds: f64,
    pub requests: usize,
    pub writes: usize,
    pub handed_over: usize,
    pub failed: usize,
    pub rss_before_kib: u64,
    pub rss_peak_kib: u64,
}

/// The whole run.
#[derive(Clone, Debug)]
pub struct HandoversReport {
    pub server: String,
    pub rows: Vec<Row>,
}

impl fmt::Display for HandoversReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "warm handovers on {}: {KEYS} keys of {VALUE_BYTES} bytes ({GIB_VALUE_BYTES} in the 1 GiB \
             rollout), jump hash over the published list",
            self.server
        )?;
        writeln!(
            f,
            "| Operation | Keys hit after | Took | Operator requests (writes) | HandedOver / HandoverFailed | Operator RSS, peak |"
        )?;
        writeln!(f, "| --- | --- | --- | --- | --- | --- |")?;
        for r in &self.rows {
            let hits = match r.hits {
                Some(hits) => format!(
                    "{hits} of {KEYS} ({:.1} %)",
                    hits as f64 * 100.0 / KEYS as f64
                ),
                None => "none: the new servers serve nothing".to_owned(),
            };
            writeln!(
                f,
                "| {} | {hits} | {:.1} s | {} ({}) | {} / {} | {:.1} -> {:.1} MiB (+{:.1}) |",
                r.operation,
                r.seconds,
                r.requests,
                r.writes,
                r.handed_over,
                r.failed,
                r.rss_before_kib as f64 / 1024.0,
                r.rss_peak_kib as f64 / 1024.0,
                r.rss_peak_kib.saturating_sub(r.rss_before_kib) as f64 / 1024.0,
            )?;
        }
        Ok(())
    }
}

/// Runs every operation against a control plane started for it, and stops everything.
pub async fn run(options: &Options, config_dir: PathBuf) -> Result<HandoversReport, String> {
    let env = start_with_memcached(options).await?;
    let report = operate(&env, options, &config_dir).await;
    env.stop().await;
    report
}

async fn operate(
    env: &Env,
    options: &Options,
    config_dir: &std::path::Path,
) -> Result<HandoversReport, String> {
    let client = env.client().clone();
    let audit = env.control_plane().audit();
    let server = client
        .apiserver_version()
        .await
        .map_err(|e| format!("GET /version: {e}"))?
        .git_version;
    let credentials = env
        .install_operator_rbac(config_dir)
        .await
        .map_err(|e| format!("cannot install the operator's CRD and RBAC: {e:#}"))?;
    let mut operator = Operator::start(options, &credentials.kubeconfig, true)?;
    operator.wait_ready(Duration::from_secs(60)).await?;
    let mut rows = Vec::new();
    for (n, operation) in operations().into_iter().enumerate() {
        let namespace = format!("handover-{n}");
        envtest::create_namespace(&client, &namespace, &[])
            .await
            .map_err(|e| format!("{e:#}"))?;
        let ns = Namespace {
            client: client.clone(),
            name: namespace,
        };
        eprintln!("{}: creating the instance", operation.name);
        ns.apply(&operation.before).await?;
        let old = ns.settled(0, &mut operator).await?;
        let bytes = operation.value_bytes;
        fill(&old, bytes).await?;
        let stored = hits(&old, bytes).await?;
        if stored != KEYS {
            return Err(format!(
                "{}: {stored} of {KEYS} keys stored before the change",
                operation.name
            ));
        }
        operator.reset_peak_rss()?;
        let rss_before_kib = operator.rss_kib()?;
        let mark = audit.mark().map_err(|e| format!("{e:#}"))?;
        let generation = ns.generation().await?;
        eprintln!("{}: {KEYS} keys stored; changing the spec", operation.name);
        let started = Instant::now();
        ns.apply(&operation.after).await?;
        let new = ns.settled(generation, &mut operator).await?;
        let seconds = started.elapsed().as_secs_f64();
        let rss_peak_kib = operator.peak_rss_kib()?;
        let hit = match operation.serves {
            true => Some(hits(&new, bytes).await?),
            false => None,
        };
        let events: Vec<AuditEvent> = audit
            .read_since(&mark)
            .map_err(|e| format!("{e:#}"))?
            .into_iter()
            .filter(|e| e.user == credentials.user && e.namespace == ns.name)
            .collect();
        let reasons = ns.event_reasons().await?;
        let row = Row {
            operation: operation.name,
            hits: hit,
            seconds,
            requests: events.len(),
            writes: events
                .iter()
                .filter(|e| WRITES.contains(&e.verb.as_str()))
                .count(),
            handed_over: reasons.get("HandedOver").copied().unwrap_or(0),
            failed: reasons.get("HandoverFailed").copied().unwrap_or(0),
            rss_before_kib,
            rss_peak_kib,
        };
        eprintln!(
            "{}: {hit:?} of {KEYS} keys hit after {seconds:.1} s, events {reasons:?}",
            operation.name
        );
        rows.push(row);
        ns.delete().await;
    }
    operator.stop();
    Ok(HandoversReport { server, rows })
}

/// A namespace holding one instance named [`INSTANCE`] (an operation's here; each instance of the operand
/// run's, [`crate::operand`]).
pub(crate) struct Namespace {
    pub(crate) client: Client,
    pub(crate) name: String,
}

impl Namespace {
    fn instances(&self) -> Api<DynamicObject> {
        Api::namespaced_with(self.client.clone(), &self.name, &memcached_resource())
    }

    /// Server-side applies the instance with `spec`.
    pub(crate) async fn apply(&self, spec: &Value) -> Result<(), String> {
        let object = json!({
            "apiVersion": "cache.example.com/v1alpha1", "kind": "Memcached",
            "metadata": {"name": INSTANCE, "namespace": self.name},
            "spec": spec
        });
        self.instances()
            .patch(
                INSTANCE,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(object),
            )
            .await
            .map(|_| ())
            .map_err(|e| format!("cannot apply Memcached {}/{INSTANCE}: {e}", self.name))
    }

    /// The instance's generation.
    pub(crate) async fn generation(&self) -> Result<i64, String> {
        let mc = self
            .instances()
            .get(INSTANCE)
            .await
            .map_err(|e| format!("GET Memcached {}/{INSTANCE}: {e}", self.name))?;
        Ok(mc.metadata.generation.unwrap_or(0))
    }

    /// Waits until the instance, of a generation past `changed_from`, is settled (status of its
    /// generation, `Available=True`, `Progressing=False`, `Degraded=False`) with every slot's pod ready;
    /// returns the pods' addresses in slot order.
    pub(crate) async fn settled(
        &self,
        changed_from: i64,
        operator: &mut Operator,
    ) -> Result<Vec<SocketAddr>, String> {
        let deadline = Instant::now() + Duration::from_secs(300);
        let mut last = String::new();
        loop {
            operator.check_running()?;
            if let Ok(mc) = self.instances().get(INSTANCE).await {
                match self.servers_if_settled(&mc, changed_from).await {
                    Ok(servers) => return Ok(servers),
                    Err(why) => last = why,
                }
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "Memcached {}/{INSTANCE} did not settle: {last}; the operator's log: {}",
                    self.name,
                    operator.log_path().display()
                ));
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    async fn servers_if_settled(
        &self,
        mc: &DynamicObject,
        changed_from: i64,
    ) -> Result<Vec<SocketAddr>, String> {
        let generation = mc.metadata.generation.unwrap_or(0);
        let status = &mc.data["status"];
        let condition = |type_: &str| {
            status["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|c| c["type"] == type_)
                .and_then(|c| c["status"].as_str())
                .unwrap_or_default()
                .to_owned()
        };
        let settled = generation > changed_from
            && status["observedGeneration"].as_i64() == Some(generation)
            && condition("Available") == "True"
            && condition("Progressing") == "False"
            && condition("Degraded") == "False";
        if !settled {
            return Err(format!("conditions {}", status["conditions"]));
        }
        let size = mc.data["spec"]["size"].as_u64().unwrap_or(0) as usize;
        let mut slots: Vec<(i64, String)> = status["servers"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|s| s["ready"] == true)
            .filter_map(|s| Some((s["slot"].as_i64()?, s["pod"].as_str()?.to_owned())))
            .collect();
        slots.sort();
        if slots.len() != size || status["serverList"].as_array().map(Vec::len) != Some(size) {
            return Err(format!("status.servers {}", status["servers"]));
        }
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &self.name);
        let mut addresses = Vec::new();
        for (slot, name) in slots {
            let pod = pods
                .get(&name)
                .await
                .map_err(|e| format!("pod {name}: {e}"))?;
            let ip = pod
                .status
                .as_ref()
                .and_then(|s| s.pod_ip.as_deref())
                .and_then(|ip| ip.parse().ok())
                .ok_or_else(|| format!("pod {name} (slot {slot}) has no IP"))?;
            addresses.push(SocketAddr::new(ip, 11211));
        }
        Ok(addresses)
    }

    /// The operator's events in the namespace, counted by reason.
    async fn event_reasons(&self) -> Result<BTreeMap<String, usize>, String> {
        let api: Api<CoreEvent> = Api::namespaced(self.client.clone(), &self.name);
        let list = api
            .list(&ListParams::default())
            .await
            .map_err(|e| format!("listing the events of {}: {e}", self.name))?;
        let mut reasons = BTreeMap::new();
        for event in list.items {
            if event.involved_object.kind.as_deref() == Some("Memcached") {
                *reasons.entry(event.reason.unwrap_or_default()).or_default() += 1;
            }
        }
        Ok(reasons)
    }

    /// Deletes the instance (its pods go with it, collected by the garbage collector).
    async fn delete(&self) {
        let _ = self.instances().delete(INSTANCE, &Default::default()).await;
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &self.name);
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            match pods.list(&ListParams::default()).await {
                Ok(list) if list.items.is_empty() => return,
                _ => tokio::time::sleep(Duration::from_millis(500)).await,
            }
        }
    }
}

fn key(i: usize) -> String {
    format!("bench-handover-{i:05}")
}

/// Key `i`'s value of `bytes` bytes (the key repeated).
fn value(i: usize, bytes: usize) -> Vec<u8> {
    let key = key(i);
    let mut value = key.repeat(bytes / key.len() + 1).into_bytes();
    value.truncate(bytes);
    value
}

/// Keys per pipelined write or multi-key `get` for values of `bytes` bytes.
fn batch(bytes: usize) -> usize {
    (BATCH_BYTES / bytes.max(1)).clamp(1, BATCH)
}

/// The slot of `key` among `count` servers, as the operator's `jump` scheme places it (and the PyPI
/// package `jump-consistent-hash` over `int(md5(key).hexdigest(), 16)`).
pub fn jump_slot(key: &[u8], count: usize) -> usize {
    let digest = Md5::digest(key);
    let mut low = [0u8; 8];
    low.copy_from_slice(&digest[8..]);
    let mut key = u64::from_be_bytes(low);
    let count = i64::try_from(count).unwrap_or(i64::MAX);
    let (mut b, mut j) = (-1i64, 0i64);
    while j < count {
        b = j;
        key = key.wrapping_mul(2_862_933_555_777_941_757).wrapping_add(1);
        j = ((b + 1) as f64 * ((1u64 << 31) as f64 / ((key >> 33) + 1) as f64)) as i64;
    }
    usize::try_from(b).unwrap_or(0)
}

/// The keys by the index of their server.
fn placed(count: usize) -> BTreeMap<usize, Vec<usize>> {
    let mut by_server: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for i in 0..KEYS {
        by_server
            .entry(jump_slot(key(i).as_bytes(), count))
            .or_default()
            .push(i);
    }
    by_server
}

async fn connect(addr: SocketAddr) -> Result<BufReader<TcpStream>, String> {
    TcpStream::connect(addr)
        .await
        .map(BufReader::new)
        .map_err(|e| format!("connecting to {addr}: {e}"))
}

/// Stores every key on its server (no expiry), with values of `bytes` bytes.
async fn fill(servers: &[SocketAddr], bytes: usize) -> Result<(), String> {
    for (server, keys) in placed(servers.len()) {
        let addr = servers[server];
        let mut conn = connect(addr).await?;
        for batch in keys.chunks(batch(bytes)) {
            let mut out = Vec::new();
            for &i in batch {
                out.extend_from_slice(format!("set {} 0 0 {bytes} noreply\r\n", key(i)).as_bytes());
                out.extend_from_slice(&value(i, bytes));
                out.extend_from_slice(b"\r\n");
            }
            conn.get_mut()
                .write_all(&out)
                .await
                .map_err(|e| format!("set on {addr}: {e}"))?;
        }
        // `noreply` sends no answers: one that does tells that every set before it was read.
        conn.get_mut()
            .write_all(b"version\r\n")
            .await
            .map_err(|e| format!("version on {addr}: {e}"))?;
        let mut line = String::new();
        conn.read_line(&mut line)
            .await
            .map_err(|e| format!("reading from {addr}: {e}"))?;
        if !line.starts_with("VERSION") {
            return Err(format!("{addr} answered {line:?}"));
        }
    }
    Ok(())
}

/// How many keys their server holds with the value (of `bytes` bytes) they were stored with.
async fn hits(servers: &[SocketAddr], bytes: usize) -> Result<usize, String> {
    let mut hits = 0;
    for (server, keys) in placed(servers.len()) {
        let addr = servers[server];
        let mut conn = connect(addr).await?;
        for batch in keys.chunks(batch(bytes)) {
            let names: Vec<String> = batch.iter().map(|&i| key(i)).collect();
            conn.get_mut()
                .write_all(format!("get {}\r\n", names.join(" ")).as_bytes())
                .await
                .map_err(|e| format!("get on {addr}: {e}"))?;
            loop {
                let mut line = String::new();
                conn.read_line(&mut line)
                    .await
                    .map_err(|e| format!("reading from {addr}: {e}"))?;
                if line == "END\r\n" {
                    break;
                }
                // VALUE <key> <flags> <bytes>
                let parts: Vec<&str> = line.split_whitespace().collect();
                let (Some(&"VALUE"), Some(name), Some(length)) =
                    (parts.first(), parts.get(1), parts.get(3))
                else {
                    return Err(format!("{addr} answered {line:?}"));
                };
                let length: usize = length
                    .parse()
                    .map_err(|_| format!("{addr} answered {line:?}"))?;
                let mut data = vec![0; length + 2];
                conn.read_exact(&mut data)
                    .await
                    .map_err(|e| format!("reading a value from {addr}: {e}"))?;
                let i = name
                    .strip_prefix("bench-handover-")
                    .and_then(|n| n.parse::<usize>().ok());
                if i.is_some_and(|i| data[..length] == value(i, bytes)[..]) {
                    hits += 1;
                }
            }
        }
    }
    Ok(hits)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The placement the PyPI package produced (tests/fixtures/hashing/jump.json, checked against the
    /// operator by tests/hashing.rs): the bench's client places keys where a real client does.
    #[test]
    fn jump_places_as_the_library_does() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/fixtures/hashing/jump.json"
        );
        let text = std::fs::read_to_string(path).expect("the jump vectors");
        let vectors: Value = serde_json::from_str(&text).expect("JSON");
        let keys: Vec<Vec<u8>> = vectors["keys"]
            .as_array()
            .expect("keys")
            .iter()
            .map(|k| {
                let hex = k.as_str().expect("hex");
                (0..hex.len())
                    .step_by(2)
                    .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex"))
                    .collect()
            })
            .collect();
        let cases = vectors["cases"].as_array().expect("cases");
        assert!(cases.len() > 1);
        for case in cases {
            let count = case["servers"].as_array().expect("servers").len();
            for (key, pick) in keys.iter().zip(case["picks"].as_array().expect("picks")) {
                assert_eq!(
                    jump_slot(key, count) as u64,
                    pick.as_u64().expect("an index"),
                    "{key:?} over {count}"
                );
            }
        }
    }

    #[test]
    fn growing_the_list_moves_keys_only_to_the_new_server() {
        for i in 0..2000 {
            let k = key(i);
            let (before, after) = (jump_slot(k.as_bytes(), 3), jump_slot(k.as_bytes(), 4));
            assert!(after == before || after == 3, "{k}: {before} -> {after}");
        }
    }
}
