//! The pause between a watch's retries, and the resumptions that cut it short.
//!
//! kube's `StreamBackoff` sleeps out every delay its backoff gives after an error, whatever happens
//! meanwhile. A watch retries on a curve of delays (see [`super::watch_retry`]) so that a failure that
//! lasts costs little, but when the API server grants requests again (a restarted server whose RBAC
//! authorizer has synced, one that answers again after an outage) the watches still sleeping out their
//! delays resumed one by one, each at the end of its own. Here a pause also ends when the API server
//! grants a request after the error ([`super::connectivity::Connectivity::resumptions`]), at most once
//! per run of failures: a kind that stays refused while everything else is granted keeps to its curve.

use std::pin::Pin;
use std::time::Duration;

use futures::{Stream, StreamExt};
use tokio::sync::watch;
use tracing::debug;

/// The delays of one watch's retries.
pub(super) trait Pauses: Iterator<Item = Duration> {
    /// Called on every successful item: whether it was progress, which starts the curve over.
    fn reset_on_progress(&mut self) -> bool;
}

/// A watch between its items: the delay its last error asked for, and whether a resumption may cut that
/// short.
struct Pacing<S, B> {
    stream: Pin<Box<S>>,
    backoff: B,
    resumptions: watch::Receiver<u64>,
    resource: &'static str,
    /// Set after an error: how long to wait before asking the watch for its next item.
    delay: Option<Duration>,
    /// Whether a resumption may still cut a delay short in this run of failures (once per run).
    may_resume: bool,
}

/// `stream` paused after each error for the next delay of `backoff`, as kube's `StreamBackoff` does, except
/// that a resumption of the API server (a bump of `resumptions` after the error) ends the pause at once,
/// once per run of failures.
pub(super) fn paced<T, E, S, B>(
    stream: S,
    backoff: B,
    resumptions: watch::Receiver<u64>,
    resource: &'static str,
) -> impl Stream<Item = Result<T, E>> + Send + use<T, E, S, B>
where
    T: Send,
    E: Send,
    S: Stream<Item = Result<T, E>> + Send + 'static,
    B: Pauses + Send + 'static,
{
    let pacing = Pacing {
        stream: Box::pin(stream),
        backoff,
        resumptions,
        resource,
        delay: None,
        may_resume: true,
    };
    futures::stream::unfold(pacing, |mut pacing| async move {
        if let Some(delay) = pacing.delay.take() {
            pacing.pause(delay).await;
        }
        let item = pacing.stream.next().await?;
        if item.is_err() {
            // Only grants after this error resume the watch early.
            pacing.resumptions.borrow_and_update();
            pacing.delay = pacing.backoff.next();
        } else if pacing.backoff.reset_on_progress() {
            pacing.may_resume = true;
        }
        Some((item, pacing))
    })
}

impl<S, B> Pacing<S, B> {
    async fn pause(&mut self, delay: Duration) {
        if delay.is_zero() {
            return;
        }
        let sleep = tokio::time::sleep(delay);
        if !self.may_resume {
            return sleep.await;
        }
        let resumptions = &mut self.resumptions;
        let resumed = async {
            if resumptions.changed().await.is_err() {
                // No client any more to resume with: the delay runs out.
                std::future::pending::<()>().await;
            }
        };
        let cut_short = tokio::select! {
            () = sleep => false,
            () = resumed => true,
        };
        if cut_short {
            self.may_resume = false;
            debug!(
                resource = self.resource,
                "the API server grants requests again; retrying the watch now"
            );
        }
    }
}
