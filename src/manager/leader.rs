//! Leader election through a `coordination.k8s.io/v1` Lease (kube-lease-manager), with a 15 s lease as in
//! controller-runtime. The leader renews when 10 s of it are left (every 5 s), so a standby takes over at most
//! 15 s after the leader stops renewing or releases the lease (a standby looks again when the lease it saw
//! would have expired; released, it is free then without the expiry margin).
//!
//! A leader that cannot renew (the API server is unreachable or slow) must stop acting before its lease can
//! expire and another replica take over, as controller-runtime's renew deadline makes it: kube-lease-manager
//! retries for as long as it takes and never says the lease was lost, so the renewals are watched here (from
//! the answers to the election client's own requests, see [`Renewals`]), and a leader whose last renewal is
//! [`RENEW_DEADLINE`] old gives up leading.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http::StatusCode;
use kube::Client;
use kube_lease_manager::{LeaseManagerBuilder, LeaseManagerError};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::observe::{Observer, Outcome, Sent};

/// Lease duration in seconds.
pub const LEASE_DURATION_SECONDS: u64 = 15;
/// Seconds before expiry at which the holder renews.
pub const LEASE_GRACE_SECONDS: u64 = 10;
/// A leader whose last successful renewal is this old stops leading: 3 s before its lease could expire,
/// which leaves room for clock skew between replicas and for one request in flight.
pub const RENEW_DEADLINE: Duration = Duration::from_secs(LEASE_DURATION_SECONDS - 3);

/// When the election client last wrote the Lease successfully (acquired, renewed or released it). Fed by
/// an [`crate::observe::ObserveLayer`] on a client used for the election alone, so every successful
/// write it sees is a write of the Lease; the time kept is when the write was sent, which is no later
/// than the `renewTime` it carried.
#[derive(Clone, Debug, Default)]
pub struct Renewals {
    last: Arc<Mutex<Option<Instant>>>,
}

impl Renewals {
    /// When the Lease was last written successfully.
    pub fn last(&self) -> Option<Instant> {
        *self.last.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Observer for Renewals {
    fn observe(&self, sent: &Sent, outcome: Outcome<'_>, _now: Instant) {
        let written = sent.verb != "get"
            && sent.verb != "watch"
            && matches!(outcome, Outcome::Answered(status, _) if status.is_success());
        if written {
            let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
            if last.is_none_or(|at| at < sent.at) {
                *last = Some(sent.at);
            }
        }
    }
}

/// Whether a leader whose last renewal was sent at `last` must stop leading at `now`.
pub fn renewal_overdue(last: Instant, now: Instant) -> bool {
    now.saturating_duration_since(last) >= RENEW_DEADLINE
}

/// Whether starting the election failed for a reason that may pass (the API server is unreachable or
/// unavailable), as opposed to one a person must fix (RBAC, a malformed Lease).
pub fn retriable(error: &LeaseManagerError) -> bool {
    match error {
        LeaseManagerError::KubeError(kube::Error::Api(status)) => StatusCode::from_u16(status.code)
            .is_ok_and(|code| code.is_server_error() || code == StatusCode::TOO_MANY_REQUESTS),
        LeaseManagerError::KubeError(_) => true,
        _ => false,
    }
}

/// A running election.
pub struct Election {
    leader: watch::Receiver<bool>,
    renewals: Renewals,
    task: JoinHandle<Result<kube_lease_manager::LeaseManager, LeaseManagerError>>,
    /// Task behind [`Election::lost`]; it holds a receiver, which must be gone before the lease is released.
    monitor: Option<JoinHandle<()>>,
}

impl Election {
    /// Starts competing for the Lease `name` in `namespace` as `identity`. `client` must report to
    /// `renewals` and be used for nothing else.
    pub async fn start(
        client: Client,
        renewals: Renewals,
        name: &str,
        namespace: &str,
        identity: &str,
    ) -> Result<Self, LeaseManagerError> {
        let manager = LeaseManagerBuilder::new(client, name)
            .with_namespace(namespace)
            .with_identity(identity)
            .with_duration(LEASE_DURATION_SECONDS)
            .with_grace(LEASE_GRACE_SECONDS)
            .build()
            .await?;
        let (leader, task) = manager.watch().await;
        Ok(Self {
            leader,
            renewals,
            task,
            monitor: None,
        })
    }

    /// Waits until this replica leads (`true`) or `stop` is cancelled first (`false`).
    pub async fn acquired(&mut self, stop: &CancellationToken) -> bool {
        loop {
            if *self.leader.borrow_and_update() {
                return true;
            }
            tokio::select! {
                () = stop.cancelled() => return false,
                changed = self.leader.changed() => if changed.is_err() {
                    warn!("leader election stopped before this replica became leader");
                    stop.cancelled().await;
                    return false;
                },
            }
        }
    }

    /// A token cancelled when this replica stops leading: the Lease was taken over, or it could not be
    /// renewed for [`RENEW_DEADLINE`]. Call once this replica leads.
    pub fn lost(&mut self) -> CancellationToken {
        let token = CancellationToken::new();
        let mut leader = self.leader.clone();
        let renewals = self.renewals.clone();
        let lost = token.clone();
        let since = Instant::now();
        self.monitor = Some(tokio::spawn(async move {
            loop {
                if !*leader.borrow_and_update() {
                    error!("another replica holds the leader lease now");
                    break;
                }
                let last = renewals.last().unwrap_or(since);
                if renewal_overdue(last, Instant::now()) {
                    error!(
                        seconds = RENEW_DEADLINE.as_secs(),
                        "could not renew the leader lease in time (is the API server reachable?); \
                         stopping before another replica may take over"
                    );
                    break;
                }
                let check = tokio::time::sleep_until((last + RENEW_DEADLINE).into());
                tokio::select! {
                    () = check => {}
                    changed = leader.changed() => if changed.is_err() {
                        error!("leader election stopped");
                        break;
                    },
                }
            }
            lost.cancel();
        }));
        token
    }

    /// Gives the Lease up (if held) so that a standby can take it as soon as it looks again.
    pub async fn release(self) {
        if let Some(monitor) = self.monitor {
            monitor.abort();
            let _ = monitor.await;
        }
        drop(self.leader);
        match tokio::time::timeout(std::time::Duration::from_secs(5), self.task).await {
            Ok(Ok(Ok(_))) => info!("leader lease released"),
            Ok(Ok(Err(error))) => {
                warn!(%error, "could not release the leader lease; it expires by itself")
            }
            Ok(Err(error)) => warn!(%error, "leader election task failed"),
            Err(_) => warn!("timed out releasing the leader lease; it expires by itself"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{Method, Version};

    fn sent(verb: &'static str, at: Instant) -> Sent {
        let method = if verb == "get" {
            Method::GET
        } else {
            Method::PATCH
        };
        Sent { method, verb, at }
    }

    #[test]
    fn renewals_are_successful_lease_writes_timed_when_sent() {
        let renewals = Renewals::default();
        let t0 = Instant::now();
        let ok = Outcome::Answered(StatusCode::OK, Version::HTTP_2);
        renewals.observe(&sent("get", t0), ok, t0);
        assert_eq!(renewals.last(), None, "a read renews nothing");

        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        let t1 = t0 + Duration::from_secs(1);
        renewals.observe(&sent("patch", t1), Outcome::Failed(&refused), t1);
        renewals.observe(
            &sent("patch", t1),
            Outcome::Answered(StatusCode::CONFLICT, Version::HTTP_2),
            t1,
        );
        assert_eq!(renewals.last(), None, "failed writes renew nothing");

        let t2 = t0 + Duration::from_secs(2);
        renewals.observe(&sent("patch", t2), ok, t2 + Duration::from_secs(3));
        assert_eq!(
            renewals.last(),
            Some(t2),
            "the send time counts, not the answer's"
        );
        // An older write answered late does not move the time back.
        renewals.observe(&sent("patch", t1), ok, t2 + Duration::from_secs(4));
        assert_eq!(renewals.last(), Some(t2));
    }

    #[test]
    fn a_leader_steps_down_before_its_lease_can_expire() {
        let t0 = Instant::now();
        assert!(RENEW_DEADLINE < Duration::from_secs(LEASE_DURATION_SECONDS));
        assert!(
            RENEW_DEADLINE > Duration::from_secs(LEASE_DURATION_SECONDS - LEASE_GRACE_SECONDS),
            "longer than the renewal period, so one late renewal is no reason to step down"
        );
        assert!(!renewal_overdue(t0, t0 + Duration::from_secs(11)));
        assert!(renewal_overdue(t0, t0 + RENEW_DEADLINE));
    }

    #[test]
    fn only_unreachable_or_unavailable_servers_are_worth_waiting_for() {
        let api = |code: u16| {
            let mut status = kube::core::Status::failure("x", "y");
            status.code = code;
            LeaseManagerError::KubeError(kube::Error::Api(Box::new(status)))
        };
        assert!(retriable(&api(503)));
        assert!(retriable(&api(429)));
        assert!(!retriable(&api(403)), "RBAC needs a person");
        assert!(retriable(&LeaseManagerError::KubeError(
            kube::Error::Service("client error (Connect)".into())
        )));
        assert!(!retriable(&LeaseManagerError::InconsistentState(
            "x".into()
        )));
    }
}
