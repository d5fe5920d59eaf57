//! The application of the operand run (`--operand`): a cache-aside reader that asks an instance's servers
//! for a fixed set of keys in turn, and on a miss stores the value, as an application in front of a
//! database does. Its gets are what the dashboard's hit ratio and items panels show.
//!
//! It places keys as a client of the published list does: over the `host:port` entries of the
//! `<name>-servers` ConfigMap in slot order, under the hashing the instance declares
//! (`spec.clients.hashing`), rebuilt whenever the list changes ([`Reader::follow`]). The placement is the
//! operator's [`memcached_operator::hashing::Placement`], which tests/hashing.rs holds to the placements
//! the client libraries themselves produced (pylibmc for `ketama`): the bench's keys go where such a
//! client's would. The memcached text protocol is spoken directly (`get`, `set`): the two commands a
//! cache-aside reader needs do not call for a client library, and the ones on crates.io bring their own
//! connection pools and runtimes.

use std::collections::HashMap;
use std::time::Duration;

use memcached_operator::hashing::{Placement, Scheme};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// How long one command may take before its connection is dropped (a server that went away).
const COMMAND_TIMEOUT: Duration = Duration::from_secs(2);

/// What the reader did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub hits: u64,
    pub misses: u64,
    /// Commands that failed (no connection, a closed one, a timeout), and reads while no server was
    /// published: the key is skipped.
    pub errors: u64,
}

impl Counts {
    /// What was done since `earlier` (a snapshot of the same reader).
    pub fn since(self, earlier: Counts) -> Counts {
        Counts {
            hits: self.hits - earlier.hits,
            misses: self.misses - earlier.misses,
            errors: self.errors - earlier.errors,
        }
    }

    /// Hits among gets that got an answer, `None` without any.
    pub fn hit_ratio(self) -> Option<f64> {
        let gets = self.hits + self.misses;
        (gets > 0).then(|| self.hits as f64 / gets as f64)
    }
}

/// A value of `len` bytes for `key`: readable in a server's dump and the same on every set.
pub fn value_of(key: &str, len: usize) -> Vec<u8> {
    key.bytes().cycle().take(len).collect()
}

/// The reader: the placement over the list it last read, open connections by published entry, and its
/// counts.
pub struct Reader {
    scheme: Scheme,
    placement: Option<Placement>,
    connections: HashMap<String, BufReader<TcpStream>>,
    pub counts: Counts,
}

impl Reader {
    /// A reader that places keys under `scheme`, with no list yet.
    pub fn new(scheme: Scheme) -> Self {
        Self {
            scheme,
            placement: None,
            connections: HashMap::new(),
            counts: Counts::default(),
        }
    }

    /// Takes `servers` (the published entries, in slot order) as the list, rebuilding the placement if it
    /// changed and dropping the connections to servers no longer in it; whether it changed. An entry that
    /// is not `host:port` (which the operator never publishes) leaves the list as it was.
    pub fn follow(&mut self, servers: &[String]) -> bool {
        if self.servers() == servers {
            return false;
        }
        let Ok(placement) = Placement::new(self.scheme, servers) else {
            return false;
        };
        self.connections
            .retain(|entry, _| servers.iter().any(|s| s == entry));
        self.placement = Some(placement);
        true
    }

    /// The list the reader follows.
    pub fn servers(&self) -> &[String] {
        self.placement.as_ref().map_or(&[], Placement::servers)
    }

    /// The published entry `key` is read from, `None` while the list is empty.
    pub fn server_of(&self, key: &str) -> Option<&str> {
        let placement = self.placement.as_ref()?;
        let index = placement.server(key.as_bytes())?;
        Some(placement.servers()[index].as_str())
    }

    /// Gets `key` from its server, and sets it (`value_len` bytes, no expiry) when missing.
    pub async fn read_through(&mut self, key: &str, value_len: usize) {
        let Some(server) = self.server_of(key).map(str::to_owned) else {
            self.counts.errors += 1;
            return;
        };
        let result =
            tokio::time::timeout(COMMAND_TIMEOUT, self.get_or_set(&server, key, value_len)).await;
        match result {
            Ok(Ok(true)) => self.counts.hits += 1,
            Ok(Ok(false)) => self.counts.misses += 1,
            Ok(Err(_)) | Err(_) => {
                self.counts.errors += 1;
                self.connections.remove(&server);
            }
        }
    }

    async fn get_or_set(
        &mut self,
        server: &str,
        key: &str,
        value_len: usize,
    ) -> std::io::Result<bool> {
        let conn = match self.connections.entry(server.to_owned()) {
            std::collections::hash_map::Entry::Occupied(entry) => entry.into_mut(),
            std::collections::hash_map::Entry::Vacant(entry) => {
                entry.insert(BufReader::new(TcpStream::connect(server).await?))
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

    fn list(hosts: &[&str]) -> Vec<String> {
        hosts.iter().map(|h| format!("{h}:11211")).collect()
    }

    #[test]
    fn the_reader_places_keys_as_the_declared_hashing_does_over_the_list_it_follows() {
        let mut reader = Reader::new(Scheme::Ketama);
        assert_eq!(reader.server_of("key"), None, "no list yet");
        let three = list(&["10.0.0.1", "10.0.0.2", "10.0.0.3"]);
        assert!(reader.follow(&three));
        assert!(!reader.follow(&three), "the same list again is no change");
        let ketama = Placement::new(Scheme::Ketama, &three).unwrap();
        for i in 0..200 {
            let key = format!("key-{i:06}");
            let index = ketama.server(key.as_bytes()).unwrap();
            assert_eq!(reader.server_of(&key), Some(three[index].as_str()), "{key}");
        }
    }

    #[test]
    fn a_replaced_address_moves_keys_under_ketama_and_the_reader_follows() {
        let mut reader = Reader::new(Scheme::Ketama);
        let before = list(&["10.0.0.1", "10.0.0.2", "10.0.0.3"]);
        let after = list(&["10.0.0.1", "10.0.0.9", "10.0.0.3"]);
        reader.follow(&before);
        let keys: Vec<String> = (0..1000).map(|i| format!("key-{i:06}")).collect();
        let old: Vec<String> = keys
            .iter()
            .map(|k| reader.server_of(k).unwrap().to_owned())
            .collect();
        assert!(reader.follow(&after));
        assert_eq!(reader.servers(), after.as_slice());
        let moved = keys
            .iter()
            .zip(&old)
            .filter(|(k, was)| reader.server_of(k) != Some(was.as_str()))
            .count();
        // The old address's keys all move; the new one takes its own share from every server.
        assert!((300..900).contains(&moved), "{moved} of 1000 keys moved");
        assert!(!reader.follow(&["no port".to_owned()]), "not host:port");
        assert_eq!(reader.servers(), after.as_slice());
    }

    #[test]
    fn counts_since_a_snapshot_and_their_hit_ratio() {
        let earlier = Counts {
            hits: 10,
            misses: 5,
            errors: 1,
        };
        let now = Counts {
            hits: 40,
            misses: 15,
            errors: 1,
        };
        let step = now.since(earlier);
        assert_eq!((step.hits, step.misses, step.errors), (30, 10, 0));
        assert_eq!(step.hit_ratio(), Some(0.75));
        assert_eq!(Counts::default().hit_ratio(), None);
    }

    #[test]
    fn values_have_the_asked_length() {
        assert_eq!(value_of("ab", 5), b"ababa");
        assert_eq!(value_of("key-1", 100).len(), 100);
    }
}
