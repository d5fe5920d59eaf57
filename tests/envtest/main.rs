//! The operator binary against a real control plane (etcd, kube-apiserver, kube-controller-manager,
//! kube-scheduler from `$KUBEBUILDER_ASSETS`) with the stand-in kubelet of the `envtest` crate.
//!
//! ```text
//! KUBEBUILDER_ASSETS=/opt/kubebuilder-assets/bin cargo test --test envtest -- --nocapture
//! ```
//!
//! Without `KUBEBUILDER_ASSETS` (or with a directory lacking a binary) every scenario passes after
//! printing `envtest: skipped <scenario>: <reason>` to stderr (past the harness's capture), so skips are
//! visible and countable: `grep -c '^envtest: skipped'`.
//!
//! # The shared setup
//!
//! One control plane per test binary ([`envtest::SharedEnv`]), started by the first scenario that asks
//! and shared by all: it takes about 4 s to start on 2 cores, and scenarios do not need one each. The
//! operator's CRD and RBAC (`config/default` minus the Deployment) are installed once, and the operator
//! runs under a token of its own ServiceAccount (`memcached-operator-system/memcached-operator-controller-manager`),
//! so the RBAC of `config/rbac` is exercised for real.
//!
//! Each scenario calls [`Scenario::start`]`("name")` (or [`Scenario::start_with`]`("name", &[extra
//! operator args])`), which gives it:
//! - a namespace of its own (`<name>-<n>`), with its `default` ServiceAccount ready;
//! - an operator process of its own, `memcached-operator run --namespace <ns> <extra args>` (no leader
//!   election), its metrics and health endpoints on free ports, its log in the control plane's directory
//!   (`operator-<ns>.log`); it is stopped when the `Scenario` is dropped, and its log's end printed if the
//!   scenario failed; [`Scenario::restart_operator`] restarts it with the same arguments;
//! - [`Scenario::step`] to print timed progress, [`Scenario::apply_file`] to apply a manifest, [`wait_for`]
//!   to poll with a timeout, [`Scenario::operator_requests`] and [`Scenario::operator_requests_since`] to
//!   count the operator's requests from the audit log, [`Scenario::real_memcached`] to know whether pods
//!   run a real memcached.
//!
//! Scenarios that install something else than `config/default` start on a control plane of their own:
//! [`Scenario::start_namespaced`] (`config/namespaced`) and [`Scenario::start_from_rendering`] (the Helm
//! chart's rendering, `chart.rs`).
//!
//! A new scenario is a file next to this one (`mod <name>;` below) with `#[tokio::test]` functions that
//! begin with `let Some(s) = Scenario::start("<name>").await else { return };`.
//!
//! Scenarios run in parallel (each test on its own thread), so one must not change what others rely on:
//! cluster-scoped objects, the API server itself. A scenario that restarts the API server or needs every
//! request to itself calls [`Scenario::start_isolated`] instead: the same, on a control plane of its own
//! (about 4 s more), stopped with the scenario.
//!
//! The operator's requests are counted by user and namespace: parallel scenarios share the operator's
//! ServiceAccount, so cluster-scoped requests (discovery, the CRD) of another scenario's operator can
//! mix into a count; namespaced ones cannot.
//!
//! Knobs: `ENVTEST_KEEP=1` keeps the control plane's directory (logs, audit log, etcd data);
//! `ENVTEST_MEMCACHED=0` turns off the real memcached per pod (on when `/usr/bin/memcached` exists);
//! `MEMCACHED_PROXY_BINARY=<a proxy-capable memcached, 1.6.23+>` runs the proxy pods of `spec.proxy` for
//! real (without it they serve nothing, and the scenarios that need them skip).

mod adoption;
mod certificates;
mod chart;
mod chart_actions;
mod convergence;
mod crd;
mod drain;
mod drift;
mod fleet;
mod handover;
mod in_clear;
mod instances;
mod invalid_args;
mod leader;
mod long_names;
mod metrics;
mod namespaced;
mod outage;
mod proxy;
mod real_clients;
mod restart;
mod rollouts;
mod scale_handover;
mod secrets;
mod settled;
mod shutdown;
mod statefulset_handover;
mod telemetry;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use envtest::kubelet::DEBIAN_MEMCACHED;
use envtest::kubelet::oneshot::OperatorImage;
use envtest::{
    AuditEvent, ControlPlane, Env, EnvOptions, KubeletOptions, Mark, Operator, OperatorCredentials,
    RequestCounts, SharedEnv,
};
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
use kube::{Api, Client};
use serde_json::Value;

/// The operator binary Cargo built for these tests.
pub const OPERATOR_BIN: &str = env!("CARGO_BIN_EXE_memcached-operator");
/// The repository, for `config/`.
pub const REPO_ROOT: &str = env!("CARGO_MANIFEST_DIR");
/// The Helm chart's operator image (`image.repository` of its values): the stand-in kubelet runs pods that
/// run once with it (`helm test`'s) as processes of [`OPERATOR_BIN`].
pub const CHART_IMAGE_REPOSITORY: &str = "registry.example.com/memcached-operator";
/// The field manager of what the scenarios apply.
pub const FIELD_MANAGER: &str = "envtest-scenario";

/// The shared environment's options: the kubelet runs a real memcached per pod where Debian's is
/// installed (so the operator's statistics collector reads real servers), unless `ENVTEST_MEMCACHED=0`,
/// and runs the pods of the chart's image that run once (`helm test`'s) as the operator binary.
fn options() -> EnvOptions {
    let memcached = Path::new(DEBIAN_MEMCACHED);
    let wanted = std::env::var("ENVTEST_MEMCACHED").map_or(true, |v| v != "0");
    EnvOptions {
        kubelet: KubeletOptions {
            memcached: (wanted && memcached.is_file()).then(|| memcached.to_owned()),
            proxy_memcached: proxy_memcached(),
            operator: Some(OperatorImage::new(OPERATOR_BIN, &[CHART_IMAGE_REPOSITORY])),
            ..KubeletOptions::default()
        },
        ..EnvOptions::default()
    }
}

/// The proxy-capable memcached (1.6.23 or later, built with `--enable-proxy`) named by
/// `$MEMCACHED_PROXY_BINARY`, if it names a file: the stand-in kubelet runs it for the proxy pods of
/// `spec.proxy`.
pub fn proxy_memcached() -> Option<PathBuf> {
    let path = PathBuf::from(std::env::var_os(PROXY_BINARY_VAR)?);
    path.is_file().then_some(path)
}

/// The variable naming the proxy-capable memcached.
pub const PROXY_BINARY_VAR: &str = "MEMCACHED_PROXY_BINARY";

/// The control plane a scenario runs on: the binary's shared one, or its own.
pub enum ScenarioEnv {
    Shared(&'static SharedEnv),
    /// For a scenario that must own the cluster ([`Scenario::start_isolated`]).
    Own(Box<Env>),
}

impl ScenarioEnv {
    pub fn control_plane(&self) -> &ControlPlane {
        match self {
            ScenarioEnv::Shared(shared) => shared.control_plane(),
            ScenarioEnv::Own(env) => env.control_plane(),
        }
    }

    /// An admin client.
    pub fn client(&self) -> Client {
        match self {
            ScenarioEnv::Shared(shared) => shared.client(),
            ScenarioEnv::Own(env) => env.client().clone(),
        }
    }
}

/// One scenario's namespace and operator.
pub struct Scenario {
    pub name: String,
    pub env: ScenarioEnv,
    /// An admin client.
    pub client: Client,
    pub namespace: String,
    pub credentials: OperatorCredentials,
    pub operator: Operator,
    /// The audit log's end just before the (first) operator started.
    pub operator_mark: Mark,
    /// The operator's arguments after `run`, for [`Scenario::restart_operator`].
    operator_args: Vec<String>,
    started: Instant,
}

impl Scenario {
    /// The shared environment, a namespace and an operator for scenario `name`; `None` (after printing the
    /// skip line) without assets. Panics if the environment cannot start.
    pub async fn start(name: &str) -> Option<Scenario> {
        Scenario::start_with(name, &[]).await
    }

    /// [`Scenario::start_with`] for a scenario that needs real memcached servers: `None` (after printing
    /// the skip line) also when the stand-in kubelet runs none.
    pub async fn start_with_memcached(name: &str, args: &[&str]) -> Option<Scenario> {
        let s = Scenario::start_with(name, args).await?;
        if !s.real_memcached() {
            eprintln!(
                "envtest: skipped {name}: the stand-in kubelet runs no memcached (install Debian's memcached)"
            );
            return None;
        }
        Some(s)
    }

    /// [`Scenario::start`] with extra arguments for `memcached-operator run` (after `--namespace <ns>`).
    pub async fn start_with(name: &str, args: &[&str]) -> Option<Scenario> {
        let started = Instant::now();
        let shared = match SharedEnv::get(options).await {
            Ok(Some(shared)) => shared,
            Ok(None) => {
                envtest::skip(name);
                return None;
            }
            Err(e) => panic!("{e:#}"),
        };
        announce_environment(shared.control_plane(), shared.env().started_in(), "shared");
        let credentials = shared
            .operator_credentials(&config_dir())
            .await
            .unwrap_or_else(|e| panic!("installing the operator's CRD and RBAC: {e:#}"))
            .clone();
        Some(
            Scenario::begin(
                name,
                ScenarioEnv::Shared(shared),
                credentials,
                args,
                started,
                None,
            )
            .await,
        )
    }

    /// Like [`Scenario::start_with`], on a control plane of the scenario's own (about 4 s more), for a
    /// scenario that restarts the API server or must not share it. It stops with the scenario.
    pub async fn start_isolated(name: &str, args: &[&str]) -> Option<Scenario> {
        Scenario::start_own(name, Install::Overlay("default"), args).await
    }

    /// On a control plane of its own, the operator's CRD and RBAC installed from `rendered` (everything
    /// but its Deployment; `source` names it), in a namespace of the scenario's own: the Helm chart's
    /// rendering, say. The rendering must hold the Namespace of the operator's ServiceAccount.
    pub async fn start_from_rendering(
        name: &str,
        rendered: String,
        source: &str,
    ) -> Option<Scenario> {
        Scenario::start_own(name, Install::Rendered { rendered, source }, &[]).await
    }

    /// On a control plane of its own, the operator installed from `config/namespaced` (its rights a Role
    /// in its own namespace, no ClusterRole), watching that namespace, which is the scenario's namespace.
    pub async fn start_namespaced(name: &str) -> Option<Scenario> {
        Scenario::start_own(name, Install::Overlay("namespaced"), &[]).await
    }

    /// A control plane of the scenario's own, the operator installed from `config/<overlay>` (in a
    /// namespace of the scenario's own for `default`, else in the namespace the install creates) or from a
    /// rendering (in a namespace of the scenario's own).
    async fn start_own(name: &str, install: Install<'_>, args: &[&str]) -> Option<Scenario> {
        let started = Instant::now();
        let Some(assets) = envtest::assets() else {
            envtest::skip(name);
            return None;
        };
        let env = Env::start(&assets, options())
            .await
            .unwrap_or_else(|e| panic!("envtest for {name}: {e:#}"));
        announce_environment(env.control_plane(), env.started_in(), name);
        let (credentials, namespace) = match install {
            Install::Overlay(overlay) => {
                let credentials = env
                    .install_operator_overlay(&config_dir(), overlay)
                    .await
                    .unwrap_or_else(|e| panic!("installing config/{overlay}: {e:#}"));
                let namespace = (overlay != "default").then(|| credentials.namespace.clone());
                (credentials, namespace)
            }
            Install::Rendered { rendered, source } => {
                let credentials = env
                    .install_operator_manifest(&rendered, source)
                    .await
                    .unwrap_or_else(|e| panic!("installing {source}: {e:#}"));
                (credentials, None)
            }
        };
        Some(
            Scenario::begin(
                name,
                ScenarioEnv::Own(Box::new(env)),
                credentials,
                args,
                started,
                namespace,
            )
            .await,
        )
    }

    /// Starts the operator for the scenario, in `namespace` when given (it exists), else in a namespace of
    /// its own.
    async fn begin(
        name: &str,
        env: ScenarioEnv,
        credentials: OperatorCredentials,
        args: &[&str],
        started: Instant,
        namespace: Option<String>,
    ) -> Scenario {
        let client = env.client();
        let namespace = match namespace {
            Some(namespace) => namespace,
            None => {
                let namespace = unique_namespace(name);
                envtest::create_namespace(&client, &namespace, &[])
                    .await
                    .unwrap_or_else(|e| panic!("{e:#}"));
                namespace
            }
        };
        let mut operator_args: Vec<String> = ["--namespace", &namespace, "--log-level", "info"]
            .iter()
            .map(|a| (*a).to_owned())
            .collect();
        operator_args.extend(args.iter().map(|a| (*a).to_owned()));
        let operator_mark = env.control_plane().audit().mark().expect("audit log mark");
        let operator = start_operator(&env, &credentials, &namespace, &operator_args).await;
        let scenario = Scenario {
            name: name.to_owned(),
            env,
            client,
            namespace,
            credentials,
            operator,
            operator_mark,
            operator_args,
            started,
        };
        scenario.step(&format!(
            "namespace {} and operator (pid {}) ready",
            scenario.namespace,
            scenario.operator.pid()
        ));
        scenario
    }

    pub fn control_plane(&self) -> &ControlPlane {
        self.env.control_plane()
    }

    /// Whether the stand-in kubelet runs a real memcached for every pod.
    pub fn real_memcached(&self) -> bool {
        options().kubelet.memcached.is_some()
    }

    /// Stops the operator (SIGTERM) and starts it again with the same arguments, as a rollout of the
    /// operator would; waits until it is ready. Its log continues in the same file.
    pub async fn restart_operator(&mut self) {
        let status = self.operator.stop();
        self.step(&format!("operator stopped ({status:?}); starting it again"));
        self.operator = start_operator(
            &self.env,
            &self.credentials,
            &self.namespace,
            &self.operator_args,
        )
        .await;
        self.step(&format!(
            "operator (pid {}) ready again",
            self.operator.pid()
        ));
    }

    /// Prints `[name +t] what`, t since the scenario started.
    pub fn step(&self, what: &str) {
        eprintln!(
            "[{} +{:.2}s] {what}",
            self.name,
            self.started.elapsed().as_secs_f64()
        );
    }

    /// Applies (server-side) the first document of the YAML file at `path` (relative to the repository)
    /// into the scenario's namespace; returns the object as the server has it.
    pub async fn apply_file(&self, path: &str) -> DynamicObject {
        let text = std::fs::read_to_string(Path::new(REPO_ROOT).join(path))
            .unwrap_or_else(|e| panic!("cannot read {path}: {e}"));
        let doc: Value = serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"));
        let mut object: DynamicObject =
            serde_json::from_value(doc).unwrap_or_else(|e| panic!("{path}: {e}"));
        object.metadata.namespace = Some(self.namespace.clone());
        let types = object.types.clone().expect("apiVersion and kind");
        let (group, version) = types
            .api_version
            .split_once('/')
            .unwrap_or(("", &types.api_version));
        let resource = ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, &types.kind));
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), &self.namespace, &resource);
        let name = object.metadata.name.clone().expect("metadata.name");
        api.patch(
            &name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&object),
        )
        .await
        .unwrap_or_else(|e| panic!("applying {path}: {e}"))
    }

    /// The operator's requests since it started: its ServiceAccount's, in this namespace or cluster-scoped.
    pub fn operator_requests(&self) -> RequestCounts {
        self.operator_requests_since(&self.operator_mark)
    }

    /// The operator's requests the API server refused (403) since it started, as `verb resource name in
    /// namespace`: an install whose RBAC misses a rule shows here.
    pub fn refused_requests(&self) -> Vec<String> {
        self.control_plane()
            .audit()
            .read_since(&self.operator_mark)
            .expect("the audit log")
            .into_iter()
            .filter(|event| event.user == self.credentials.user && event.code == 403)
            .map(|event| {
                format!(
                    "{} {} {} in {:?}",
                    event.verb, event.resource, event.name, event.namespace
                )
            })
            .collect()
    }

    /// The operator's requests since `mark` (see [`Scenario::operator_requests`]).
    pub fn operator_requests_since(&self, mark: &Mark) -> RequestCounts {
        let audit = self.control_plane().audit();
        let events = audit.read_since(mark).expect("audit log");
        envtest::audit::count(events.iter().filter(|e: &&AuditEvent| {
            e.user == self.credentials.user
                && (e.namespace == self.namespace || e.namespace.is_empty())
        }))
    }
}

impl Drop for Scenario {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "[{}] FAILED; the end of the operator's log ({}):\n{}",
                self.name,
                self.operator.log().display(),
                self.operator.log_tail(60)
            );
        }
        self.operator.stop();
    }
}

/// Polls `check` every 100 ms until it returns `Some`, or panics after `timeout` with `what` and the
/// last value `describe`d.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    let started = Instant::now();
    loop {
        let last = match check().await {
            Ok(value) => return value,
            Err(last) => last,
        };
        if started.elapsed() > timeout {
            panic!("timed out after {timeout:?} waiting for {what}; last seen: {last}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Prints a control plane's start-up: the shared one once per binary, an own one every time.
fn announce_environment(plane: &ControlPlane, started_in: Duration, which: &str) {
    static SHARED_ONCE: std::sync::Once = std::sync::Once::new();
    let print = || {
        let milestones: Vec<String> = plane
            .timings()
            .iter()
            .map(|(what, at)| format!("{what} {:.2}s", at.as_secs_f64()))
            .collect();
        let memcached = options().kubelet.memcached;
        eprintln!(
            "envtest: {which} control plane up in {:.2}s ({}); kube-scheduler {}; memcached per pod: {}; dir {}",
            started_in.as_secs_f64(),
            milestones.join(", "),
            if plane.has_scheduler() { "yes" } else { "no" },
            memcached
                .as_deref()
                .map_or("no".into(), |p| p.display().to_string()),
            plane.dir().display()
        );
    };
    if which == "shared" {
        SHARED_ONCE.call_once(print);
    } else {
        print();
    }
}

/// Starts `memcached-operator run <args>` under the operator's ServiceAccount and waits until it is ready;
/// its log is `operator-<namespace>.log` in the control plane's directory.
async fn start_operator(
    env: &ScenarioEnv,
    credentials: &OperatorCredentials,
    namespace: &str,
    args: &[String],
) -> Operator {
    let log = env
        .control_plane()
        .dir()
        .join(format!("operator-{namespace}.log"));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut operator = Operator::start(
        Path::new(OPERATOR_BIN),
        &credentials.kubeconfig,
        &args,
        &log,
    )
    .unwrap_or_else(|e| panic!("{e:#}"));
    operator
        .wait_ready(Duration::from_secs(60))
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
    operator
}

/// What [`Scenario::start_own`] installs.
enum Install<'a> {
    /// `config/<overlay>`, rendered by kustomize.
    Overlay(&'a str),
    /// A rendering made elsewhere, named `source`.
    Rendered { rendered: String, source: &'a str },
}

fn config_dir() -> PathBuf {
    Path::new(REPO_ROOT).join("config")
}

/// `<name>-<n>`, unique in this process (the control plane is new for every process).
fn unique_namespace(name: &str) -> String {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let base: String = name
        .to_lowercase()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .take(50)
        .collect();
    format!("{base}-{n}")
}
