//! The accept loop of the operator's HTTP servers (the probes, and `/metrics` over HTTPS or plain HTTP),
//! with limits on what a client may hold (see [`Limits`]): connections open at once, in all and per
//! client address ([`super::budget`]), time to finish a TLS handshake and to send a request's headers,
//! time without traffic. The probes and `/metrics` are two servers on two ports, each with a budget of
//! its own, so that scrapes cannot starve the kubelet's probes nor the reverse. Accepting never stops: a
//! connection over budget evicts an idle one (one that has not sent a request yet first), and is
//! dropped at once only when every connection of the budget is answering a request. HTTP/1.1 only,
//! unless TLS negotiates `h2` by ALPN, which it does only when the server's configuration offers it
//! (`--metrics-enable-http2`): HTTP/2 is off by default, as Kubebuilder's `--enable-http2` has it since
//! the HTTP/2 rapid-reset attacks (CVE-2023-44487); an HTTP/2 connection preface sent without ALPN
//! ("prior knowledge") is answered as HTTP/1.1, that is refused.
//!
//! Served by hyper-util's connection builder over tokio-rustls, both already in the dependency tree on
//! the `ring` provider: `axum::serve` takes plain TCP only, sets no header timeout, and `axum-server`'s
//! rustls feature would bring a second TLS stack choice (aws-lc) to keep out.

use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::response::Response;
use futures::future::BoxFuture;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::runtime::Handle;
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::ServerConfig;

use super::budget::{Activity, Budget, Table, Ticket};

/// Most connections open at once, per server (the probes' and `/metrics`' each); more evict idle ones.
pub const MAX_CONNECTIONS: usize = 256;
/// Most connections open at once from one client address (an IPv6 /64): the kubelet probes from the
/// node's address, one connection a probe; a Prometheus scrapes on one or two.
pub const MAX_CONNECTIONS_PER_CLIENT: usize = 32;
/// Longest wait for a request's headers over HTTP/1.1, from the connection's start (or the end of its TLS
/// handshake) or the end of the previous response: a client that sends them slowly (or not at all), and a
/// keep-alive connection idle this long, are closed. The kubelet and Prometheus send theirs at once.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(3);
/// Longest time a connection may go without a byte read or written before it is closed (HTTP/2's
/// idle connections too), unless a request on it is still being answered.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(15);
/// Longest TLS handshake: a client that connects and says nothing does not hold a connection long.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(3);
/// Pause after a failed accept (out of file descriptors and the like), so as not to spin.
const ACCEPT_RETRY: Duration = Duration::from_millis(10);
/// Largest read buffer of an HTTP/1.1 connection, so the largest request head (hyper's default is about
/// 400 KiB): a scrape's head with a bearer token takes a few KiB.
pub const MAX_BUF_SIZE: usize = 64 * 1024;
/// Most requests at once on one HTTP/2 connection, and the largest header list.
pub const MAX_CONCURRENT_STREAMS: u32 = 16;
pub const MAX_HEADER_LIST_SIZE: u32 = 64 * 1024;

/// What a client of the server may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub max_connections: usize,
    pub max_connections_per_client: usize,
    pub header_read_timeout: Duration,
    pub idle_timeout: Duration,
    pub handshake_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: MAX_CONNECTIONS,
            max_connections_per_client: MAX_CONNECTIONS_PER_CLIENT,
            header_read_timeout: HEADER_READ_TIMEOUT,
            idle_timeout: IDLE_TIMEOUT,
            handshake_timeout: HANDSHAKE_TIMEOUT,
        }
    }
}

/// Binds `addr` now (so a taken port fails the start) and serves `router` in the background, over TLS
/// when `tls` is given, within `limits`. Connections are accepted on a thread of their own, so that
/// accepting goes on however busy the runtime's workers are (a runtime task would wait for a worker
/// behind every connection's task, while the kernel's queue filled and new connections waited in it or
/// were refused); they are served on the current runtime.
pub async fn serve(
    addr: SocketAddr,
    router: Router,
    tls: Option<Arc<ServerConfig>>,
    limits: Limits,
) -> io::Result<SocketAddr> {
    let listener = std::net::TcpListener::bind(addr)?;
    let local = listener.local_addr()?;
    let server = Server {
        router,
        tls: tls.map(TlsAcceptor::from),
        limits,
        runtime: Handle::current(),
    };
    std::thread::Builder::new()
        .name(format!("accept-{}", local.port()))
        .spawn(move || server.accept(listener))?;
    Ok(local)
}

/// What each accepted connection is served with, and where.
struct Server {
    router: Router,
    tls: Option<TlsAcceptor>,
    limits: Limits,
    runtime: Handle,
}

impl Server {
    /// Accepts connections until the runtime shuts down; each gets a place in the budget, or is closed.
    fn accept(self, listener: std::net::TcpListener) {
        let table = Table::new(Budget {
            total: self.limits.max_connections,
            per_client: self.limits.max_connections_per_client,
        });
        loop {
            let (tcp, peer) = match listener.accept() {
                Ok(accepted) => accepted,
                Err(error) => {
                    tracing::warn!(%error, "cannot accept a connection");
                    std::thread::sleep(ACCEPT_RETRY);
                    continue;
                }
            };
            let Some(ticket) = table.admit(peer.ip()) else {
                tracing::debug!(%peer, "every connection is answering a request: dropping a new one");
                continue;
            };
            let registered = tcp.set_nonblocking(true).and_then(|()| {
                let _runtime = self.runtime.enter();
                TcpStream::from_std(tcp)
            });
            match registered {
                Ok(tcp) => {
                    let (router, tls) = (self.router.clone(), self.tls.clone());
                    self.runtime
                        .spawn(connection(tcp, router, tls, self.limits, ticket));
                }
                // The runtime is shutting down: so is the server.
                Err(error) if is_shutdown(&error) => return,
                Err(error) => tracing::warn!(%error, "cannot serve a connection"),
            }
        }
    }
}

/// Whether registering a connection failed because the runtime is shutting down (tokio says so in its
/// message only: "A Tokio 1.x context was found, but it is being shutdown.").
fn is_shutdown(error: &io::Error) -> bool {
    error.to_string().contains("shutdown")
}

/// One connection, holding its `ticket` until it ends, or until it is evicted.
async fn connection(
    tcp: TcpStream,
    router: Router,
    tls: Option<TlsAcceptor>,
    limits: Limits,
    ticket: Ticket,
) {
    let router = Counted {
        router,
        activity: ticket.activity.clone(),
    };
    tokio::select! {
        () = handshake(tcp, router, tls, limits) => {}
        () = ticket.evicted.cancelled() => {}
    }
}

async fn handshake(tcp: TcpStream, router: Counted, tls: Option<TlsAcceptor>, limits: Limits) {
    let _ = tcp.set_nodelay(true);
    let Some(acceptor) = tls else {
        return http(tcp, router, false, limits).await;
    };
    let tls = match tokio::time::timeout(limits.handshake_timeout, acceptor.accept(tcp)).await {
        Ok(Ok(tls)) => tls,
        Ok(Err(error)) => {
            tracing::debug!(%error, "TLS handshake failed");
            return;
        }
        Err(_) => return,
    };
    let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
    http(tls, router, h2, limits).await;
}

/// Serves HTTP/2 (`h2`) or HTTP/1.1 on `io` until the client is done, or has been idle for the limit.
async fn http<I>(io: I, router: Counted, h2: bool, limits: Limits)
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (io, last) = Traffic::new(io);
    let builder = builder(h2, limits);
    let conn = builder.serve_connection(TokioIo::new(io), TowerToHyperService::new(router));
    tokio::pin!(conn);
    let mut shutting_down = false;
    loop {
        let quiet_since = last.at();
        tokio::select! {
            result = conn.as_mut() => {
                if let Err(error) = result {
                    tracing::debug!(%error, "connection ended");
                }
                return;
            }
            () = tokio::time::sleep_until(quiet_since + limits.idle_timeout) => {
                if last.at() > quiet_since {
                    continue;
                }
                if shutting_down {
                    // Idle even after being asked to close: dropped.
                    return;
                }
                // Closes the connection once the requests on it (if any) are answered.
                conn.as_mut().graceful_shutdown();
                shutting_down = true;
                last.touch();
            }
        }
    }
}

/// The router, noting on the connection's [`Activity`] when a request is being answered: such a
/// connection is not evicted.
#[derive(Clone)]
struct Counted {
    router: Router,
    activity: Arc<Activity>,
}

impl<B> tower::Service<http::Request<B>> for Counted
where
    Router: tower::Service<http::Request<B>, Response = Response, Error = Infallible>,
    <Router as tower::Service<http::Request<B>>>::Future: Send + 'static,
{
    type Response = Response;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Response, Infallible>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        tower::Service::<http::Request<B>>::poll_ready(&mut self.router, cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let answering = self.activity.begin();
        let response = self.router.call(request);
        Box::pin(async move {
            let response = response.await;
            drop(answering);
            response
        })
    }
}

fn builder(h2: bool, limits: Limits) -> auto::Builder<TokioExecutor> {
    let mut builder = if h2 {
        auto::Builder::new(TokioExecutor::new()).http2_only()
    } else {
        auto::Builder::new(TokioExecutor::new()).http1_only()
    };
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .max_buf_size(MAX_BUF_SIZE);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(MAX_CONCURRENT_STREAMS)
        .max_header_list_size(MAX_HEADER_LIST_SIZE);
    builder
}

/// When a connection last carried a byte, either way.
#[derive(Clone)]
struct LastTraffic {
    start: Instant,
    /// Milliseconds from `start`.
    millis: Arc<AtomicU64>,
}

impl LastTraffic {
    fn at(&self) -> Instant {
        self.start + Duration::from_millis(self.millis.load(Ordering::Relaxed))
    }

    fn touch(&self) {
        let millis = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.millis.fetch_max(millis, Ordering::Relaxed);
    }
}

/// A stream that notes when it last carried a byte.
struct Traffic<I> {
    io: I,
    last: LastTraffic,
}

impl<I> Traffic<I> {
    fn new(io: I) -> (Self, LastTraffic) {
        let last = LastTraffic {
            start: Instant::now(),
            millis: Arc::default(),
        };
        (
            Traffic {
                io,
                last: last.clone(),
            },
            last,
        )
    }
}

impl<I: AsyncRead + Unpin> AsyncRead for Traffic<I> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.io).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.last.touch();
        }
        polled
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for Traffic<I> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.io).poll_write(cx, data);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.last.touch();
        }
        polled
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.last.touch();
        }
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}
