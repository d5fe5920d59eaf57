//! One tower layer in the kube client's stack through which the operator sees every API request it makes:
//! the metrics count them, [`crate::run::connectivity`] tells from them whether the API server
//! answers, and leader election tells from them when the Lease was last renewed. Observers see the
//! request's method, verb and start, and its outcome; they never change a request or its answer.

use std::error::Error as StdError;
use std::task::{Context as TaskContext, Poll};
use std::time::Instant;

use futures::future::BoxFuture;
use http::{Method, Request, Response, StatusCode, Version};

/// What an observer learns about a request before it is sent.
#[derive(Clone, Debug)]
pub struct Sent {
    pub method: Method,
    /// The Kubernetes verb ([`verb`]).
    pub verb: &'static str,
    /// When the request was handed to the client stack.
    pub at: Instant,
}

/// How a request ended.
#[derive(Clone, Copy, Debug)]
pub enum Outcome<'a> {
    /// The API server answered with this status, over this HTTP version (HTTP/2 over TLS where the server
    /// offers it: see [`crate::manager::transport`]).
    Answered(StatusCode, Version),
    /// No answer arrived (connection refused or reset, timeout, TLS failure, ...).
    Failed(&'a (dyn StdError + Send + Sync)),
}

/// Something that wants to see every request's outcome.
pub trait Observer: Clone + Send + Sync + 'static {
    fn observe(&self, sent: &Sent, outcome: Outcome<'_>, now: Instant);
}

/// The Kubernetes verb of a request, from its method and (for GET) whether it is a watch.
/// A plain GET is reported as `get` whether it reads one object or lists many.
pub fn verb<B>(request: &Request<B>) -> &'static str {
    match *request.method() {
        Method::GET => {
            let watch = request
                .uri()
                .query()
                .is_some_and(|q| q.split('&').any(|kv| kv == "watch=true" || kv == "watch=1"));
            if watch { "watch" } else { "get" }
        }
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE => "delete",
        _ => "other",
    }
}

/// An error and its causes on one line: hyper's own message ("client error (Connect)") says little without
/// the cause underneath ("Connection refused").
pub fn error_chain(error: &(dyn StdError + Send + Sync)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// Tower layer that shows every request to an [`Observer`].
#[derive(Clone)]
pub struct ObserveLayer<O> {
    observer: O,
}

impl<O> ObserveLayer<O> {
    pub fn new(observer: O) -> Self {
        Self { observer }
    }
}

impl<S, O: Clone> tower::Layer<S> for ObserveLayer<O> {
    type Service = ObserveService<S, O>;

    fn layer(&self, inner: S) -> Self::Service {
        ObserveService {
            inner,
            observer: self.observer.clone(),
        }
    }
}

/// Service produced by [`ObserveLayer`].
#[derive(Clone)]
pub struct ObserveService<S, O> {
    inner: S,
    observer: O,
}

impl<S, O, ReqBody, ResBody> tower::Service<Request<ReqBody>> for ObserveService<S, O>
where
    S: tower::Service<Request<ReqBody>, Response = Response<ResBody>>,
    S::Error: AsRef<dyn StdError + Send + Sync>,
    S::Future: Send + 'static,
    O: Observer,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut TaskContext<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let sent = Sent {
            method: request.method().clone(),
            verb: verb(&request),
            at: Instant::now(),
        };
        let observer = self.observer.clone();
        let future = self.inner.call(request);
        Box::pin(async move {
            let result = future.await;
            let outcome = match &result {
                Ok(response) => Outcome::Answered(response.status(), response.version()),
                Err(error) => Outcome::Failed(error.as_ref()),
            };
            observer.observe(&sent, outcome, Instant::now());
            result
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};
    use tower::{BoxError, Layer, Service, ServiceExt};

    #[test]
    fn verbs_from_method_and_watch_flag() {
        let req = |m: Method, uri: &str| Request::builder().method(m).uri(uri).body(()).unwrap();
        assert_eq!(
            verb(&req(
                Method::GET,
                "/apis/apps/v1/deployments?watch=true&resourceVersion=1"
            )),
            "watch"
        );
        assert_eq!(
            verb(&req(Method::GET, "/apis/apps/v1/deployments?limit=500")),
            "get"
        );
        assert_eq!(
            verb(&req(
                Method::PATCH,
                "/apis/apps/v1/namespaces/a/deployments/b"
            )),
            "patch"
        );
        assert_eq!(
            verb(&req(
                Method::POST,
                "/apis/events.k8s.io/v1/namespaces/a/events"
            )),
            "create"
        );
    }

    #[derive(Clone, Default)]
    struct Seen(Arc<Mutex<Vec<String>>>);

    impl Observer for Seen {
        fn observe(&self, sent: &Sent, outcome: Outcome<'_>, _now: Instant) {
            let outcome = match outcome {
                Outcome::Answered(status, version) => format!("{} {version:?}", status.as_u16()),
                Outcome::Failed(error) => error_chain(error),
            };
            self.0
                .lock()
                .unwrap()
                .push(format!("{} {outcome}", sent.verb));
        }
    }

    #[tokio::test]
    async fn observers_see_answers_and_failures_with_their_causes() {
        let seen = Seen::default();
        let mut answered =
            ObserveLayer::new(seen.clone()).layer(tower::service_fn(|_req: Request<()>| async {
                let response = Response::builder().status(409).version(Version::HTTP_2);
                Ok::<_, BoxError>(response.body(()).unwrap())
            }));
        let patch = Request::builder()
            .method(Method::PATCH)
            .uri("/x")
            .body(())
            .unwrap();
        answered.ready().await.unwrap().call(patch).await.unwrap();

        #[derive(Debug, thiserror::Error)]
        #[error("client error (Connect)")]
        struct Connect(#[source] std::io::Error);
        let mut failing =
            ObserveLayer::new(seen.clone()).layer(tower::service_fn(|_req: Request<()>| async {
                let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
                Err::<Response<()>, BoxError>(Box::new(Connect(refused)))
            }));
        let watch = Request::builder().uri("/x?watch=true").body(()).unwrap();
        assert!(failing.ready().await.unwrap().call(watch).await.is_err());

        assert_eq!(
            *seen.0.lock().unwrap(),
            [
                "patch 409 HTTP/2.0",
                "watch client error (Connect): connection refused"
            ]
        );
    }
}
