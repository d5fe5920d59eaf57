//! The operator binary as a child process (`memcached-operator run …`), as it runs in a cluster: its own
//! credentials, its own log file, stopped by SIGTERM (then killed) when dropped.
//!
//! The binary's path comes from the caller (in the root crate's integration tests,
//! `env!("CARGO_BIN_EXE_memcached-operator")`), so this crate does not depend on the operator and
//! changing the operator does not rebuild it.

use std::path::Path;
use std::process::{Command, ExitStatus};
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::net::free_ports;
use crate::process::{Process, tail};

/// A running operator process.
pub struct Operator {
    process: Process,
    metrics_port: Option<u16>,
    probe_port: Option<u16>,
}

impl Operator {
    /// Runs `binary run <args>` with `KUBECONFIG=kubeconfig`, output appended to `log`. Unless `args`
    /// set them, the metrics and health endpoints listen on free ports of 127.0.0.1 (the defaults, `:8443`
    /// and `:8081`, would collide between operators and with anything else on the machine), metrics over
    /// plain HTTP unless `args` set `--metrics-secure`.
    pub fn start(binary: &Path, kubeconfig: &Path, args: &[&str], log: &Path) -> Result<Operator> {
        Operator::start_with_env(binary, kubeconfig, args, &[], log)
    }

    /// [`Operator::start`] with extra environment variables (`POD_NAME`, `POD_NAMESPACE`, …).
    pub fn start_with_env(
        binary: &Path,
        kubeconfig: &Path,
        args: &[&str],
        env: &[(&str, &str)],
        log: &Path,
    ) -> Result<Operator> {
        let has = |flag: &str| args.iter().any(|a| a.starts_with(flag));
        let mut cmd = Command::new(binary);
        cmd.arg("run").args(args);
        // Chosen together: two ports picked one after the other can be the same one.
        let [metrics_free, probe_free] = free_ports::<2>()?;
        let mut metrics_port = None;
        if !has("--metrics-bind-address") {
            let port = metrics_free;
            cmd.arg(format!("--metrics-bind-address=127.0.0.1:{port}"));
            if !has("--metrics-secure") {
                // Plain HTTP on loopback, for scenarios that only read the figures; a scenario that
                // checks the secure endpoint passes `--metrics-secure=true`.
                cmd.arg("--metrics-secure=false");
            }
            metrics_port = Some(port);
        }
        let mut probe_port = None;
        if !has("--health-probe-bind-address") {
            let port = probe_free;
            cmd.arg(format!("--health-probe-bind-address=127.0.0.1:{port}"));
            probe_port = Some(port);
        }
        cmd.env("KUBECONFIG", kubeconfig)
            // Nothing of the test's own cluster context must leak in (an in-cluster config would win).
            .env_remove("KUBERNETES_SERVICE_HOST")
            .env_remove("KUBERNETES_SERVICE_PORT");
        for (k, v) in env {
            cmd.env(k, v);
        }
        Ok(Operator {
            process: Process::start("memcached-operator", cmd, log)?,
            metrics_port,
            probe_port,
        })
    }

    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    pub fn log(&self) -> &Path {
        self.process.log_path()
    }

    /// The last `lines` lines of its log.
    pub fn log_tail(&self, lines: usize) -> String {
        tail(self.process.log_path(), lines)
    }

    /// Port of `/metrics` on 127.0.0.1, when chosen here.
    pub fn metrics_port(&self) -> Option<u16> {
        self.metrics_port
    }

    /// Port of `/healthz` and `/readyz` on 127.0.0.1, when chosen here.
    pub fn probe_port(&self) -> Option<u16> {
        self.probe_port
    }

    /// An error with the end of the log if the process has exited.
    pub fn check_running(&mut self) -> Result<()> {
        self.process.check_running()
    }

    /// Waits until `/readyz` answers 200 (needs the probe port chosen here).
    pub async fn wait_ready(&mut self, timeout: Duration) -> Result<()> {
        let Some(port) = self.probe_port else {
            bail!("the health probe address was set by the caller; wait on it there");
        };
        let started = Instant::now();
        loop {
            self.check_running()?;
            if http_status(port, "/readyz").await == Some(200) {
                return Ok(());
            }
            if started.elapsed() > timeout {
                bail!(
                    "the operator is not ready after {timeout:?}; the end of {}:\n{}",
                    self.log().display(),
                    self.log_tail(30)
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// SIGTERM, then SIGKILL after 10 s; the exit status.
    pub fn stop(&mut self) -> Option<ExitStatus> {
        self.process.stop(Duration::from_secs(10))
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The status code of a plain HTTP/1.0 GET on 127.0.0.1:`port`, or `None` if there is no answer.
pub async fn http_status(port: u16, path: &str) -> Option<u16> {
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .ok()?;
    let request = format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut head = [0u8; 12];
    stream.read_exact(&mut head).await.ok()?;
    std::str::from_utf8(&head[9..12]).ok()?.parse().ok()
}
