//! The operator process under measurement: started with a kubeconfig (for the fake, or the operator's
//! ServiceAccount on a real API server), probed on `/readyz`, and measured from `/proc` (CPU from `stat`,
//! peak memory from `status`), as `top` would.

use std::collections::BTreeMap;
use std::fs::File;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::Options;

pub struct Operator {
    child: Child,
    dir: PathBuf,
    health: SocketAddr,
    metrics: Option<SocketAddr>,
    ticks_per_second: f64,
}

/// A scratch directory of this run (`memcached-bench-<pid>-<nanos>` under the temp dir), removed when
/// dropped.
pub struct Scratch(PathBuf);

impl Scratch {
    pub fn new() -> Result<Self, String> {
        new_dir().map(Self)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

/// A new directory under the temp dir, unique to this process and moment.
fn new_dir() -> Result<PathBuf, String> {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    let dir = std::env::temp_dir().join(format!("memcached-bench-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    Ok(dir)
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl Operator {
    /// Starts `binary` with `KUBECONFIG=kubeconfig`, in every namespace and without leader election (a
    /// single replica), with only warnings logged (to a file in a scratch directory of its own). Its
    /// `/metrics` listens on a free loopback port when `metrics` is set ([`Operator::metrics`]), else
    /// nowhere.
    pub fn start(options: &Options, kubeconfig: &Path, metrics: bool) -> Result<Self, String> {
        let binary = &options.operator;
        // Not a `Scratch`: the log stays when the run fails (only `stop` removes the directory).
        let dir = new_dir()?;
        let health = free_port()?;
        let metrics = metrics.then(free_port).transpose()?;
        let metrics_args = match metrics {
            // Plain HTTP on loopback: the bench reads its own figures, no scraper to authenticate.
            Some(addr) => vec![
                format!("--metrics-bind-address={addr}"),
                "--metrics-secure=false".to_owned(),
            ],
            None => vec!["--metrics-bind-address=0".to_owned()],
        };
        let log = File::create(dir.join("operator.log"))
            .map_err(|e| format!("cannot create the operator's log: {e}"))?;
        let child = Command::new(binary)
            .arg("run")
            .args(metrics_args)
            .arg(format!("--health-probe-bind-address={health}"))
            .arg("--log-level=warn")
            .args(stats_off(&options.operator_args))
            .args(&options.operator_args)
            .env_clear()
            .envs(options.operator_env.iter().map(|(k, v)| (k, v)))
            .env("KUBECONFIG", kubeconfig)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", binary.display()))?;
        Ok(Self {
            child,
            dir,
            health,
            metrics,
            ticks_per_second: ticks_per_second(),
        })
    }

    pub fn log_path(&self) -> PathBuf {
        self.dir.join("operator.log")
    }

    /// Fails when the operator has exited.
    pub fn check_running(&mut self) -> Result<(), String> {
        match self.child.try_wait() {
            Ok(None) => Ok(()),
            Ok(Some(status)) => Err(format!(
                "the operator exited ({status}); its log: {}",
                self.log_path().display()
            )),
            Err(e) => Err(format!("cannot wait for the operator: {e}")),
        }
    }

    /// Waits until `/readyz` answers 200: the caches are synced and the controller runs.
    pub async fn wait_ready(&mut self, timeout: Duration) -> Result<(), String> {
        let deadline = Instant::now() + timeout;
        loop {
            if readyz(self.health).await {
                return Ok(());
            }
            self.check_running()?;
            if Instant::now() > deadline {
                return Err(format!("the operator was not ready within {timeout:?}"));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// User plus system CPU time so far.
    pub fn cpu_seconds(&self) -> Result<f64, String> {
        let path = format!("/proc/{}/stat", self.child.id());
        let stat =
            std::fs::read_to_string(&path).map_err(|e| format!("cannot read {path}: {e}"))?;
        cpu_ticks(&stat)
            .map(|ticks| ticks as f64 / self.ticks_per_second)
            .ok_or_else(|| format!("cannot read the CPU times in {path}"))
    }

    /// Resident set size now (VmRSS), in KiB.
    pub fn rss_kib(&self) -> Result<u64, String> {
        self.status_kib("VmRSS:")
    }

    /// Resets the peak resident set size to the current one (proc(5): `5` to `clear_refs`), so that
    /// [`Operator::peak_rss_kib`] tells the peak of what follows.
    pub fn reset_peak_rss(&self) -> Result<(), String> {
        let path = format!("/proc/{}/clear_refs", self.child.id());
        std::fs::write(&path, "5").map_err(|e| format!("cannot write {path}: {e}"))
    }

    fn status_kib(&self, field: &str) -> Result<u64, String> {
        let path = format!("/proc/{}/status", self.child.id());
        let status =
            std::fs::read_to_string(&path).map_err(|e| format!("cannot read {path}: {e}"))?;
        status
            .lines()
            .find_map(|line| line.strip_prefix(field))
            .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
            .ok_or_else(|| format!("no {field} in {path}"))
    }

    /// Peak resident set size (VmHWM), in KiB.
    pub fn peak_rss_kib(&self) -> Result<u64, String> {
        self.status_kib("VmHWM:")
    }

    /// Stops the operator and removes its scratch directory.
    pub fn stop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }

    /// Kills the process `--operator` named and every process under it (a wrapper script's operator
    /// outlives the script's SIGKILL), and reaps it.
    fn kill(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            signal_tree(self.child.id(), libc::SIGKILL);
        }
        let _ = self.child.wait();
    }

    /// Stops the operator as a kubelet does: SIGTERM, then SIGKILL after `grace`; removes its scratch
    /// directory. Whether it exited by itself.
    pub async fn terminate(&mut self, grace: Duration) -> bool {
        // The child is not reaped yet, so its pid (and its descendants') are still theirs.
        signal_tree(self.child.id(), libc::SIGTERM);
        let deadline = Instant::now() + grace;
        let exited = loop {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                break true;
            }
            if Instant::now() > deadline {
                break false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        self.stop();
        exited
    }

    /// `GET /metrics`'s text, when started with metrics.
    pub async fn metrics(&self) -> Result<String, String> {
        metrics_text(self.metrics_address()?).await
    }

    /// Where `/metrics` listens (plain HTTP), when started with metrics.
    pub fn metrics_address(&self) -> Result<SocketAddr, String> {
        self.metrics
            .ok_or_else(|| "the operator was started without /metrics".to_owned())
    }
}

/// `GET http://addr/metrics`'s text.
pub async fn metrics_text(addr: SocketAddr) -> Result<String, String> {
    let (code, body) = http_get(addr, "/metrics")
        .await
        .ok_or_else(|| format!("no answer from http://{addr}/metrics"))?;
    if code != 200 {
        return Err(format!("http://{addr}/metrics answered {code}"));
    }
    Ok(body)
}

/// `--stats-interval=0` unless the operator arguments set the interval: the fake kubelet's pods run no
/// memcached, so operand telemetry would find every server unreadable, and the benchmark measures the
/// reconciler. `--operator-arg=--stats-interval=30s` turns the collector on.
fn stats_off(operator_args: &[String]) -> Option<&'static str> {
    let set = operator_args
        .iter()
        .any(|arg| arg.starts_with("--stats-interval"));
    (!set).then_some("--stats-interval=0")
}

impl Drop for Operator {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Sends `signal` to `pid` and to every process descended from it (parents first, all found before
/// the first signal, so that none is missed by being reparented when its parent dies).
fn signal_tree(pid: u32, signal: libc::c_int) {
    let parents = parents();
    let mut tree = vec![pid];
    let mut next = 0;
    while let Some(&parent) = tree.get(next) {
        tree.extend(
            parents
                .iter()
                .filter(|(_, p)| **p == parent)
                .map(|(c, _)| *c),
        );
        next += 1;
    }
    for pid in tree {
        if let Ok(pid) = libc::pid_t::try_from(pid) {
            // SAFETY: kill(2) with a pid read from /proc just now: our own child, or a process under it.
            unsafe {
                libc::kill(pid, signal);
            }
        }
    }
}

/// Every process's parent, by pid, from `/proc/<pid>/stat`.
fn parents() -> BTreeMap<u32, u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return BTreeMap::new();
    };
    entries
        .flatten()
        .filter_map(|entry| {
            let pid = entry.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
            Some((pid, parent_pid(&stat)?))
        })
        .collect()
}

/// utime + stime, fields 14 and 15 of `/proc/<pid>/stat`, counted after the command name (which may hold
/// spaces, so it is skipped up to its closing parenthesis).
pub fn cpu_ticks(stat: &str) -> Option<u64> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    // after_name starts at field 3 (state).
    let utime: u64 = fields.get(14 - 3)?.parse().ok()?;
    let stime: u64 = fields.get(15 - 3)?.parse().ok()?;
    Some(utime + stime)
}

/// CPU time of this process (the fake API server and kubelet) so far: they share the machine with the
/// operator, so their load is part of what a reader must know about the figures.
pub fn own_cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    cpu_ticks(&stat).map(|ticks| ticks as f64 / ticks_per_second())
}

/// CPU time so far of this process's children named in `names` (their `comm`, at most 15 characters),
/// summed by name: the control plane's processes in a `--real` run.
pub fn children_cpu_seconds(names: &[&str]) -> BTreeMap<String, f64> {
    let me = std::process::id();
    let per_second = ticks_per_second();
    let mut out = BTreeMap::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return out;
    };
    for entry in entries.flatten() {
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        let (Some(comm), Some(ppid), Some(ticks)) =
            (command_name(&stat), parent_pid(&stat), cpu_ticks(&stat))
        else {
            continue;
        };
        if ppid == me && names.contains(&comm) {
            *out.entry(comm.to_owned()).or_insert(0.0) += ticks as f64 / per_second;
        }
    }
    out
}

/// The command name of a `/proc/<pid>/stat` line: between the first `(` and the last `)`.
fn command_name(stat: &str) -> Option<&str> {
    stat.get(stat.find('(')? + 1..stat.rfind(')')?)
}

/// The parent's pid: field 4 of `/proc/<pid>/stat`.
fn parent_pid(stat: &str) -> Option<u32> {
    stat[stat.rfind(')')? + 1..]
        .split_whitespace()
        .nth(4 - 3)?
        .parse()
        .ok()
}

fn ticks_per_second() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|out| String::from_utf8(out.stdout).ok())
        .and_then(|text| text.trim().parse().ok())
        .unwrap_or(100.0)
}

fn free_port() -> Result<SocketAddr, String> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map_err(|e| format!("no free port: {e}"))
}

async fn readyz(addr: SocketAddr) -> bool {
    http_get(addr, "/readyz")
        .await
        .is_some_and(|(code, _)| code == 200)
}

/// A plain HTTP/1.1 GET of `path` on `addr`, the connection closed after the answer: its status code and
/// body (the body as sent: the operator's endpoints answer with a length, not in chunks).
async fn http_get(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer).await;
    let text = String::from_utf8_lossy(&answer);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let code = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((code, body.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_times_are_read_after_a_command_name_with_spaces() {
        let stat = "42 (memcached op) S 1 42 42 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 9 0 1 2 3";
        assert_eq!(cpu_ticks(stat), Some(300));
        assert_eq!(command_name(stat), Some("memcached op"));
        assert_eq!(parent_pid(stat), Some(1));
    }

    /// A wrapper script as `--operator` (as `perf record` or an `env` shim would be): stopping it stops
    /// the process it started too. Failed before: only the script was killed, its child ran on.
    #[tokio::test]
    async fn stopping_a_wrapper_stops_what_it_started() {
        use std::os::unix::fs::PermissionsExt;
        let scratch = Scratch::new().unwrap();
        let pid_file = scratch.path().join("inner.pid");
        let wrapper = scratch.path().join("wrapper.sh");
        let script = format!(
            "#!/bin/sh\n/bin/sleep 300 &\necho $! > {}\nwait\n",
            pid_file.display()
        );
        std::fs::write(&wrapper, script).unwrap();
        std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
        let options = Options {
            operator: wrapper,
            operator_args: Vec::new(),
            operator_env: Vec::new(),
            instances: 0,
            latency: Duration::ZERO,
            pod_start: Duration::ZERO,
            settle: Duration::ZERO,
            timeout: Duration::ZERO,
            tls: false,
            record: None,
        };
        let mut operator = Operator::start(&options, Path::new("/dev/null"), false).unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        let inner: u32 = loop {
            let written = std::fs::read_to_string(&pid_file).unwrap_or_default();
            if let Ok(pid) = written.trim().parse() {
                break pid;
            }
            assert!(
                Instant::now() < deadline,
                "the wrapper did not start its child"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        operator.stop();
        // Gone, or a zombie waiting for init to reap it.
        let running = || {
            let stat = std::fs::read_to_string(format!("/proc/{inner}/stat")).unwrap_or_default();
            stat.rfind(')')
                .is_some_and(|end| !stat[end + 1..].trim_start().starts_with('Z'))
        };
        let deadline = Instant::now() + Duration::from_secs(5);
        while running() {
            assert!(
                Instant::now() < deadline,
                "the wrapper's child {inner} outlived the stop"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    #[test]
    fn telemetry_is_off_unless_the_operator_arguments_set_it() {
        assert_eq!(stats_off(&[]), Some("--stats-interval=0"));
        assert_eq!(
            stats_off(&["--concurrency=8".into()]),
            Some("--stats-interval=0")
        );
        assert_eq!(stats_off(&["--stats-interval=30s".into()]), None);
    }
}
