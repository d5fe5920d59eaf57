//! Requests sent again when the connection under them was lost before any answer came.
//!
//! The tests' own clients (admin, kubelet) speak HTTP/1.1 through kube's stack, whose pool reuses idle
//! connections. Now and then a connection is closed under a request in flight: a CI run lost a scenario's
//! first apply that way (`ServiceError: client error (SendRequest)`), on a 2-core machine running the control
//! plane, the stand-in kubelet's memcached servers and the operators of the scenarios at once.
//! kube-apiserver closes idle HTTP/1.1 connections after 90 s, the age at which the client's pool gives them
//! up too. Go's clients send such a request again on a new connection; kube's do not, so the scenario failed
//! on the harness's transport, not on the operator it tests.
//!
//! This layer sends a request again, at most twice, when the error says that the connection was lost: not on
//! a refused connection (a scenario that stops the API server expects its requests to fail at once), not on
//! a timeout, and never once the server has answered (an answer with an error status is not an error here).
//! A request the server had already carried out is carried out again. For what the harness sends
//! (server-side applies, gets, lists, watches, deletes) that is harmless; a create sent again is answered
//! `AlreadyExists`, no worse than the transport error it replaces.

use std::error::Error as StdError;
use std::future::Future;
use std::io;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::future::BoxFuture;
use http::{Request, Response};
use http_body_util::BodyExt as _;
use kube::client::Body;
use tower::buffer::Buffer;
use tower::{BoxError, Layer, Service, ServiceExt as _};

/// Attempts per request, the first included.
const ATTEMPTS: usize = 3;
/// The pause before a request is sent again.
const PAUSE: Duration = Duration::from_millis(100);

/// Wraps a client's service in [`Retrying`]. Must be applied inside a Tokio runtime: the buffer it adds
/// spawns its worker there.
#[derive(Clone, Copy, Debug, Default)]
pub struct RetryLayer;

impl<S> Layer<S> for RetryLayer
where
    S: Service<Request<Body>, Error = BoxError> + Send + 'static,
    S::Future: Send + 'static,
    S::Response: Send + 'static,
{
    type Service = Retrying<S::Future>;

    fn layer(&self, inner: S) -> Self::Service {
        // The buffer lets each request's future reach the one inner service again (kube's client puts its
        // service behind a buffer the same way).
        Retrying {
            inner: Buffer::new(inner, 1024),
        }
    }
}

/// See the module documentation.
pub struct Retrying<F> {
    inner: Buffer<Request<Body>, F>,
}

impl<F: Send + 'static> Clone for Retrying<F> {
    fn clone(&self) -> Self {
        Retrying {
            inner: self.inner.clone(),
        }
    }
}

impl<F, B> Service<Request<Body>> for Retrying<F>
where
    F: Future<Output = Result<Response<B>, BoxError>> + Send + 'static,
    B: Send + 'static,
{
    type Response = Response<B>;
    type Error = BoxError;
    type Future = BoxFuture<'static, Result<Response<B>, BoxError>>;

    /// Always ready: each call waits for the buffer itself, once per attempt.
    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let mut inner = self.inner.clone();
        Box::pin(async move {
            let (parts, body) = request.into_parts();
            // kube's request bodies are whole byte strings: collecting one only moves it.
            let body = body.collect().await?.to_bytes();
            let mut attempt = 1;
            loop {
                let request = Request::from_parts(parts.clone(), Body::from(body.clone()));
                match inner.ready().await?.call(request).await {
                    Err(error) if attempt < ATTEMPTS && lost_connection(error.as_ref()) => {
                        tracing::warn!(
                            method = %parts.method, uri = %parts.uri, attempt, error = %chain(error.as_ref()),
                            "the connection was lost before an answer; sending the request again"
                        );
                        attempt += 1;
                        tokio::time::sleep(PAUSE).await;
                    }
                    result => return result,
                }
            }
        })
    }
}

/// Whether `error` says that an established connection was lost before the answer (see the module
/// documentation for what is not sent again).
fn lost_connection(error: &(dyn StdError + 'static)) -> bool {
    let mut lost = false;
    let mut next = Some(error);
    while let Some(e) = next {
        if let Some(client) = e.downcast_ref::<hyper_util::client::legacy::Error>() {
            if client.is_connect() {
                return false;
            }
        } else if let Some(http) = e.downcast_ref::<hyper::Error>() {
            if http.is_timeout() {
                return false;
            }
            lost |= http.is_incomplete_message() || http.is_canceled() || http.is_closed();
        } else if let Some(io) = e.downcast_ref::<io::Error>() {
            use io::ErrorKind::*;
            match io.kind() {
                TimedOut | ConnectionRefused => return false,
                ConnectionReset | ConnectionAborted | BrokenPipe | UnexpectedEof => lost = true,
                _ => {}
            }
        }
        next = e.source();
    }
    lost
}

/// `error: cause: cause`, for the log.
fn chain(error: &(dyn StdError + 'static)) -> String {
    let mut text = error.to_string();
    let mut next = error.source();
    while let Some(e) = next {
        text.push_str(": ");
        text.push_str(&e.to_string());
        next = e.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// An error whose `source` is `cause`.
    #[derive(Debug)]
    struct Wrapped(Box<dyn StdError + Send + Sync>);

    impl std::fmt::Display for Wrapped {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("wrapped")
        }
    }

    impl StdError for Wrapped {
        fn source(&self) -> Option<&(dyn StdError + 'static)> {
            Some(self.0.as_ref())
        }
    }

    fn io_error(kind: io::ErrorKind) -> BoxError {
        Box::new(Wrapped(Box::new(io::Error::new(kind, "test"))))
    }

    #[test]
    fn a_reset_connection_is_lost_and_a_refused_or_timed_out_one_is_not() {
        assert!(lost_connection(
            io_error(io::ErrorKind::ConnectionReset).as_ref()
        ));
        assert!(lost_connection(
            io_error(io::ErrorKind::BrokenPipe).as_ref()
        ));
        assert!(!lost_connection(
            io_error(io::ErrorKind::ConnectionRefused).as_ref()
        ));
        assert!(!lost_connection(io_error(io::ErrorKind::TimedOut).as_ref()));
        assert!(!lost_connection(
            io_error(io::ErrorKind::InvalidData).as_ref()
        ));
    }

    type Answer = BoxFuture<'static, Result<Response<Vec<u8>>, BoxError>>;

    /// A service failing its first `failures` calls with `error()`, then answering 200 with the body it got;
    /// and how many calls it had.
    fn flaky(
        failures: usize,
        error: fn() -> BoxError,
    ) -> (
        impl Service<Request<Body>, Response = Response<Vec<u8>>, Error = BoxError, Future = Answer>
        + Send
        + 'static,
        Arc<AtomicUsize>,
    ) {
        let calls = Arc::new(AtomicUsize::new(0));
        let counted = calls.clone();
        let service = tower::service_fn(move |request: Request<Body>| {
            let n = counted.fetch_add(1, Ordering::SeqCst);
            Box::pin(async move {
                if n < failures {
                    return Err(error());
                }
                let body = request.into_body().collect().await?.to_bytes();
                Ok(Response::new(body.to_vec()))
            }) as Answer
        });
        (service, calls)
    }

    fn request() -> Request<Body> {
        Request::patch("/apis/cache.example.com/v1alpha1/namespaces/n/memcacheds/cache")
            .body(Body::from(b"{\"spec\":{}}".to_vec()))
            .expect("a valid request")
    }

    #[tokio::test]
    async fn a_request_whose_connection_was_lost_is_sent_again_with_its_body() {
        let (service, calls) = flaky(2, || io_error(io::ErrorKind::ConnectionReset));
        let mut retrying = RetryLayer.layer(service);
        let response = retrying.ready().await.unwrap().call(request()).await;
        let response = response.expect("the third attempt is answered");
        assert_eq!(response.body(), b"{\"spec\":{}}");
        assert_eq!(calls.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn a_third_lost_connection_is_the_callers_error() {
        let (service, calls) = flaky(3, || io_error(io::ErrorKind::ConnectionReset));
        let mut retrying = RetryLayer.layer(service);
        let result = retrying.ready().await.unwrap().call(request()).await;
        assert!(result.is_err());
        assert_eq!(calls.load(Ordering::SeqCst), ATTEMPTS);
    }

    /// Through kube's own stack: a server that reads the first request and closes the connection without
    /// an answer (what hyper reports as `SendRequest`), then answers the next one.
    #[tokio::test]
    async fn a_kube_client_gets_the_answer_after_the_server_dropped_its_request() {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let server = tokio::spawn(async move {
            for answer in [false, true] {
                let (mut socket, _) = listener.accept().await.unwrap();
                let mut request = vec![0; 4096];
                let _ = socket.read(&mut request).await.unwrap();
                if answer {
                    let body = r#"{"major":"1","minor":"28"}"#;
                    let response = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                        body.len()
                    );
                    socket.write_all(response.as_bytes()).await.unwrap();
                }
            }
        });
        let builder =
            kube::client::ClientBuilder::try_from(kube::Config::new(url.parse().unwrap()));
        let client = builder.unwrap().with_layer(&RetryLayer).build();
        let version = client
            .apiserver_version()
            .await
            .expect("answered on the second connection");
        assert_eq!(
            (version.major.as_str(), version.minor.as_str()),
            ("1", "28")
        );
        server.await.unwrap();
    }

    #[tokio::test]
    async fn a_refused_connection_fails_at_once() {
        let (service, calls) = flaky(1, || io_error(io::ErrorKind::ConnectionRefused));
        let mut retrying = RetryLayer.layer(service);
        let result = retrying.ready().await.unwrap().call(request()).await;
        assert!(result.is_err());
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }
}
