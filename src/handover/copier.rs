//! One copy from one source server to one target server ([`Copier`]), within its bounds ([`Settings`]):
//! the engine under every warm handover, whatever planned it.

use std::sync::Arc;
use std::time::Duration;

use super::bounds::{KeyFilter, Settings};
use super::copy;
use super::error::{CopyError, Failure};
use super::progress::{Progress, Snapshot};
use crate::connection::Target;

/// A dump the source refused with `BUSY` is asked for again after this pause ...
const BUSY_PAUSE: Duration = Duration::from_millis(250);
/// ... at most this many times in a row (10 s).
const BUSY_RETRIES: usize = 40;
/// The most sweeps after a copy: one, and more only while each found more missing keys than it holds at
/// once (see `copy::Walked::Capped`).
const MAX_SWEEPS: usize = 16;

/// One copy from a source server to a target server: build it, keep its [`Copier::progress`] to watch,
/// then await [`Copier::run`] (or spawn it; dropping the future cancels it).
pub struct Copier {
    source: Target,
    target: Target,
    settings: Settings,
    filter: Option<KeyFilter>,
    /// Whether the target is emptied first ([`Copier::emptying_target`]).
    empty_target: bool,
    progress: Arc<Progress>,
}

impl Copier {
    /// Copies every live item of `source` to `target`.
    pub fn new(source: Target, target: Target, settings: Settings) -> Self {
        Self {
            source,
            target,
            settings,
            filter: None,
            empty_target: false,
            progress: Arc::default(),
        }
    }

    /// Copies only the items whose key `filter` selects.
    pub fn only(mut self, filter: KeyFilter) -> Self {
        self.filter = Some(filter);
        self
    }

    /// Empties the target (`flush_all`) before copying, within the copy's time bound: for a target that
    /// is the operator's own server (a StatefulSet rollout's spare), which no client uses.
    pub fn emptying_target(mut self) -> Self {
        self.empty_target = true;
        self
    }

    /// The live counters, readable while the copy runs.
    pub fn progress(&self) -> Arc<Progress> {
        self.progress.clone()
    }

    /// Copies, within the time bound: the final counts, or why it stopped and how far it got.
    ///
    /// Two walks of the source: the copy proper, then a sweep ([`copy::Pass::Sweep`]) that stores what
    /// the first walk did not list and the target does not hold, within the time the first left (more
    /// sweeps while one finds more than it holds at once). The sweep only adds: when it fails or runs out
    /// of time, the first walk's copy stands and the reason is logged.
    #[tracing::instrument(
        name = "copy",
        skip_all,
        fields(source = %self.source.address, target = %self.target.address)
    )]
    pub async fn run(self) -> Result<Snapshot, Failure> {
        self.progress.start();
        let started = tokio::time::Instant::now();
        let walk = async {
            if self.empty_target {
                copy::flush(&self.settings, &self.target).await?;
            }
            self.walk(&self.progress, copy::Pass::Walk).await.map(drop)
        };
        let result = tokio::time::timeout(self.settings.timeout, walk)
            .await
            .unwrap_or(Err(CopyError::Timeout(self.settings.timeout)));
        if let Err(error) = result {
            let progress = self.progress.snapshot();
            return Err(Failure { error, progress });
        }
        for _ in 0..MAX_SWEEPS {
            let left = self.settings.timeout.saturating_sub(started.elapsed());
            if self.sweep(left).await != Some(copy::Walked::Capped) {
                break;
            }
        }
        Ok(self.progress.snapshot())
    }

    /// One walk of the source, started again while the source answers `BUSY` (memcached runs one
    /// `lru_crawler` crawl at a time: another copy's dump of the same server is ending).
    async fn walk(&self, progress: &Progress, pass: copy::Pass) -> Result<copy::Walked, CopyError> {
        tokio::select! {
            walked = self.walk_source(progress, pass) => walked,
            slow = at_least_the_minimum_rate(&self.settings, progress) => Err(slow),
        }
    }

    async fn walk_source(
        &self,
        progress: &Progress,
        pass: copy::Pass,
    ) -> Result<copy::Walked, CopyError> {
        let mut refused = 0;
        loop {
            let started = copy::Copy::start(
                &self.source,
                &self.target,
                &self.settings,
                progress,
                self.filter.as_ref(),
                pass,
            )
            .await;
            let result = match started {
                Ok(copy) => copy.run().await,
                Err(error) => Err(error),
            };
            match result {
                Err(error) if error.source_busy() && refused < BUSY_RETRIES => {
                    refused += 1;
                    tokio::time::sleep(BUSY_PAUSE).await;
                }
                other => return other,
            }
        }
    }

    /// A sweep, within `left`: its items count as copied; its own counts of what it skipped (items the
    /// first walk counted already) are dropped. How it ended, when it did.
    async fn sweep(&self, left: Duration) -> Option<copy::Walked> {
        let found = Progress::default();
        let result = tokio::time::timeout(left, self.walk(&found, copy::Pass::Sweep)).await;
        let swept = found.snapshot();
        self.progress.add_copied(swept.copied, swept.bytes);
        let target = self.target.address;
        match result {
            Ok(Ok(walked)) => {
                if swept.copied > 0 {
                    tracing::info!(
                        %target, items = swept.copied,
                        "the sweep copied items the first walk of the source did not list"
                    );
                }
                Some(walked)
            }
            Ok(Err(error)) => {
                tracing::warn!(
                    %target, items = swept.copied, %error,
                    "the sweep after the copy stopped; the copy stands"
                );
                None
            }
            Err(_) => {
                tracing::warn!(
                    %target, items = swept.copied,
                    "the sweep after the copy ran out of the copy's time; the copy stands"
                );
                None
            }
        }
    }
}

/// Watches a walk's progress: ends, with why, when the source sent less than the minimum within a
/// window ([`Settings::min_bytes_per_window`]). The copy's own waits for its byte rate are not the
/// source's doing: a window they took half of is not judged (a wait is credited whole as it starts, and
/// each window uses a window's worth of the credit: a single long wait, a large item at a low rate, spans
/// several windows). The source cannot earn credit without sending: a wait is the time its bytes take at
/// the rate.
async fn at_least_the_minimum_rate(settings: &Settings, progress: &Progress) -> CopyError {
    let window = settings.progress_window;
    let mut last = progress.activity();
    let mut credit = Duration::ZERO;
    loop {
        tokio::time::sleep(window).await;
        let now = progress.activity();
        let read = now.read - last.read;
        credit += now.paced - last.paced;
        last = now;
        if read < settings.min_bytes_per_window && credit < window / 2 {
            return CopyError::Slow {
                read,
                min: settings.min_bytes_per_window,
                window,
            };
        }
        credit = credit.saturating_sub(window);
    }
}

/// A copy to a port nobody listens on, for the controller's tests: it ends at once with a refused
/// connection.
#[cfg(test)]
pub(crate) fn refused_copier() -> Copier {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    let address = closed.local_addr().expect("its address");
    drop(closed);
    Copier::new(
        Target::plain(address),
        Target::plain(address),
        Settings::default(),
    )
}
