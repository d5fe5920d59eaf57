//! `cargo xtask`: the release tooling's command line. Each command prints to stdout or writes files under
//! the repository root; progress and errors go to stderr.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use memcached_operator::manifests;
use xtask::bundle::{self, Options};
use xtask::generate;
use xtask::install::{self, default_operator_image, parse_image};
use xtask::{api_docs, pictures, repo_root};

/// Generates memcached-operator's release files: manifests, one-file install, OLM bundle, API docs.
#[derive(Debug, Parser)]
#[command(name = "cargo xtask", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Write every generated file: the CRD and RBAC under config/, dist/install.yaml, docs/api.md,
    /// docs/memcached-options.md, the README's spec table, the OLM bundle (bundle/, bundle.Dockerfile), with the default version
    /// and image, and the Helm chart's copies (charts/memcached-operator/crds, files/) (`make manifests`).
    Manifests,
    /// List the committed generated files that differ from what `manifests` writes; fail if any does.
    Check,
    /// Print the CustomResourceDefinition YAML.
    Crd,
    /// Print the operator's RBAC roles as YAML.
    Rbac,
    /// Print the complete install as one YAML file (namespace, CRD, RBAC, operator Deployment, metrics
    /// Service): `kubectl kustomize config/default` with the operator image set.
    Install(InstallArgs),
    /// Write the Operator Lifecycle Manager bundle (manifests/, metadata/) and bundle.Dockerfile.
    Bundle(BundleArgs),
    /// Print the API reference of the Memcached resource (docs/api.md) as markdown.
    ApiDocs,
    /// Draw the dashboard's main panels (docs/images/*.svg) from the recordings of `bench --record DIR`
    /// and `bench --operand --record DIR`, evaluating the panels' own queries (`make dashboard-pictures`).
    DashboardPictures(PicturesArgs),
}

#[derive(Debug, Clone, Args)]
struct PicturesArgs {
    /// The directory the bench recorded into (convergence.jsonl, operand.jsonl and their marks).
    #[arg(long)]
    samples: PathBuf,
    /// Where the SVG files go.
    #[arg(long, default_value = "docs/images")]
    out: PathBuf,
    /// What $__rate_interval and $__interval stand for.
    #[arg(long, default_value = pictures::RATE_INTERVAL)]
    rate_interval: String,
}

#[derive(Debug, Clone, Args)]
struct InstallArgs {
    /// Operator image the Deployment runs.
    #[arg(long, default_value_t = default_operator_image(), value_parser = parse_image)]
    image: String,
}

#[derive(Debug, Clone, Args)]
struct BundleArgs {
    /// Bundle and ClusterServiceVersion version (semver, no leading v).
    #[arg(
        id = "bundle_version",
        long = "version",
        value_name = "VERSION",
        default_value = memcached_operator::VERSION,
        value_parser = bundle::parse_version
    )]
    version: String,

    /// Operator image the ClusterServiceVersion deploys.
    #[arg(long, default_value_t = default_operator_image(), value_parser = parse_image)]
    image: String,

    /// Bundle directory; bundle.Dockerfile is written next to it.
    #[arg(long, default_value = bundle::BUNDLE_DIR)]
    output_dir: PathBuf,

    /// Channels the bundle belongs to (comma-separated).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = bundle::DEFAULT_CHANNEL,
        value_parser = bundle::parse_channel
    )]
    channels: Vec<String>,

    /// Channel subscriptions follow when they name none; one of --channels.
    #[arg(long, default_value = bundle::DEFAULT_CHANNEL, value_parser = bundle::parse_channel)]
    default_channel: String,
}

impl BundleArgs {
    /// The bundle options these arguments ask for.
    fn options(&self) -> Options {
        Options {
            version: self.version.clone(),
            image: self.image.clone(),
            channels: self.channels.clone(),
            default_channel: self.default_channel.clone(),
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Manifests => generate::write_all().map(report_written).map_err(error),
        Command::Check => check(),
        Command::Crd => manifests::crd_yaml().map(print).map_err(error),
        Command::Rbac => manifests::rbac_yaml().map(print).map_err(error),
        Command::Install(args) => install::install_yaml(&args.image).map(print).map_err(error),
        Command::Bundle(args) => bundle::write(&args.options(), &args.output_dir)
            .map(report_written)
            .map_err(error),
        Command::ApiDocs => {
            print(api_docs::api_markdown());
            Ok(())
        }
        Command::DashboardPictures(args) => pictures::draw_all(
            &repo_root().join(xtask::chart::DASHBOARD_PATH),
            &args.samples,
            &repo_root().join(&args.out),
            &args.rate_interval,
        )
        .map(report_drawn)
        .map_err(error),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::FAILURE
        }
    }
}

fn print(text: String) {
    print!("{text}");
}

fn error(error: impl std::fmt::Display) -> String {
    error.to_string()
}

/// Lists what was written on stderr, so stdout stays clean for scripts.
fn report_written(paths: Vec<PathBuf>) {
    for path in paths {
        eprintln!("wrote {}", path.display());
    }
}

/// The pictures written, and under each ratio its lines' lowest values between the run's moments.
fn report_drawn(drawn: Vec<pictures::Drawn>) {
    for picture in drawn {
        eprintln!("wrote {}", picture.path.display());
        for lowest in picture.lowest {
            eprintln!(
                "  lowest {:<28} from {:<24} {:.1} %",
                lowest.legend,
                lowest.from,
                lowest.value * 100.0
            );
        }
    }
}

/// Fails, naming each stale file, when a committed generated file differs from what the code generates.
fn check() -> Result<(), String> {
    let stale = generate::stale(&repo_root()).map_err(error)?;
    if stale.is_empty() {
        eprintln!("every generated file is current");
        return Ok(());
    }
    for path in &stale {
        eprintln!("stale: {path}");
    }
    Err(format!(
        "{} generated file(s) differ from what the code generates: run `make manifests` (cargo xtask \
         manifests) and commit the result",
        stale.len()
    ))
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
    fn commands_parse_and_check_their_input() {
        let cli = Cli::try_parse_from(["xtask", "install"]).unwrap();
        let Command::Install(args) = cli.command else {
            panic!("expected install")
        };
        assert_eq!(args.image, default_operator_image());

        let cli = Cli::try_parse_from([
            "xtask",
            "bundle",
            "--version",
            "1.2.3",
            "--image",
            "reg/op:v1.2.3",
            "--channels",
            "alpha,stable",
            "--default-channel",
            "stable",
        ])
        .unwrap();
        let Command::Bundle(args) = cli.command else {
            panic!("expected bundle")
        };
        let options = args.options();
        assert_eq!(options.version, "1.2.3");
        assert_eq!(options.channels, ["alpha", "stable"]);
        assert_eq!(args.output_dir, PathBuf::from("bundle"));

        let cli = Cli::try_parse_from(["xtask", "bundle"]).unwrap();
        let Command::Bundle(args) = cli.command else {
            panic!("expected bundle")
        };
        assert_eq!(args.options(), Options::default());

        for bad in [
            vec!["bundle", "--version", "v1.0.0"],
            vec!["bundle", "--channels", "Alpha"],
            vec!["install", "--image", ""],
            vec!["install", "--image", "a b"],
        ] {
            let args = std::iter::once("xtask").chain(bad.iter().copied());
            assert!(Cli::try_parse_from(args).is_err(), "{bad:?}");
        }
        for command in ["manifests", "check", "crd", "rbac", "api-docs"] {
            assert!(Cli::try_parse_from(["xtask", command]).is_ok(), "{command}");
        }
    }
}
