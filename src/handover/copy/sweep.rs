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
//! What is kept is bounded by [`MAX_MISSING_KEY_BYTES`]: past it the rest of the dump is read and
//! dropped, the kept keys are copied, and the walk ends [`Walked::Capped`], so that the engine sweeps
//! again (the target then holds what this one copied).

use super::{Copy, CopyError, Pass, Walked, WireKey};

/// The most key bytes a sweep keeps before it copies them (about 33 000 keys of the longest length).
pub(super) const MAX_MISSING_KEY_BYTES: usize = 8 << 20;

impl Copy<'_> {
    /// Reads the whole dump, keeping the keys the target lacks, then copies them.
    pub(super) async fn sweep(mut self) -> Result<Walked, CopyError> {
        debug_assert_eq!(self.pass, Pass::Sweep);
        let mut missing: Vec<(WireKey, u64)> = Vec::new();
        let mut kept_bytes = 0;
        let mut walked = Walked::Whole;
        loop {
            let more = self.fill().await?;
            if walked == Walked::Whole && !self.keys.is_empty() {
                self.keep_missing().await?;
                for (key, size) in self.keys.drain(..).zip(self.sizes.drain(..)) {
                    kept_bytes += key.text.len();
                    missing.push((key, size));
                }
                if kept_bytes >= MAX_MISSING_KEY_BYTES {
                    walked = Walked::Capped;
                }
            }
            if !more {
                break;
            }
        }
        // The dump has ended: the source's items are free to fetch.
        self.copy_kept(missing).await?;
        Ok(walked)
    }

    /// Fetches and stores `kept` (keys with their listed sizes), in batches of at most the settings' items
    /// and the batch's listed bytes.
    async fn copy_kept(&mut self, kept: Vec<(WireKey, u64)>) -> Result<(), CopyError> {
        let mut rest = kept.into_iter().peekable();
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
