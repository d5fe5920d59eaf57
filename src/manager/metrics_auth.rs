//! Who may read `/metrics`: the caller's bearer token is authenticated by a TokenReview and the user it
//! names is authorized by a SubjectAccessReview for `get` on the non-resource URL `/metrics`, as
//! controller-runtime's `WithAuthenticationAndAuthorization` filter does for Kubebuilder operators. The
//! metrics name every tenant's instances and pods, so they are not for whoever reaches the pod.
//!
//! Both answers are cached per token (keyed by its SHA-256, so the token itself is neither kept nor
//! logged): a Prometheus scraping every 15 s costs two API requests a minute at most, not two per scrape.
//! At most [`MAX_CONCURRENT_SCRAPES`] requests are handled at once; more are answered 503 at once rather
//! than queued, so a flood of scrapes (each possibly costing API requests) cannot pile up behind them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::Client;
use kube::api::{Api, PostParams};
use sha2::{Digest, Sha256};
use tokio::sync::Semaphore;

/// The path and verb a scraper must be allowed, as in Kubebuilder's `metrics-reader` ClusterRole.
pub const METRICS_PATH: &str = "/metrics";
pub const METRICS_VERB: &str = "get";
/// How long an allowed token stays allowed without asking again: a revoked binding takes effect within it.
pub const ALLOWED_TTL: Duration = Duration::from_secs(60);
/// How long a refused token (unauthenticated or forbidden) stays refused: short, so that a binding just
/// created is honoured soon.
pub const DENIED_TTL: Duration = Duration::from_secs(10);
/// Most tokens remembered: a few scrapers are expected; a caller sending endless random tokens cannot grow
/// the cache beyond this (expired entries go first, then everything).
pub const MAX_CACHED_TOKENS: usize = 256;
/// Most `/metrics` requests served at once; the rest get 503 (Prometheus tries again at its next interval).
pub const MAX_CONCURRENT_SCRAPES: usize = 4;

/// What a token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// No valid token: 401.
    Unauthenticated,
    /// A valid token whose user may not `get /metrics`: 403.
    Forbidden,
    /// 200.
    Allowed,
}

/// Why no verdict could be reached (the API server did not answer as expected): 500, not cached.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("TokenReview failed: {0}")]
    TokenReview(#[source] kube::Error),
    #[error("SubjectAccessReview failed: {0}")]
    SubjectAccessReview(#[source] kube::Error),
}

/// Checks tokens through the API server, remembering the answers for a while.
pub struct Authorizer {
    client: Client,
    cache: Mutex<HashMap<[u8; 32], (Verdict, Instant)>>,
}

impl Authorizer {
    pub fn new(client: Client) -> Self {
        Authorizer {
            client,
            cache: Mutex::new(HashMap::new()),
        }
    }

    /// The verdict for `token`, from the cache while fresh, else from a TokenReview and (when it
    /// authenticates) a SubjectAccessReview.
    pub async fn verdict(&self, token: &str) -> Result<Verdict, AuthError> {
        let key: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let now = Instant::now();
        if let Some(verdict) = self.cached(&key, now) {
            return Ok(verdict);
        }
        let verdict = self.review(token).await?;
        let ttl = if verdict == Verdict::Allowed {
            ALLOWED_TTL
        } else {
            DENIED_TTL
        };
        self.remember(key, verdict, Instant::now() + ttl);
        Ok(verdict)
    }

    fn cached(&self, key: &[u8; 32], now: Instant) -> Option<Verdict> {
        let cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        cache
            .get(key)
            .filter(|(_, expires)| *expires > now)
            .map(|(verdict, _)| *verdict)
    }

    fn remember(&self, key: [u8; 32], verdict: Verdict, expires: Instant) {
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        if cache.len() >= MAX_CACHED_TOKENS && !cache.contains_key(&key) {
            let now = Instant::now();
            cache.retain(|_, (_, expires)| *expires > now);
            if cache.len() >= MAX_CACHED_TOKENS {
                cache.clear();
            }
        }
        cache.insert(key, (verdict, expires));
    }

    async fn review(&self, token: &str) -> Result<Verdict, AuthError> {
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_owned()),
                ..TokenReviewSpec::default()
            },
            ..TokenReview::default()
        };
        let reviewed = Api::<TokenReview>::all(self.client.clone())
            .create(&PostParams::default(), &review)
            .await
            .map_err(AuthError::TokenReview)?;
        let Some(status) = reviewed.status.filter(|s| s.authenticated == Some(true)) else {
            return Ok(Verdict::Unauthenticated);
        };
        let user = status.user.unwrap_or_default();
        let access = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: user.username,
                groups: user.groups,
                uid: user.uid,
                extra: user.extra,
                non_resource_attributes: Some(NonResourceAttributes {
                    path: Some(METRICS_PATH.to_owned()),
                    verb: Some(METRICS_VERB.to_owned()),
                }),
                ..SubjectAccessReviewSpec::default()
            },
            ..SubjectAccessReview::default()
        };
        let answered = Api::<SubjectAccessReview>::all(self.client.clone())
            .create(&PostParams::default(), &access)
            .await
            .map_err(AuthError::SubjectAccessReview)?;
        Ok(if answered.status.is_some_and(|s| s.allowed) {
            Verdict::Allowed
        } else {
            Verdict::Forbidden
        })
    }
}

/// What every `/metrics` request passes: the concurrency limit, then (when `authorizer` is set, i.e. unless
/// `--metrics-secure=false`) the token check.
#[derive(Clone)]
pub struct Gate {
    authorizer: Option<Arc<Authorizer>>,
    permits: Arc<Semaphore>,
}

impl Gate {
    /// Tokens checked by `authorizer`, or none checked (development, loopback only).
    pub fn new(authorizer: Option<Arc<Authorizer>>) -> Self {
        Gate {
            authorizer,
            permits: Arc::new(Semaphore::new(MAX_CONCURRENT_SCRAPES)),
        }
    }
}

/// The bearer token of an `Authorization: Bearer <token>` header (the scheme is case-insensitive).
fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// The middleware (`axum::middleware::from_fn_with_state`) enforcing a [`Gate`].
pub async fn enforce(State(gate): State<Gate>, request: Request, next: Next) -> Response {
    let Ok(_permit) = gate.permits.clone().try_acquire_owned() else {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            [(header::RETRY_AFTER, "1")],
            "too many concurrent scrapes\n",
        )
            .into_response();
    };
    let Some(authorizer) = &gate.authorizer else {
        return next.run(request).await;
    };
    let Some(token) = bearer(request.headers()) else {
        return unauthorized();
    };
    match authorizer.verdict(token).await {
        Ok(Verdict::Allowed) => next.run(request).await,
        Ok(Verdict::Unauthenticated) => unauthorized(),
        Ok(Verdict::Forbidden) => (
            StatusCode::FORBIDDEN,
            "forbidden: this user may not get /metrics (bind it to the metrics-reader ClusterRole)\n",
        )
            .into_response(),
        Err(error) => {
            tracing::warn!(%error, "cannot check a /metrics caller");
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                "cannot check the token with the API server\n",
            )
                .into_response()
        }
    }
}

fn unauthorized() -> Response {
    (
        StatusCode::UNAUTHORIZED,
        [(header::WWW_AUTHENTICATE, "Bearer")],
        "unauthorized: a valid bearer token is required\n",
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_tokens_are_read_from_the_authorization_header() {
        let with = |value: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(header::AUTHORIZATION, value.parse().unwrap());
            headers
        };
        assert_eq!(bearer(&with("Bearer abc")), Some("abc"));
        assert_eq!(bearer(&with("bearer abc")), Some("abc"));
        assert_eq!(bearer(&with("Basic abc")), None);
        assert_eq!(bearer(&with("Bearer ")), None);
        assert_eq!(bearer(&HeaderMap::new()), None);
    }
}
