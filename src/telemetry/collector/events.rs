//! The events the collector publishes about an instance: `Evicting` when evictions start, and how a
//! certificate rotation went (`CertificatesReloaded`, `CertificatesNotReloaded`); each bounded by the
//! writes in flight and a timeout.

use std::time::Duration;

use kube::Resource;
use kube::runtime::events::{Event, EventType};
use tracing::{info, warn};

use super::state::{Collector, WRITE_TIMEOUT};
use crate::api::Memcached;
use crate::telemetry::metrics::InstanceKey;
use crate::telemetry::reload::{self, Outcome};
use crate::telemetry::stats::Stats;

/// Event reason when an instance starts evicting.
pub const EVICTING: &str = "Evicting";

impl Collector {
    pub(super) async fn warn_evicting(
        &self,
        (namespace, name): &InstanceKey,
        mc: &Memcached,
        evicted: u64,
        read: &[Stats],
    ) {
        let note = evicting_note(evicted, self.settings.interval, read);
        info!(memcached = %name, %namespace, %note, "evictions started");
        let event = Event {
            type_: EventType::Warning,
            reason: EVICTING.to_owned(),
            note: Some(note),
            action: "ReadStats".to_owned(),
            secondary: None,
        };
        self.publish(&(namespace.clone(), name.clone()), mc, event)
            .await;
    }

    /// Publishes an event about `mc`, bounded by the writes in flight and a timeout.
    pub(super) async fn publish(
        &self,
        (namespace, name): &InstanceKey,
        mc: &Memcached,
        event: Event,
    ) {
        let Ok(_permit) = self.writes.acquire().await else {
            return;
        };
        let reason = event.reason.clone();
        match tokio::time::timeout(
            WRITE_TIMEOUT,
            self.writer.events.publish(&event, &mc.object_ref(&())),
        )
        .await
        {
            Ok(Ok(())) => {}
            Ok(Err(error)) => {
                warn!(memcached = %name, %namespace, %error, %reason, "cannot publish an event")
            }
            Err(_) => {
                warn!(memcached = %name, %namespace, %reason, "timed out publishing an event")
            }
        }
    }
}

/// The note of the `Evicting` event: how many, and how full the memory is, with the way out.
pub fn evicting_note(evicted: u64, interval: Duration, read: &[Stats]) -> String {
    let sum = |f: fn(&Stats) -> u64| read.iter().map(f).fold(0u64, u64::saturating_add);
    let limit = sum(|s| s.limit_maxbytes);
    let used = crate::telemetry::summary::percent(sum(|s| s.bytes), limit).unwrap_or_default();
    format!(
        "memcached evicted {evicted} valid items in the last {}s ({} in total since the servers started): \
         the cache is too small for what is written to it. Items use {used}% of the {} MiB memory limit \
         of the {} servers read; raise spec.memcached.maxMemoryMB or spec.size",
        interval.as_secs(),
        sum(|s| s.evictions),
        limit / (1024 * 1024),
        read.len(),
    )
}

/// At most five pod names, for an event note (which the API server limits to 1 kB).
fn shown_pods(pods: &[String]) -> String {
    let mut shown = pods.iter().take(5).cloned().collect::<Vec<_>>().join(", ");
    if pods.len() > 5 {
        shown.push_str(", ...");
    }
    shown
}

/// The event that says how a rotation went, if it is time to say.
pub(super) fn reload_event(mc: &Memcached, outcome: &Outcome) -> Option<Event> {
    let secret = mc
        .spec
        .tls()
        .map(|tls| tls.secret_name.as_str())
        .unwrap_or_default();
    let (type_, reason, note) = match outcome {
        Outcome::Nothing => return None,
        Outcome::Unusable(why) => (
            EventType::Warning,
            reload::CERTIFICATES_NOT_RELOADED,
            format!(
                "the certificate of Secret {secret} cannot be loaded: {why}. The servers are not asked to \
                 load it and keep serving the one they have; a server started now would fail to start"
            ),
        ),
        Outcome::Reloaded { servers, after } => (
            EventType::Normal,
            reload::CERTIFICATES_RELOADED,
            format!(
                "{servers} server(s) reloaded the rotated certificate of Secret {secret} in place \
                 (refresh_certs) within {}s of presenting the previous one; no pod was restarted",
                after.as_secs()
            ),
        ),
        Outcome::NotReloaded {
            pending,
            total,
            refused,
            after,
        } => (
            EventType::Warning,
            reload::CERTIFICATES_NOT_RELOADED,
            match refused {
                Some((pod, answer)) => format!(
                    "{pod} refused to reload the certificate of Secret {secret} (refresh_certs \
                     answered {answer:?}): it keeps serving the previous one. Check that tls.key matches \
                     tls.crt; {} of {total} server(s) present another certificate than the Secret's",
                    pending.len()
                ),
                None => format!(
                    "{} of {total} server(s) ({}) still present another certificate than Secret {secret}'s \
                     {}s after the first was seen to, although asked to reload it (refresh_certs): the \
                     kubelet writes a changed Secret into running pods within about a minute; restart \
                     the pods to load it (kubectl rollout restart)",
                    pending.len(),
                    shown_pods(pending),
                    after.as_secs()
                ),
            },
        ),
    };
    Some(Event {
        type_,
        reason: reason.to_owned(),
        note: Some(note),
        action: "ReloadCertificates".to_owned(),
        secondary: None,
    })
}
