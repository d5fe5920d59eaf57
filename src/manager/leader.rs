//! Leader election through a `coordination.k8s.io/v1` Lease (kube-lease-manager), with the timings of
//! controller-runtime: a 15 s lease renewed when 5 s of it are left (every 10 s), so a standby takes over
//! at most 15 s after the leader stops renewing or releases the lease (a standby looks again when the lease
//! it saw would have expired; released, it is free then without the expiry margin).

use kube::Client;
use kube_lease_manager::{LeaseManagerBuilder, LeaseManagerError};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// Lease duration in seconds.
pub const LEASE_DURATION_SECONDS: u64 = 15;
/// Seconds before expiry at which the holder renews.
pub const LEASE_GRACE_SECONDS: u64 = 5;

/// A running election.
pub struct Election {
    leader: watch::Receiver<bool>,
    task: JoinHandle<Result<kube_lease_manager::LeaseManager, LeaseManagerError>>,
    /// Task behind [`Election::lost`]; it holds a receiver, which must be gone before the lease is released.
    monitor: Option<JoinHandle<()>>,
}

impl Election {
    /// Starts competing for the Lease `name` in `namespace` as `identity`.
    pub async fn start(
        client: Client,
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

    /// A token cancelled when this replica stops leading (the Lease was taken over or could not be kept).
    pub fn lost(&mut self) -> CancellationToken {
        let token = CancellationToken::new();
        let mut leader = self.leader.clone();
        let lost = token.clone();
        self.monitor = Some(tokio::spawn(async move {
            loop {
                if !*leader.borrow_and_update() {
                    break;
                }
                if leader.changed().await.is_err() {
                    break;
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
