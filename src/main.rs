//! The `memcached-operator` binary.

use std::process::ExitCode;

use clap::Parser;
use memcached_operator::cli::{BundleArgs, Cli, Command, LogFormat, RunArgs};
use memcached_operator::{bundle, docs, install, manager, manifests};

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Some(Command::Crd) => print(manifests::crd_yaml()),
        Some(Command::Rbac) => print(manifests::rbac_yaml()),
        Some(Command::Manifests(args)) => print(install::install_yaml(&args.image)),
        Some(Command::Bundle(args)) => write_bundle(&args),
        Some(Command::ApiDocs) => print(Ok::<_, std::convert::Infallible>(docs::api_markdown())),
        Some(Command::Version) => {
            println!("memcached-operator {}", env!("CARGO_PKG_VERSION"));
            ExitCode::SUCCESS
        }
        Some(Command::Run(args)) => run(args),
        None => run(cli.run),
    }
}

fn print(yaml: Result<String, impl std::fmt::Display>) -> ExitCode {
    match yaml {
        Ok(yaml) => {
            print!("{yaml}");
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::FAILURE
        }
    }
}

/// Writes the bundle and lists what it wrote on stderr, so stdout stays clean for scripts.
fn write_bundle(args: &BundleArgs) -> ExitCode {
    match bundle::write(&args.options(), &args.output_dir) {
        Ok(paths) => {
            for path in paths {
                eprintln!("wrote {}", path.display());
            }
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: RunArgs) -> ExitCode {
    let args = args.normalized();
    if let Err(error) = init_logging(&args) {
        eprintln!("error: {error}");
        return ExitCode::from(2);
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(manager::run(args)) {
        Ok(code) => code,
        Err(error) => {
            tracing::error!("{error:#}");
            ExitCode::FAILURE
        }
    }
}

/// The tracing directives for `--log-level`. A plain level up to `info` also quiets kube's per-request
/// failure logs (an ERROR line for every refused connection, a WARN line for every watch cut short): during
/// an API-server outage they repeat several times a second, and the operator reports the outage itself,
/// once, and counts every failure in its metrics. Directives, or `debug` and `trace`, are taken as given.
fn log_directives(level: &str) -> String {
    let plain = ["error", "warn", "info"].contains(&level.trim().to_ascii_lowercase().as_str());
    if plain {
        format!("{level},kube_client::client=error,kube_client::client::builder=off")
    } else {
        level.to_owned()
    }
}

fn init_logging(args: &RunArgs) -> Result<(), String> {
    let filter = tracing_subscriber::EnvFilter::try_new(log_directives(&args.log_level))
        .map_err(|e| format!("invalid --log-level {:?}: {e}", args.log_level))?;
    let builder = tracing_subscriber::fmt()
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let result = match args.log_format {
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
        LogFormat::Text => builder.try_init(),
    };
    result.map_err(|e| format!("cannot set up logging: {e}"))
}
