//! Memcached for the telemetry tests: the real `memcached` binary when it is installed ([`real_binary`],
//! [`RealServer`], [`exercise`]), and the memcached side of a fake server's conversation ([`converse`]).
//! Shared by `tests/telemetry_client.rs`, `tests/telemetry/` and `tests/smoke/`. Everything listens on
//! 127.0.0.x only.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

// ---- The real memcached, when installed ----------------------------------------------------------------

/// The `memcached` binary on PATH. Missing: a failure on CI (`CI` set), where the tests must run; a skip
/// with a message elsewhere.
pub fn real_binary() -> Option<PathBuf> {
    let found = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|path| std::env::split_paths(&path).collect::<Vec<_>>())
        .map(|dir| dir.join("memcached"))
        .find(|candidate| candidate.is_file());
    if found.is_none() {
        assert!(
            std::env::var_os("CI").is_none(),
            "memcached is not installed: CI must install Debian's `memcached` package for the real-server tests"
        );
        eprintln!("skipped: memcached is not installed (apt-get install memcached)");
    }
    found
}

/// Whether this memcached was built with TLS (Debian's is).
pub fn supports_tls(binary: &Path) -> bool {
    let help = Command::new(binary)
        .arg("-h")
        .output()
        .map(|o| o.stdout)
        .unwrap_or_default();
    String::from_utf8_lossy(&help).contains("ssl_chain_cert")
}

/// The real memcached when it is installed and built with TLS: a failure on CI without it (Debian's has
/// TLS), a skip with a message elsewhere.
pub fn real_tls_binary() -> Option<PathBuf> {
    let binary = real_binary()?;
    if !supports_tls(&binary) {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI's memcached must be built with TLS (Debian's is)"
        );
        eprintln!("skipped: this memcached has no TLS");
        return None;
    }
    Some(binary)
}

/// A memcached process started for one test, with its files; killed and cleaned up on drop.
pub struct RealServer {
    child: Child,
    pub address: SocketAddr,
    dir: PathBuf,
}

impl RealServer {
    /// Starts `binary` on a free 127.0.0.1 port (8 MiB, one thread, no UDP) with `extra` arguments;
    /// `files` are written to a fresh directory first and `{dir}` in an argument stands for it. `name`
    /// tells the directories of the tests of one process apart.
    pub async fn start(binary: &Path, name: &str, files: &[(&str, &[u8])], extra: &[&str]) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "memcached-operator-test-{}-{name}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).expect("test directory");
        for (file, contents) in files {
            std::fs::write(dir.join(file), contents).expect("test file");
        }
        let port = {
            let probe = std::net::TcpListener::bind("127.0.0.1:0").expect("free port");
            probe.local_addr().expect("address").port()
        };
        let address = SocketAddr::from(([127, 0, 0, 1], port));
        let dir_text = dir.to_str().expect("UTF-8 temp dir");
        let mut args = vec![
            "-p".to_owned(),
            port.to_string(),
            "-U".into(),
            "0".into(),
            "-l".into(),
            "127.0.0.1".into(),
        ];
        // memcached refuses to run as root without -u; as another user it ignores -u root.
        args.extend(["-u", "root", "-m", "8", "-t", "1"].map(str::to_owned));
        args.extend(extra.iter().map(|arg| arg.replace("{dir}", dir_text)));
        let child = Command::new(binary)
            .args(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start memcached");
        let mut server = Self {
            child,
            address,
            dir,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(address).await.is_err() {
            // An early exit means bad arguments or a port taken in the meantime: say so, do not wait.
            if let Ok(Some(status)) = server.child.try_wait() {
                panic!("memcached exited with {status}: {args:?}");
            }
            assert!(
                Instant::now() < deadline,
                "memcached did not listen on {address}: {args:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        server
    }
}

impl RealServer {
    /// Replaces one of its files, as the kubelet updates a mounted Secret: the new content under a new
    /// name, renamed over the old, so the server never reads half a file.
    pub fn replace_file(&self, file: &str, contents: &[u8]) {
        let staged = self.dir.join(format!(".{file}.new"));
        std::fs::write(&staged, contents).expect("staged file");
        std::fs::rename(&staged, self.dir.join(file)).expect("file replaced");
    }
}

impl Drop for RealServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A few commands over plain TCP, so the stats have known values: after the authenticating `set` when
/// `auth` gives its data, one `set` of each of `keys`, one `get` of each (hits), then `misses` gets of a
/// missing key. Fails on any error reply.
pub async fn exercise(address: SocketAddr, auth: Option<&str>, keys: &[&str], misses: usize) {
    let mut stream = BufReader::new(TcpStream::connect(address).await.expect("connect"));
    let mut commands = String::new();
    if let Some(data) = auth {
        commands.push_str(&format!("set auth 0 0 {}\r\n{data}\r\n", data.len()));
    }
    for key in keys {
        commands.push_str(&format!("set {key} 0 0 5\r\nvalue\r\n"));
    }
    for key in keys {
        commands.push_str(&format!("get {key}\r\n"));
    }
    commands.push_str(&"get missing\r\n".repeat(misses));
    stream.write_all(commands.as_bytes()).await.expect("send");
    // STORED per set; VALUE, the data and END per hit; END per miss.
    let expected_lines = auth.map_or(0, |_| 1) + keys.len() + 3 * keys.len() + misses;
    let mut line = String::new();
    for _ in 0..expected_lines {
        line.clear();
        stream.read_line(&mut line).await.expect("reply");
        assert!(!line.contains("ERROR"), "{line:?}");
    }
}

// ---- Fake memcached servers ----------------------------------------------------------------------------

/// How a fake server behaves once asked for `stats`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Answers, then holds the connection until the client closes it.
    Answer,
    /// Never answers (and keeps the connection open).
    Silent,
    /// Sends half the reply, then closes.
    CloseMidReply,
}

/// Plays memcached on an accepted connection: checks the authenticating `set` when `auth` says which data
/// to expect (`user password`), answering `STORED` or an authentication failure (and closing), waits for
/// `stats\r\n`, then replies with `reply` as `mode` says.
pub async fn converse<S>(stream: S, mode: Mode, auth: Option<&str>, reply: &[u8])
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut stream = BufReader::new(stream);
    let mut line = String::new();
    if let Some(expected) = auth {
        if stream.read_line(&mut line).await.is_err() {
            return;
        }
        let length: usize = line
            .trim_end()
            .rsplit(' ')
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        let mut data = vec![0; length + 2];
        if stream.read_exact(&mut data).await.is_err() {
            return;
        }
        let accepted = data == format!("{expected}\r\n").as_bytes();
        let answer: &[u8] = if accepted {
            b"STORED\r\n"
        } else {
            b"CLIENT_ERROR authentication failure\r\n"
        };
        let _ = stream.write_all(answer).await;
        let _ = stream.flush().await;
        if !accepted {
            return;
        }
        line.clear();
    }
    if stream.read_line(&mut line).await.is_err() || line != "stats\r\n" {
        return;
    }
    match mode {
        Mode::Answer => {
            let _ = stream.write_all(reply).await;
            let _ = stream.flush().await;
            let mut rest = Vec::new();
            let _ = stream.read_to_end(&mut rest).await;
        }
        Mode::Silent => {
            let mut rest = Vec::new();
            let _ = stream.read_to_end(&mut rest).await;
        }
        Mode::CloseMidReply => {
            let _ = stream.write_all(&reply[..reply.len() / 2]).await;
            let _ = stream.flush().await;
        }
    }
}
