//! What the proxy benches send and read: the workloads' requests and expected answers, the keys stored
//! for them, and a blocking client connection (plain or TLS, with rustls) split into a writing and a
//! reading half, so that a writer thread can send on a schedule while a reader thread times the answers.

use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio_rustls::rustls::pki_types::ServerName;
use tokio_rustls::rustls::{ClientConfig, ClientConnection};

/// Keys read (`bench:hop:0` to `bench:hop:9`), each holding a value of [`VALUE_BYTES`].
pub(crate) const KEYS: usize = 10;
const VALUE_BYTES: usize = 100;
/// With no answer for this long, a measurement fails.
pub(crate) const STALL: Duration = Duration::from_secs(10);

/// One request of a workload: what is written, and the answer expected (always the same bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Workload {
    /// `get bench:hop:0`.
    Get,
    /// `get bench:hop:0` … `get bench:hop:7`, written at once; the request is the batch.
    Pipelined8,
    /// `get bench:hop:0 … bench:hop:9`.
    MultiGet10,
}

impl Workload {
    pub const ALL: [Workload; 3] = [Workload::Get, Workload::Pipelined8, Workload::MultiGet10];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Workload::Get => "get",
            Workload::Pipelined8 => "8 pipelined gets",
            Workload::MultiGet10 => "10-key multi-get",
        }
    }

    /// Keys read by one request.
    pub fn keys(self) -> usize {
        match self {
            Workload::Get => 1,
            Workload::Pipelined8 => 8,
            Workload::MultiGet10 => 10,
        }
    }

    /// The request's bytes and its answer's.
    pub(crate) fn exchange(self) -> (Vec<u8>, Vec<u8>) {
        let value = |k: usize| {
            format!(
                "VALUE {} 0 {VALUE_BYTES}\r\n{}\r\n",
                key(k),
                "v".repeat(VALUE_BYTES)
            )
        };
        match self {
            Workload::Get => (
                format!("get {}\r\n", key(0)).into_bytes(),
                format!("{}END\r\n", value(0)).into_bytes(),
            ),
            Workload::Pipelined8 => (
                (0..8)
                    .map(|k| format!("get {}\r\n", key(k)))
                    .collect::<String>()
                    .into_bytes(),
                (0..8)
                    .map(|k| format!("{}END\r\n", value(k)))
                    .collect::<String>()
                    .into_bytes(),
            ),
            Workload::MultiGet10 => (
                format!("get {}\r\n", (0..10).map(key).collect::<Vec<_>>().join(" ")).into_bytes(),
                format!("{}END\r\n", (0..10).map(value).collect::<String>()).into_bytes(),
            ),
        }
    }
}

pub(crate) fn key(k: usize) -> String {
    format!("bench:hop:{k}")
}

/// Stores the [`KEYS`] keys.
pub(crate) fn store(port: u16, tls: Option<&Arc<ClientConfig>>) -> Result<(), String> {
    let (mut writer, mut reader) = connect(port, tls)?;
    let mut command = Vec::new();
    for k in 0..KEYS {
        command.extend(format!("set {} 0 0 {VALUE_BYTES}\r\n", key(k)).bytes());
        command.extend(std::iter::repeat_n(b'v', VALUE_BYTES));
        command.extend(b"\r\n");
    }
    writer.send(&command).map_err(|e| e.to_string())?;
    reader
        .expect(&b"STORED\r\n".repeat(KEYS), &mut Vec::new())
        .map_err(|e| format!("the sets: {e}"))
}

pub(crate) fn timed_out(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

/// TLS handshakes refused by a server and tried again.
pub(crate) static HANDSHAKE_RETRIES: AtomicUsize = AtomicUsize::new(0);

/// [`connect`], its handshake tried up to 5 times.
pub(crate) fn connect_retrying(
    port: u16,
    tls: Option<&Arc<ClientConfig>>,
) -> Result<(Writer, Reader), String> {
    let mut tries = 0;
    loop {
        match connect(port, tls) {
            Err(e) if e.starts_with("TLS handshake") && tries < 4 => {
                tries += 1;
                HANDSHAKE_RETRIES.fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(10));
            }
            outcome => return outcome,
        }
    }
}

/// The writing half of a connection.
pub(crate) struct Writer {
    socket: TcpStream,
    tls: Option<Arc<Mutex<ClientConnection>>>,
}

/// The reading half of a connection.
pub(crate) struct Reader {
    socket: TcpStream,
    tls: Option<Arc<Mutex<ClientConnection>>>,
    buffer: Vec<u8>,
}

/// A connection to `port` on loopback (`TCP_NODELAY`), over TLS with `tls` (handshake done), split
/// into its halves. Over TLS both share the session: the writer holds it only while it encrypts and
/// writes (its socket gives up after 1 ms, so the session is let go while the socket is full), the
/// reader while it decrypts what it read.
pub(crate) fn connect(
    port: u16,
    tls: Option<&Arc<ClientConfig>>,
) -> Result<(Writer, Reader), String> {
    let mut socket = TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string())?;
    socket.set_nodelay(true).map_err(|e| e.to_string())?;
    let session = match tls {
        Some(config) => {
            let name = ServerName::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST).into());
            let mut session =
                ClientConnection::new(config.clone(), name).map_err(|e| e.to_string())?;
            session.set_buffer_limit(None);
            while session.is_handshaking() {
                session
                    .complete_io(&mut socket)
                    .map_err(|e| format!("TLS handshake: {e}"))?;
            }
            socket
                .set_write_timeout(Some(Duration::from_millis(1)))
                .map_err(|e| e.to_string())?;
            Some(Arc::new(Mutex::new(session)))
        }
        None => None,
    };
    socket
        .set_read_timeout(Some(Duration::from_millis(50)))
        .map_err(|e| e.to_string())?;
    let reading = socket.try_clone().map_err(|e| e.to_string())?;
    Ok((
        Writer {
            socket,
            tls: session.clone(),
        },
        Reader {
            socket: reading,
            tls: session,
            buffer: vec![0; 64 * 1024],
        },
    ))
}

impl Writer {
    pub(crate) fn send(&mut self, bytes: &[u8]) -> io::Result<()> {
        let Some(tls) = &self.tls else {
            return self.socket.write_all(bytes);
        };
        let mut session = tls.lock().expect("session");
        session.writer().write_all(bytes)?;
        while session.wants_write() {
            match session.write_tls(&mut self.socket) {
                Ok(_) => {}
                Err(e) if timed_out(&e) => {
                    // The socket is full: let the reader decrypt (and so the server write) meanwhile.
                    drop(session);
                    std::thread::yield_now();
                    session = tls.lock().expect("session");
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

impl Reader {
    /// Reads until `received` (cleared first) holds as many bytes as `answer` (waiting at most
    /// [`STALL`]), and fails unless they are `answer`.
    pub(crate) fn expect(&mut self, answer: &[u8], received: &mut Vec<u8>) -> Result<(), String> {
        received.clear();
        let deadline = Instant::now() + STALL;
        while received.len() < answer.len() {
            match self.receive(received) {
                Ok(0) => return Err("the connection was closed".to_owned()),
                Ok(_) => {}
                Err(e) if timed_out(&e) && Instant::now() < deadline => {}
                Err(e) => return Err(e.to_string()),
            }
        }
        match received.as_slice() == answer {
            true => Ok(()),
            false => Err(format!(
                "an unexpected answer: {:?}",
                String::from_utf8_lossy(received)
            )),
        }
    }

    /// Reads what has come (waiting at most 50 ms), appends its plain text to `out`; `Ok(0)` when
    /// the peer closed.
    pub(crate) fn receive(&mut self, out: &mut Vec<u8>) -> io::Result<usize> {
        let read = self.socket.read(&mut self.buffer)?;
        if read == 0 {
            return Ok(0);
        }
        let Some(tls) = &self.tls else {
            out.extend_from_slice(&self.buffer[..read]);
            return Ok(read);
        };
        let mut session = tls.lock().expect("session");
        let mut incoming = &self.buffer[..read];
        while !incoming.is_empty() {
            session.read_tls(&mut incoming)?;
            session
                .process_new_packets()
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
            let mut chunk = [0u8; 16 * 1024];
            loop {
                match session.reader().read(&mut chunk) {
                    Ok(0) => break,
                    Ok(n) => out.extend_from_slice(&chunk[..n]),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(read)
    }
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_what_the_server_sends() {
        let (request, answer) = Workload::Pipelined8.exchange();
        assert_eq!(request.windows(5).filter(|w| w == b"get b").count(), 8);
        assert_eq!(answer.windows(5).filter(|w| w == b"END\r\n").count(), 8);
        let (request, answer) = Workload::MultiGet10.exchange();
        assert!(request.starts_with(b"get bench:hop:0 bench:hop:1 "));
        assert_eq!(answer.windows(5).filter(|w| w == b"VALUE").count(), 10);
        assert!(answer.ends_with(b"v\r\nEND\r\n"));
    }
}
