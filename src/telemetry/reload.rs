//! Rotated certificates reloaded in place: which servers still present the previous certificate, when to
//! ask each of them again (`refresh_certs`), and when to say that they all reloaded, or that they do not.
//!
//! The pod template does not carry the TLS Secret's content (see
//! [`crate::resources::secrets::tls_reload`]), so a rotated certificate restarts nothing. The kubelet
//! writes the new files into the running pods' Secret volume some time after the Secret changed (its
//! sync period plus its cache's TTL: about a minute by default); memcached keeps serving the certificate
//! it loaded until told to load the files again. The collector compares the certificate each server
//! presents with the leaf of the Secret's `tls.crt` and, while they differ, sends `refresh_certs` on its
//! stats connection. A server asked before the kubelet updated its files answers `OK` and presents the
//! old certificate still, so it is asked again, with backoff: at the next collection, then two, four, ...
//! collections later, at most [`MAX_BACKOFF`] apart. Asking costs one command on a connection the
//! collector opens anyway.
//!
//! Pure: the collector feeds it what each read gave and publishes what it returns.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use super::client::{CertificateDigest, Presented, RefreshAnswer};

/// Event reason when every server of an instance presents the rotated certificate after being asked to
/// reload it.
pub const CERTIFICATES_RELOADED: &str = "CertificatesReloaded";
/// Event reason when servers still present another certificate [`PATIENCE`] after the first was seen to,
/// or refused to reload.
pub const CERTIFICATES_NOT_RELOADED: &str = "CertificatesNotReloaded";
/// Longest time between two `refresh_certs` to one server.
pub const MAX_BACKOFF: Duration = Duration::from_secs(120);
/// How long servers may present another certificate before a Warning says so: well beyond the kubelet's
/// default Secret update delay.
pub const PATIENCE: Duration = Duration::from_secs(600);

/// What one collection read of one server, for [`Reload::observe`].
pub struct Observed<'a> {
    pub pod: &'a str,
    /// What it presented, when it was read over TLS; `None` when it could not be read.
    pub presented: Option<&'a Presented>,
}

/// What to publish after a collection.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    Nothing,
    /// Every server presents the expected certificate; `servers` of them were asked to reload, the first
    /// mismatch was seen `after` ago.
    Reloaded {
        servers: usize,
        after: Duration,
    },
    /// The Secret's certificate cannot be loaded (why): no server is asked to; said once per reason.
    Unusable(String),
    /// Servers still present another certificate `after` the first was seen to (or one refused):
    /// said once per rotation.
    NotReloaded {
        pending: Vec<String>,
        total: usize,
        refused: Option<(String, String)>,
        after: Duration,
    },
}

/// One server still presenting another certificate.
#[derive(Clone, Debug, Default)]
struct Attempts {
    /// `refresh_certs` sent so far (answered `OK`).
    sent: u32,
    /// Collections to let pass before the next.
    wait: u32,
}

/// A rotation in progress: some server presents a certificate other than the expected one.
#[derive(Debug)]
struct Rotation {
    since: Instant,
    pods: BTreeMap<String, Attempts>,
    /// Servers that were asked and now present the expected certificate.
    reloaded: BTreeSet<String>,
    /// The latest refusal: (pod, answer).
    refused: Option<(String, String)>,
    warned: bool,
}

/// The reload state of one instance, kept by the collector between collections.
#[derive(Debug, Default)]
pub struct Reload {
    expected: Option<CertificateDigest>,
    ca: Option<Vec<u8>>,
    /// The CA before the latest change, trusted until every server presents the expected certificate, so
    /// that a server still presenting a certificate of the previous CA can be reached and asked to reload.
    previous_ca: Option<Vec<u8>>,
    rotation: Option<Rotation>,
    /// Why the Secret's certificate cannot be loaded, and whether that was said.
    unusable: Option<(String, bool)>,
}

impl Reload {
    /// The certificate (or why it cannot be loaded: see [`super::client::matching_pair`]) and CA of the
    /// instance's TLS Secret now. A new certificate starts the attempts over; a new CA keeps the previous
    /// one trusted until the servers present the new certificate.
    pub fn secret(&mut self, certificate: Result<CertificateDigest, String>, ca: Option<&[u8]>) {
        let expected = match certificate {
            Ok(digest) => {
                self.unusable = None;
                Some(digest)
            }
            Err(reason) => {
                if self
                    .unusable
                    .as_ref()
                    .is_none_or(|(said, _)| *said != reason)
                {
                    self.unusable = Some((reason, false));
                }
                None
            }
        };
        if self.expected != expected {
            if let Some(rotation) = &mut self.rotation {
                for attempts in rotation.pods.values_mut() {
                    *attempts = Attempts::default();
                }
                rotation.warned = false;
                rotation.refused = None;
            }
            if self.expected.is_some() && self.ca.as_deref() != ca && self.ca.is_some() {
                self.previous_ca = self.ca.take();
            }
            self.expected = expected;
        }
        self.ca = ca.map(<[u8]>::to_vec);
    }

    /// The CA to trust besides the Secret's own, while servers may still present a certificate it issued.
    pub fn previous_ca(&self) -> Option<&[u8]> {
        self.previous_ca.as_deref()
    }

    /// Whether a read of `pod` at this collection may send `refresh_certs` (when the server presents
    /// another certificate): the first time at once, then with backoff.
    pub fn may_refresh(&self, pod: &str) -> bool {
        self.rotation
            .as_ref()
            .and_then(|rotation| rotation.pods.get(pod))
            .is_none_or(|attempts| attempts.wait == 0)
    }

    /// Takes in one collection: `servers` are all the instance's servers, read or not; `interval` is the
    /// time between collections.
    pub fn observe(
        &mut self,
        now: Instant,
        interval: Duration,
        servers: &[Observed<'_>],
    ) -> Outcome {
        let Some(expected) = self.expected else {
            self.rotation = None;
            self.previous_ca = None;
            return match &mut self.unusable {
                Some((reason, said)) if !*said => {
                    *said = true;
                    Outcome::Unusable(reason.clone())
                }
                _ => Outcome::Nothing,
            };
        };
        let mut all_read_and_current = true;
        for server in servers {
            let Some(presented) = server.presented else {
                all_read_and_current = false;
                continue;
            };
            if presented.digest == expected {
                if let Some(rotation) = &mut self.rotation
                    && let Some(attempts) = rotation.pods.remove(server.pod)
                    && attempts.sent > 0
                {
                    rotation.reloaded.insert(server.pod.to_owned());
                }
                continue;
            }
            all_read_and_current = false;
            let rotation = self.rotation.get_or_insert_with(|| Rotation {
                since: now,
                pods: BTreeMap::new(),
                reloaded: BTreeSet::new(),
                refused: None,
                warned: false,
            });
            let attempts = rotation.pods.entry(server.pod.to_owned()).or_default();
            match &presented.refresh {
                Some(RefreshAnswer::Reloaded) => {
                    attempts.sent += 1;
                    attempts.wait = backoff(attempts.sent, interval);
                }
                Some(RefreshAnswer::Refused(answer)) => {
                    attempts.sent += 1;
                    attempts.wait = backoff(attempts.sent, interval);
                    rotation.refused = Some((server.pod.to_owned(), answer.clone()));
                }
                None => attempts.wait = attempts.wait.saturating_sub(1),
            }
        }
        if all_read_and_current {
            self.previous_ca = None;
        }
        let Some(rotation) = &mut self.rotation else {
            return Outcome::Nothing;
        };
        // Servers gone (deleted, replaced, no longer ready) are no longer waited for.
        rotation
            .pods
            .retain(|pod, _| servers.iter().any(|s| s.pod == pod));
        let after = now.saturating_duration_since(rotation.since);
        if rotation.pods.is_empty() {
            let servers = rotation.reloaded.len();
            self.rotation = None;
            return if servers > 0 {
                Outcome::Reloaded { servers, after }
            } else {
                Outcome::Nothing
            };
        }
        if !rotation.warned && (after >= PATIENCE || rotation.refused.is_some()) {
            rotation.warned = true;
            return Outcome::NotReloaded {
                pending: rotation.pods.keys().cloned().collect(),
                total: servers.len(),
                refused: rotation.refused.clone(),
                after,
            };
        }
        Outcome::Nothing
    }
}

/// Collections to let pass after the `sent`-th attempt: 0, 1, 3, 7, ... (the next attempt one, two, four,
/// eight collections later), so that attempts are at most [`MAX_BACKOFF`] apart.
fn backoff(sent: u32, interval: Duration) -> u32 {
    let cap = u32::try_from(MAX_BACKOFF.as_millis() / interval.as_millis().max(1))
        .unwrap_or(u32::MAX)
        .max(1);
    let spacing = 1u32
        .checked_shl(sent.saturating_sub(1))
        .unwrap_or(u32::MAX)
        .min(cap);
    spacing - 1
}

#[cfg(test)]
mod tests {
    use super::*;

    const INTERVAL: Duration = Duration::from_secs(10);

    fn digest(byte: u8) -> CertificateDigest {
        CertificateDigest::of_der(&[byte])
    }

    fn presented(byte: u8, refresh: Option<RefreshAnswer>) -> Presented {
        Presented {
            digest: digest(byte),
            refresh,
        }
    }

    /// A collection where every pod presents `byte` with `refresh`, `at` seconds from `start`.
    fn collect(
        reload: &mut Reload,
        start: Instant,
        at: u64,
        pods: &[&str],
        shown: &Presented,
    ) -> Outcome {
        let servers: Vec<Observed<'_>> = pods
            .iter()
            .map(|pod| Observed {
                pod,
                presented: Some(shown),
            })
            .collect();
        reload.observe(start + Duration::from_secs(at), INTERVAL, &servers)
    }

    #[test]
    fn attempts_back_off_to_at_most_the_cap() {
        assert_eq!(
            (1..=6).map(|n| backoff(n, INTERVAL)).collect::<Vec<_>>(),
            [0, 1, 3, 7, 11, 11],
            "then every 12 collections: 120 s"
        );
        assert_eq!(backoff(3, Duration::from_secs(300)), 0, "every collection");
        assert_eq!(backoff(40, Duration::from_millis(1)), 119_999);
    }

    #[test]
    fn servers_presenting_the_secret_certificate_need_nothing() {
        let (mut reload, start) = (Reload::default(), Instant::now());
        reload.secret(Ok(digest(1)), None);
        assert!(reload.may_refresh("a"));
        let current = presented(1, None);
        assert_eq!(
            collect(&mut reload, start, 0, &["a", "b"], &current),
            Outcome::Nothing
        );
        assert!(reload.rotation.is_none());
    }

    #[test]
    fn a_rotation_is_asked_for_with_backoff_and_reported_once_reloaded() {
        let (mut reload, start) = (Reload::default(), Instant::now());
        reload.secret(Ok(digest(2)), None);
        // The kubelet has not updated the files: both answer OK and present the old certificate.
        let old_ok = presented(1, Some(RefreshAnswer::Reloaded));
        assert_eq!(
            collect(&mut reload, start, 0, &["a", "b"], &old_ok),
            Outcome::Nothing
        );
        assert!(
            reload.may_refresh("a"),
            "asked again at the next collection"
        );
        collect(&mut reload, start, 10, &["a", "b"], &old_ok);
        assert!(!reload.may_refresh("a"), "then one collection left out");
        let old_unasked = presented(1, None);
        collect(&mut reload, start, 20, &["a", "b"], &old_unasked);
        assert!(reload.may_refresh("a"));
        // One server reloads; the other is still waiting for its files.
        let servers = [
            Observed {
                pod: "a",
                presented: Some(&presented(2, None)),
            },
            Observed {
                pod: "b",
                presented: Some(&old_ok),
            },
        ];
        assert_eq!(
            reload.observe(start + Duration::from_secs(30), INTERVAL, &servers),
            Outcome::Nothing
        );
        let new = presented(2, None);
        assert_eq!(
            collect(&mut reload, start, 70, &["a", "b"], &new),
            Outcome::Reloaded {
                servers: 2,
                after: Duration::from_secs(70)
            }
        );
        assert_eq!(
            collect(&mut reload, start, 80, &["a", "b"], &new),
            Outcome::Nothing,
            "said once"
        );
    }

    #[test]
    fn servers_that_do_not_reload_are_warned_about_once() {
        let (mut reload, start) = (Reload::default(), Instant::now());
        reload.secret(Ok(digest(2)), None);
        let old_ok = presented(1, Some(RefreshAnswer::Reloaded));
        assert_eq!(
            collect(&mut reload, start, 0, &["a"], &old_ok),
            Outcome::Nothing
        );
        let late = PATIENCE.as_secs();
        assert_eq!(
            collect(&mut reload, start, late, &["a"], &old_ok),
            Outcome::NotReloaded {
                pending: vec!["a".into()],
                total: 1,
                refused: None,
                after: PATIENCE
            }
        );
        assert_eq!(
            collect(&mut reload, start, late + 10, &["a"], &old_ok),
            Outcome::Nothing
        );
    }

    #[test]
    fn a_refusal_is_warned_about_at_once() {
        let (mut reload, start) = (Reload::default(), Instant::now());
        reload.secret(Ok(digest(2)), None);
        let refused = presented(1, Some(RefreshAnswer::Refused("ERROR key mismatch".into())));
        assert_eq!(
            collect(&mut reload, start, 0, &["a"], &refused),
            Outcome::NotReloaded {
                pending: vec!["a".into()],
                total: 1,
                refused: Some(("a".into(), "ERROR key mismatch".into())),
                after: Duration::ZERO
            }
        );
        // A corrected Secret starts over: asked at once, warned about again if it fails again.
        reload.secret(Ok(digest(3)), None);
        assert!(reload.may_refresh("a"));
        assert!(matches!(
            collect(&mut reload, start, 10, &["a"], &refused),
            Outcome::NotReloaded { .. }
        ));
    }

    #[test]
    fn a_certificate_that_cannot_be_loaded_is_said_once_and_asked_for_never() {
        let (mut reload, start) = (Reload::default(), Instant::now());
        reload.secret(Err("tls.key does not go with tls.crt".into()), None);
        let old = presented(1, None);
        assert_eq!(
            collect(&mut reload, start, 0, &["a"], &old),
            Outcome::Unusable("tls.key does not go with tls.crt".into())
        );
        reload.secret(Err("tls.key does not go with tls.crt".into()), None);
        assert_eq!(
            collect(&mut reload, start, 10, &["a"], &old),
            Outcome::Nothing
        );
        // Fixed: the servers are asked to reload it.
        reload.secret(Ok(digest(2)), None);
        assert!(reload.may_refresh("a"));
        let asked = presented(1, Some(RefreshAnswer::Reloaded));
        assert_eq!(
            collect(&mut reload, start, 20, &["a"], &asked),
            Outcome::Nothing
        );
        assert_eq!(
            collect(&mut reload, start, 30, &["a"], &presented(2, None)),
            Outcome::Reloaded {
                servers: 1,
                after: Duration::from_secs(10)
            }
        );
    }

    #[test]
    fn servers_that_go_are_not_waited_for_and_replacements_need_no_reload() {
        let (mut reload, start) = (Reload::default(), Instant::now());
        reload.secret(Ok(digest(2)), None);
        let old_ok = presented(1, Some(RefreshAnswer::Reloaded));
        collect(&mut reload, start, 0, &["a"], &old_ok);
        // Pod a was replaced by b, which started with the new files.
        assert_eq!(
            collect(&mut reload, start, 10, &["b"], &presented(2, None)),
            Outcome::Nothing,
            "nobody reloaded: nothing to say"
        );
        assert!(reload.rotation.is_none());
    }

    #[test]
    fn the_previous_ca_is_trusted_until_every_server_presents_the_new_certificate() {
        let (mut reload, start) = (Reload::default(), Instant::now());
        reload.secret(Ok(digest(1)), Some(b"old CA"));
        assert_eq!(reload.previous_ca(), None);
        reload.secret(Ok(digest(2)), Some(b"new CA"));
        assert_eq!(reload.previous_ca(), Some(&b"old CA"[..]));
        // A server that could not be read keeps it trusted.
        let servers = [
            Observed {
                pod: "a",
                presented: Some(&presented(2, None)),
            },
            Observed {
                pod: "b",
                presented: None,
            },
        ];
        reload.observe(start, INTERVAL, &servers);
        assert_eq!(reload.previous_ca(), Some(&b"old CA"[..]));
        collect(&mut reload, start, 10, &["a", "b"], &presented(2, None));
        assert_eq!(reload.previous_ca(), None);
        // The same CA with a new leaf keeps nothing extra.
        reload.secret(Ok(digest(3)), Some(b"new CA"));
        assert_eq!(reload.previous_ca(), None);
    }
}
