//! A fake Kubernetes API server, in-process, for the operator's smoke tests (`tests/smoke`) and the
//! scale benchmark (`bench`): the real operator binary talks to it through a kubeconfig as to a cluster.
//!
//! It is stateful, as an API server is: one store per collection ([`collections`]: its own, and the
//! operator's kinds of children as its caller names them) with a resource
//! version per change ([`store`]); lists and watches that keep to their namespace and label selector
//! ([`selector`]); watches held open that receive every later change, so what a client writes comes back
//! to its caches; metadata-only lists, gets and watches (`as=PartialObjectMetadata`); create, server-side
//! apply ([`apply`]), merge, strategic-merge and JSON patches, update and delete; the status subresource
//! (a status write changes only the status, any other write leaves it alone; the generation goes up when
//! the spec changes); and unchanged writes that change nothing (no new version, no watch event).
//!
//! It can fail as an API server fails: the operator's CRD missing ([`Fake::set_crd_missing`]: its API
//! group answers `404 page not found`), slow lists ([`Fake::slow_list`]), an outage and a return on the
//! same address, restarted (old resource versions answered 410 `Expired`) or not ([`Fake::outage`],
//! [`Fake::back`], through [`door`]); over TLS ([`tls`], HTTP/2 and HTTP/1.1 by ALPN) a restart that
//! drops every connection at once ([`Fake::restart`]) and a server that vanishes behind its open
//! connections ([`Fake::vanish`]). Every request can wait a fixed latency ([`Options::latency`]), and is
//! recorded ([`request::Req`]) with its HTTP version, headers, body and answer; connections are counted
//! by protocol.
//!
//! What it leaves out, because the operator does not depend on it, and what a real API server
//! (`bench --real`, `tests/envtest`) is there to check:
//! - defaulting, validation, admission, quantities' canonical forms: it stores what it is sent;
//! - field managers: server-side apply merges the applied fields in, never removes fields an earlier
//!   apply set, and never answers a conflict;
//! - set-based label selectors (refused), field selectors (ignored), `resourceVersionMatch`, paging;
//! - watch bookmarks and timeouts (watches stay open until the connection ends), and the initial
//!   events of a watch without a resource version;
//! - finalizers and graceful deletion (a delete is immediate), garbage collection of owned objects;
//! - controllers: nothing makes pods or reports workloads (the bench's `kubelet` does, through
//!   [`Store::on_change`]);
//! - discovery beyond one group/version's resources, authentication and authorization (the token is
//!   recorded, not checked), TokenReview and SubjectAccessReview.
//!
//! A request to any other path gets a 404 `Status`, recorded, so a test can fail on it.

pub mod apply;
pub mod collections;
mod door;
mod handler;
pub mod path;
pub mod request;
mod response;
mod routes;
pub mod selector;
mod server;
pub mod store;
pub mod tls;
mod watch;

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

pub use crate::request::Req;
pub use crate::store::{Change, ChangeKind, Refusal, Store, TIMESTAMP};
pub use crate::tls::Connections;

use crate::server::Front;

/// Why the fake cannot start, or cannot do what it was asked.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot serve on a loopback port: {0}")]
    Io(#[from] std::io::Error),
    #[error("{0}")]
    Certificates(String),
    #[error("{0} needs the fake to be started with {1}")]
    NotStartedWith(&'static str, &'static str),
}

/// How to serve the fake.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// Every request's answer waits this long, as a real API server's round trip would take.
    pub latency: Duration,
    /// TLS offering HTTP/2 and HTTP/1.1 by ALPN, as a real API server; else plain HTTP.
    pub tls: bool,
    /// Served behind a door that can close and open again ([`Fake::outage`], [`Fake::back`]): one more
    /// relay per connection, which the benchmark does without.
    pub outages: bool,
    /// The plurals of the children's collections of a CRD ([`collections::Collection::crd`]) whose CRD
    /// the cluster has installed: the others are not served.
    pub installed: Vec<&'static str>,
    /// The collections of the kinds of children the operator creates, served beside the fake's own
    /// ([`collections::OWN`]): the caller builds them from the operator's table of kinds.
    pub children: Vec<collections::Collection>,
}

/// What the HTTP handler shares: the store and the latency.
pub(crate) struct Api {
    store: Mutex<Store>,
    latency: Duration,
}

impl Api {
    /// The store; a panic elsewhere while holding it does not make it unusable (every change to it is
    /// complete between statements).
    pub(crate) fn store(&self) -> MutexGuard<'_, Store> {
        self.store.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The fake API server, served on 127.0.0.1 until dropped.
pub struct Fake {
    api: Arc<Api>,
    front: Front,
}

impl Fake {
    /// Serves an empty fake (no object of any kind) on a free loopback port.
    pub async fn start(options: Options) -> Result<Arc<Self>, Error> {
        let mut store = Store::serving(&options.children);
        store.settings.installed = options.installed;
        let api = Arc::new(Api {
            store: Mutex::new(store),
            latency: options.latency,
        });
        let router = axum::Router::new()
            .fallback(handler::handle)
            .with_state(api.clone());
        let front = Front::serve(router, options.tls, options.outages).await?;
        Ok(Arc::new(Self { api, front }))
    }

    /// The objects, the requests so far, and the hooks: lock it briefly, the server waits meanwhile.
    pub fn store(&self) -> MutexGuard<'_, Store> {
        self.api.store()
    }

    /// Where clients reach it.
    pub fn addr(&self) -> SocketAddr {
        self.front.addr
    }

    /// The URL a kubeconfig names: `https://` over TLS, `http://` otherwise.
    pub fn url(&self) -> String {
        let scheme = match self.front.certificate_authority_data {
            Some(_) => "https",
            None => "http",
        };
        format!("{scheme}://{}", self.front.addr)
    }

    /// Over TLS, the kubeconfig's `certificate-authority-data`: the CA's PEM, base64.
    pub fn certificate_authority_data(&self) -> Option<&str> {
        self.front.certificate_authority_data.as_deref()
    }

    /// The connections accepted so far, by the protocol each spoke.
    pub fn connections(&self) -> Connections {
        self.front.connections()
    }

    /// Every request so far.
    pub fn requests(&self) -> Vec<Req> {
        self.store().requests.clone()
    }

    /// How many requests so far.
    pub fn count(&self) -> usize {
        self.store().requests.len()
    }

    /// Every request, one per line, for failure messages: when it came (seconds after the first), and
    /// what it was.
    pub fn log(&self) -> String {
        let mut out = String::new();
        let store = self.store();
        let requests = store.requests();
        let start = requests.first().map(|r| r.at);
        for req in requests {
            let after = start.map(|s| req.at - s).unwrap_or_default();
            let _ = writeln!(out, "{:>8.3}s {}", after.as_secs_f64(), req.line());
        }
        out
    }

    /// Whether the operator's CRD is missing: every request to its API group gets the plain-text 404 a
    /// real API server gives for a path it does not serve.
    pub fn set_crd_missing(&self, missing: bool) {
        self.store().settings.crd_missing = missing;
    }

    /// Lists of `path` (not watches) are answered after `delay`, as a large list or a busy API server.
    pub fn slow_list(&self, path: &str, delay: Duration) {
        self.store()
            .settings
            .slow_lists
            .push((path.to_owned(), delay));
    }

    fn tls(&self, what: &'static str) -> Result<&tls::TlsServer, Error> {
        self.front
            .tls()
            .ok_or(Error::NotStartedWith(what, "Options::tls"))
    }

    fn door(&self, what: &'static str) -> Result<&door::Door, Error> {
        self.front
            .door
            .as_ref()
            .ok_or(Error::NotStartedWith(what, "Options::outages"))
    }

    /// The API server restarts at once (over TLS): every open connection is dropped without a goodbye,
    /// new ones are accepted straight away, and the resource versions handed out before have expired
    /// (watches from them are answered 410 `Expired`).
    pub fn restart(&self) -> Result<(), Error> {
        let server = self.tls("a restart")?;
        {
            let mut store = self.store();
            store.expire_versions();
            store.end_watches();
        }
        server.drop_connections();
        Ok(())
    }

    /// The API server behind the open connections vanishes without a goodbye (over TLS), as a
    /// control-plane node that loses power, or whose flow a load balancer drops: every open connection
    /// stays open but goes silent (no answer, no PONG, no reset, no GOAWAY), while new connections reach
    /// another server of the same cluster. That one serves the same objects from the same store, so the
    /// resource versions handed out before are still valid (watches from them resume, no 410).
    pub fn vanish(&self) -> Result<(), Error> {
        let server = self.tls("vanishing")?;
        self.store().end_watches();
        server.freeze_connections();
        Ok(())
    }

    /// The API server goes away: connections are refused, and open ones (watches) are cut.
    pub fn outage(&self) -> Result<(), Error> {
        let door = self.door("an outage")?;
        self.store().end_watches();
        door.close();
        Ok(())
    }

    /// The API server is back on the same address. A `restarted` one no longer knows the resource
    /// versions it handed out before: watches from them are answered 410 `Expired`, and the client must
    /// list again.
    pub fn back(&self, restarted: bool) -> Result<(), Error> {
        let door = self.door("a return")?;
        if restarted {
            self.store().expire_versions();
        }
        door.open()?;
        Ok(())
    }
}
