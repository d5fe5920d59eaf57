//! How the fake is served on a loopback port: plain HTTP (HTTP/1.1, as a kube client speaks it without
//! TLS) or TLS with HTTP/2 and HTTP/1.1 by ALPN ([`crate::tls`]), each accepted connection counted by
//! protocol; optionally behind a [`Door`] that makes outages.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::Router;
use axum::serve::ListenerExt as _;
use tokio::net::TcpListener;

use crate::Error;
use crate::door::Door;
use crate::tls::{Certificates, Connections, TlsServer};

enum Transport {
    /// axum's server, with every accepted connection counted (one atomic add per connection).
    Plain(Arc<AtomicUsize>),
    Tls(TlsServer),
}

pub(crate) struct Front {
    /// Where clients reach the fake: the door's address, or the server's.
    pub addr: SocketAddr,
    /// Over TLS: the kubeconfig's `certificate-authority-data`.
    pub certificate_authority_data: Option<String>,
    transport: Transport,
    pub door: Option<Door>,
}

impl Front {
    /// Serves `router` on 127.0.0.1 until dropped (TLS) or the runtime ends (plain HTTP).
    pub async fn serve(router: Router, tls: bool, door: bool) -> Result<Self, Error> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let backend = listener.local_addr()?;
        let (transport, certificate_authority_data) = if tls {
            let certificates = Certificates::generate().map_err(Error::Certificates)?;
            let server = TlsServer::serve(listener, &certificates, router);
            (
                Transport::Tls(server),
                Some(certificates.certificate_authority_data()),
            )
        } else {
            let accepted = Arc::new(AtomicUsize::new(0));
            let counter = accepted.clone();
            let listener = listener.tap_io(move |_| {
                counter.fetch_add(1, Ordering::SeqCst);
            });
            tokio::spawn(async move { axum::serve(listener, router).await });
            (Transport::Plain(accepted), None)
        };
        let door = if door {
            Some(Door::open_for(backend)?)
        } else {
            None
        };
        Ok(Self {
            addr: door.as_ref().map_or(backend, |door| door.addr),
            certificate_authority_data,
            transport,
            door,
        })
    }

    pub fn tls(&self) -> Option<&TlsServer> {
        match &self.transport {
            Transport::Tls(server) => Some(server),
            Transport::Plain(_) => None,
        }
    }

    /// The connections accepted so far, by protocol (all HTTP/1.1 over plain HTTP).
    pub fn connections(&self) -> Connections {
        match &self.transport {
            Transport::Plain(accepted) => Connections {
                http2: 0,
                http1: accepted.load(Ordering::SeqCst),
            },
            Transport::Tls(server) => server.connections(),
        }
    }
}
