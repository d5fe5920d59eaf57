//! Who may read `/metrics`: the caller's bearer token is authenticated by a TokenReview and the user it
//! names is authorized by a SubjectAccessReview for `get` on the non-resource URL `/metrics`, as
//! controller-runtime's `WithAuthenticationAndAuthorization` filter does for Kubebuilder operators. The
//! metrics name every tenant's instances and pods, so they are not for whoever reaches the pod.
//!
//! Answers are remembered per token (keyed by its SHA-256, so the token itself is neither kept nor
//! logged): a Prometheus scraping every 15 s costs two API requests a minute at most, not two per scrape.
//! Tokens that may read are remembered apart from those refused, so that a caller sending endless
//! random tokens can fill only the second memory, and never pushes an allowed token out of the first.
//!
//! Authentication comes before, and apart from, the limit on scrapes, so that unauthenticated callers
//! cannot starve Prometheus even while the API server is slow to review tokens:
//! - a token allowed less than [`ALLOWED_TTL`] ago passes at once, without a review and without waiting
//!   for anything; used after [`REFRESH_AFTER`], it is reviewed again in the background, so that a
//!   regular scraper's verdict never runs out. A token allowed before, whose verdict has run out, is
//!   reviewed again on slots of its own ([`MAX_CONCURRENT_RECHECKS`]), which unknown tokens cannot take;
//! - a token refused less than [`DENIED_TTL`] ago is refused at once;
//! - any other token is reviewed on one of [`MAX_CONCURRENT_REVIEWS`] slots, or answered 429 at once
//!   when they are all taken, rather than queued;
//! - only then, at most [`MAX_CONCURRENT_SCRAPES`] allowed requests are answered at once; more get 503.

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
/// How old an allowed token's verdict may be before its next use has it reviewed again, in the
/// background: a scraper coming at least once per `ALLOWED_TTL - REFRESH_AFTER` never waits for a review.
pub const REFRESH_AFTER: Duration = Duration::from_secs(30);
/// How long a token stays known as once allowed after its verdict has run out: until then it is reviewed
/// again on slots of its own, which unknown tokens cannot take.
pub const FORGET_AFTER: Duration = Duration::from_secs(600);
/// How long a refused token (unauthenticated or forbidden) stays refused: short, so that a binding just
/// created is honoured soon.
pub const DENIED_TTL: Duration = Duration::from_secs(10);
/// Most allowed tokens remembered (a few scrapers are expected; only tokens the API server allowed get
/// here). When full, the longest unused goes.
pub const MAX_ALLOWED_TOKENS: usize = 64;
/// Most refused tokens remembered: a caller sending endless random tokens cannot grow the memory beyond
/// this (expired entries go first, then every refused one). About 50 bytes each.
pub const MAX_DENIED_TOKENS: usize = 1024;
/// Most reviews of unknown tokens at once; more unknown tokens are answered 429 at once.
pub const MAX_CONCURRENT_REVIEWS: usize = 4;
/// Most reviews at once of tokens allowed before (refreshes, and verdicts that ran out); more wait.
pub const MAX_CONCURRENT_RECHECKS: usize = 2;
/// Most allowed `/metrics` requests served at once; the rest get 503 (Prometheus tries again at its next
/// interval).
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

/// Why no verdict was reached: the API server did not answer as expected (500), or every review slot
/// was taken (429). Not remembered.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("TokenReview failed: {0}")]
    TokenReview(#[source] kube::Error),
    #[error("SubjectAccessReview failed: {0}")]
    SubjectAccessReview(#[source] kube::Error),
    #[error("too many unknown tokens are being reviewed")]
    Busy,
}

/// The durations and slots of an [`Authorizer`]: the constants above by default (tests shorten them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub allowed_ttl: Duration,
    pub refresh_after: Duration,
    pub forget_after: Duration,
    pub denied_ttl: Duration,
    pub reviews: usize,
    pub rechecks: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            allowed_ttl: ALLOWED_TTL,
            refresh_after: REFRESH_AFTER,
            forget_after: FORGET_AFTER,
            denied_ttl: DENIED_TTL,
            reviews: MAX_CONCURRENT_REVIEWS,
            rechecks: MAX_CONCURRENT_RECHECKS,
        }
    }
}

/// A token's SHA-256.
type Key = [u8; 32];

/// What is remembered of the tokens reviewed.
#[derive(Default)]
struct Memory {
    /// Allowed tokens: when they were last allowed, and whether a review of them is under way.
    allowed: HashMap<Key, (Instant, bool)>,
    /// Refused tokens: how, and until when.
    denied: HashMap<Key, (Verdict, Instant)>,
}

/// What the memory says of a token.
enum Recall {
    /// Allowed; `refresh`: review it again in the background (this caller does it).
    Allowed {
        refresh: bool,
    },
    /// Allowed before, but that verdict has run out: review it again on the re-check slots.
    RanOut,
    Refused(Verdict),
    Unknown,
}

/// Checks tokens through the API server, remembering the answers for a while. Clones share everything.
#[derive(Clone)]
pub struct Authorizer {
    inner: Arc<Inner>,
}

struct Inner {
    client: Client,
    limits: Limits,
    memory: Mutex<Memory>,
    reviews: Semaphore,
    rechecks: Semaphore,
}

impl Authorizer {
    pub fn new(client: Client) -> Self {
        Authorizer::with_limits(client, Limits::default())
    }

    pub fn with_limits(client: Client, limits: Limits) -> Self {
        Authorizer {
            inner: Arc::new(Inner {
                client,
                limits,
                memory: Mutex::default(),
                reviews: Semaphore::new(limits.reviews),
                rechecks: Semaphore::new(limits.rechecks),
            }),
        }
    }

    /// The verdict for `token`: from memory while it holds (see the module documentation), else from a
    /// TokenReview and (when it authenticates) a SubjectAccessReview; [`AuthError::Busy`] for an unknown
    /// token while every review slot is taken.
    pub async fn verdict(&self, token: &str) -> Result<Verdict, AuthError> {
        let key: Key = Sha256::digest(token.as_bytes()).into();
        match self.recall(&key) {
            Recall::Allowed { refresh } => {
                if refresh {
                    self.refresh(key, token.to_owned());
                }
                Ok(Verdict::Allowed)
            }
            Recall::Refused(verdict) => Ok(verdict),
            Recall::RanOut => {
                let _slot = self.inner.rechecks.acquire().await;
                // Another request with the same token may have had it reviewed meanwhile.
                if let Recall::Allowed { .. } = self.recall(&key) {
                    return Ok(Verdict::Allowed);
                }
                self.check(key, token).await
            }
            Recall::Unknown => {
                let Ok(_slot) = self.inner.reviews.try_acquire() else {
                    return Err(AuthError::Busy);
                };
                self.check(key, token).await
            }
        }
    }

    fn memory(&self) -> std::sync::MutexGuard<'_, Memory> {
        self.inner.memory.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn recall(&self, key: &Key) -> Recall {
        let limits = &self.inner.limits;
        let now = Instant::now();
        let mut memory = self.memory();
        if let Some((at, rechecking)) = memory.allowed.get_mut(key) {
            let age = now.saturating_duration_since(*at);
            if age < limits.allowed_ttl {
                let refresh = age >= limits.refresh_after && !*rechecking;
                *rechecking |= refresh;
                return Recall::Allowed { refresh };
            }
            if age < limits.forget_after {
                return Recall::RanOut;
            }
            memory.allowed.remove(key);
        }
        match memory.denied.get(key) {
            Some((verdict, until)) if *until > now => Recall::Refused(*verdict),
            _ => Recall::Unknown,
        }
    }

    async fn check(&self, key: Key, token: &str) -> Result<Verdict, AuthError> {
        let verdict = self.review(token).await?;
        self.remember(key, verdict);
        Ok(verdict)
    }

    /// Reviews an allowed token again in the background, on a re-check slot; until the answer comes (or
    /// if none does) its verdict stands, as long as it has not run out.
    fn refresh(&self, key: Key, token: String) {
        let this = self.clone();
        tokio::spawn(async move {
            let _slot = this.inner.rechecks.acquire().await;
            match this.review(&token).await {
                Ok(verdict) => this.remember(key, verdict),
                Err(error) => {
                    tracing::warn!(%error, "cannot check a /metrics caller again; its verdict stands until it runs out");
                    if let Some((_, rechecking)) = this.memory().allowed.get_mut(&key) {
                        *rechecking = false;
                    }
                }
            }
        });
    }

    fn remember(&self, key: Key, verdict: Verdict) {
        let now = Instant::now();
        let forget_after = self.inner.limits.forget_after;
        let denied_until = now + self.inner.limits.denied_ttl;
        let mut memory = self.memory();
        if verdict == Verdict::Allowed {
            memory.denied.remove(&key);
            let allowed = &mut memory.allowed;
            if allowed.len() >= MAX_ALLOWED_TOKENS && !allowed.contains_key(&key) {
                allowed.retain(|_, (at, _)| now.saturating_duration_since(*at) < forget_after);
                let oldest = allowed
                    .iter()
                    .min_by_key(|(_, (at, _))| *at)
                    .map(|(k, _)| *k);
                if let Some(oldest) = oldest.filter(|_| allowed.len() >= MAX_ALLOWED_TOKENS) {
                    allowed.remove(&oldest);
                }
            }
            allowed.insert(key, (now, false));
            return;
        }
        // A token refused now (a binding revoked) is no longer one allowed before.
        memory.allowed.remove(&key);
        let denied = &mut memory.denied;
        if denied.len() >= MAX_DENIED_TOKENS && !denied.contains_key(&key) {
            denied.retain(|_, (_, until)| *until > now);
            if denied.len() >= MAX_DENIED_TOKENS {
                denied.clear();
            }
        }
        denied.insert(key, (verdict, denied_until));
    }

    async fn review(&self, token: &str) -> Result<Verdict, AuthError> {
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_owned()),
                ..TokenReviewSpec::default()
            },
            ..TokenReview::default()
        };
        let reviewed = Api::<TokenReview>::all(self.inner.client.clone())
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
        let answered = Api::<SubjectAccessReview>::all(self.inner.client.clone())
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

/// What every `/metrics` request passes: (when `authorizer` is set, i.e. unless `--metrics-secure=false`)
/// the token check, then the limit on scrapes served at once.
#[derive(Clone)]
pub struct Gate {
    authorizer: Option<Arc<Authorizer>>,
    scrapes: Arc<Semaphore>,
}

impl Gate {
    /// Tokens checked by `authorizer`, or none checked (development, loopback only).
    pub fn new(authorizer: Option<Arc<Authorizer>>) -> Self {
        Gate {
            authorizer,
            scrapes: Arc::new(Semaphore::new(MAX_CONCURRENT_SCRAPES)),
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
    if let Some(authorizer) = &gate.authorizer
        && let Err(refusal) = admit(authorizer, request.headers()).await
    {
        return refusal;
    }
    let Ok(_permit) = gate.scrapes.clone().try_acquire_owned() else {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            [(header::RETRY_AFTER, "1")],
            "too many concurrent scrapes\n",
        )
            .into_response();
    };
    next.run(request).await
}

/// Nothing when the request's token may read the metrics, else the answer that refuses it.
async fn admit(authorizer: &Authorizer, headers: &HeaderMap) -> Result<(), Response> {
    let Some(token) = bearer(headers) else {
        return Err(unauthorized());
    };
    match authorizer.verdict(token).await {
        Ok(Verdict::Allowed) => Ok(()),
        Ok(Verdict::Unauthenticated) => Err(unauthorized()),
        Ok(Verdict::Forbidden) => Err((
            StatusCode::FORBIDDEN,
            "forbidden: this user may not get /metrics (bind it to the metrics-reader ClusterRole)\n",
        )
            .into_response()),
        Err(AuthError::Busy) => Err((
            StatusCode::TOO_MANY_REQUESTS,
            [(header::RETRY_AFTER, "1")],
            "too many unknown tokens are being checked; try again\n",
        )
            .into_response()),
        Err(error) => {
            tracing::warn!(%error, "cannot check a /metrics caller");
            Err((
                StatusCode::INTERNAL_SERVER_ERROR,
                "cannot check the token with the API server\n",
            )
                .into_response())
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
