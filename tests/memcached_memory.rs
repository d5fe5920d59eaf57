//! The operator's sizing of memcached's memory (`resources::memory`) against the real binary:
//! - the slab classes it counts are the ones `memcached -vv` prints ("slab class N: chunk size S"), for
//!   several option sets;
//! - a fill of every class's size, a few rounds, keeps memcached's resident memory (VmRSS) within
//!   `-m` + the computed overhead, and takes it past `-m` + 32 MiB, the former allowance, which
//!   the kernel OOM-killed in a memory cgroup of that size.
//!
//! Runs `memcached` on PATH (Debian's 1.6.18; CI installs it); skips with a message when it is missing.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use memcached_operator::api::MemcachedConfig;
use memcached_operator::api::flags::{argv, startup};
use memcached_operator::resources::memory::{class_sizes, overhead_mb};

/// Per class and round, bytes of items stored.
const FILL_PER_CLASS: usize = 4 << 20;
const ROUNDS: usize = 3;
/// `sizeof(item)` + the CAS value + the key's NUL and the data's CRLF: an item's bytes beyond key and data.
const ITEM_EXTRA: usize = 48 + 8 + 1 + 2;

/// A memcached child on a free 127.0.0.1 port, killed on drop.
struct Server {
    child: Child,
    address: SocketAddr,
}

impl Server {
    /// Starts `binary` with the operator's own arguments for `-m max_memory_mb` and `extra`. memcached
    /// refuses to run as root without `-u`; as another user it ignores `-u nobody`.
    fn start(binary: &Path, max_memory_mb: i32, extra: &[&str]) -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("free port")
            .port();
        let max = max_memory_mb.to_string();
        let port_text = port.to_string();
        let mut args = vec![
            "-u",
            "nobody",
            "-U",
            "0",
            "-l",
            "127.0.0.1",
            "-p",
            &port_text,
        ];
        args.extend(["-m", &max, "-o", "modern"]);
        args.extend(extra);
        let child = Command::new(binary)
            .args(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start memcached");
        let mut server = Self {
            child,
            address: SocketAddr::from(([127, 0, 0, 1], port)),
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(server.address).is_err() {
            if let Ok(Some(status)) = server.child.try_wait() {
                panic!("memcached exited with {status}: {args:?}");
            }
            assert!(
                Instant::now() < deadline,
                "memcached did not listen: {args:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        server
    }

    /// Resident memory in MiB, from /proc/PID/status.
    fn rss_mib(&self) -> f64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .expect("/proc/PID/status");
        let kib: f64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmRSS line");
        kib / 1024.0
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn config(max_memory_mb: i32, extra: &[&str]) -> MemcachedConfig {
    MemcachedConfig {
        max_memory_mb: Some(max_memory_mb),
        extra_args: extra.iter().map(|a| (*a).to_owned()).collect(),
        ..MemcachedConfig::default()
    }
}

/// The model's classes for `extra`, in the reading of `slab_chunk_max` this binary makes (bytes before
/// 1.6.24, kilobytes since).
fn model_classes(binary: &Path, extra: &[&str]) -> Vec<u64> {
    let args: Vec<String> = extra.iter().map(|a| (*a).to_owned()).collect();
    let given = argv::parse(&args).expect("options the operator admits");
    let [bytes, kilobytes] = startup::slabs(&given, None);
    let out = Command::new(binary)
        .arg("-V")
        .output()
        .expect("memcached -V");
    let version = String::from_utf8_lossy(&out.stdout).into_owned();
    let minor: u32 = version
        .trim()
        .rsplit('.')
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("a memcached 1.6.x version: {version:?}"));
    class_sizes(if minor < 24 { &bytes } else { &kilobytes })
}

/// The chunk sizes `memcached -vv` prints for `extra`.
fn printed_classes(binary: &Path, extra: &[&str]) -> Vec<u64> {
    let mut args = vec!["-vv"];
    args.extend(extra);
    let mut server = Server::start(binary, 64, &args);
    let _ = server.child.kill();
    let mut stderr = String::new();
    server
        .child
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut stderr)
        .expect("memcached's stderr");
    stderr
        .lines()
        .filter(|l| l.starts_with("slab class"))
        .map(|l| {
            let size = l
                .split("chunk size")
                .nth(1)
                .and_then(|r| r.split_whitespace().next());
            size.and_then(|s| s.parse().ok())
                .unwrap_or_else(|| panic!("a chunk size in {l:?}"))
        })
        .collect()
}

#[test]
fn slab_classes_are_the_ones_memcached_prints() {
    let Some(binary) = common::memcached::real_binary() else {
        return;
    };
    let sets: &[&[&str]] = &[
        &[],
        &["-f", "1.05"],
        &["-n", "5", "-f", "1.01"],
        &["-n", "100", "-f", "2"],
        &["--slab-growth-factor=1.1", "--slab-min-size=24"],
        &["-o", "slab_chunk_max=256"],
        &["-o", "slab_sizes=100-200-300"],
    ];
    for extra in sets {
        let model = model_classes(&binary, extra);
        let printed = printed_classes(&binary, extra);
        assert_eq!(model, printed, "{extra:?}");
        println!("{extra:?}: {} classes", printed.len());
    }
    assert_eq!(model_classes(&binary, &[]).len(), 39);
    assert_eq!(model_classes(&binary, &["-f", "1.05"]).len(), 63);
}

/// Stores items of the smallest class until they alone exceed the item memory (`first_mib`), so that
/// every other class is still without a page when the limit is reached (the worst order: each then gets
/// its first page beyond -m, and the many small items grow the hash table); then `FILL_PER_CLASS` of
/// items of each class's chunk size, `ROUNDS` times over with new keys. Waits for memcached to have read
/// them all.
fn fill(server: &Server, classes: &[u64], first_mib: usize) {
    let stream = TcpStream::connect(server.address).expect("connect");
    let mut writer = std::io::BufWriter::with_capacity(1 << 20, &stream);
    let mut store = |key: String, chunk: u64| {
        let data = vec![b'x'; chunk as usize - ITEM_EXTRA - key.len()];
        write!(writer, "set {key} 0 0 {} noreply\r\n", data.len()).expect("send");
        writer
            .write_all(&data)
            .and_then(|()| writer.write_all(b"\r\n"))
            .expect("send");
    };
    for n in 0..(first_mib << 20) / classes[0] as usize {
        store(format!("first{n}"), classes[0]);
    }
    for round in 0..ROUNDS {
        for (class, &chunk) in classes.iter().enumerate() {
            for n in 0..(FILL_PER_CLASS / chunk as usize).max(1) {
                store(format!("r{round}c{class}n{n}"), chunk);
            }
        }
    }
    writer
        .write_all(b"version\r\n")
        .and_then(|()| writer.flush())
        .expect("send");
    drop(writer);
    let mut reply = String::new();
    BufReader::new(&stream)
        .read_line(&mut reply)
        .expect("reply");
    assert!(reply.starts_with("VERSION"), "memcached answered {reply:?}");
}

#[test]
fn a_fill_of_every_class_stays_within_the_computed_overhead() {
    let Some(binary) = common::memcached::real_binary() else {
        return;
    };
    for max_memory_mb in [8, 64] {
        let server = Server::start(&binary, max_memory_mb, &[]);
        fill(
            &server,
            &model_classes(&binary, &[]),
            max_memory_mb as usize + 8,
        );
        let rss = server.rss_mib();
        let sized = max_memory_mb + overhead_mb(&config(max_memory_mb, &[]));
        let former = max_memory_mb + 32;
        println!(
            "-m {max_memory_mb}: VmRSS {rss:.1} MiB; sized {sized} MiB, formerly {former} MiB"
        );
        assert!(
            rss <= f64::from(sized),
            "-m {max_memory_mb}: VmRSS {rss:.1} MiB above the computed {sized} MiB"
        );
        assert!(
            rss > f64::from(former),
            "-m {max_memory_mb}: VmRSS {rss:.1} MiB within the former {former} MiB: the fill did not reach \
             the pages beyond -m"
        );
    }
}
