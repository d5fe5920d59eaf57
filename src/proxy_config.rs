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
//!
//! The ConfigMap carries data, not code: the route's server list and settings
//! (`resources::proxy::routes::Route`, key `route.json`), which the writer checks strictly (each server
//! an IP address or a DNS name and a port; a bounded count and size) and renders into the Lua memcached
//! loads. Whatever else the ConfigMap holds is never read. Data that fails the checks is refused with a
//! warning naming the problem, and the last good configuration stays. Its confirming `stats` read is
//! bounded too (64 KiB, one second): the writer shares its pod with the tenant's proxy image.
//!
//! During an upgrade from an operator whose ConfigMap carried the Lua itself (`proxy.lua`): the proxy
//! pods' template names the operator's image, so the upgrade rolls them, and each new pod's writer
//! renders from the data. Until its pod is replaced, an older writer finds no `proxy.lua` any more,
//! says so, and keeps serving the route it last wrote.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::Args;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tracing::{info, warn};

use crate::resources::proxy::identities;
use crate::resources::proxy::routes::{CONFIG_KEY, DATA_KEY, Route, RouteError, render};

/// How long the sidecar waits for memcached to count a reload (it applies one within a second).
const RELOAD_WAIT: Duration = Duration::from_secs(3);
/// How often it reads `stats` meanwhile.
const POLL: Duration = Duration::from_millis(20);
/// The most bytes of one `stats` answer read (memcached's, a proxy's included, is under 8 KiB).
const STATS_LIMIT: u64 = 64 * 1024;
/// How long one `stats` read may take, connecting included.
const STATS_TIMEOUT: Duration = Duration::from_secs(1);

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
    /// With access control (the init container): write nothing before the route carries this trust
    /// epoch, so that memcached never starts trusting a CA the Secret no longer holds.
    #[arg(long, conflicts_with = "pid_file")]
    pub trust_epoch: Option<String>,
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
    // The sidecar starts after the init container wrote the configuration memcached started with.
    let mut written = match args.once {
        true => None,
        false => Files::read(&args.dir),
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
        let files = match configuration(&config_map, &args.config_map) {
            Ok(files) => files,
            Err(refusal) => {
                warn!(config_map = %args.config_map, %refusal,
                    "not writing a route configuration; the last good one stays");
                continue;
            }
        };
        if let Some(epoch) = &args.trust_epoch
            && files.epoch.as_ref() != Some(epoch)
        {
            info!(config_map = %args.config_map, %epoch,
                "waiting for the route of this pod's trust epoch");
            continue;
        }
        if written.as_ref() == Some(&files) {
            continue;
        }
        files.write(&args.dir)?;
        written = Some(files);
        info!(dir = %args.dir.display(), "wrote the route configuration");
        if args.once {
            return Ok(());
        }
        if let Some(pid_file) = &args.pid_file {
            reload(pid_file, &args.stats_address).await;
        }
    }
}

/// Why a ConfigMap gives no configuration to write.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    #[error(
        "the ConfigMap has no {DATA_KEY} key (an operator older than this writer publishes none)"
    )]
    Missing,
    #[error(transparent)]
    Invalid(#[from] RouteError),
}

/// The files memcached reads: the route configuration and, with access control, the client CA bundle
/// (and the trust epoch it belongs to) and the access library.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Files {
    pub config: String,
    pub client_ca: Option<String>,
    pub epoch: Option<String>,
}

impl Files {
    /// What a previous writer of this pod left in `dir` (the sidecar starts after the init container).
    fn read(dir: &Path) -> Option<Self> {
        let config = std::fs::read_to_string(dir.join(CONFIG_KEY)).ok()?;
        let client_ca = std::fs::read_to_string(dir.join(identities::CA_FILE)).ok();
        let epoch = std::fs::read_to_string(dir.join(EPOCH_FILE)).ok();
        Some(Self {
            config,
            client_ca,
            epoch,
        })
    }

    /// Writes them into `dir`, each atomically: the library and the CA bundle before the configuration
    /// that needs them.
    pub fn write(&self, dir: &Path) -> std::io::Result<()> {
        if let Some(ca) = &self.client_ca {
            write_atomically(&dir.join(identities::LIBRARY_FILE), identities::LIBRARY)?;
            write_atomically(&dir.join(identities::CA_FILE), ca)?;
        }
        if let Some(epoch) = &self.epoch {
            write_atomically(&dir.join(EPOCH_FILE), epoch)?;
        }
        write_atomically(&dir.join(CONFIG_KEY), &self.config)
    }
}

/// The file recording the trust epoch of the CA bundle written, beside it.
const EPOCH_FILE: &str = "client-ca.epoch";

/// The files to write for the route ConfigMap `config_map` (named `name`): rendered here from its route
/// data ([`DATA_KEY`]), checked first; nothing else of the ConfigMap is read, so no code in it reaches
/// memcached.
pub fn configuration(config_map: &ConfigMap, name: &str) -> Result<Files, Refusal> {
    let data = config_map
        .data
        .as_ref()
        .and_then(|d| d.get(DATA_KEY))
        .ok_or(Refusal::Missing)?;
    let route = Route::parse(data)?;
    Ok(Files {
        config: render(name, &route),
        client_ca: route.access.as_ref().map(|a| a.client_ca.clone()),
        epoch: route.access.as_ref().map(|a| a.epoch.clone()),
    })
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

/// Reads `proxy_config_reloads` and `proxy_config_reload_fails` from `stats` at `address`, within
/// [`STATS_TIMEOUT`] in all (connecting included).
async fn reload_counts(address: &str) -> anyhow::Result<ReloadCounts> {
    let connect = tokio::time::timeout(STATS_TIMEOUT, TcpStream::connect(address));
    let stream = connect.await.context("connecting timed out")??;
    read_counts(stream).await
}

/// Asks `stream` for `stats` and reads the reload counters from the answer: at most
/// [`STATS_LIMIT`] bytes, within [`STATS_TIMEOUT`].
async fn read_counts<S: AsyncRead + AsyncWrite + Unpin>(
    mut stream: S,
) -> anyhow::Result<ReloadCounts> {
    let read = async {
        stream.write_all(b"stats\r\n").await?;
        let mut answer = BufReader::new((&mut stream).take(STATS_LIMIT));
        let mut counts = ReloadCounts::default();
        let mut line = Vec::new();
        loop {
            line.clear();
            if answer.read_until(b'\n', &mut line).await? == 0 || !line.ends_with(b"\n") {
                anyhow::bail!("stats ended early or ran past {STATS_LIMIT} bytes");
            }
            let line = String::from_utf8_lossy(&line);
            let line = line.trim_end();
            if line == "END" {
                return Ok(counts);
            }
            parse_stat(line, &mut counts);
        }
    };
    tokio::time::timeout(STATS_TIMEOUT, read)
        .await
        .context("stats timed out")?
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
    use crate::resources::proxy::routes::{MAX_ROUTE_BYTES, MAX_SERVERS};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

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

    fn route_map(data: &[(&str, String)]) -> ConfigMap {
        ConfigMap {
            data: Some(
                data.iter()
                    .map(|(k, v)| ((*k).to_owned(), v.clone()))
                    .collect(),
            ),
            ..ConfigMap::default()
        }
    }

    fn route(servers: &[&str]) -> String {
        Route {
            servers: servers.iter().map(|s| (*s).to_owned()).collect(),
            backend_tls: false,
            access: None,
        }
        .to_data()
    }

    #[test]
    fn lua_in_the_config_map_never_reaches_the_rendered_file() {
        let evil = "os.execute('id')\nroutes{ default = route_null{} }\n".to_owned();
        let both = route_map(&[
            (CONFIG_KEY, evil.clone()),
            (DATA_KEY, route(&["10.0.0.7:11211"])),
        ]);
        let text = configuration(&both, "cache-proxy")
            .expect("rendered from the data")
            .config;
        assert!(!text.contains("os.execute"), "{text}");
        assert_eq!(
            text,
            render(
                "cache-proxy",
                &Route::parse(&route(&["10.0.0.7:11211"])).unwrap()
            )
        );
        let lua_only = route_map(&[(CONFIG_KEY, evil)]);
        assert!(
            configuration(&lua_only, "cache-proxy").is_err(),
            "no data: nothing written"
        );
    }

    #[test]
    fn an_address_that_could_break_out_of_its_string_is_refused() {
        for address in [
            "x\" }, os.execute(\"id\") --:11211",
            "x\nos.execute('id'):11211",
            "x]]os.execute('id')--[[:11211",
            "[::1]]:11211",
        ] {
            // With the Lua an older operator rendered of it beside: never taken either.
            let lua =
                crate::resources::proxy::routes::config("cache", &["10.0.0.7:11211", address]);
            let map = route_map(&[
                (CONFIG_KEY, lua),
                (DATA_KEY, route(&["10.0.0.7:11211", address])),
            ]);
            let refused = configuration(&map, "cache-proxy");
            assert!(refused.is_err(), "{address:?}: {refused:?}");
        }
    }

    #[test]
    fn an_oversize_route_is_refused() {
        let many: Vec<String> = (0..=MAX_SERVERS)
            .map(|i| format!("10.0.{}.{}:11211", i / 256, i % 256))
            .collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        let lua = crate::resources::proxy::routes::config("cache", &many);
        let map = route_map(&[(CONFIG_KEY, lua), (DATA_KEY, route(&many))]);
        assert!(configuration(&map, "cache-proxy").is_err());
        let padded = format!(
            "{}{}",
            route(&["10.0.0.7:11211"]),
            " ".repeat(MAX_ROUTE_BYTES)
        );
        let lua = format!(
            "{}--{}",
            crate::resources::proxy::routes::config("cache", &[]),
            " ".repeat(MAX_ROUTE_BYTES)
        );
        let map = route_map(&[(CONFIG_KEY, lua), (DATA_KEY, padded)]);
        assert!(configuration(&map, "cache-proxy").is_err());
    }

    /// A stream that answers with `total` bytes of `x` (no line end), counting what was read.
    struct Endless {
        total: usize,
        served: Arc<AtomicUsize>,
    }

    impl AsyncRead for Endless {
        fn poll_read(
            self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
            buf: &mut tokio::io::ReadBuf<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            let served = self.served.load(Ordering::Relaxed);
            let n = buf.remaining().min(self.total - served);
            buf.put_slice(&vec![b'x'; n]);
            self.served.fetch_add(n, Ordering::Relaxed);
            std::task::Poll::Ready(Ok(()))
        }
    }

    impl AsyncWrite for Endless {
        fn poll_write(
            self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
            buf: &[u8],
        ) -> std::task::Poll<std::io::Result<usize>> {
            std::task::Poll::Ready(Ok(buf.len()))
        }
        fn poll_flush(
            self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            std::task::Poll::Ready(Ok(()))
        }
        fn poll_shutdown(
            self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            std::task::Poll::Ready(Ok(()))
        }
    }

    #[tokio::test]
    async fn the_stats_read_is_bounded_in_bytes() {
        let served = Arc::new(AtomicUsize::new(0));
        let stream = Endless {
            total: 64 << 20,
            served: served.clone(),
        };
        assert!(read_counts(stream).await.is_err());
        let served = served.load(Ordering::Relaxed);
        assert!(
            served <= 72 * 1024,
            "read {served} bytes of an endless answer"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_stats_read_is_bounded_in_time() {
        let (client, _server) = tokio::io::duplex(1024);
        let started = tokio::time::Instant::now();
        assert!(read_counts(client).await.is_err(), "a silent server");
        assert!(started.elapsed() <= Duration::from_secs(1));
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
