//! `memcached-operator proxy-config`: the proxy pods' configuration writer (see `resources::proxy`).
//!
//! It watches one ConfigMap, the instance's route configuration `<name>-proxy` (its Role allows nothing
//! else), and writes its configuration into the directory the pod shares with memcached, atomically (a
//! temporary file renamed over the old one). As the init container (`--once`) it waits for the ConfigMap,
//! writes it and exits, so memcached starts with a configuration. As the sidecar it writes each new one
//! and sends memcached `SIGHUP` (its pid from the pid file memcached writes there; the pod shares one
//! process namespace), then reads memcached's `stats` until `proxy_config_reloads` or
//! `proxy_config_reload_fails` counts the reload, and logs the outcome and how long it took. memcached
//! applies a reload at its next clock tick (within a second); a configuration it refuses leaves the last
//! one serving.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::Args;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tracing::{info, warn};

use crate::resources::proxy::routes::CONFIG_KEY;

/// How long the sidecar waits for memcached to count a reload (it applies one within a second).
const RELOAD_WAIT: Duration = Duration::from_secs(3);
/// How often it reads `stats` meanwhile.
const POLL: Duration = Duration::from_millis(20);

/// Flags of `proxy-config`.
#[derive(Debug, Clone, Args)]
pub struct ProxyConfigArgs {
    /// The ConfigMap holding the route configuration (key `proxy.lua`).
    #[arg(long)]
    pub config_map: String,
    /// Its namespace: the pod's own.
    #[arg(long, env = "POD_NAMESPACE")]
    pub namespace: String,
    /// The directory shared with memcached, where `proxy.lua` is written.
    #[arg(long)]
    pub dir: PathBuf,
    /// Write the configuration once it exists, then exit (the init container).
    #[arg(long)]
    pub once: bool,
    /// memcached's pid file: after each write, memcached gets SIGHUP (the sidecar).
    #[arg(long, conflicts_with = "once")]
    pub pid_file: Option<PathBuf>,
    /// Where memcached's `stats` are read to confirm a reload: `host:port`.
    #[arg(long, env = "PROXY_STATS_ADDRESS", default_value = "127.0.0.1:11211")]
    pub stats_address: String,
}

/// Runs the writer until the watch ends (never, in the sidecar) or, with `--once`, until written.
pub async fn run(args: ProxyConfigArgs) -> anyhow::Result<()> {
    let client = Client::try_default()
        .await
        .context("no Kubernetes client configuration")?;
    let api: Api<ConfigMap> = Api::namespaced(client, &args.namespace);
    let selector = format!("metadata.name={}", args.config_map);
    let mut configs = watcher(api, watcher::Config::default().fields(&selector))
        .default_backoff()
        .applied_objects()
        .boxed();
    let path = args.dir.join(CONFIG_KEY);
    // The sidecar starts after the init container wrote the configuration memcached started with.
    let mut written = match args.once {
        true => None,
        false => std::fs::read_to_string(&path).ok(),
    };
    loop {
        let config_map = match configs.try_next().await {
            Ok(Some(config_map)) => config_map,
            Ok(None) => anyhow::bail!("the watch of ConfigMap {} ended", args.config_map),
            Err(error) => {
                warn!(%error, config_map = %args.config_map, "watch failed; retrying");
                continue;
            }
        };
        let Some(text) = config_map.data.and_then(|mut d| d.remove(CONFIG_KEY)) else {
            warn!(config_map = %args.config_map, "no {CONFIG_KEY} key; waiting for one");
            continue;
        };
        if written.as_deref() == Some(text.as_str()) {
            continue;
        }
        write_atomically(&path, &text)?;
        written = Some(text);
        info!(path = %path.display(), "wrote the route configuration");
        if args.once {
            return Ok(());
        }
        if let Some(pid_file) = &args.pid_file {
            reload(pid_file, &args.stats_address).await;
        }
    }
}

/// Writes `text` to a temporary file beside `path` and renames it over `path`: memcached never reads a
/// half-written configuration.
pub fn write_atomically(path: &Path, text: &str) -> std::io::Result<()> {
    let temporary = path.with_extension("tmp");
    let mut file = std::fs::File::create(&temporary)?;
    file.write_all(text.as_bytes())?;
    file.sync_all()?;
    std::fs::rename(&temporary, path)
}

/// Signals memcached and waits for its stats to count the reload, logging the outcome.
async fn reload(pid_file: &Path, stats_address: &str) {
    let before = reload_counts(stats_address).await.ok();
    let started = Instant::now();
    if let Err(error) = signal(pid_file) {
        warn!(%error, pid_file = %pid_file.display(), "cannot signal memcached");
        return;
    }
    let Some(before) = before else {
        info!("signalled memcached to reload; its stats could not be read to confirm");
        return;
    };
    while started.elapsed() < RELOAD_WAIT {
        tokio::time::sleep(POLL).await;
        let Ok(now) = reload_counts(stats_address).await else {
            continue;
        };
        let milliseconds = started.elapsed().as_millis();
        if now.fails > before.fails {
            warn!(
                milliseconds,
                "memcached refused the new configuration; the last one serves"
            );
            return;
        }
        if now.reloads > before.reloads {
            info!(milliseconds, "memcached reloaded the route configuration");
            return;
        }
    }
    warn!("memcached did not count a reload within {RELOAD_WAIT:?}");
}

/// `SIGHUP` to the pid in `pid_file`.
fn signal(pid_file: &Path) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(pid_file)?;
    let pid: libc::pid_t = text.trim().parse().context("not a pid")?;
    anyhow::ensure!(pid > 1, "pid {pid} is not memcached's");
    // SAFETY: kill(2) with a plain pid and signal number touches no memory of this process.
    let result = unsafe { libc::kill(pid, libc::SIGHUP) };
    if result != 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    Ok(())
}

/// memcached's reload counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReloadCounts {
    pub reloads: u64,
    pub fails: u64,
}

/// Reads `proxy_config_reloads` and `proxy_config_reload_fails` from `stats` at `address`.
async fn reload_counts(address: &str) -> anyhow::Result<ReloadCounts> {
    let mut stream = TcpStream::connect(address).await?;
    stream.write_all(b"stats\r\n").await?;
    let mut lines = BufReader::new(stream).lines();
    let mut counts = ReloadCounts::default();
    let read = async {
        while let Some(line) = lines.next_line().await? {
            if line == "END" {
                return Ok(counts);
            }
            parse_stat(&line, &mut counts);
        }
        anyhow::bail!("stats ended early")
    };
    tokio::time::timeout(Duration::from_secs(1), read).await?
}

/// Takes the reload counters from one `STAT name value` line.
pub fn parse_stat(line: &str, counts: &mut ReloadCounts) {
    let mut words = line.split_ascii_whitespace();
    let (Some("STAT"), Some(name), Some(value)) = (words.next(), words.next(), words.next()) else {
        return;
    };
    let Ok(value) = value.parse() else {
        return;
    };
    match name {
        "proxy_config_reloads" => counts.reloads = value,
        "proxy_config_reload_fails" => counts.fails = value,
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reload_counters_are_read_from_stats_lines() {
        let mut counts = ReloadCounts::default();
        for line in [
            "STAT pid 42",
            "STAT proxy_config_reloads 3",
            "STAT proxy_config_reload_fails 1",
            "STAT proxy_config_reloads not-a-number",
            "END",
        ] {
            parse_stat(line, &mut counts);
        }
        assert_eq!(
            counts,
            ReloadCounts {
                reloads: 3,
                fails: 1
            }
        );
    }

    #[test]
    fn a_write_replaces_the_file_whole() {
        let dir = std::env::temp_dir().join(format!("proxy-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(CONFIG_KEY);
        write_atomically(&path, "first").unwrap();
        write_atomically(&path, "second").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "second");
        assert!(!path.with_extension("tmp").exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
