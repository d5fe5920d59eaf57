//! Running the operator binary against the fake: a scratch directory with a kubeconfig, the process
//! (killed on drop, its log printed when a test fails), HTTP probes, and the run-until-settled cycle
//! most scenarios use.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::http::Method;
use fake_apiserver::{Fake, Req};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::checks::{assert_no_unexpected_requests, children_applied, sample};
use crate::cluster::paths::{LEASE, STRATEGIC};
use crate::cluster::world::World;
use crate::cluster::{self, lease, lease_holder};

pub const BIN: &str = env!("CARGO_BIN_EXE_memcached-operator");
/// Runs another build of the operator instead of [`BIN`], to see a scenario fail on an earlier one:
/// `SMOKE_OPERATOR=/path/to/memcached-operator cargo test --test smoke <scenario>`.
pub const OTHER_BUILD: &str = "SMOKE_OPERATOR";
pub const TOKEN: &str = "smoke-token";
pub const IDENTITY: &str = "smoke-1";

/// Every wait is bounded by this, at most.
pub const WAIT: Duration = Duration::from_secs(30);

/// A scratch directory under Cargo's per-target temp dir, removed on drop.
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new(name: &str) -> Self {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("smoke-{name}-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }

    /// A kubeconfig for the fake, with a bearer token; over TLS, it trusts the fake's CA.
    pub fn kubeconfig(&self, fake: &Fake) -> PathBuf {
        let path = self.0.join("kubeconfig.yaml");
        let server = fake.url();
        let ca = match fake.certificate_authority_data() {
            Some(data) => format!("\n    certificate-authority-data: {data}"),
            None => String::new(),
        };
        let yaml = format!(
            "apiVersion: v1
kind: Config
clusters:
- name: fake
  cluster:
    server: {server}{ca}
users:
- name: smoke
  user:
    token: {TOKEN}
contexts:
- name: fake
  context:
    cluster: fake
    user: smoke
    namespace: default
current-context: fake
"
        );
        std::fs::write(&path, yaml).unwrap();
        path
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The running binary. Killed on drop; when the test is failing (or `SMOKE_DUMP` is set), its output
/// and the fake's request log are printed.
pub struct Operator {
    pub child: Child,
    pub stdout: PathBuf,
    pub stderr: PathBuf,
    pub fake: Option<Arc<Fake>>,
    pub exited: Option<ExitStatus>,
}

impl Operator {
    /// Starts the binary with a clean environment: only `env`, so no proxy, `RUST_LOG`, in-cluster or
    /// operator variable of the machine running the test leaks in.
    pub fn spawn(
        scratch: &Scratch,
        fake: Option<Arc<Fake>>,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Self {
        let stdout = scratch.0.join("stdout.log");
        let stderr = scratch.0.join("stderr.log");
        let bin = std::env::var(OTHER_BUILD).unwrap_or_else(|_| BIN.to_owned());
        let child = Command::new(&bin)
            .args(args)
            .env_clear()
            .env("RUST_BACKTRACE", "1")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(File::create(&stdout).unwrap())
            .stderr(File::create(&stderr).unwrap())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {bin}: {e}"));
        Self {
            child,
            stdout,
            stderr,
            fake,
            exited: None,
        }
    }

    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether the process has exited (and how), without waiting.
    pub fn poll_exit(&mut self) -> Option<ExitStatus> {
        if self.exited.is_none() {
            self.exited = self.child.try_wait().unwrap();
        }
        self.exited
    }

    /// Waits up to `timeout` for the process to exit.
    pub async fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.poll_exit() {
                return Some(status);
            }
            if Instant::now() > deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Polls `check` until it holds; fails if `timeout` passes or the process exits first.
    pub async fn wait_until<F, Fut>(&mut self, what: &str, timeout: Duration, mut check: F)
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = bool>,
    {
        let deadline = Instant::now() + timeout;
        loop {
            if check().await {
                return;
            }
            if let Some(status) = self.poll_exit() {
                panic!("the operator exited ({status}) while waiting for: {what}");
            }
            if Instant::now() > deadline {
                panic!("timed out after {timeout:?} waiting for: {what}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub fn sigterm(&self) {
        let status = Command::new("kill")
            .args(["-TERM", &self.pid().to_string()])
            .status()
            .expect("cannot run kill");
        assert!(status.success(), "kill -TERM failed: {status}");
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        if self.poll_exit().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        if std::thread::panicking() || std::env::var_os("SMOKE_DUMP").is_some() {
            let stdout = std::fs::read_to_string(&self.stdout).unwrap_or_default();
            eprintln!(
                "--- operator stderr ---\n{}\n--- operator stdout ---\n{stdout}",
                self.stderr()
            );
            if let Some(fake) = &self.fake {
                eprintln!("--- requests to the fake API server ---\n{}", fake.log());
            }
        }
    }
}

pub fn free_addr() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().to_string()
}

/// A GET over plain HTTP/1.1: status and body, or `None` when nothing answers (within 5 s).
pub async fn http_get(addr: &str, path: &str) -> Option<(u16, String)> {
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
        let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.ok()?;
        let mut response = Vec::new();
        stream.read_to_end(&mut response).await.ok()?;
        let text = String::from_utf8_lossy(&response).into_owned();
        let code = text.split_whitespace().nth(1)?.parse().ok()?;
        let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_owned())?;
        Some((code, body))
    };
    tokio::time::timeout(Duration::from_secs(5), exchange)
        .await
        .ok()
        .flatten()
}

pub async fn is_ok(addr: &str, path: &str) -> bool {
    matches!(http_get(addr, path).await, Some((200, _)))
}

/// Starts `memcached-operator run` against `fake` as a replica `smoke-1` with leader election (Lease in
/// `op-system`) watching `default`. Returns the scratch dir (drop it last), the process, and the
/// metrics and probe addresses.
pub fn start_run(fake: &Arc<Fake>, name: &str) -> (Scratch, Operator, String, String) {
    start_run_with(fake, name, &[])
}

/// [`start_run`] with `extra` arguments.
pub fn start_run_with(
    fake: &Arc<Fake>,
    name: &str,
    extra: &[&str],
) -> (Scratch, Operator, String, String) {
    let mut args = vec![
        "--leader-elect",
        "--leader-election-namespace",
        "op-system",
        "--log-level",
        "debug",
    ];
    args.extend_from_slice(extra);
    start_with(fake, name, &args)
}

/// Starts `memcached-operator run` against `fake`, watching `default`, with `args` added, as replica
/// `smoke-1`. Returns the scratch dir (drop it last), the process, and the metrics and probe addresses.
pub fn start_with(
    fake: &Arc<Fake>,
    name: &str,
    args: &[&str],
) -> (Scratch, Operator, String, String) {
    let scratch = Scratch::new(name);
    let kubeconfig = scratch.kubeconfig(fake);
    let metrics = free_addr();
    let probes = free_addr();
    let mut all = vec![
        "run",
        "--namespace",
        "default",
        "--metrics-bind-address",
        &metrics,
        // Plain HTTP on loopback: the fake API server answers no TokenReview.
        "--metrics-secure=false",
        "--health-probe-bind-address",
        &probes,
    ];
    all.extend_from_slice(args);
    let op = Operator::spawn(
        &scratch,
        Some(fake.clone()),
        &all,
        &[
            ("KUBECONFIG", kubeconfig.to_str().unwrap()),
            ("POD_NAME", IDENTITY),
        ],
    );
    (scratch, op, metrics, probes)
}

/// Waits (up to [`WAIT`]) until the fake has received no request for `quiet`: the reconciles that the
/// start triggered (the initial lists, the Secret watch) have all finished. A SIGTERM sent earlier lets an
/// in-flight reconcile finish its writes, by design.
pub async fn settled(fake: &Fake, quiet: Duration) {
    let deadline = Instant::now() + WAIT;
    let mut count = fake.count();
    let mut since = Instant::now();
    while Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = fake.count();
        if now != count {
            (count, since) = (now, Instant::now());
        } else if since.elapsed() >= quiet {
            return;
        }
    }
    panic!(
        "the operator kept sending requests for {WAIT:?}:\n{}",
        fake.log()
    );
}

/// SIGTERM: the process exits 0 within 15 s, and releases the Lease on the way out.
pub async fn stop_and_check_release(op: &mut Operator, fake: &Fake) {
    let before_sigterm = fake.count();
    op.sigterm();
    let exit = op.wait_exit(Duration::from_secs(15)).await;
    let Some(exit) = exit else {
        panic!("the operator did not exit within 15 s of SIGTERM");
    };
    assert_eq!(exit.code(), Some(0), "exit status {exit}");
    let after: Vec<Req> = fake.requests().split_off(before_sigterm);
    assert!(
        after.iter().any(|r| r.is(&Method::PATCH, LEASE)
            && r.content_type.as_deref() == Some(STRATEGIC)
            && r.body["spec"]
                .as_object()
                .is_some_and(|s| s.get("holderIdentity") == Some(&Value::Null))),
        "a patch after SIGTERM clears holderIdentity; after SIGTERM: {after:#?}"
    );
    let lease = lease(fake).unwrap();
    assert!(
        lease["spec"].get("holderIdentity").is_none(),
        "released lease: {lease}"
    );
    // Shutdown writes nothing but the Lease.
    assert!(
        after.iter().all(|r| r.path == LEASE),
        "requests after SIGTERM: {after:#?}"
    );
    let stderr = op.stderr();
    assert!(stderr.contains("leader lease released"), "{stderr}");
    assert!(stderr.contains("shut down cleanly"), "{stderr}");
}

/// Waits until `op` holds the Lease, has applied the sample instance's children with their `Created`
/// event, and reports ready as the leader.
pub async fn leads_and_creates_the_children(op: &mut Operator, fake: &Fake, probes: &str) {
    op.wait_until("the Lease is held by smoke-1", WAIT, || {
        let holder = lease_holder(fake);
        async move { holder.as_deref() == Some(IDENTITY) }
    })
    .await;
    op.wait_until(
        "the Deployment, Services and *PDB applies and the Created event",
        WAIT,
        || {
            let applied = children_applied(&fake.requests());
            async move { applied }
        },
    )
    .await;
    op.wait_until("/readyz answers 200 as the leader", WAIT, || {
        is_ok(probes, "/readyz")
    })
    .await;
}

/// Runs the operator against `world` until it leads, its caches are synced and it has finished as many
/// successful reconciles as there are instances, lets it settle, stops it (checking the clean release)
/// and returns every request. The stats collector is off (`--stats-interval=0`): these runs check the
/// reconciler's requests, and the pods they list have addresses (127.0.0.x:11211) where no memcached
/// answers, which the collector would report in status.stats. The collector's own requests, restarts
/// included, are checked in [`crate::telemetry`].
pub async fn run_once(world: World, name: &str) -> Vec<Req> {
    run_once_with(world, name, &["--stats-interval=0"]).await
}

/// [`run_once`] with `extra` arguments instead of turning the stats collector off.
pub async fn run_once_with(world: World, name: &str, extra: &[&str]) -> Vec<Req> {
    let instances = world.memcacheds.len() as f64;
    let fake = cluster::start_with(world, None).await;
    let (_scratch, mut op, metrics, probes) = start_run_with(&fake, name, extra);
    op.wait_until("the Lease is held by smoke-1", WAIT, || {
        let holder = lease_holder(&fake);
        async move { holder.as_deref() == Some(IDENTITY) }
    })
    .await;
    op.wait_until("/readyz answers 200 as the leader", WAIT, || {
        is_ok(&probes, "/readyz")
    })
    .await;
    op.wait_until("a successful reconcile of every instance", WAIT, || {
        let metrics = metrics.clone();
        async move {
            http_get(&metrics, "/metrics")
                .await
                .is_some_and(|(_, text)| {
                    sample(
                        &text,
                        "memcached_operator_reconcile_total{result=\"success\"}",
                    )
                    .is_some_and(|n| n >= instances)
                })
        }
    })
    .await;
    // Reconciles triggered by the children's initial lists.
    settled(&fake, Duration::from_millis(1500)).await;
    stop_and_check_release(&mut op, &fake).await;
    assert_no_unexpected_requests(&fake);
    fake.requests()
}
