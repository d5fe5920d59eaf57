//! `envtest up`: a control plane and the stand-in kubelet for trying the operator by hand, until Ctrl+C
//! or SIGTERM; `make e2e` (`hack/e2e.sh`) runs the end-to-end suite against it when `KUBECONFIG` is unset.
//! It prints `export KUBECONFIG=<admin kubeconfig>` on stdout once everything is up; logs go to stderr.
//!
//! ```text
//! KUBEBUILDER_ASSETS=/opt/kubebuilder-assets/bin cargo run -p envtest -- up --memcached
//! ```

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Result, anyhow};
use clap::{Parser, Subcommand};
use envtest::kubelet::DEBIAN_MEMCACHED;
use envtest::{Assets, ControlPlane, ControlPlaneOptions, Env, EnvOptions, KubeletOptions};
use tokio::signal::unix::{SignalKind, signal};

#[derive(Parser)]
#[command(
    about = "A local Kubernetes control plane from $KUBEBUILDER_ASSETS, with a stand-in kubelet"
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Start etcd, kube-apiserver, kube-controller-manager, kube-scheduler (if present) and the stand-in
    /// kubelet; print the kubeconfig; run until SIGINT or SIGTERM, then stop everything.
    Up(Up),
}

#[derive(Parser)]
struct Up {
    /// Directory for data, logs and kubeconfigs (kept afterwards); default: a temp dir, removed on exit.
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Keep the temp dir on exit.
    #[arg(long)]
    keep: bool,
    /// Nodes the stand-in kubelet registers.
    #[arg(long, default_value_t = 3)]
    nodes: usize,
    /// Time from a pod's binding to its being Running, in milliseconds.
    #[arg(long, default_value_t = 100)]
    pod_start_ms: u64,
    /// Time from a pod's deletion to its removal, in milliseconds.
    #[arg(long, default_value_t = 0)]
    pod_termination_ms: u64,
    /// Run a real memcached for each pod, on its loopback pod IP.
    #[arg(long)]
    memcached: bool,
    /// The memcached binary for --memcached.
    #[arg(long, default_value = DEBIAN_MEMCACHED)]
    memcached_bin: PathBuf,
    /// Do not run kube-scheduler even if present (the kubelet binds pods round-robin).
    #[arg(long)]
    no_scheduler: bool,
    /// For a real node (`hack/real-node.sh`): start no stand-in kubelet, and make the API server
    /// reachable from the node's pods at this address (the node's bridge address), with the endpoint
    /// controllers running.
    #[arg(long)]
    real_node_address: Option<std::net::Ipv4Addr>,
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                // kube's client logs every refused connection while the API server starts as an error.
                .unwrap_or_else(|_| {
                    tracing_subscriber::EnvFilter::new("info,kube_client::client::builder=off")
                }),
        )
        .with_writer(std::io::stderr)
        .init();
    let Cmd::Up(up) = Cli::parse().command;
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("envtest: cannot start a runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(up)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("envtest: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(up: Up) -> Result<()> {
    let assets = envtest::assets().ok_or_else(|| {
        anyhow!(
            "{}",
            envtest::assets::why_missing().unwrap_or_else(|| "no assets".to_owned())
        )
    })?;
    let control_plane = ControlPlaneOptions {
        dir: up.dir,
        keep: up.keep || ControlPlaneOptions::default().keep,
        scheduler: !up.no_scheduler,
        node_address: up.real_node_address,
        ..ControlPlaneOptions::default()
    };
    if up.real_node_address.is_some() {
        return run_control_plane_alone(&assets, control_plane).await;
    }
    let options = EnvOptions {
        control_plane,
        kubelet: KubeletOptions {
            nodes: up.nodes,
            pod_start_delay: Duration::from_millis(up.pod_start_ms),
            pod_termination_delay: Duration::from_millis(up.pod_termination_ms),
            memcached: up.memcached.then_some(up.memcached_bin),
            ..KubeletOptions::default()
        },
    };
    let env = Env::start(&assets, options).await?;
    let plane = env.control_plane();
    for (what, at) in plane.timings() {
        eprintln!("envtest: {what} after {:.2}s", at.as_secs_f64());
    }
    eprintln!(
        "envtest: up in {:.2}s; nodes {}; kube-scheduler {}; directory {}",
        env.started_in().as_secs_f64(),
        env.kubelet()
            .map(|k| k.nodes().join(","))
            .unwrap_or_default(),
        if plane.has_scheduler() {
            "running"
        } else {
            "absent (the kubelet binds pods)"
        },
        plane.dir().display()
    );
    println!("export KUBECONFIG={}", plane.kubeconfig().display());
    println!("# audit log: {}", plane.audit().path().display());

    wait_for_signal().await?;
    eprintln!("envtest: stopping");
    env.stop().await;
    Ok(())
}

/// The control plane without the stand-in kubelet, for a real node started beside it.
async fn run_control_plane_alone(assets: &Assets, options: ControlPlaneOptions) -> Result<()> {
    let plane = ControlPlane::start(assets, &options).await?;
    for (what, at) in plane.timings() {
        eprintln!("envtest: {what} after {:.2}s", at.as_secs_f64());
    }
    eprintln!(
        "envtest: up (no stand-in kubelet: for a real node); directory {}",
        plane.dir().display()
    );
    println!("export KUBECONFIG={}", plane.kubeconfig().display());
    println!(
        "# node kubeconfig: {}",
        plane.kubelet_kubeconfig().display()
    );
    println!("# audit log: {}", plane.audit().path().display());
    wait_for_signal().await?;
    eprintln!("envtest: stopping");
    plane.stop();
    Ok(())
}

async fn wait_for_signal() -> Result<()> {
    let mut terminate = signal(SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = terminate.recv() => {}
    }
    Ok(())
}
