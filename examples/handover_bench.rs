//! `make bench-handover` (`cargo run --example handover_bench`): the warm-handover copy engine's memory
//! and throughput on a large cache.
//!
//! Starts two real memcached servers, fills the source with `--megabytes` of `--value-kib` values through
//! a small client, then runs one [`Copier`] in this process and reports items/s, MiB/s and how much the
//! process's peak resident memory grew during the copy (issue 23 asks for < 10 MiB for 1 GiB).
//!
//! An example of the operator package rather than a mode of the `bench` crate: that crate deliberately
//! does not link the operator library (it runs the operator binary, as a cluster would), and the copy
//! must run in-process for its memory to be measured.

use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Parser;
use memcached_operator::connection::Target;
use memcached_operator::handover::{Copier, Settings};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// Copies a filled memcached to an empty one in-process and reports speed and peak memory growth.
#[derive(Debug, Parser)]
struct Cli {
    /// Value bytes to fill the source with, in MiB.
    #[arg(long, default_value_t = 1024)]
    megabytes: u64,
    /// Size of each value, in KiB.
    #[arg(long, default_value_t = 100)]
    value_kib: u64,
    /// Each memcached's memory limit (`-m`), in MiB.
    #[arg(long, default_value_t = 1200)]
    memory_mib: u64,
    /// The copy's byte rate limit [default: none that matters, to measure the engine].
    #[arg(long, default_value_t = 1 << 40)]
    max_bytes_per_second: u64,
    /// The memcached binary.
    #[arg(long, default_value = "/usr/bin/memcached")]
    memcached: PathBuf,
}

/// A memcached process, killed when dropped.
struct Server {
    child: Child,
    address: SocketAddr,
}

impl Server {
    async fn start(binary: &PathBuf, memory_mib: u64) -> anyhow::Result<Self> {
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let child = Command::new(binary)
            .args(["-l", "127.0.0.1", "-U", "0", "-t", "2", "-u", "root"])
            .args(["-p", &port.to_string(), "-m", &memory_mib.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {}", binary.display()))?;
        let server = Self {
            child,
            address: SocketAddr::from(([127, 0, 0, 1], port)),
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(server.address).await.is_err() {
            if Instant::now() > deadline {
                bail!("memcached did not listen on {}", server.address);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(server)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Stores `count` values of `size` bytes, 64 per round trip, reusing one value buffer.
async fn fill(address: SocketAddr, count: u64, size: usize) -> anyhow::Result<()> {
    let mut stream = BufReader::new(TcpStream::connect(address).await?);
    let value = vec![b'v'; size];
    let mut line = String::new();
    let mut next = 0;
    while next < count {
        let batch = (count - next).min(64);
        for i in next..next + batch {
            let header = format!("ms bench-{i} {size} F{} T0\r\n", i % 65_536);
            stream.write_all(header.as_bytes()).await?;
            stream.write_all(&value).await?;
            stream.write_all(b"\r\n").await?;
        }
        for _ in 0..batch {
            line.clear();
            stream.read_line(&mut line).await?;
            if line != "HD\r\n" {
                bail!("memcached refused a value: {line:?}");
            }
        }
        next += batch;
    }
    Ok(())
}

/// A `VmRSS`/`VmHWM` line of /proc/self/status, in KiB.
fn status_kib(field: &str) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    status
        .lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|value| value.trim().trim_end_matches(" kB").parse().ok())
        .with_context(|| format!("no {field} in /proc/self/status"))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let size = usize::try_from(cli.value_kib * 1024)?;
    let count = cli.megabytes * 1024 / cli.value_kib;
    let source = Server::start(&cli.memcached, cli.memory_mib).await?;
    let target = Server::start(&cli.memcached, cli.memory_mib).await?;
    eprintln!(
        "filling {} with {count} values of {} KiB ...",
        source.address, cli.value_kib
    );
    fill(source.address, count, size).await?;

    let settings = Settings {
        max_bytes_per_second: cli.max_bytes_per_second,
        timeout: Duration::from_secs(3600),
        ..Settings::default()
    };
    let rss_before = status_kib("VmRSS")?;
    // Writing 5 to clear_refs resets the peak (VmHWM) to the current RSS, so the fill's peak is not counted.
    let reset = std::fs::write("/proc/self/clear_refs", "5").is_ok();
    let hwm_before = status_kib("VmHWM")?;
    let started = Instant::now();
    let summary = Copier::new(
        Target::plain(source.address),
        Target::plain(target.address),
        settings,
    )
    .run()
    .await?;
    let seconds = started.elapsed().as_secs_f64();
    let hwm_after = status_kib("VmHWM")?;
    if summary.copied == 0 {
        bail!("nothing copied: {summary:?}");
    }
    let mib = summary.bytes as f64 / 1024.0 / 1024.0;
    // The LRU walk may miss a few items the server moves while it walks (see docs/clients.md).
    println!(
        "copied {} of {count} items ({} not listed by the dump), {mib:.0} MiB in {seconds:.2} s: \
         {:.0} items/s, {:.1} MiB/s",
        summary.copied,
        count - summary.items_seen().min(count),
        summary.copied as f64 / seconds,
        mib / seconds
    );
    println!(
        "RSS before the copy {:.1} MiB; peak during it {:.1} MiB: grew {:.1} MiB{}",
        rss_before as f64 / 1024.0,
        hwm_after as f64 / 1024.0,
        hwm_after.saturating_sub(rss_before) as f64 / 1024.0,
        if reset {
            String::new()
        } else {
            format!(
                " (peak not reset: it was {:.1} MiB before)",
                hwm_before as f64 / 1024.0
            )
        }
    );
    Ok(())
}
