//! The harness clients' requests: run on the client's own runtime, and sent again when the connection under
//! them was lost before any answer came.
//!
//! **On the client's runtime.** A kube client hands each request to hyper's pooled client, whose future
//! opens a connection when it needs one and spawns the connection's task on whatever runtime polls it: the
//! caller's, not the client's. The shared environment's admin client serves every scenario, each on a Tokio
//! runtime that ends with it; a connection opened while one scenario's request was polled died with that
//! scenario's runtime, and a later scenario's request on it failed mid-flight, after the API server had
//! carried it out: two CI runs lost an apply that way (`ServiceError: client error (SendRequest)`,
//! `ServiceError: connection closed before message completed`). So each request runs as a task of the
//! runtime the client was made in, and its connections live as long as the client's runtime.
//!
//! **Sent again.** kube-apiserver also closes idle HTTP/1.1 connections after 90 s, the age at which the
//! client's pool gives them up; Go's clients send a request caught by that again on a new connection,
//! kube's do not. So a request is sent again, at most twice, when the error says that the connection was
//! lost: not on a refused connection (a scenario that stops the API server expects its requests to fail at
//! once), not on a timeout, and never once the server has answered (an answer with an error status is not
//! an error here). A request the server had already carried out is carried out again. For what the harness
//! sends (server-side applies, gets, lists, watches, deletes) that is harmless; a create sent again is
//! answered `AlreadyExists`, no worse than the transport error it replaces.

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

/// Wraps a client's service in [`Retrying`]. Must be applied inside the Tokio runtime the client belongs
/// to: its requests run there.
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
            runtime: tokio::runtime::Handle::current(),
        }
    }
}

/// See the module documentation.
pub struct Retrying<F> {
    inner: Buffer<Request<Body>, F>,
    /// The runtime the client was made in.
    runtime: tokio::runtime::Handle,
}

impl<F: Send + 'static> Clone for Retrying<F> {
    fn clone(&self) -> Self {
        Retrying {
            inner: self.inner.clone(),
            runtime: self.runtime.clone(),
        }
    }
}

/// A request's task, aborted when its caller stops waiting for it.
struct Aborting<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for Aborting<T> {
    fn drop(&mut self) {
        self.0.abort();
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
        let work = async move {
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
        };
        let mut task = Aborting(self.runtime.spawn(work));
        Box::pin(async move {
            match (&mut task.0).await {
                Ok(result) => result,
                Err(error) => Err(format!("the request's task ended: {error}").into()),
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

    /// A client made in one runtime and used from another that then ends: its connection lives on with
    /// the client's runtime, and the next request, from a third runtime, uses it again.
    #[test]
    fn a_connection_opened_for_a_request_from_another_runtime_outlives_that_runtime() {
        use std::sync::atomic::AtomicUsize;
        use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader};

        let clients = tokio::runtime::Runtime::new().unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let (client, url) = clients.block_on({
            let accepted = accepted.clone();
            async move {
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
                let url = format!("http://{}", listener.local_addr().unwrap());
                // Answers every request of every connection (HTTP/1.1 keep-alive), counting connections.
                tokio::spawn(async move {
                    loop {
                        let (socket, _) = listener.accept().await.unwrap();
                        accepted.fetch_add(1, Ordering::SeqCst);
                        tokio::spawn(async move {
                            let (read, mut write) = socket.into_split();
                            let mut lines = BufReader::new(read).lines();
                            while let Ok(Some(line)) = lines.next_line().await {
                                if !line.is_empty() {
                                    continue;
                                }
                                let body = r#"{"major":"1","minor":"28"}"#;
                                let response = format!(
                                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                                    body.len()
                                );
                                if write.write_all(response.as_bytes()).await.is_err() {
                                    return;
                                }
                            }
                        });
                    }
                });
                let config = kube::Config::new(url.parse().unwrap());
                let builder = kube::client::ClientBuilder::try_from(config).unwrap();
                (builder.with_layer(&RetryLayer).build(), url)
            }
        });
        for _ in 0..2 {
            // A scenario's runtime, which ends with the scenario.
            let scenario = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            let version = scenario.block_on(client.apiserver_version());
            assert_eq!(version.expect("answered").minor, "28", "{url}");
            drop(scenario);
        }
        assert_eq!(
            accepted.load(Ordering::SeqCst),
            1,
            "one connection served both scenarios"
        );
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
