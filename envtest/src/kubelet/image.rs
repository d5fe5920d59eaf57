//! Image pulls, as far as the stand-in kubelet can tell them. It has no container runtime and pulls
//! nothing, so it takes every image as pulled, except images that no registry can ever serve: those of a
//! registry under the reserved top-level domain `.invalid` (RFC 2606 and RFC 6761: such names never
//! resolve), as in `registry.invalid/app:1`. For a container with such an image it reports what a kubelet
//! reports for an image it cannot pull: the container waiting with reason `ErrImagePull` right after a
//! failed attempt, then `ImagePullBackOff` until the next attempt, with the kubelet's image back-off
//! (10 s, doubling up to 5 minutes) between attempts; the container is never started, so the pod stays
//! `Pending` and not ready.
//!
//! One more registry is special: images of `no-server.test` ([`NO_SERVER_REGISTRY`], under the reserved
//! `.test` domain) are taken as pulled, and their container is reported running and ready, but the
//! stand-in starts no memcached for it: connections to the pod's address are refused. That is a server
//! that stopped accepting after it turned ready (a crash between two probes, a full connection table),
//! which a scenario cannot otherwise bring about at a chosen moment; a real kubelet's readiness probe
//! would mark it not ready a few seconds later, the stand-in runs no probes.
//!
//! Pure functions of the image and the time since the first attempt, so the rules are tested without a
//! server.

use std::time::Duration;

/// The kubelet's first image back-off, doubled after each failed attempt ...
pub const BACKOFF_INITIAL: Duration = Duration::from_secs(10);
/// ... up to this (the kubelet's `MaxContainerBackOff`).
pub const BACKOFF_MAX: Duration = Duration::from_secs(300);
/// How long a container shows `ErrImagePull` after a failed attempt before the back-off shows
/// (`ImagePullBackOff`): until the kubelet's next sync of the pod, a few seconds.
pub const ERR_IMAGE_PULL_SHOWN: Duration = Duration::from_secs(5);

/// A container's waiting state, as the kubelet reports it in `state.waiting`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Waiting {
    pub reason: String,
    pub message: String,
}

/// The registry host of an image reference (`host[:port]/path[:tag][@digest]`), lower-cased, without
/// its port; `None` for an image of the default registry (`memcached:1.6`, `prom/exporter`), whose
/// first component names no host (no `.` or `:` in it, and not `localhost`).
pub fn registry(image: &str) -> Option<String> {
    let (first, _rest) = image.split_once('/')?;
    let is_host = first.contains('.') || first.contains(':') || first == "localhost";
    if !is_host {
        return None;
    }
    let host = match first.rsplit_once(':') {
        // An IPv6 literal in brackets has colons of its own.
        Some((host, port)) if port.chars().all(|c| c.is_ascii_digit()) => host,
        _ => first,
    };
    Some(host.to_ascii_lowercase())
}

/// Why `image` cannot be pulled, as the kubelet's `ErrImagePull` message says it; `None` when the
/// stand-in takes it as pulled.
pub fn pull_error(image: &str) -> Option<String> {
    let host = registry(image)?;
    let host = host.trim_end_matches('.');
    let reserved = host == "invalid" || host.ends_with(".invalid");
    reserved.then(|| {
        format!(
            "failed to pull and unpack image \"{image}\": failed to resolve reference \"{image}\": \
             dial tcp: lookup {host}: no such host"
        )
    })
}

/// The registry whose images run no server ([module docs](self)).
pub const NO_SERVER_REGISTRY: &str = "no-server.test";

/// Whether the stand-in runs a memcached for a container of `image`: every image but those of
/// [`NO_SERVER_REGISTRY`].
pub fn runs_server(image: &str) -> bool {
    registry(image).as_deref() != Some(NO_SERVER_REGISTRY)
}

/// How long the back-off after failed attempt `attempt` (0 for the first) lasts.
fn backoff(attempt: u32) -> Duration {
    BACKOFF_INITIAL
        .checked_mul(1u32.checked_shl(attempt).unwrap_or(u32::MAX))
        .unwrap_or(BACKOFF_MAX)
        .min(BACKOFF_MAX)
}

/// The state of a container whose image cannot be pulled (`error`, from [`pull_error`]), `elapsed`
/// after the first attempt; and how long that state lasts (when the status changes next).
pub fn pull_state(image: &str, error: &str, elapsed: Duration) -> (Waiting, Duration) {
    let mut attempt_at = Duration::ZERO;
    let mut attempt = 0u32;
    loop {
        let backoff_ends = attempt_at + ERR_IMAGE_PULL_SHOWN + backoff(attempt);
        if elapsed < backoff_ends {
            let err_ends = attempt_at + ERR_IMAGE_PULL_SHOWN;
            return if elapsed < err_ends {
                (
                    Waiting {
                        reason: "ErrImagePull".to_owned(),
                        message: error.to_owned(),
                    },
                    err_ends - elapsed,
                )
            } else {
                (
                    Waiting {
                        reason: "ImagePullBackOff".to_owned(),
                        message: format!("Back-off pulling image \"{image}\""),
                    },
                    backoff_ends - elapsed,
                )
            };
        }
        attempt_at = backoff_ends;
        attempt = attempt.saturating_add(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registries_are_told_from_docker_hub_names() {
        assert_eq!(registry("memcached:1.6"), None);
        assert_eq!(registry("prom/memcached-exporter:v0.15.0"), None);
        assert_eq!(
            registry("registry.invalid/does-not-exist:0.0.0").as_deref(),
            Some("registry.invalid")
        );
        assert_eq!(
            registry("Registry.Invalid:5000/a/b@sha256:00").as_deref(),
            Some("registry.invalid")
        );
        assert_eq!(
            registry("localhost/memcached").as_deref(),
            Some("localhost")
        );
        assert_eq!(
            registry("quay.io/prometheus/memcached-exporter").as_deref(),
            Some("quay.io")
        );
    }

    #[test]
    fn only_images_of_the_no_server_registry_run_no_server() {
        assert!(!runs_server("no-server.test/memcached:1.6"));
        assert!(!runs_server("No-Server.Test:5000/memcached:1.6"));
        for serving in [
            "memcached:1.6",
            "no-server/memcached:1.6",
            "registry.no-server.test/memcached:1.6",
            "quay.io/no-server.test/memcached:1",
        ] {
            assert!(runs_server(serving), "{serving}");
        }
    }

    #[test]
    fn only_images_of_the_reserved_invalid_domain_fail() {
        for pullable in [
            "memcached:1.6.38-alpine",
            "docker.io/library/memcached:1.6",
            "quay.io/invalid/image:1",
            "invalid/image:1",
            "registry.invalid.example.com/x:1",
        ] {
            assert_eq!(pull_error(pullable), None, "{pullable}");
        }
        for unpullable in [
            "registry.invalid/does-not-exist:0.0.0",
            "registry.invalid/e2e-drift/memcached:0.0.0",
            "a.b.INVALID:443/x",
            "registry.invalid./x",
        ] {
            let error = pull_error(unpullable).unwrap_or_else(|| panic!("{unpullable}"));
            assert!(
                error.contains(unpullable) && error.contains("no such host"),
                "{error}"
            );
        }
    }

    #[test]
    fn err_image_pull_then_back_off_growing_to_five_minutes() {
        let image = "registry.invalid/x:1";
        let error = pull_error(image).unwrap();
        let at = |s: u64| pull_state(image, &error, Duration::from_secs(s));
        let (first, lasts) = at(0);
        assert_eq!(first.reason, "ErrImagePull");
        assert_eq!(first.message, error);
        assert_eq!(lasts, ERR_IMAGE_PULL_SHOWN);
        let (backing_off, lasts) = at(5);
        assert_eq!(backing_off.reason, "ImagePullBackOff");
        assert_eq!(
            backing_off.message,
            "Back-off pulling image \"registry.invalid/x:1\""
        );
        assert_eq!(lasts, Duration::from_secs(10));
        // Attempts at 0, 15 (5 + 10), 40 (+ 5 + 20), 85 (+ 5 + 40), ...
        assert_eq!(at(15).0.reason, "ErrImagePull");
        assert_eq!(at(20).0.reason, "ImagePullBackOff");
        assert_eq!(at(39).1, Duration::from_secs(1));
        assert_eq!(at(40).0.reason, "ErrImagePull");
        // Far out, the back-off is capped at five minutes.
        let (_, lasts) = at(100_000);
        assert!(lasts <= BACKOFF_MAX, "{lasts:?}");
        assert_eq!(backoff(40), BACKOFF_MAX);
    }
}
