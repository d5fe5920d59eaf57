//! One copy from one source server to one target server ([`Copier`]), within its bounds ([`Settings`]):
//! the engine under every warm handover, whatever planned it.

use std::sync::Arc;
use std::time::Duration;

use super::copy;
use super::error::{CopyError, Failure};
use super::progress::{Progress, Snapshot};
use crate::api::WarmHandover;
use crate::connection::Target;

/// A dump the source refused with `BUSY` is asked for again after this pause ...
const BUSY_PAUSE: Duration = Duration::from_millis(250);
/// ... at most this many times in a row (10 s).
const BUSY_RETRIES: usize = 40;
/// The most sweeps after a copy: one, and more only while each found more missing keys than it holds at
/// once (see `copy::Walked::Capped`).
const MAX_SWEEPS: usize = 16;

/// The largest value a copy takes (memcached's `-I` allows up to 1 GiB): larger items are skipped, so
/// what the operator holds stays within one batch plus this, whatever the servers' settings.
pub const MAX_VALUE_BYTES: usize = 8 * 1024 * 1024;

/// The most one copy holds in memory, whatever its servers answer: 16 MiB (so the operator's
/// [`MOST_COPIES`](super::tasks::MOST_COPIES) copies hold at most 48 MiB). See `copy` for what adds up to it.
pub const COPY_MEMORY_BOUND: usize = 16 << 20;

/// The minimum rate of a copy ([`Settings::min_bytes_per_window`]): 64 KiB from the source within 30 s.
pub const MIN_BYTES_PER_WINDOW: u64 = 64 * 1024;
pub const PROGRESS_WINDOW: Duration = Duration::from_secs(30);

/// Selects the keys a copy takes (a scale handover: the keys that move to the target under the
/// clients' hashing). Called once per item listed, with the raw key.
pub type KeyFilter = Arc<dyn Fn(&[u8]) -> bool + Send + Sync>;

/// The bounds of one copy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settings {
    /// Value bytes stored per second, at most.
    pub max_bytes_per_second: u64,
    /// The whole copy's time bound.
    pub timeout: Duration,
    /// The bound of each request: opening a connection (with TLS and authentication), one dump line, one
    /// batch's fetch, one batch's store.
    pub request_timeout: Duration,
    /// Keys per batch, at most.
    pub batch_items: usize,
    /// The listed sizes of a batch's items, at most (a single larger item makes a batch of its own):
    /// what bounds the values held in memory. Lowered at low rates, so that the rate limit never leaves
    /// the source's dump unread for more than a quarter second per batch (see `copy`).
    pub batch_bytes: u64,
    /// The minimum rate, as the bytes the source must send within each `progress_window` (dump lines,
    /// fetched values): a copy under it ends as too slow, giving its slot back, unless it spent most of
    /// the window waiting for its own byte rate ([`CopyError::Slow`]).
    pub min_bytes_per_window: u64,
    pub progress_window: Duration,
}

/// The request bound: long enough for a 1 MiB batch over a slow link, short enough that a server that
/// stopped answering is given up well within a copy's time bound.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// The default of `--handover-max-timeout-seconds`: the longest any copy may take, whatever its
/// instance's `spec.handover.timeoutSeconds` (which allows up to 3600): a tenant's copies give the
/// operator's shared copy slots back within ten minutes.
pub const DEFAULT_MAX_TIMEOUT_SECONDS: u64 = 600;

impl Default for Settings {
    fn default() -> Self {
        Self::from_spec(&WarmHandover::default(), DEFAULT_MAX_TIMEOUT_SECONDS)
    }
}

impl Settings {
    /// The bounds `spec.handover` sets, its time bound at most `max_timeout_seconds` (the operator's
    /// `--handover-max-timeout-seconds`); batches of 64 keys and 1 MiB (round trips per megabyte are then
    /// few, and the values held stay small).
    pub fn from_spec(spec: &WarmHandover, max_timeout_seconds: u64) -> Self {
        let timeout = Duration::from_secs(spec.timeout_seconds().min(max_timeout_seconds));
        Self {
            max_bytes_per_second: spec.max_bytes_per_second(),
            timeout,
            request_timeout: DEFAULT_REQUEST_TIMEOUT.min(timeout),
            batch_items: 64,
            batch_bytes: 1024 * 1024,
            min_bytes_per_window: MIN_BYTES_PER_WINDOW,
            progress_window: PROGRESS_WINDOW,
        }
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_follow_the_spec_and_the_request_bound_never_exceeds_the_whole() {
        let settings = Settings::default();
        assert_eq!(settings.max_bytes_per_second, 64 * 1024 * 1024);
        assert_eq!(settings.timeout, Duration::from_secs(120));
        assert_eq!(settings.request_timeout, DEFAULT_REQUEST_TIMEOUT);
        let short = Settings::from_spec(
            &WarmHandover {
                timeout_seconds: Some(3),
                ..WarmHandover::default()
            },
            DEFAULT_MAX_TIMEOUT_SECONDS,
        );
        assert_eq!(short.request_timeout, Duration::from_secs(3));
    }

    #[test]
    fn the_operators_maximum_caps_the_specs_time_bound() {
        let hour = WarmHandover {
            timeout_seconds: Some(3600),
            ..WarmHandover::default()
        };
        let capped = Settings::from_spec(&hour, DEFAULT_MAX_TIMEOUT_SECONDS);
        assert_eq!(capped.timeout, Duration::from_secs(600));
        assert_eq!(
            Settings::from_spec(&hour, 3600).timeout,
            Duration::from_secs(3600)
        );
        let short = WarmHandover {
            timeout_seconds: Some(30),
            ..WarmHandover::default()
        };
        assert_eq!(
            Settings::from_spec(&short, 600).timeout,
            Duration::from_secs(30)
        );
    }
}
