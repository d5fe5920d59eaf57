//! The sweep ([`Pass::Sweep`]): a second walk of the source, through its hash table
//! (`lru_crawler metadump hash`), for the items the first walk (through the LRUs) did not list.
//!
//! Its dump is read to the end before anything is fetched from the source: memcached before 1.6.19 holds
//! an item lock while it waits for the dump to be read, and a fetch of a key under that lock would wait
//! for the dump, which would wait for the fetch. Each batch of listed keys is looked up on the target as
//! the dump goes (another server: no lock of the source's), and the keys the target lacks are kept, with
//! their listed sizes, until the dump ends; then they are fetched and stored a batch at a time, within
//! the batch bounds of the first walk.
//!
//! What is kept is bounded, in key bytes ([`MAX_KEPT_KEY_BYTES`]) and in keys ([`MAX_KEPT_KEYS`]), so
//! that a dump that lists keys without end (a server that is not memcached) cannot grow it: past either
//! bound the rest of the dump is read and dropped, the kept keys are copied, and the walk ends
//! [`Walked::Capped`], so that the engine sweeps again (the target then holds what this one copied), at
//! most `MAX_SWEEPS` times and within the copy's time bound.

use super::walk::{Copy, Pass, Walked};
use super::wire::WireKey;
use crate::handover::error::CopyError;

/// The most key bytes a sweep keeps before it copies them (16 000 keys of the longest length).
pub(super) const MAX_KEPT_KEY_BYTES: usize = 4 << 20;
/// The most keys a sweep keeps before it copies them; each costs [`KeptKey`]'s 16 bytes besides its
/// text, so what a sweep keeps stays within 5 MiB.
pub(super) const MAX_KEPT_KEYS: usize = 64 * 1024;
/// The most a sweep keeps, capacity included.
#[cfg(test)]
pub(super) const MAX_KEPT_BYTES: usize =
    MAX_KEPT_KEY_BYTES + MAX_KEPT_KEYS * std::mem::size_of::<KeptKey>();

/// The keys a sweep keeps until its dump ends: their texts one after the other, and for each where it
/// ends, whether it is base64 and its listed size. Never more than its bounds, its capacity included.
#[derive(Debug, Default)]
pub(super) struct Kept {
    text: Vec<u8>,
    keys: Vec<KeptKey>,
}

#[derive(Debug)]
struct KeptKey {
    end: u32,
    base64: bool,
    size: u64,
}

/// Makes room in `vec` for `more`, doubling as a `Vec` does but never past `most` (or what is needed).
fn room<T>(vec: &mut Vec<T>, more: usize, most: usize) {
    let needed = vec.len() + more;
    if needed > vec.capacity() {
        let grown = (vec.capacity() * 2).clamp(needed, most.max(needed));
        vec.reserve_exact(grown - vec.len());
    }
}

impl Kept {
    /// Keeps `key` unless a bound is reached: whether it was kept.
    pub(super) fn keep(&mut self, key: &WireKey, size: u64) -> bool {
        let end = self.text.len() + key.text.len();
        if self.keys.len() >= MAX_KEPT_KEYS || end > MAX_KEPT_KEY_BYTES {
            return false;
        }
        room(&mut self.text, key.text.len(), MAX_KEPT_KEY_BYTES);
        room(&mut self.keys, 1, MAX_KEPT_KEYS);
        self.text.extend_from_slice(&key.text);
        self.keys.push(KeptKey {
            // Within MAX_KEPT_KEY_BYTES.
            end: end as u32,
            base64: key.base64,
            size,
        });
        true
    }

    /// The kept keys with their listed sizes, in the order kept.
    fn iter(&self) -> impl Iterator<Item = (WireKey, u64)> + '_ {
        let starts = std::iter::once(0).chain(self.keys.iter().map(|k| k.end as usize));
        starts.zip(&self.keys).map(|(start, key)| {
            let text = self.text[start..key.end as usize].to_vec();
            let wire = WireKey {
                text,
                base64: key.base64,
            };
            (wire, key.size)
        })
    }

    /// The bytes held, capacity included.
    #[cfg(test)]
    fn held(&self) -> usize {
        self.text.capacity() + self.keys.capacity() * std::mem::size_of::<KeptKey>()
    }
}

impl Copy<'_> {
    /// Reads the whole dump, keeping the keys the target lacks, then copies them.
    pub(super) async fn sweep(mut self) -> Result<Walked, CopyError> {
        debug_assert_eq!(self.pass, Pass::Sweep);
        let mut kept = Kept::default();
        let mut walked = Walked::Whole;
        loop {
            let more = self.fill().await?;
            if walked == Walked::Whole && !self.keys.is_empty() {
                self.keep_missing().await?;
                for (key, &size) in self.keys.iter().zip(&self.sizes) {
                    if !kept.keep(key, size) {
                        walked = Walked::Capped;
                        break;
                    }
                }
            }
            if !more {
                break;
            }
        }
        // The dump has ended: the source's items are free to fetch.
        self.copy_kept(&kept).await?;
        Ok(walked)
    }

    /// Fetches and stores `kept` (keys with their listed sizes), in batches of at most the settings' items
    /// and the batch's listed bytes.
    async fn copy_kept(&mut self, kept: &Kept) -> Result<(), CopyError> {
        let mut rest = kept.iter().peekable();
        while rest.peek().is_some() {
            self.keys.clear();
            self.sizes.clear();
            let mut bytes = 0;
            while self.keys.len() < self.settings.batch_items && bytes < self.batch_bytes {
                let Some((key, size)) = rest.next() else {
                    break;
                };
                bytes += size;
                self.keys.push(key);
                self.sizes.push(size);
            }
            self.fetch_batch().await?;
            self.store_batch().await?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(text: &[u8]) -> WireKey {
        WireKey {
            text: text.to_vec(),
            base64: false,
        }
    }

    #[test]
    fn kept_keys_come_back_as_kept() {
        let mut kept = Kept::default();
        assert!(kept.keep(&key(b"a"), 10));
        let long = WireKey {
            text: vec![b'b'; 250],
            base64: true,
        };
        assert!(kept.keep(&long, 20));
        let back: Vec<(WireKey, u64)> = kept.iter().collect();
        assert_eq!(back, vec![(key(b"a"), 10), (long, 20)]);
    }

    #[test]
    fn one_byte_keys_stop_at_the_count_and_long_ones_at_the_bytes_capacity_included() {
        let mut kept = Kept::default();
        let taken = (0..MAX_KEPT_KEYS + 10)
            .take_while(|_| kept.keep(&key(b"k"), 1))
            .count();
        assert_eq!(taken, MAX_KEPT_KEYS);
        assert!(kept.held() <= MAX_KEPT_KEYS * (1 + std::mem::size_of::<KeptKey>()));
        let mut kept = Kept::default();
        let longest = key(&[b'k'; 250]);
        let taken = (0..MAX_KEPT_KEYS)
            .take_while(|_| kept.keep(&longest, 1))
            .count();
        assert_eq!(taken, MAX_KEPT_KEY_BYTES / 250);
        assert!(kept.held() <= MAX_KEPT_BYTES, "{}", kept.held());
        assert_eq!(MAX_KEPT_BYTES, 5 << 20);
    }
}
