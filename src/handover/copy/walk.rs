//! The copy itself: the dump (`lru_crawler metadump all`) read from one source connection, each batch of keys fetched on a second
//! (`mg`) and stored on the target (`ms` in add mode), a batch at a time. The same engine runs the sweep
//! that follows ([`Pass::Sweep`], in [`sweep`](super::sweep)): the hash table's dump, each batch first looked up on the
//! target, only what it lacks fetched once the dump ended.
//!
//! Each batch is written whole, then its answers are read in order (memcached answers pipelined requests
//! in order), so a copy costs two round trips per batch, not per item.
//!
//! What the source answers is the tenant's (its own image): nothing it sends makes the copy hold more than
//! [`COPY_MEMORY_BOUND`](crate::handover::bounds::COPY_MEMORY_BOUND). A copy holds at any time:
//! - one line, at most [`MAX_LINE_BYTES`] (a dump's) or [`LINE_REPLY_LIMIT`] (an answer's);
//! - one batch's keys (at most [`Settings::batch_items`] of at most `wire::MAX_KEY_BYTES`) and values:
//!   a value is read into memory only when it is no larger than the size the dump listed for it (a
//!   larger answer is read past in small pieces and counted skipped), and a batch lists at most
//!   [`Settings::batch_bytes`] (1 MiB) plus one item of at most [`MAX_VALUE_BYTES`] and its
//!   `LISTED_OVERHEAD`: 9 MiB;
//! - a sweep's kept keys, at most `sweep::MAX_KEPT_KEY_BYTES` and `sweep::MAX_KEPT_KEYS` entries: 5 MiB
//!   (`sweep::MAX_KEPT_BYTES`);
//! - its output buffers (the batch's requests, [`WRITE_CHUNK`] of stores) and three connections' read
//!   buffers (with TLS, theirs): under 1 MiB.
//!
//! That is under 15 MiB; `tests/handover_hostile.rs` measures it against a hostile server.

use std::time::Instant;

use tokio::io::AsyncReadExt;

use crate::connection::{self, LINE_REPLY_LIMIT, Target};
use crate::handover::bounds::{KeyFilter, MAX_VALUE_BYTES, Settings};
use crate::handover::dump::{self, DumpItem, DumpLine, MAX_LINE_BYTES};
use crate::handover::error::{CopyError, Side};
use crate::handover::progress::Progress;
use crate::handover::rate::TokenBucket;

use super::conn::{Conn, bounded, link, open, read_line, send, server_time};
use super::wire::{WireKey, parse_value_header};

/// memcached reads an expiry time above 30 days as a unix time rather than a number of seconds.
const RELATIVE_TTL_LIMIT: i64 = 60 * 60 * 24 * 30;
/// What a dump's `size` counts besides the value: the item header, key, suffix and CAS (a generous bound).
const LISTED_OVERHEAD: usize = 1024;
/// Stored commands are gathered up to this many bytes before a write.
const WRITE_CHUNK: usize = 64 * 1024;
/// The longest the rate limit should hold the copy between two reads of the dump.
///
/// While the dump's socket is full, memcached's crawler waits for it to drain in polls of one second, and
/// a poll that times out after part of its buffer went out makes it send that part again (crawler.c,
/// `lru_crawler_write`): a garbled dump. So the dump must be read at least every second, and a batch
/// holds no more bytes than the rate lets through in a quarter of one.
const MAX_RATE_WAIT_DIVISOR: u64 = 4;
/// The smallest batch, in listed bytes, whatever the rate: a few small items.
const MIN_BATCH_BYTES: u64 = 4096;

/// The listed bytes a batch may hold: the configured bound, smaller at low rates so the rate limit never
/// holds the dump unread for long (see [`MAX_RATE_WAIT_DIVISOR`]).
fn batch_bytes(settings: &Settings) -> u64 {
    let per_wait = (settings.max_bytes_per_second / MAX_RATE_WAIT_DIVISOR).max(MIN_BATCH_BYTES);
    settings.batch_bytes.min(per_wait)
}

/// One fetched item of a batch: where its value lies in the batch's value buffer.
struct Fetched {
    key: usize,
    flags: u32,
    /// The `T` to store with: `None` for an item that never expires.
    ttl: Option<i64>,
    value: std::ops::Range<usize>,
}

/// The open connections and reused buffers of one copy.
pub(crate) struct Copy<'a> {
    pub(super) settings: &'a Settings,
    progress: &'a Progress,
    filter: Option<&'a KeyFilter>,
    /// A sweep ([`Pass::Sweep`]): only keys the target does not hold are fetched.
    pub(super) pass: Pass,
    dump: Conn,
    fetch: Conn,
    store: Conn,
    /// The source's clock when the copy started, and when that was by the operator's monotonic clock.
    source_time: (i64, Instant),
    target_time: (i64, Instant),
    bucket: TokenBucket,
    pub(super) batch_bytes: u64,
    pub(super) keys: Vec<WireKey>,
    /// The listed size of each of `keys`.
    pub(super) sizes: Vec<u64>,
    key_bytes: u64,
    values: Vec<u8>,
    fetched: Vec<Fetched>,
    line: Vec<u8>,
    out: Vec<u8>,
}

/// Which walk of the source a copy is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Pass {
    /// The copy proper: every listed item the filter selects is fetched and stored.
    Walk,
    /// A second walk after the first, for the items the first did not list (written to the source after
    /// the walk passed them, or moved between LRUs as it passed): a walk of the hash table, whose keys are
    /// looked up on the target (`mg <key> u`, no value); those it does not hold are fetched and stored
    /// once the dump ended ([`sweep`]).
    Sweep,
}

/// How a walk ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Walked {
    /// Every item the dump listed was seen to.
    Whole,
    /// A sweep found more missing keys than it holds at once: it copied those, another sweep finds the
    /// rest.
    Capped,
}

/// Empties `target` (`flush_all`), so that it holds only what the copy brings: a StatefulSet rollout's
/// spare server holds one server's items at a time (see `handover::plan::spare`).
pub(crate) async fn flush(settings: &Settings, target: &Target) -> Result<(), CopyError> {
    let mut conn = open(settings, Side::Target, target).await?;
    bounded(settings, Side::Target, async {
        send(&mut conn, Side::Target, b"flush_all\r\n").await?;
        let mut line = Vec::with_capacity(16);
        read_line(&mut conn, Side::Target, &mut line, LINE_REPLY_LIMIT).await?;
        if line == b"OK\r\n" {
            Ok(())
        } else {
            Err(CopyError::Protocol {
                side: Side::Target,
                answer: connection::shown(&line),
            })
        }
    })
    .await
}

fn elapsed_secs(since: Instant) -> i64 {
    i64::try_from(since.elapsed().as_secs()).unwrap_or(i64::MAX)
}

impl<'a> Copy<'a> {
    /// Opens the three connections (the target's first, so a target that cannot be reached fails before
    /// the source is asked for anything), reads both clocks and starts the dump.
    pub(crate) async fn start(
        source: &Target,
        target: &Target,
        settings: &'a Settings,
        progress: &'a Progress,
        filter: Option<&'a KeyFilter>,
        pass: Pass,
    ) -> Result<Self, CopyError> {
        let mut line = Vec::with_capacity(256);
        let mut store = open(settings, Side::Target, target).await?;
        let target_time = bounded(
            settings,
            Side::Target,
            server_time(&mut store, Side::Target, &mut line),
        )
        .await?;
        let target_time = (target_time, Instant::now());
        let fetch = open(settings, Side::Source, source).await?;
        let mut dump = open(settings, Side::Source, source).await?;
        let source_time = bounded(settings, Side::Source, async {
            let time = server_time(&mut dump, Side::Source, &mut line).await?;
            // The first walk goes through the LRUs, fetching as it goes: before 1.6.19 the hash walk
            // holds an item lock while it waits for the dump to be read, which the copy's own fetches
            // wait for (a copy of 102 400 items against 1.6.18 stalled after 3 840). The LRU walk
            // misses items the server moves between LRUs as it walks: 7 of 102 400 in that copy, but
            // right after a burst of reads 60 % of a server's items, dump after dump (1.6.18, 2 658 of
            // 6 648 listed). The sweep walks the hash table (1.6.9+), which lists every item, and
            // fetches only after its dump ended ([`sweep`]). Sent alone: memcached refuses a metadump
            // pipelined behind other commands.
            let command: &[u8] = match pass {
                Pass::Walk => b"lru_crawler metadump all\r\n",
                Pass::Sweep => b"lru_crawler metadump hash\r\n",
            };
            send(&mut dump, Side::Source, command).await?;
            Ok(time)
        })
        .await?;
        Ok(Self {
            settings,
            progress,
            filter,
            pass,
            dump,
            fetch,
            store,
            source_time: (source_time, Instant::now()),
            target_time,
            bucket: TokenBucket::new(settings.max_bytes_per_second),
            batch_bytes: batch_bytes(settings),
            keys: Vec::with_capacity(settings.batch_items),
            sizes: Vec::with_capacity(settings.batch_items),
            key_bytes: 0,
            values: Vec::new(),
            fetched: Vec::with_capacity(settings.batch_items),
            line,
            out: Vec::with_capacity(WRITE_CHUNK),
        })
    }

    /// Walks the source: the copy proper, or the sweep.
    pub(crate) async fn run(self) -> Result<Walked, CopyError> {
        match self.pass {
            Pass::Walk => self.stream().await.map(|()| Walked::Whole),
            Pass::Sweep => self.sweep().await,
        }
    }

    /// Copies batch after batch until the dump's end.
    async fn stream(mut self) -> Result<(), CopyError> {
        loop {
            let more = self.fill().await?;
            if !self.keys.is_empty() {
                self.fetch_batch().await?;
                self.store_batch().await?;
            }
            if !more {
                return Ok(());
            }
        }
    }

    /// Reads dump lines into the batch until it is full (by items or by bytes); `false` at the dump's end.
    pub(crate) async fn fill(&mut self) -> Result<bool, CopyError> {
        self.keys.clear();
        self.sizes.clear();
        self.key_bytes = 0;
        while self.keys.len() < self.settings.batch_items && self.key_bytes < self.batch_bytes {
            bounded(
                self.settings,
                Side::Source,
                read_line(&mut self.dump, Side::Source, &mut self.line, MAX_LINE_BYTES),
            )
            .await?;
            self.progress.read(self.line.len() as u64);
            let item = match dump::parse_line(&self.line)? {
                DumpLine::End => return Ok(false),
                DumpLine::Item(item) => item,
            };
            self.admit(item);
        }
        Ok(true)
    }

    /// Counts an item the copy skips, or adds it to the batch.
    fn admit(&mut self, item: DumpItem) {
        let now = self.source_time.0 + elapsed_secs(self.source_time.1);
        if item.expired_at(now) {
            self.progress.expired();
        } else if self.filter.is_some_and(|filter| !filter(&item.key)) {
            self.progress.filtered();
        } else {
            match WireKey::of(&item.key) {
                // The listed size counts the item's header and key too: a value of at most
                // MAX_VALUE_BYTES may list a little more, and is checked again when fetched.
                Some(key) if item.size <= (MAX_VALUE_BYTES + LISTED_OVERHEAD) as u64 => {
                    self.keys.push(key);
                    self.sizes.push(item.size);
                    self.key_bytes += item.size;
                }
                _ => self.progress.skipped(),
            }
        }
    }

    /// Keeps in the batch only the keys the target does not hold: one pipelined `mg <key> u` each (no
    /// value; `HD` held, `EN` not; `u` leaves the target's LRU as it was).
    pub(crate) async fn keep_missing(&mut self) -> Result<(), CopyError> {
        self.out.clear();
        for key in &self.keys {
            self.out.extend_from_slice(b"mg ");
            self.out.extend_from_slice(&key.text);
            self.out
                .extend_from_slice(if key.base64 { b" b u\r\n" } else { b" u\r\n" });
        }
        let mut missing = Vec::with_capacity(self.keys.len());
        let (conn, out, line) = (&mut self.store, &self.out, &mut self.line);
        let count = self.keys.len();
        bounded(self.settings, Side::Target, async {
            send(conn, Side::Target, out).await?;
            for _ in 0..count {
                read_line(conn, Side::Target, line, LINE_REPLY_LIMIT).await?;
                missing.push(match line.as_slice() {
                    b"HD\r\n" => false,
                    b"EN\r\n" => true,
                    _ => {
                        return Err(CopyError::Protocol {
                            side: Side::Target,
                            answer: connection::shown(line),
                        });
                    }
                });
            }
            Ok(())
        })
        .await?;
        let mut keep = missing.iter();
        self.keys.retain(|_| keep.next().copied().unwrap_or(false));
        let mut keep = missing.iter();
        self.sizes.retain(|_| keep.next().copied().unwrap_or(false));
        Ok(())
    }

    /// Fetches the batch's keys from the source: value, client flags and remaining TTL of each. With `u`:
    /// the copy's reads leave each item where the source's LRU had it, neither bumped nor marked as hit,
    /// so a source that keeps serving (a scale-up's) does not take every copied item for a hot one.
    pub(crate) async fn fetch_batch(&mut self) -> Result<(), CopyError> {
        self.out.clear();
        for key in &self.keys {
            self.out.extend_from_slice(b"mg ");
            self.out.extend_from_slice(&key.text);
            self.out.extend_from_slice(if key.base64 {
                b" b v f t u\r\n"
            } else {
                b" v f t u\r\n"
            });
        }
        self.values.clear();
        self.fetched.clear();
        // Every value read is at most its listed size (with its CRLF): the batch's listed bytes are room
        // enough, reserved at once so the buffer never grows past them.
        let listed: u64 = self.sizes.iter().sum();
        self.values
            .reserve_exact(usize::try_from(listed).unwrap_or(usize::MAX));
        let settings = self.settings;
        let (conn, out, line, sizes) = (&mut self.fetch, &self.out, &mut self.line, &self.sizes);
        let (values, fetched, progress) = (&mut self.values, &mut self.fetched, self.progress);
        bounded(settings, Side::Source, async move {
            send(conn, Side::Source, out).await?;
            for (key, &listed) in sizes.iter().enumerate() {
                read_line(conn, Side::Source, line, LINE_REPLY_LIMIT).await?;
                progress.read(line.len() as u64);
                if line == b"EN\r\n" {
                    progress.vanished();
                    continue;
                }
                let header = parse_value_header(line).ok_or_else(|| CopyError::Protocol {
                    side: Side::Source,
                    answer: connection::shown(line),
                })?;
                let value = header.length as u64 + 2;
                if header.length > MAX_VALUE_BYTES || value > listed {
                    // Larger than the copy takes, or than the dump listed (memcached's listed size
                    // counts the value, its CRLF and the item's header: an item rewritten larger since,
                    // or a server that is not memcached): read past in small pieces, never held.
                    let drained =
                        tokio::io::copy(&mut (&mut *conn).take(value), &mut tokio::io::sink())
                            .await
                            .map_err(link(Side::Source))?;
                    progress.read(drained);
                    if drained < value {
                        return Err(CopyError::Link {
                            side: Side::Source,
                            error: connection::LinkError::Closed,
                        });
                    }
                    progress.skipped();
                    continue;
                }
                let start = values.len();
                let end = start + header.length;
                values.resize(end + 2, 0);
                conn.read_exact(&mut values[start..])
                    .await
                    .map_err(link(Side::Source))?;
                progress.read(value);
                if !values.ends_with(b"\r\n") {
                    return Err(CopyError::Protocol {
                        side: Side::Source,
                        answer: "a value not ended by CRLF".to_owned(),
                    });
                }
                values.truncate(end);
                match header.ttl {
                    // Gone by the server's clock as it answered: nothing to copy.
                    Some(ttl) if ttl <= 0 => progress.expired(),
                    ttl => fetched.push(Fetched {
                        key,
                        flags: header.flags,
                        ttl,
                        value: start..end,
                    }),
                }
            }
            Ok(())
        })
        .await
    }

    /// Stores the fetched items on the target in add mode, at the rate limit.
    pub(crate) async fn store_batch(&mut self) -> Result<(), CopyError> {
        if self.fetched.is_empty() {
            return Ok(());
        }
        let wait = self
            .bucket
            .take_at(self.values.len() as u64, tokio::time::Instant::now());
        if !wait.is_zero() {
            self.progress.paced(wait);
            tokio::time::sleep(wait).await;
        }
        let target_now = self.target_time.0 + elapsed_secs(self.target_time.1);
        let settings = self.settings;
        let (conn, out, line) = (&mut self.store, &mut self.out, &mut self.line);
        let (keys, values, fetched) = (&self.keys, &self.values, &self.fetched);
        let progress = self.progress;
        let result = bounded(settings, Side::Target, async move {
            out.clear();
            for item in fetched {
                let (key, value) = (&keys[item.key], &values[item.value.clone()]);
                out.extend_from_slice(b"ms ");
                out.extend_from_slice(&key.text);
                let base64 = if key.base64 { " b" } else { "" };
                out.extend_from_slice(
                    format!(" {}{base64} F{}", value.len(), item.flags).as_bytes(),
                );
                if let Some(ttl) = item.ttl {
                    // A remaining TTL above 30 days only reads as seconds when given as a unix time.
                    let ttl = if ttl > RELATIVE_TTL_LIMIT {
                        target_now + ttl
                    } else {
                        ttl
                    };
                    out.extend_from_slice(format!(" T{ttl}").as_bytes());
                }
                // Mode E: add. A key the target already holds was written by a client since: kept.
                out.extend_from_slice(b" ME\r\n");
                if value.len() >= WRITE_CHUNK {
                    send(conn, Side::Target, out).await?;
                    out.clear();
                    send(conn, Side::Target, value).await?;
                } else {
                    out.extend_from_slice(value);
                }
                out.extend_from_slice(b"\r\n");
                if out.len() >= WRITE_CHUNK {
                    send(conn, Side::Target, out).await?;
                    out.clear();
                }
            }
            send(conn, Side::Target, out).await?;
            for item in fetched {
                read_line(conn, Side::Target, line, LINE_REPLY_LIMIT).await?;
                match line.as_slice() {
                    b"HD\r\n" => progress.copied(item.value.len() as u64),
                    b"NS\r\n" => progress.existing(),
                    _ => {
                        return Err(CopyError::Protocol {
                            side: Side::Target,
                            answer: connection::shown(line),
                        });
                    }
                }
            }
            Ok(())
        })
        .await;
        // One item larger than a batch grows the buffer: give the excess back.
        let bound = usize::try_from(self.batch_bytes.saturating_mul(2)).unwrap_or(usize::MAX);
        if self.values.capacity() > bound {
            self.values = Vec::new();
        }
        result
    }
}

#[cfg(test)]
mod tests;
