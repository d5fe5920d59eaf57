//! Command line. Flag names follow the Kubebuilder scaffold where one exists; each flag also reads an
//! environment variable, so the in-cluster Deployment can be configured either way.

use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::resources::{DEFAULT_IMAGE, DEFAULT_OPERATOR_IMAGE};

pub use crate::controller::DEFAULT_CONCURRENCY;

/// Runs Memcached on Kubernetes through the Memcached custom resource (cache.example.com/v1alpha1).
#[derive(Debug, Parser)]
#[command(
    name = "memcached-operator",
    version,
    args_conflicts_with_subcommands = true,
    args_override_self = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,

    /// Flags of `run`, so the operator also starts when no subcommand is given.
    #[command(flatten)]
    pub run: RunArgs,
}

// Parsed once at start: the size of the `run` variant costs nothing worth a Box.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the operator against the current kube context or in-cluster config (the default).
    #[command(args_override_self = true)]
    Run(RunArgs),
    /// Write a proxy pod's route configuration from its ConfigMap and have memcached reload it (the
    /// proxy pods of `spec.proxy` run it; see `resources::proxy`).
    ProxyConfig(crate::proxy_config::ProxyConfigArgs),
    /// Check that an installed operator answers: its Deployment has an available replica, a ready pod of it
    /// holds and renews its leader Lease, and a sample Memcached it is given becomes Available (then it is
    /// deleted). The Helm chart's `helm test` pod runs it; exit status 1 says which step failed.
    Check(CheckArgs),
    /// Print the version.
    Version,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    /// Address of the Prometheus /metrics endpoint (":8443" means every interface; "0" disables it).
    #[arg(long, env = "METRICS_BIND_ADDRESS", default_value = ":8443")]
    pub metrics_bind_address: String,

    /// Serve /metrics over HTTPS to callers whose bearer token may `get` the non-resource URL `/metrics`
    /// (TokenReview and SubjectAccessReview). `false` serves plain HTTP to anyone, for development, and is
    /// refused unless the bind address is a loopback address.
    #[arg(long, env = "METRICS_SECURE", default_value_t = true, action = clap::ArgAction::Set)]
    pub metrics_secure: bool,

    /// Directory holding the /metrics server's certificate (`tls.crt`, PEM chain) and key (`tls.key`),
    /// e.g. a mounted cert-manager Secret; re-read when they change. Without it, a self-signed certificate
    /// is generated at start.
    #[arg(long, env = "METRICS_CERT_DIR")]
    pub metrics_cert_dir: Option<std::path::PathBuf>,

    /// Offer HTTP/2 (by ALPN) on the HTTPS /metrics endpoint. Off by default, as Kubebuilder's
    /// `--enable-http2`, since the HTTP/2 rapid-reset attacks (CVE-2023-44487): HTTP/1.1 serves Prometheus
    /// as well.
    #[arg(long, env = "METRICS_ENABLE_HTTP2")]
    pub metrics_enable_http2: bool,

    /// Address of the /healthz and /readyz endpoints.
    #[arg(long, env = "HEALTH_PROBE_BIND_ADDRESS", default_value = ":8081")]
    pub health_probe_bind_address: String,

    /// Elect a leader through a coordination.k8s.io Lease, so that only one replica reconciles.
    #[arg(long, env = "LEADER_ELECT")]
    pub leader_elect: bool,

    /// Namespace of the leader-election Lease [default: $POD_NAMESPACE].
    #[arg(long, env = "LEADER_ELECTION_NAMESPACE")]
    pub leader_election_namespace: Option<String>,

    /// Name of the leader-election Lease.
    #[arg(
        long,
        env = "LEADER_ELECTION_ID",
        default_value = "memcached-operator.cache.example.com"
    )]
    pub leader_election_id: String,

    /// Name of the Secret, in the operator's namespace (--leader-election-namespace, else $POD_NAMESPACE,
    /// else the kubeconfig's namespace), holding the key of the Secrets' hash in pod templates. The
    /// operator creates it when missing; deleting it rotates the key (every instance using Secrets rolls once).
    #[arg(
        long,
        env = "DIGEST_KEY_SECRET",
        default_value = crate::store::digest_key::DEFAULT_SECRET
    )]
    pub digest_key_secret: String,

    /// Watch and reconcile only this namespace [default: all namespaces]. Empty means all namespaces, as
    /// OLM's AllNamespaces install mode passes it.
    #[arg(long, env = "WATCH_NAMESPACE")]
    pub namespace: Option<String>,

    /// Most instances reconciled at the same time; the others wait in the order they became due.
    // A reconcile spends nearly all its time waiting for the API server, so the default is set by how many
    // round trips may be in flight, not by cores: on `make bench` (300 instances, 5 ms per request) 64
    // has every instance's children within about 0.25 s (7.8 s with 4). Each reconcile in flight holds a
    // connection and the objects it builds and compares, so fewer save memory, but at a cost: 32 peaks
    // 1.8 MiB lower at 300 instances (the image's build) for 20-35 % more CPU, and took 4.9 s instead of
    // 3 s for the children of 3000; 16 took 60 % more CPU. It stays well below the API server's default
    // in-flight limits (400 reads, 200 writes).
    #[arg(long, env = "CONCURRENCY", default_value_t = DEFAULT_CONCURRENCY, value_parser = clap::value_parser!(u16).range(1..))]
    pub concurrency: u16,

    /// Safety requeue of every instance after a successful reconcile (e.g. 300s, 5m, 1h).
    #[arg(long, env = "REQUEUE_INTERVAL", default_value = "5m", value_parser = parse_duration)]
    pub requeue_interval: Duration,

    /// How often the operator reads every ready memcached server's `stats` for the operand metrics,
    /// status.stats and eviction events (e.g. 30s, 1m); 0 turns that off.
    #[arg(long, env = "STATS_INTERVAL", default_value = "30s", value_parser = parse_duration_or_zero)]
    pub stats_interval: Duration,

    /// Shortest time between two writes of one instance's status.stats; they are written only when a
    /// value changed.
    #[arg(long, env = "STATS_STATUS_INTERVAL", default_value = "5m", value_parser = parse_duration)]
    pub stats_status_interval: Duration,

    /// The cluster's DNS domain: memcached server certificates may name the instance's Services under
    /// `<service>.<namespace>.svc.<domain>`, which the operator checks when it reads stats over TLS.
    #[arg(long, env = "CLUSTER_DOMAIN", default_value = crate::telemetry::client::DEFAULT_CLUSTER_DOMAIN)]
    pub cluster_domain: String,

    /// The longest a warm-handover copy may take, in seconds, whatever its instance's
    /// `spec.handover.timeoutSeconds` says (up to 3600): a tenant's copies give the operator's copy slots
    /// back within it.
    #[arg(long, env = "HANDOVER_MAX_TIMEOUT_SECONDS", default_value_t = crate::handover::DEFAULT_MAX_TIMEOUT_SECONDS, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub handover_max_timeout_seconds: u64,

    /// How many instances the operator's own changes of the pod template (a new version, a changed
    /// default such as --memcached-image, the digest key) roll at a time, in namespace/name order: a
    /// number (3) or a percentage of the instances (5%), at least one. An instance owner's change rolls
    /// at once and takes a slot first.
    #[arg(long, env = "FLEET_ROLLOUT_BUDGET", default_value_t = crate::resources::fleet::DEFAULT_BUDGET)]
    pub fleet_rollout_budget: crate::resources::fleet::Budget,

    /// Image for instances whose spec sets none.
    #[arg(long, env = "MEMCACHED_IMAGE", default_value = DEFAULT_IMAGE)]
    pub memcached_image: String,

    /// The operator's own image: the proxy pods (`spec.proxy`) run it as their configuration writer.
    #[arg(long, env = "OPERATOR_IMAGE", default_value = DEFAULT_OPERATOR_IMAGE)]
    pub operator_image: String,

    /// Log filter: a level (error, warn, info, debug, trace) or tracing directives such as "info,kube=debug".
    #[arg(long, env = "LOG_LEVEL", default_value = "info")]
    pub log_level: String,

    /// Log format.
    #[arg(long, env = "LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

/// Flags of `check` (see [`crate::check`]).
#[derive(Debug, Clone, Args)]
pub struct CheckArgs {
    /// Namespace of the operator's Deployment and Lease [default: $POD_NAMESPACE, else the kubeconfig's
    /// or the pod's namespace].
    #[arg(long, env = "POD_NAMESPACE")]
    pub namespace: Option<String>,

    /// The operator's Deployment.
    #[arg(long)]
    pub deployment: String,

    /// The leader-election Lease (--leader-election-id of `run`); leave it out for an operator that runs
    /// without --leader-elect.
    #[arg(long)]
    pub lease: Option<String>,

    /// Name of the sample Memcached to create, wait for and delete.
    #[arg(long)]
    pub instance: String,

    /// Namespace of the sample Memcached, one the operator watches [default: --namespace].
    #[arg(long)]
    pub instance_namespace: Option<String>,

    /// How long the whole check may take (e.g. 90s, 2m).
    #[arg(long, default_value = "2m", value_parser = parse_duration)]
    pub timeout: Duration,
}

impl CheckArgs {
    /// What to check; empty namespaces read as unset.
    pub fn check(self) -> crate::check::Check {
        let unset_if_blank = |value: Option<String>| value.filter(|v| !v.trim().is_empty());
        crate::check::Check {
            namespace: unset_if_blank(self.namespace),
            deployment: self.deployment,
            lease: unset_if_blank(self.lease),
            instance_namespace: unset_if_blank(self.instance_namespace),
            instance: self.instance,
            timeout: self.timeout,
        }
    }
}

impl RunArgs {
    /// The arguments with empty namespaces read as unset. An environment variable that is set but empty
    /// reaches clap as `Some("")`: OLM sets WATCH_NAMESPACE to "" for the AllNamespaces install mode (from
    /// the `olm.targetNamespaces` annotation), and that must mean every namespace, not a namespace named "".
    pub fn normalized(mut self) -> Self {
        let unset_if_blank = |value: Option<String>| value.filter(|v| !v.trim().is_empty());
        self.namespace = unset_if_blank(self.namespace);
        self.leader_election_namespace = unset_if_blank(self.leader_election_namespace);
        self
    }
}

/// Parses "90", "90s", "5m" or "1h".
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (number, unit) = match s.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => s.split_at(i),
        None => (s, "s"),
    };
    let n: u64 = number
        .parse()
        .map_err(|_| format!("{s:?} is not a duration such as 300s, 5m or 1h"))?;
    let secs = match unit {
        "s" => n,
        "m" => n.saturating_mul(60),
        "h" => n.saturating_mul(3600),
        _ => return Err(format!("{s:?} has an unknown unit; use s, m or h")),
    };
    if secs == 0 {
        return Err("the duration must be positive".into());
    }
    Ok(Duration::from_secs(secs))
}

/// Like [`parse_duration`], but "0" (with or without a unit) is allowed and means off.
pub fn parse_duration_or_zero(s: &str) -> Result<Duration, String> {
    match s.trim().trim_end_matches(['s', 'm', 'h']) {
        "0" => Ok(Duration::ZERO),
        _ => parse_duration(s),
    }
}

/// A bind address with the Go-style empty host (":8080") read as every interface.
pub fn bind_address(s: &str) -> Result<Option<std::net::SocketAddr>, String> {
    if s == "0" {
        return Ok(None);
    }
    let full = if s.starts_with(':') {
        format!("0.0.0.0{s}")
    } else {
        s.to_owned()
    };
    full.parse()
        .map(Some)
        .map_err(|e| format!("{s:?} is not an address such as :8080 or 127.0.0.1:8080: {e}"))
}

/// How `/metrics` is served, from `--metrics-bind-address` and `--metrics-secure`: `None` when disabled.
/// Plain HTTP without authentication exposes every tenant's instance and pod names, so it is refused on any
/// address but a loopback one (a port-forward or a sidecar can still reach it there).
pub fn metrics_endpoint(
    address: &str,
    secure: bool,
) -> Result<Option<(std::net::SocketAddr, bool)>, String> {
    let Some(addr) = bind_address(address)? else {
        return Ok(None);
    };
    if !secure && !addr.ip().is_loopback() {
        return Err(format!(
            "--metrics-secure=false serves /metrics without TLS or authentication, so only on a loopback \
             address such as 127.0.0.1:8080 or [::1]:8080, not {address:?}; keep it secure (the default) \
             or disable it with --metrics-bind-address=0"
        ));
    }
    Ok(Some((addr, secure)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn flags_work_with_and_without_the_run_subcommand() {
        let cli = Cli::try_parse_from(["memcached-operator", "--leader-elect", "--namespace", "a"])
            .unwrap();
        assert!(cli.command.is_none());
        assert!(cli.run.leader_elect);
        assert_eq!(cli.run.namespace.as_deref(), Some("a"));
        assert_eq!(cli.run.concurrency, DEFAULT_CONCURRENCY);

        let cli = Cli::try_parse_from([
            "memcached-operator",
            "run",
            "--concurrency",
            "8",
            "--log-format",
            "json",
        ])
        .unwrap();
        let Some(Command::Run(run)) = cli.command else {
            panic!("expected run")
        };
        assert_eq!(run.concurrency, 8);
        assert_eq!(run.log_format, LogFormat::Json);
        assert_eq!(run.metrics_bind_address, ":8443");
        assert!(run.metrics_secure, "secure by default");
        assert_eq!(run.health_probe_bind_address, ":8081");
        assert!(!run.leader_elect);
        assert_eq!(run.stats_interval, Duration::from_secs(30));
        assert_eq!(run.stats_status_interval, Duration::from_secs(300));

        assert!(Cli::try_parse_from(["memcached-operator", "run", "--concurrency", "0"]).is_err());
    }

    /// The chart and the kustomize install pass some flags themselves; one given again (the chart's
    /// `extraArgs`, a patched Deployment) takes the last value, as Kubebuilder operators' flags do,
    /// instead of stopping the operator at start.
    #[test]
    fn a_flag_given_twice_takes_its_last_value() {
        for args in [
            &["memcached-operator", "run"][..],
            &["memcached-operator"][..],
        ] {
            let args = args.iter().chain(&[
                "--leader-elect",
                "--log-format=json",
                "--health-probe-bind-address=:8081",
                "--leader-elect",
                "--log-format=text",
                "--health-probe-bind-address=:9091",
            ]);
            let cli = Cli::try_parse_from(args).unwrap();
            let run = match cli.command {
                Some(Command::Run(run)) => run,
                _ => cli.run,
            };
            assert!(run.leader_elect);
            assert_eq!(run.log_format, LogFormat::Text);
            assert_eq!(run.health_probe_bind_address, ":9091");
        }
    }

    #[test]
    fn the_handover_maximum_defaults_to_ten_minutes_within_the_specs_range() {
        let cli = Cli::try_parse_from(["memcached-operator", "run"]).unwrap();
        let Some(Command::Run(run)) = cli.command else {
            panic!("expected run")
        };
        assert_eq!(run.handover_max_timeout_seconds, 600);
        let flag = |value: &str| {
            Cli::try_parse_from([
                "memcached-operator",
                "--handover-max-timeout-seconds",
                value,
            ])
            .map(|cli| cli.run.handover_max_timeout_seconds)
        };
        assert_eq!(flag("60").unwrap(), 60);
        assert_eq!(flag("3600").unwrap(), 3600);
        assert!(flag("0").is_err());
        assert!(flag("3601").is_err());
    }

    #[test]
    fn empty_namespaces_mean_all_namespaces() {
        let cli = Cli::try_parse_from(["memcached-operator", "run", "--namespace", ""]).unwrap();
        let Some(Command::Run(run)) = cli.command else {
            panic!("expected run")
        };
        assert_eq!(
            run.namespace.as_deref(),
            Some(""),
            "clap keeps the empty value"
        );
        assert_eq!(run.normalized().namespace, None);

        let cli = Cli::try_parse_from(["memcached-operator", "--namespace", "cache"]).unwrap();
        assert_eq!(cli.run.normalized().namespace.as_deref(), Some("cache"));
    }

    /// Marker telling [`watch_namespace_env_probe`] that it runs in the child process of
    /// [`empty_watch_namespace_env_means_all_namespaces`].
    const PROBE: &str = "MEMCACHED_OPERATOR_CLI_ENV_PROBE";

    /// Runs this test binary again with WATCH_NAMESPACE set but empty (as OLM's AllNamespaces mode sets it),
    /// so the real environment path of clap is exercised without changing this process's environment.
    #[test]
    fn empty_watch_namespace_env_means_all_namespaces() {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "cli::tests::watch_namespace_env_probe",
                "--nocapture",
            ])
            .env("WATCH_NAMESPACE", "")
            .env(PROBE, "1")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains("1 passed"),
            "probe failed:\n{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    #[test]
    fn watch_namespace_env_probe() {
        if std::env::var_os(PROBE).is_none() {
            return;
        }
        assert_eq!(std::env::var("WATCH_NAMESPACE").as_deref(), Ok(""));
        let cli = Cli::try_parse_from(["memcached-operator", "run"]).unwrap();
        let Some(Command::Run(run)) = cli.command else {
            panic!("expected run")
        };
        assert_eq!(run.normalized().namespace, None);
    }

    /// The binary runs the operator (and, in the proxy pods, the proxy's configuration writer; in `helm test`, the check); the CRD,
    /// the roles and every release file are `cargo xtask`'s.
    #[test]
    fn only_operator_commands() {
        let names: Vec<String> = Cli::command()
            .get_subcommands()
            .map(|c| c.get_name().to_owned())
            .collect();
        assert_eq!(names, ["run", "proxy-config", "check", "version"]);
        for moved in ["manifests", "bundle", "api-docs", "crd", "rbac"] {
            assert!(
                Cli::try_parse_from(["memcached-operator", moved]).is_err(),
                "{moved}"
            );
        }
    }

    #[test]
    fn check_takes_the_release_objects_and_a_timeout() {
        let cli = Cli::try_parse_from([
            "memcached-operator",
            "check",
            "--namespace=ops",
            "--deployment=op-controller-manager",
            "--lease=op.cache.example.com",
            "--instance=op-helm-test",
            "--instance-namespace=apps",
            "--timeout=90s",
        ])
        .unwrap();
        let Some(Command::Check(args)) = cli.command else {
            panic!("expected check")
        };
        let check = args.check();
        assert_eq!(check.namespace.as_deref(), Some("ops"));
        assert_eq!(check.deployment, "op-controller-manager");
        assert_eq!(check.lease.as_deref(), Some("op.cache.example.com"));
        assert_eq!(check.instance_namespace.as_deref(), Some("apps"));
        assert_eq!(check.timeout, Duration::from_secs(90));

        let cli = Cli::try_parse_from([
            "memcached-operator",
            "check",
            "--deployment=d",
            "--instance=i",
            "--lease=",
        ])
        .unwrap();
        let Some(Command::Check(args)) = cli.command else {
            panic!("expected check")
        };
        let check = args.check();
        assert_eq!(check.lease, None, "an empty Lease means no leader election");
        assert_eq!(check.timeout, Duration::from_secs(120));
        assert!(
            Cli::try_parse_from(["memcached-operator", "check", "--instance=i"]).is_err(),
            "the Deployment is required"
        );
    }

    #[test]
    fn durations_and_addresses() {
        assert_eq!(parse_duration("90"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert!(
            parse_duration("0s").is_err()
                && parse_duration("5d").is_err()
                && parse_duration("x").is_err()
        );

        assert_eq!(
            bind_address(":8080").unwrap(),
            Some("0.0.0.0:8080".parse().unwrap())
        );
        assert_eq!(
            bind_address("127.0.0.1:9").unwrap(),
            Some("127.0.0.1:9".parse().unwrap())
        );
        assert_eq!(bind_address("0").unwrap(), None);

        assert_eq!(parse_duration_or_zero("0"), Ok(Duration::ZERO));
        assert_eq!(parse_duration_or_zero("0s"), Ok(Duration::ZERO));
        assert_eq!(parse_duration_or_zero("30s"), Ok(Duration::from_secs(30)));
        assert!(parse_duration_or_zero("x").is_err() && parse_duration_or_zero("").is_err());
        assert!(bind_address("localhost").is_err());
    }

    #[test]
    fn plain_metrics_only_on_loopback() {
        assert_eq!(
            metrics_endpoint(":8443", true),
            Ok(Some(("0.0.0.0:8443".parse().unwrap(), true)))
        );
        assert_eq!(
            metrics_endpoint("127.0.0.1:8080", false),
            Ok(Some(("127.0.0.1:8080".parse().unwrap(), false)))
        );
        assert!(metrics_endpoint("[::1]:8080", false).is_ok());
        let refused = metrics_endpoint(":8080", false).unwrap_err();
        assert!(refused.contains("loopback"), "{refused}");
        assert!(metrics_endpoint("10.0.0.1:8080", false).is_err());
        assert_eq!(
            metrics_endpoint("0", false),
            Ok(None),
            "0 still disables it"
        );
    }
}
