//! A proxy-capable memcached (1.6.23 or later, built with `--enable-proxy`) run as a child process, for
//! the tests of the proxy's route configuration and of the collector's reads of it. Named by
//! `MEMCACHED_PROXY_BINARY`; CI has none, and the tests pass with a message saying so.

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The binary `MEMCACHED_PROXY_BINARY` names, if it is a file.
pub fn proxy_binary() -> Option<PathBuf> {
    let path = PathBuf::from(std::env::var_os("MEMCACHED_PROXY_BINARY")?);
    path.is_file().then_some(path)
}

/// A child process killed when dropped.
pub struct Process(pub Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A loopback port free when asked.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Starts `binary` on loopback `port` (with `extra` arguments: a proxy's `-o proxy_config=...`, say) and
/// waits until it accepts connections.
pub fn start(binary: &Path, port: u16, extra: &[String]) -> Process {
    let child = Command::new(binary)
        .args([
            "-l",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "-U",
            "0",
            "-t",
            "2",
        ])
        // Refused as root without a user to run as (ignored otherwise).
        .args(["-u", "nobody"])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let process = Process(child);
    let deadline = Instant::now() + Duration::from_secs(5);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "memcached on {port} did not start"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    process
}
