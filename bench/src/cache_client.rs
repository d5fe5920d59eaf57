//! The application of the operand run (`--operand`): a cache-aside reader that asks the instance's ready
//! servers for a fixed set of keys in turn, and on a miss stores the value, as an application in front of
//! a database does. Its gets are what the dashboard's hit ratio and items panels show.
//!
//! Keys are placed by rendezvous hashing over the ready pods' names, so that a server leaving or joining
//! moves only its share of the keys, as a consistent-hashing client does. The memcached text protocol is
//! spoken directly (`get`, `set`): the three commands a cache-aside reader needs do not call for a client
//! library, and the ones on crates.io bring their own connection pools and runtimes.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// How long one command may take before its connection is dropped (a server that went away).
const COMMAND_TIMEOUT: Duration = Duration::from_secs(2);

/// A ready server: its pod's name (what keys are hashed against) and address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Server {
    pub pod: String,
    pub addr: SocketAddr,
}

/// What the reader did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub hits: u64,
    pub misses: u64,
    /// Commands that failed (no connection, a closed one, a timeout): the key is skipped.
    pub errors: u64,
}

/// The server of `key` among `servers`: the one whose pod name scores highest with it.
pub fn server_of<'a>(key: &str, servers: &'a [Server]) -> Option<&'a Server> {
    servers.iter().max_by_key(|server| {
        // SipHash with fixed keys: the same placement in every run and on every machine.
        let mut hasher = DefaultHasher::new();
        (key, server.pod.as_str()).hash(&mut hasher);
        hasher.finish()
    })
}

/// A value of `len` bytes for `key`: readable in a server's dump and the same on every set.
pub fn value_of(key: &str, len: usize) -> Vec<u8> {
    key.bytes().cycle().take(len).collect()
}

/// The reader: open connections by pod name, and its counts.
#[derive(Default)]
pub struct Reader {
    connections: HashMap<String, BufReader<TcpStream>>,
    pub counts: Counts,
}

impl Reader {
    /// Gets `key` from its server, and sets it (`value_len` bytes, no expiry) when missing.
    pub async fn read_through(&mut self, key: &str, servers: &[Server], value_len: usize) {
        let Some(server) = server_of(key, servers) else {
            self.counts.errors += 1;
            return;
        };
        let result =
            tokio::time::timeout(COMMAND_TIMEOUT, self.get_or_set(server, key, value_len)).await;
        match result {
            Ok(Ok(true)) => self.counts.hits += 1,
            Ok(Ok(false)) => self.counts.misses += 1,
            Ok(Err(_)) | Err(_) => {
                self.counts.errors += 1;
                self.connections.remove(&server.pod);
            }
        }
    }

    /// Drops the connections to servers no longer ready.
    pub fn forget_others(&mut self, servers: &[Server]) {
        self.connections
            .retain(|pod, _| servers.iter().any(|s| &s.pod == pod));
    }

    async fn get_or_set(
        &mut self,
        server: &Server,
        key: &str,
        value_len: usize,
    ) -> std::io::Result<bool> {
        let conn = match self.connections.entry(server.pod.clone()) {
            std::collections::hash_map::Entry::Occupied(entry) => entry.into_mut(),
            std::collections::hash_map::Entry::Vacant(entry) => {
                entry.insert(BufReader::new(TcpStream::connect(server.addr).await?))
            }
        };
        if get(conn, key).await? {
            return Ok(true);
        }
        set(conn, key, &value_of(key, value_len)).await?;
        Ok(false)
    }
}

/// `get key`: whether the server had it (its value is read and dropped).
async fn get(conn: &mut BufReader<TcpStream>, key: &str) -> std::io::Result<bool> {
    conn.get_mut()
        .write_all(format!("get {key}\r\n").as_bytes())
        .await?;
    let mut line = String::new();
    read_line(conn, &mut line).await?;
    if line == "END\r\n" {
        return Ok(false);
    }
    // VALUE <key> <flags> <bytes>\r\n<data>\r\nEND\r\n
    let len: usize = line
        .strip_prefix("VALUE ")
        .and_then(|rest| rest.split_whitespace().nth(2))
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| unexpected(&line))?;
    let mut data = vec![0; len + 2];
    conn.read_exact(&mut data).await?;
    line.clear();
    read_line(conn, &mut line).await?;
    if line != "END\r\n" {
        return Err(unexpected(&line));
    }
    Ok(true)
}

/// `set key 0 0 <len>`: stored, or an error.
async fn set(conn: &mut BufReader<TcpStream>, key: &str, value: &[u8]) -> std::io::Result<()> {
    let mut command = format!("set {key} 0 0 {}\r\n", value.len()).into_bytes();
    command.extend_from_slice(value);
    command.extend_from_slice(b"\r\n");
    conn.get_mut().write_all(&command).await?;
    let mut line = String::new();
    read_line(conn, &mut line).await?;
    if line != "STORED\r\n" {
        return Err(unexpected(&line));
    }
    Ok(())
}

async fn read_line(conn: &mut BufReader<TcpStream>, line: &mut String) -> std::io::Result<()> {
    if conn.read_line(line).await? == 0 {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    Ok(())
}

fn unexpected(line: &str) -> std::io::Error {
    std::io::Error::other(format!("unexpected answer {:?}", line.trim_end()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn servers(pods: &[&str]) -> Vec<Server> {
        pods.iter()
            .enumerate()
            .map(|(i, pod)| Server {
                pod: (*pod).to_owned(),
                addr: SocketAddr::from(([127, 0, 0, 1], 11211 + i as u16)),
            })
            .collect()
    }

    #[test]
    fn a_server_leaving_moves_only_its_own_keys() {
        let three = servers(&["cache-a", "cache-b", "cache-c"]);
        let two = servers(&["cache-a", "cache-b"]);
        let keys: Vec<String> = (0..1000).map(|i| format!("key-{i}")).collect();
        let mut on_c = 0;
        for key in &keys {
            let before = server_of(key, &three).unwrap();
            let after = server_of(key, &two).unwrap();
            if before.pod == "cache-c" {
                on_c += 1;
            } else {
                assert_eq!(
                    before.pod, after.pod,
                    "{key} moved off a server that stayed"
                );
            }
        }
        assert!(
            (200..470).contains(&on_c),
            "cache-c held {on_c} of 1000 keys"
        );
        assert!(server_of("key", &[]).is_none());
    }

    #[test]
    fn values_have_the_asked_length() {
        assert_eq!(value_of("ab", 5), b"ababa");
        assert_eq!(value_of("key-1", 100).len(), 100);
    }
}
