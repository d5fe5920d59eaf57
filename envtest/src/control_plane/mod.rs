//! etcd, kube-apiserver, kube-controller-manager and (when present) kube-scheduler, started from
//! [`Assets`] in one directory on free loopback ports.
//!
//! Every component authenticates with a static token of its own, in a kubeconfig of its own: the admin
//! (user `envtest-admin`, group `system:masters`, `admin.kubeconfig`), the stand-in kubelet
//! (`envtest-kubelet`), the controller-manager (`system:kube-controller-manager`, each controller then
//! acting under its own ServiceAccount) and the scheduler (`system:kube-scheduler`). Every request is
//! audited ([`crate::audit`]), so counts by user tell them apart.
//!
//! Methods take `&self` (the processes sit behind locks) so that one control plane can be shared by the
//! tests of a binary ([`crate::SharedEnv`]), including a restart of the API server.

mod apiserver;
mod controllers;

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow};
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::Api;

pub use apiserver::AUDIT_POLICY;
pub use controllers::CONTROLLERS;

use crate::assets::Assets;
use crate::audit::AuditLog;
use crate::net::{free_port, free_ports, wait_for_listener};
use crate::pki::{Pki, random_token, write_file};
use crate::process::Process;
use apiserver::ApiServerConfig;

/// The admin user of the kubeconfig [`ControlPlane::kubeconfig`], as it appears in the audit log.
pub const ADMIN_USER: &str = "envtest-admin";
/// The stand-in kubelet's user ([`ControlPlane::kubelet_kubeconfig`]).
pub const KUBELET_USER: &str = "envtest-kubelet";

/// How long a stopping component may take before it is killed. kube-apiserver stops listening at once
/// on SIGTERM but then waits for its open watches (10 s and more), and nothing here needs a graceful end:
/// the data is thrown away, or kept as etcd has it.
pub const STOP_GRACE: Duration = Duration::from_secs(1);

const ADMIN_KUBECONFIG: &str = "admin.kubeconfig";
const KUBELET_KUBECONFIG: &str = "kubelet.kubeconfig";
const CONTROLLER_MANAGER_KUBECONFIG: &str = "kube-controller-manager.kubeconfig";
const SCHEDULER_KUBECONFIG: &str = "kube-scheduler.kubeconfig";

/// Who authenticates with a static token: (user, groups, kubeconfig file). One identity per component,
/// so that the audit log tells the test's own requests from the kubelet's and the controllers'. The
/// controller-manager and the scheduler use the users the API server's bootstrap RBAC already binds.
const IDENTITIES: [(&str, &str, &str); 4] = [
    (ADMIN_USER, "system:masters", ADMIN_KUBECONFIG),
    (KUBELET_USER, "system:masters", KUBELET_KUBECONFIG),
    (
        "system:kube-controller-manager",
        "",
        CONTROLLER_MANAGER_KUBECONFIG,
    ),
    ("system:kube-scheduler", "", SCHEDULER_KUBECONFIG),
];

/// The Service ClusterIP range of the API server and the controller-manager: a `/16`, so that hundreds of
/// instances (each with a ClusterIP Service) fit; a `/24` holds 253 and the 254th Service is refused
/// ("failed to allocate a serviceIP: range is full").
pub const SERVICE_CLUSTER_IP_RANGE: &str = "10.0.0.0/16";

/// How to start a [`ControlPlane`].
#[derive(Clone, Debug)]
pub struct ControlPlaneOptions {
    /// Where to put data, logs and kubeconfigs. A directory given here is never removed; by default a
    /// new one under the system's temp dir is made, and removed on stop unless `keep`.
    pub dir: Option<PathBuf>,
    /// Keep the temp dir (logs, audit log, etcd data) after stop. Default: `ENVTEST_KEEP=1`.
    pub keep: bool,
    /// Run kube-scheduler if the assets have it (else the stand-in kubelet binds pods).
    pub scheduler: bool,
    /// How long the API server may take to become ready (also after a restart).
    pub start_timeout: Duration,
    /// For a real node (`hack/real-node.sh`) instead of the stand-in kubelet: the node's bridge address,
    /// at which its pods reach the API server. The API server then listens on every address, publishes
    /// this one as the `kubernetes` Service's endpoint (its certificate names it), and the endpoint
    /// controllers run.
    pub node_address: Option<Ipv4Addr>,
}

impl Default for ControlPlaneOptions {
    fn default() -> Self {
        ControlPlaneOptions {
            dir: None,
            keep: std::env::var("ENVTEST_KEEP").is_ok_and(|v| v == "1"),
            scheduler: true,
            start_timeout: Duration::from_secs(60),
            node_address: None,
        }
    }
}

/// A running control plane; stopped by [`ControlPlane::stop`] or on `Drop`.
pub struct ControlPlane {
    dir: PathBuf,
    remove_dir: bool,
    server: String,
    kubeconfig: PathBuf,
    ca_cert: PathBuf,
    audit: AuditLog,
    apiserver_config: ApiServerConfig,
    start_timeout: Duration,
    etcd: Mutex<Option<Process>>,
    apiserver: Mutex<Option<Process>>,
    controller_manager: Mutex<Option<Process>>,
    scheduler: Mutex<Option<Process>>,
    has_scheduler: bool,
    timings: Mutex<Vec<(String, Duration)>>,
}

impl ControlPlane {
    /// Starts everything and waits until the API server is ready and the controllers work (the `default`
    /// ServiceAccount exists in `default`, which needs the controller-manager's ServiceAccount and token
    /// controllers and so its whole start-up).
    pub async fn start(assets: &Assets, options: &ControlPlaneOptions) -> Result<ControlPlane> {
        let started = Instant::now();
        let (dir, remove_dir) = match &options.dir {
            Some(dir) => (dir.clone(), false),
            None => (new_temp_dir(), !options.keep),
        };
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
        let extra_names: Vec<String> = options.node_address.iter().map(|a| a.to_string()).collect();
        let pki = Pki::create(&dir.join("pki"), &extra_names)?;
        let [etcd_port, etcd_peer_port, port] = free_ports::<3>()?;
        let server = format!("https://127.0.0.1:{port}");
        let token_file = dir.join("tokens.csv");
        let mut tokens = String::new();
        for (user, groups, file) in IDENTITIES {
            let token = random_token();
            tokens.push_str(&format!("{token},{user},{user},\"{groups}\"\n"));
            crate::kubeconfig::write(&dir.join(file), &server, &pki.ca_cert, (user, &token), None)?;
        }
        write_file(&token_file, &tokens, 0o600)?;
        let audit_policy = dir.join("audit-policy.yaml");
        write_file(&audit_policy, AUDIT_POLICY, 0o644)?;
        let kubeconfig = dir.join(ADMIN_KUBECONFIG);

        let apiserver_config = ApiServerConfig {
            binary: assets.kube_apiserver.clone(),
            port,
            etcd_url: format!("http://127.0.0.1:{etcd_port}"),
            pki: pki.clone(),
            token_file,
            audit_policy,
            audit_log: dir.join("audit").join("audit.log"),
            cert_dir: dir.join("apiserver-certs"),
            log: dir.join("kube-apiserver.log"),
            node_address: options.node_address,
        };
        // From here on, an early return drops `plane`, which stops what was started.
        let plane = ControlPlane {
            audit: AuditLog::new(&apiserver_config.audit_log),
            dir,
            remove_dir,
            server,
            kubeconfig,
            ca_cert: pki.ca_cert.clone(),
            apiserver_config,
            start_timeout: options.start_timeout,
            etcd: Mutex::new(None),
            apiserver: Mutex::new(None),
            controller_manager: Mutex::new(None),
            scheduler: Mutex::new(None),
            has_scheduler: options.scheduler && assets.kube_scheduler.is_some(),
            timings: Mutex::new(Vec::new()),
        };

        let etcd = Process::start(
            "etcd",
            controllers::etcd(
                &assets.etcd,
                &plane.dir.join("etcd"),
                etcd_port,
                etcd_peer_port,
            ),
            &plane.dir.join("etcd.log"),
        )?;
        *lock(&plane.etcd)? = Some(etcd);
        wait_for_listener([127, 0, 0, 1].into(), etcd_port, Duration::from_secs(30))
            .await
            .map_err(|e| plane.with_log("etcd", &plane.etcd, e))?;
        plane.record("etcd listening", started.elapsed());

        plane.start_apiserver().await?;
        plane.record("kube-apiserver ready", started.elapsed());
        // Not before the API server is ready: the controller-manager exits if RBAC's bootstrap roles
        // are not there yet when it first reads extension-apiserver-authentication.
        let kcm = controllers::controller_manager(
            &assets.kube_controller_manager,
            &plane.dir.join(CONTROLLER_MANAGER_KUBECONFIG),
            &pki,
            free_port()?,
            options.node_address.is_some(),
        );
        *lock(&plane.controller_manager)? = Some(Process::start(
            "kube-controller-manager",
            kcm,
            &plane.dir.join("kube-controller-manager.log"),
        )?);
        if let (true, Some(binary)) = (plane.has_scheduler, &assets.kube_scheduler) {
            let kubeconfig = plane.dir.join(SCHEDULER_KUBECONFIG);
            let cmd = controllers::scheduler(binary, &kubeconfig, free_port()?);
            *lock(&plane.scheduler)? = Some(Process::start(
                "kube-scheduler",
                cmd,
                &plane.dir.join("kube-scheduler.log"),
            )?);
        }
        plane.wait_for_default_service_account().await?;
        plane.record("controllers working", started.elapsed());
        Ok(plane)
    }

    /// The directory holding logs, the audit log, etcd's data and the kubeconfigs.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The admin kubeconfig (group `system:masters`).
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// The stand-in kubelet's kubeconfig (user `envtest-kubelet`, group `system:masters`).
    pub fn kubelet_kubeconfig(&self) -> PathBuf {
        self.dir.join(KUBELET_KUBECONFIG)
    }

    /// `https://127.0.0.1:<port>`; the same across API server restarts.
    pub fn server(&self) -> &str {
        &self.server
    }

    /// The CA that signed the API server's certificate (PEM).
    pub fn ca_cert(&self) -> &Path {
        &self.ca_cert
    }

    pub fn audit(&self) -> &AuditLog {
        &self.audit
    }

    /// Whether kube-scheduler runs (else pods stay unscheduled unless the kubelet binds them).
    pub fn has_scheduler(&self) -> bool {
        self.has_scheduler
    }

    /// An admin client in the caller's runtime.
    pub async fn admin_client(&self) -> Result<kube::Client> {
        crate::kubeconfig::client(&self.kubeconfig).await
    }

    /// Milestones of the start, as time since it began (and of restarts, since each began).
    pub fn timings(&self) -> Vec<(String, Duration)> {
        self.timings.lock().map(|t| t.clone()).unwrap_or_default()
    }

    /// Stops the API server alone (SIGTERM, then SIGKILL after [`STOP_GRACE`]): clients see connections
    /// refused until [`ControlPlane::start_apiserver`]. etcd and the controllers keep running.
    pub fn stop_apiserver(&self) -> Result<()> {
        if let Some(mut p) = lock(&self.apiserver)?.take() {
            p.stop(STOP_GRACE);
        }
        Ok(())
    }

    /// Starts the API server (again, unless it runs) on the same port, with the same data, certificates
    /// and audit log, and waits until it is ready.
    pub async fn start_apiserver(&self) -> Result<()> {
        {
            let mut slot = lock(&self.apiserver)?;
            if slot.as_mut().is_none_or(|p| p.exit_status().is_some()) {
                *slot = Some(self.apiserver_config.start()?);
            }
        }
        let client = self.admin_client().await?;
        apiserver::wait_ready(&self.apiserver, &client, self.start_timeout)
            .await
            .map_err(|e| self.with_log("kube-apiserver", &self.apiserver, e))
    }

    /// Stops the API server and starts it again; returns how long it took to be ready again.
    pub async fn restart_apiserver(&self) -> Result<Duration> {
        let started = Instant::now();
        self.stop_apiserver()?;
        self.start_apiserver().await?;
        let took = started.elapsed();
        self.record("kube-apiserver restarted", took);
        Ok(took)
    }

    /// Stops every process (scheduler and controller-manager first, etcd last) and removes the directory
    /// unless it is to be kept. Idempotent; `Drop` calls it.
    pub fn stop(&self) {
        for slot in [
            &self.scheduler,
            &self.controller_manager,
            &self.apiserver,
            &self.etcd,
        ] {
            // A poisoned lock still holds the process, which must be stopped all the same.
            let mut guard = slot.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(mut p) = guard.take() {
                p.stop(STOP_GRACE);
            }
        }
        if self.remove_dir && self.dir.exists() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    /// Whether every process that should run does; an error names the first one that exited, with the
    /// end of its log.
    pub fn check_running(&self) -> Result<()> {
        for slot in [
            &self.etcd,
            &self.apiserver,
            &self.controller_manager,
            &self.scheduler,
        ] {
            if let Some(p) = lock(slot)?.as_mut() {
                p.check_running()?;
            }
        }
        Ok(())
    }

    async fn wait_for_default_service_account(&self) -> Result<()> {
        let client = self.admin_client().await?;
        let api: Api<ServiceAccount> = Api::namespaced(client, "default");
        let deadline = Instant::now() + self.start_timeout;
        loop {
            self.check_running()?;
            if api.get_opt("default").await.ok().flatten().is_some() {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(anyhow!(
                    "no ServiceAccount default/default after {:?}: is kube-controller-manager working? See {}",
                    self.start_timeout,
                    self.dir.join("kube-controller-manager.log").display()
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn record(&self, what: &str, at: Duration) {
        if let Ok(mut t) = self.timings.lock() {
            t.push((what.to_owned(), at));
        }
    }

    /// `error`, with the end of the named process's log appended.
    fn with_log(
        &self,
        name: &str,
        slot: &Mutex<Option<Process>>,
        error: anyhow::Error,
    ) -> anyhow::Error {
        let log = lock(slot)
            .ok()
            .and_then(|g| g.as_ref().map(|p| p.log_path().to_owned()));
        match log {
            Some(log) => error.context(format!(
                "{name} failed; the end of {}:\n{}",
                log.display(),
                crate::process::tail(&log, 30)
            )),
            None => error,
        }
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        self.stop();
    }
}

fn lock(slot: &Mutex<Option<Process>>) -> Result<MutexGuard<'_, Option<Process>>> {
    slot.lock()
        .map_err(|_| anyhow!("a process lock is poisoned"))
}

/// A new directory name under the temp dir, unique to this process and moment.
fn new_temp_dir() -> PathBuf {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or_default();
    std::env::temp_dir().join(format!("envtest-{}-{nanos:09}", std::process::id()))
}
