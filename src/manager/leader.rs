//! Leader election through a `coordination.k8s.io/v1` Lease (kube-lease-manager), with a 15 s lease as in
//! controller-runtime. The leader renews when 10 s of it are left (every 5 s); on a graceful stop it releases
//! the Lease.
//!
//! A standby reads the Lease every [`RETRY_PERIOD`] (client-go's retry period), and competes for it at once
//! when it finds it free: released by a leader that stopped, or expired. kube-lease-manager alone would look
//! again only when the lease it last saw would have expired (up to 15 s after a release), and after failed
//! reads during an API-server outage only after its own backoff (up to 30 s). The competing itself is
//! kube-lease-manager's (a server-side apply of the holder that conflicts with another replica's): on a free
//! Lease the standby's manager, which holds on to what it last saw, is replaced by a new one, which reads
//! the Lease afresh and takes it.
//!
//! A leader that cannot renew (the API server is unreachable or slow) must stop acting before its lease can
//! expire and another replica take over, as controller-runtime's renew deadline makes it: kube-lease-manager
//! retries for as long as it takes and never says the lease was lost, so the renewals are watched here (from
//! the answers to the election client's own requests, see [`Renewals`]), and a leader whose last renewal is
//! [`RENEW_DEADLINE`] old gives up leading.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use http::StatusCode;
use k8s_openapi::api::coordination::v1::Lease;
use kube::{Api, Client};
use kube_lease_manager::{LeaseManager, LeaseManagerBuilder, LeaseManagerError};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use crate::observe::{Observer, Outcome, Sent};

/// Lease duration in seconds.
pub const LEASE_DURATION_SECONDS: u64 = 15;
/// Seconds before expiry at which the holder renews.
pub const LEASE_GRACE_SECONDS: u64 = 10;
/// How often a standby reads the Lease (client-go's `RetryPeriod`): a released Lease is taken over within
/// this long, plus the few requests that take it.
pub const RETRY_PERIOD: Duration = Duration::from_secs(2);
/// Longest wait for one look at the Lease (a read, and a new manager's own read when the Lease is free).
const LOOK_TIMEOUT: Duration = Duration::from_secs(10);
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

/// The Lease this replica competes for, and as whom.
struct Candidate {
    client: Client,
    name: String,
    namespace: String,
    identity: String,
}

impl Candidate {
    /// A lease manager for the Lease, which knows nothing of it yet: its first step reads it.
    async fn manager(&self) -> Result<LeaseManager, LeaseManagerError> {
        LeaseManagerBuilder::new(self.client.clone(), &self.name)
            .with_namespace(&self.namespace)
            .with_identity(&self.identity)
            // The library's default, made of the identity instead of a random string, so that every manager
            // of this replica applies the holder as the same field manager.
            .with_field_manager(format!("kube-lease-manager-{}", self.identity))
            .with_duration(LEASE_DURATION_SECONDS)
            .with_grace(LEASE_GRACE_SECONDS)
            .build()
            .await
    }

    /// Reads the Lease: `None` when it does not exist.
    async fn read(&self) -> kube::Result<Option<Lease>> {
        Api::<Lease>::namespaced(self.client.clone(), &self.namespace)
            .get_opt(&self.name)
            .await
    }
}

/// Whether `lease` may be taken at `now`: it does not exist, has no holder (released), or has expired by
/// the local clock (as kube-lease-manager judges expiry too).
pub fn free(lease: Option<&Lease>, now: SystemTime) -> bool {
    let Some(spec) = lease.and_then(|l| l.spec.as_ref()) else {
        return true;
    };
    if spec.holder_identity.as_deref().is_none_or(str::is_empty) {
        return true;
    }
    match (&spec.renew_time, spec.lease_duration_seconds) {
        (Some(renewed), Some(seconds)) => {
            let renewed = SystemTime::from(renewed.0);
            let seconds = u64::try_from(seconds).unwrap_or(0);
            renewed + Duration::from_secs(seconds) < now
        }
        // A holder without a renewal time or duration: kube-lease-manager takes it for expired.
        _ => true,
    }
}

/// A running election.
pub struct Election {
    candidate: Candidate,
    leader: watch::Receiver<bool>,
    renewals: Renewals,
    task: JoinHandle<Result<LeaseManager, LeaseManagerError>>,
    /// The version of the Lease for which the manager was last replaced: a free Lease that the new manager
    /// could not take (a conflict with another replica, a refused write) is left to that manager's own
    /// retries rather than replaced again at every look.
    replaced_for: Option<String>,
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
        let candidate = Candidate {
            client,
            name: name.to_owned(),
            namespace: namespace.to_owned(),
            identity: identity.to_owned(),
        };
        let (leader, task) = candidate.manager().await?.watch().await;
        Ok(Self {
            candidate,
            leader,
            renewals,
            task,
            replaced_for: None,
            monitor: None,
        })
    }

    /// Waits until this replica leads (`true`) or `stop` is cancelled first (`false`). Meanwhile the Lease
    /// is read every [`RETRY_PERIOD`], and found free it is competed for at once.
    pub async fn acquired(&mut self, stop: &CancellationToken) -> bool {
        let mut looks =
            tokio::time::interval_at(tokio::time::Instant::now() + RETRY_PERIOD, RETRY_PERIOD);
        looks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
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
                _ = looks.tick() => {
                    let look = tokio::time::timeout(LOOK_TIMEOUT, self.look());
                    let manager = tokio::select! {
                        () = stop.cancelled() => return false,
                        looked = look => looked.ok().flatten(),
                    };
                    if let Some((manager, version)) = manager {
                        self.replace(manager, version).await;
                    }
                }
            }
        }
    }

    /// Reads the Lease; when it is free (and was not already free at this version when the manager was
    /// last replaced), a new manager to compete for it, and the Lease's version.
    async fn look(&self) -> Option<(LeaseManager, String)> {
        let lease = match self.candidate.read().await {
            Ok(lease) => lease,
            Err(error) => {
                debug!(%error, "cannot read the leader lease; looking again later");
                return None;
            }
        };
        if !free(lease.as_ref(), SystemTime::now()) {
            return None;
        }
        let version = lease
            .as_ref()
            .and_then(|l| l.metadata.resource_version.clone())
            .unwrap_or_default();
        if self.replaced_for.as_ref() == Some(&version) {
            return None;
        }
        match self.candidate.manager().await {
            Ok(manager) => Some((manager, version)),
            Err(error) => {
                debug!(%error, "cannot compete for the free leader lease yet; looking again later");
                None
            }
        }
    }

    /// Replaces the standby's manager, which waits for the expiry of the lease it last saw, with `manager`,
    /// which reads the Lease afresh and takes it if it is still free. The old one is stopped without
    /// releasing anything (it holds nothing: this replica does not lead); a write of the Lease it had in
    /// flight either took the Lease for this identity, which the new manager then finds, or did not.
    async fn replace(&mut self, manager: LeaseManager, version: String) {
        if *self.leader.borrow() {
            // The old manager took the Lease meanwhile: it leads, and keeps renewing.
            return;
        }
        debug!(version, "the leader lease is free; competing for it now");
        self.task.abort();
        let _ = (&mut self.task).await;
        let (leader, task) = manager.watch().await;
        self.leader = leader;
        self.task = task;
        self.replaced_for = Some(version);
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
    fn a_lease_is_free_when_missing_released_or_expired() {
        let lease = |spec: serde_json::Value| -> Lease {
            serde_json::from_value(serde_json::json!({"metadata": {"name": "l"}, "spec": spec}))
                .unwrap()
        };
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let at = |secs_before: u64| {
            let t = k8s_openapi::jiff::Timestamp::try_from(now - Duration::from_secs(secs_before))
                .unwrap();
            serde_json::to_value(k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(t))
                .unwrap()
        };
        let held = lease(
            serde_json::json!({"holderIdentity": "a", "renewTime": at(5), "leaseDurationSeconds": 15}),
        );
        assert!(!free(Some(&held), now), "held and renewed 5 s ago");
        let expired = lease(
            serde_json::json!({"holderIdentity": "a", "renewTime": at(16), "leaseDurationSeconds": 15}),
        );
        assert!(free(Some(&expired), now));
        // Released as kube-lease-manager releases (fields removed) and as client-go does (empty holder).
        assert!(free(
            Some(&lease(serde_json::json!({"leaseTransitions": 3}))),
            now
        ));
        let emptied = lease(
            serde_json::json!({"holderIdentity": "", "renewTime": at(0), "leaseDurationSeconds": 1}),
        );
        assert!(free(Some(&emptied), now));
        assert!(free(None, now), "a missing Lease is created and taken");
        assert!(
            free(
                Some(&lease(serde_json::json!({"holderIdentity": "a"}))),
                now
            ),
            "no renewal time"
        );
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
