//! The accept loop of the operator's HTTP servers (the probes, and `/metrics` over HTTPS or plain HTTP),
//! with limits on what a client may hold (see [`Limits`]): connections open at once, time to send a
//! request's headers, time without traffic. HTTP/1.1 only, unless TLS negotiates `h2` by ALPN, which it
//! does only when the server's configuration offers it (`--metrics-enable-http2`): HTTP/2 is off by
//! default, as Kubebuilder's `--enable-http2` has it since the HTTP/2 rapid-reset attacks
//! (CVE-2023-44487); an HTTP/2 connection preface sent without ALPN ("prior knowledge") is answered as
//! HTTP/1.1, that is refused.
//!
//! Served by hyper-util's connection builder over tokio-rustls, both already in the dependency tree on
//! the `ring` provider: `axum::serve` takes plain TCP only, sets no header timeout, and `axum-server`'s
//! rustls feature would bring a second TLS stack choice (aws-lc) to keep out.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::ServerConfig;

/// Most connections open at once, per server; more wait in the listen backlog until one closes.
pub const MAX_CONNECTIONS: usize = 256;
/// Longest wait for a request's headers over HTTP/1.1, from the connection's start or the end of the
/// previous response: a client that sends them slowly (or not at all), and a keep-alive connection
/// idle this long, are closed.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest time a connection may go without a byte read or written before it is closed (HTTP/2's
/// idle connections too), unless a request on it is still being answered.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// Longest TLS handshake: a client that connects and says nothing does not hold a connection long.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
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
    pub header_read_timeout: Duration,
    pub idle_timeout: Duration,
    pub handshake_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: MAX_CONNECTIONS,
            header_read_timeout: HEADER_READ_TIMEOUT,
            idle_timeout: IDLE_TIMEOUT,
            handshake_timeout: HANDSHAKE_TIMEOUT,
        }
    }
}

/// Binds `addr` now (so a taken port fails the start) and serves `router` in the background, over TLS
/// when `tls` is given, within `limits`.
pub async fn serve(
    addr: SocketAddr,
    router: Router,
    tls: Option<Arc<ServerConfig>>,
    limits: Limits,
) -> io::Result<SocketAddr> {
    let listener = TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    let tls = tls.map(TlsAcceptor::from);
    tokio::spawn(accept(listener, router, tls, limits));
    Ok(local)
}

async fn accept(listener: TcpListener, router: Router, tls: Option<TlsAcceptor>, limits: Limits) {
    let open = Arc::new(Semaphore::new(limits.max_connections));
    loop {
        let Ok(permit) = open.clone().acquire_owned().await else {
            return;
        };
        let tcp = match listener.accept().await {
            Ok((tcp, _)) => tcp,
            Err(error) => {
                // Out of file descriptors and the like: wait rather than spin.
                tracing::warn!(%error, "cannot accept a connection");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        tokio::spawn(connection(tcp, router.clone(), tls.clone(), limits, permit));
    }
}

/// One connection, holding one of the open-connection `permit`s until it ends.
async fn connection(
    tcp: TcpStream,
    router: Router,
    tls: Option<TlsAcceptor>,
    limits: Limits,
    _permit: OwnedSemaphorePermit,
) {
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
async fn http<I>(io: I, router: Router, h2: bool, limits: Limits)
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
