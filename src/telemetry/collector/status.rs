//! The collector's one write of the instance: `status.stats`, a server-side apply under its own field
//! manager ([`FIELD_MANAGER`]), so neither it nor the reconciler's status apply removes the other's fields.

use kube::Resource;
use serde_json::json;
use tracing::warn;

use super::state::{Collector, WRITE_TIMEOUT};
use crate::api::{CacheStats, Memcached};
use crate::telemetry::metrics::InstanceKey;

/// Field manager of the `status.stats` applies: not the reconciler's, so neither removes the other's
/// fields.
pub const FIELD_MANAGER: &str = "memcached-operator-stats";

impl Collector {
    /// Applies `status.stats` (or its removal, for `None`); whether it was written.
    pub(super) async fn write_status(
        &self,
        (namespace, name): &InstanceKey,
        stats: Option<&CacheStats>,
    ) -> bool {
        // The semaphore is never closed.
        let Ok(_permit) = self.writes.acquire().await else {
            return false;
        };
        let patch = stats_patch(name, stats);
        let written =
            self.writer
                .apply_status::<Memcached, _>(namespace, name, &patch, FIELD_MANAGER);
        match tokio::time::timeout(WRITE_TIMEOUT, written).await {
            Ok(Ok(_)) => true,
            Ok(Err(error)) => {
                warn!(memcached = %name, %namespace, %error, "cannot write status.stats; retrying at the next collection");
                false
            }
            Err(_) => {
                warn!(memcached = %name, %namespace, "timed out writing status.stats; retrying at the next collection");
                false
            }
        }
    }
}

/// The apply that sets `status.stats` to `stats` and nothing else; with `None`, an apply without it,
/// which removes what this field manager set before.
pub fn stats_patch(name: &str, stats: Option<&CacheStats>) -> serde_json::Value {
    let status = match stats {
        Some(stats) => json!({"stats": stats}),
        None => json!({}),
    };
    json!({
        "apiVersion": Memcached::api_version(&()),
        "kind": Memcached::kind(&()),
        "metadata": {"name": name},
        "status": status,
    })
}
