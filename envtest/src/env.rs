//! [`Env`]: a control plane, the stand-in kubelet and an admin client, started together; and
//! [`SharedEnv`]: one `Env` per test binary, shared by all its tests.
//!
//! Why share: the control plane takes seconds to start and a few hundred MB to run, and every scenario
//! can have a namespace and an operator process of its own (`--namespace`), so one per binary is enough
//! and keeps a suite of many scenarios fast on a 2-core machine. A scenario that must own the cluster
//! (restarting the API server, counting every request regardless of user) starts an `Env` of its own.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow};
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use kube::api::PostParams;
use kube::{Api, Client};
use serde_json::json;
use tokio::sync::OnceCell;

use crate::assets::Assets;
use crate::control_plane::{ControlPlane, ControlPlaneOptions};
use crate::install::{
    OperatorCredentials, install_operator_manifest, install_operator_overlay, install_operator_rbac,
};
use crate::kubelet::{Kubelet, KubeletOptions};

/// How to start an [`Env`].
#[derive(Clone, Debug, Default)]
pub struct EnvOptions {
    pub control_plane: ControlPlaneOptions,
    /// `log_dir` is replaced by `<control plane dir>/kubelet`, `bind_pods` turned on when no scheduler
    /// runs, and the API server of `operator` is the control plane's.
    pub kubelet: KubeletOptions,
}

/// A control plane with the stand-in kubelet running against it.
pub struct Env {
    control_plane: ControlPlane,
    kubelet: Option<Kubelet>,
    client: Client,
    started_in: Duration,
}

impl Env {
    /// Starts the control plane, then the kubelet (its tasks run in the current Tokio runtime, which must
    /// outlive the `Env`).
    pub async fn start(assets: &Assets, options: EnvOptions) -> Result<Env> {
        let started = Instant::now();
        let control_plane = ControlPlane::start(assets, &options.control_plane).await?;
        let client = control_plane.admin_client().await?;
        let kubelet_client = crate::kubeconfig::client(&control_plane.kubelet_kubeconfig()).await?;
        let mut kubelet_options = options.kubelet;
        kubelet_options.log_dir = control_plane.dir().join("kubelet");
        kubelet_options.bind_pods |= !control_plane.has_scheduler();
        if let Some(operator) = &mut kubelet_options.operator {
            operator.server = control_plane.server().to_owned();
            operator.ca_cert = control_plane.ca_cert().to_owned();
        }
        let kubelet = Kubelet::start(kubelet_client, kubelet_options)
            .await
            .context("cannot start the stand-in kubelet")?;
        Ok(Env {
            control_plane,
            kubelet: Some(kubelet),
            client,
            started_in: started.elapsed(),
        })
    }

    pub fn control_plane(&self) -> &ControlPlane {
        &self.control_plane
    }

    pub fn kubelet(&self) -> Option<&Kubelet> {
        self.kubelet.as_ref()
    }

    /// The admin client, made in the runtime that started the `Env`.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The admin kubeconfig.
    pub fn kubeconfig(&self) -> &Path {
        self.control_plane.kubeconfig()
    }

    /// How long [`Env::start`] took.
    pub fn started_in(&self) -> Duration {
        self.started_in
    }

    /// Installs the operator's CRD and RBAC from `config_dir` and returns its ServiceAccount's kubeconfig.
    pub async fn install_operator_rbac(&self, config_dir: &Path) -> Result<OperatorCredentials> {
        install_operator_rbac(&self.control_plane, &self.client, config_dir).await
    }

    /// Installs the operator's CRD and RBAC from the kustomization `<config_dir>/<overlay>`.
    pub async fn install_operator_overlay(
        &self,
        config_dir: &Path,
        overlay: &str,
    ) -> Result<OperatorCredentials> {
        install_operator_overlay(&self.control_plane, &self.client, config_dir, overlay).await
    }

    /// Installs the operator's CRD and RBAC from a rendering made elsewhere (the Helm chart's).
    pub async fn install_operator_manifest(
        &self,
        rendered: &str,
        source: &str,
    ) -> Result<OperatorCredentials> {
        install_operator_manifest(&self.control_plane, &self.client, rendered, source).await
    }

    /// Stops the kubelet (killing its processes), then the control plane.
    pub async fn stop(mut self) {
        if let Some(kubelet) = self.kubelet.take() {
            kubelet.stop().await;
        }
        self.control_plane.stop();
    }
}

/// Creates namespace `name` (with `labels`) and waits for its `default` ServiceAccount, without which
/// the API server admits no pod into it (so a Deployment created at once would stall for a while).
pub async fn create_namespace(client: &Client, name: &str, labels: &[(&str, &str)]) -> Result<()> {
    let labels: serde_json::Map<String, serde_json::Value> = labels
        .iter()
        .map(|(k, v)| ((*k).to_owned(), json!(v)))
        .collect();
    let namespace: Namespace = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": labels},
    }))?;
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &namespace)
        .await
        .with_context(|| format!("cannot create namespace {name}"))?;
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), name);
    let deadline = Instant::now() + Duration::from_secs(30);
    while accounts.get_opt("default").await?.is_none() {
        if Instant::now() > deadline {
            return Err(anyhow!("no ServiceAccount {name}/default after 30s"));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

/// One [`Env`] for the whole test binary, started by the first test that asks for it, in a Tokio runtime
/// of its own (each `#[tokio::test]` has a runtime that ends with the test; the kubelet's tasks must
/// not).
///
/// A `static` is never dropped, so at exit an `atexit` handler stops the processes and removes the
/// directory (unless kept); were that skipped (`kill -9`), the processes still die with the binary
/// (see [`crate::process`]).
pub struct SharedEnv {
    /// Hosts the kubelet and the admin client's connections for the life of the process.
    _runtime: tokio::runtime::Runtime,
    env: Env,
    operator: OnceCell<Result<OperatorCredentials, String>>,
}

static SHARED: OnceCell<Result<SharedEnv, String>> = OnceCell::const_new();

impl SharedEnv {
    /// The shared environment: `Ok(None)` when there are no assets (the caller skips), an error when it
    /// could not start (every caller gets the same error). The first caller's `options` are used.
    pub async fn get(options: impl FnOnce() -> EnvOptions) -> Result<Option<&'static SharedEnv>> {
        let Some(assets) = crate::assets() else {
            return Ok(None);
        };
        let shared = SHARED
            .get_or_init(|| async move {
                SharedEnv::start(assets, options())
                    .await
                    .map_err(|e| format!("{e:#}"))
            })
            .await;
        match shared {
            Ok(shared) => Ok(Some(shared)),
            Err(e) => Err(anyhow!("the shared envtest did not start: {e}")),
        }
    }

    async fn start(assets: Assets, options: EnvOptions) -> Result<SharedEnv> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("envtest-shared")
            .enable_all()
            .build()?;
        let started = runtime
            .spawn(async move { Env::start(&assets, options).await })
            .await;
        let env = match started {
            Ok(Ok(env)) => env,
            Ok(Err(e)) => {
                runtime.shutdown_background();
                return Err(e);
            }
            Err(e) => {
                runtime.shutdown_background();
                return Err(anyhow!("the envtest start panicked: {e}"));
            }
        };
        // SAFETY: registering a handler with atexit(3) has no preconditions; the handler is an
        // `extern "C"` function that catches nothing and cannot unwind (it only locks and signals).
        unsafe {
            libc::atexit(stop_shared_at_exit);
        }
        Ok(SharedEnv {
            _runtime: runtime,
            env,
            operator: OnceCell::new(),
        })
    }

    pub fn env(&self) -> &Env {
        &self.env
    }

    pub fn control_plane(&self) -> &ControlPlane {
        self.env.control_plane()
    }

    /// The admin client. It lives in the shared runtime and works from any test's runtime.
    pub fn client(&self) -> Client {
        self.env.client().clone()
    }

    /// The operator's CRD and RBAC, installed once for the binary, and its ServiceAccount's kubeconfig.
    pub async fn operator_credentials(&self, config_dir: &Path) -> Result<&OperatorCredentials> {
        let config_dir: PathBuf = config_dir.to_owned();
        let client = self.client();
        let done = self
            .operator
            .get_or_init(|| async move {
                install_operator_rbac(self.control_plane(), &client, &config_dir)
                    .await
                    .map_err(|e| format!("{e:#}"))
            })
            .await;
        done.as_ref().map_err(|e| anyhow!("{e}"))
    }
}

extern "C" fn stop_shared_at_exit() {
    if let Some(Ok(shared)) = SHARED.get() {
        shared.env.control_plane.stop();
    }
}
