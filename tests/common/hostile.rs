//! A hostile memcached for the warm-handover tests: what a tenant's own `spec.image` may answer a copy
//! (oversize values, dumps that never end or drip, lines that never end). It plays both sides of a copy
//! (source and target: `stats`, `lru_crawler metadump`, `mg`, `ms`, `flush_all`) and allocates little of
//! its own (one read buffer and one line per connection, one chunk per dump), so that a test counting the
//! process's allocations counts the copy's.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// What the server answers.
#[derive(Clone, Copy, Debug)]
pub enum Script {
    /// The first walk lists `items` items of `listed` bytes each; every fetch answers a value of
    /// `value` bytes.
    Values {
        items: usize,
        listed: usize,
        value: usize,
    },
    /// The first walk lists nothing; the sweep's dump never ends (one-byte keys, listed again and
    /// again), and the target holds none of them.
    EndlessSweep,
    /// The first walk's dump never ends; every fetch finds nothing.
    EndlessDump,
    /// The first walk's dump is one line of 16 MiB without a line end.
    LongLine,
    /// The first walk's dump sends one line every `every`, for ever.
    Drip { every: Duration },
}

/// The server's clock, as `stats` gives it.
const TIME: i64 = 1_700_000_000;
/// One listed item: never expires, 100 bytes in memory.
const ITEM: &[u8] = b"key=k exp=-1 la=1 cas=1 fetch=no cls=1 size=100\r\n";
/// What the server writes a long answer from.
static FILL: [u8; 64 * 1024] = [b'x'; 64 * 1024];

/// A running hostile server; stopped (its listener and the connections it serves closed) on drop.
pub struct Hostile {
    pub address: SocketAddr,
    task: JoinHandle<()>,
}

impl Drop for Hostile {
    fn drop(&mut self) {
        self.task.abort();
    }
}

pub async fn start(script: Script) -> Hostile {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let address = listener.local_addr().expect("address");
    let task = tokio::spawn(async move {
        let mut connections = tokio::task::JoinSet::new();
        while let Ok((stream, _)) = listener.accept().await {
            connections.spawn(serve(stream, script));
        }
    });
    Hostile { address, task }
}

/// One connection: commands until it closes; a dump is the last answer of its connection.
async fn serve(stream: TcpStream, script: Script) {
    // Answers go out as they are written: pipelined lookups are not held back by Nagle's algorithm.
    let _ = stream.set_nodelay(true);
    let (read, mut write) = stream.into_split();
    let mut read = BufReader::new(read);
    let mut line = Vec::with_capacity(1024);
    loop {
        line.clear();
        match read.read_until(b'\n', &mut line).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        let text = String::from_utf8_lossy(&line).trim_end().to_owned();
        let tokens: Vec<&str> = text.split(' ').collect();
        let answered = match tokens[0] {
            "stats" => {
                write
                    .write_all(format!("STAT time {TIME}\r\nEND\r\n").as_bytes())
                    .await
            }
            "lru_crawler" => {
                let _ = dump(&mut write, script, tokens.last() == Some(&"hash")).await;
                return;
            }
            "mg" if tokens.contains(&"v") => fetched(&mut write, script).await,
            "mg" => write.write_all(b"EN\r\n").await,
            "ms" => {
                let length: u64 = tokens[2].parse().expect("ms length");
                let drained =
                    tokio::io::copy(&mut (&mut read).take(length + 2), &mut tokio::io::sink())
                        .await;
                match drained {
                    Ok(_) => write.write_all(b"HD\r\n").await,
                    Err(error) => Err(error),
                }
            }
            "flush_all" => write.write_all(b"OK\r\n").await,
            _ => write.write_all(b"ERROR\r\n").await,
        };
        if answered.is_err() {
            return;
        }
    }
}

/// The answer to a fetch (`mg <key> v f t u`).
async fn fetched(write: &mut OwnedWriteHalf, script: Script) -> std::io::Result<()> {
    let Script::Values { value, .. } = script else {
        return write.write_all(b"EN\r\n").await;
    };
    write
        .write_all(format!("VA {value} f0 t-1\r\n").as_bytes())
        .await?;
    let mut left = value;
    while left > 0 {
        let chunk = left.min(FILL.len());
        write.write_all(&FILL[..chunk]).await?;
        left -= chunk;
    }
    write.write_all(b"\r\n").await
}

/// A dump: the first walk's (`metadump all`) or the sweep's (`metadump hash`).
async fn dump(write: &mut OwnedWriteHalf, script: Script, hash: bool) -> std::io::Result<()> {
    match (script, hash) {
        (Script::Values { items, listed, .. }, false) => {
            let item = format!("key=k exp=-1 la=1 cas=1 fetch=no cls=1 size={listed}\r\n");
            for _ in 0..items {
                write.write_all(item.as_bytes()).await?;
            }
        }
        (Script::EndlessSweep, true) | (Script::EndlessDump, false) => {
            let lines = ITEM.repeat(FILL.len() / ITEM.len());
            loop {
                write.write_all(&lines).await?;
            }
        }
        (Script::LongLine, false) => {
            write.write_all(b"key=").await?;
            for _ in 0..256 {
                write.write_all(&FILL).await?;
            }
        }
        (Script::Drip { every }, false) => loop {
            write.write_all(ITEM).await?;
            tokio::time::sleep(every).await;
        },
        _ => {}
    }
    write.write_all(b"END\r\n").await
}
