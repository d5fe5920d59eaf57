//! Where the operator reaches the fake API server, and the connections it opened there. TLS offering
//! HTTP/2 and HTTP/1.1 by ALPN ([`crate::tls`]) by default, as a real API server does, which is the only
//! way to see whether the operator's requests share one HTTP/2 connection; with `--plain-http`, plain
//! HTTP, as the figures before the operator spoke HTTP/2 were measured.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::serve::ListenerExt as _;
use serde::Serialize;
use tokio::net::TcpListener;

use crate::fake::Fake;
use crate::tls::{Certificates, TlsServer};

/// The operator's connections to the fake API server over a run, by protocol.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Connections {
    /// Whether the fake was served over TLS; over plain HTTP a kube client speaks HTTP/1.1 only.
    pub tls: bool,
    pub http2: usize,
    pub http1: usize,
}

impl Connections {
    /// As the report's table shows them: `1 HTTP/2, 0 HTTP/1.1 (TLS)`.
    pub fn describe(&self) -> String {
        let transport = if self.tls { "TLS" } else { "plain HTTP" };
        format!(
            "{} HTTP/2, {} HTTP/1.1 ({transport})",
            self.http2, self.http1
        )
    }
}

/// How the fake is served: what counts its connections.
enum Front {
    /// axum's server, with every accepted connection counted (one atomic add per connection).
    Plain(Arc<AtomicUsize>),
    Tls(TlsServer),
}

/// The fake API server, served on a free loopback port.
pub struct Endpoint {
    addr: SocketAddr,
    /// The kubeconfig's `certificate-authority-data`, over TLS.
    certificate_authority_data: Option<String>,
    front: Front,
}

impl Endpoint {
    /// Serves `fake` on 127.0.0.1, over TLS when `tls` is set, until dropped (TLS) or the process ends.
    pub async fn serve(fake: &Arc<Fake>, tls: bool) -> Result<Self, String> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| format!("cannot listen: {e}"))?;
        let addr = listener
            .local_addr()
            .map_err(|e| format!("no address: {e}"))?;
        let router = fake.router();
        if tls {
            let certificates = Certificates::generate()?;
            let server = TlsServer::serve(listener, &certificates, router);
            return Ok(Self {
                addr,
                certificate_authority_data: Some(certificates.certificate_authority_data()),
                front: Front::Tls(server),
            });
        }
        let accepted = Arc::new(AtomicUsize::new(0));
        let counter = accepted.clone();
        let listener = listener.tap_io(move |_| {
            counter.fetch_add(1, Ordering::SeqCst);
        });
        tokio::spawn(async move { axum::serve(listener, router).await });
        Ok(Self {
            addr,
            certificate_authority_data: None,
            front: Front::Plain(accepted),
        })
    }

    /// The `cluster:` entry of a kubeconfig for the fake: its URL and, over TLS, the CA to trust.
    pub fn kubeconfig_cluster(&self) -> String {
        let addr = self.addr;
        match &self.certificate_authority_data {
            Some(ca) => {
                format!("    server: https://{addr}\n    certificate-authority-data: {ca}\n")
            }
            None => format!("    server: http://{addr}\n"),
        }
    }

    /// Writes a kubeconfig for the fake to `path`: its `cluster:` entry, and a token the fake ignores.
    pub fn write_kubeconfig(&self, path: &Path) -> Result<(), String> {
        let yaml = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: bench\n  cluster:\n{}\
             users:\n- name: bench\n  user:\n    token: bench\ncontexts:\n- name: bench\n  context:\n    \
             cluster: bench\n    user: bench\n    namespace: default\ncurrent-context: bench\n",
            self.kubeconfig_cluster()
        );
        std::fs::write(path, yaml).map_err(|e| format!("cannot write the kubeconfig: {e}"))
    }

    /// The connections accepted so far.
    pub fn connections(&self) -> Connections {
        match &self.front {
            Front::Plain(accepted) => Connections {
                tls: false,
                http2: 0,
                http1: accepted.load(Ordering::SeqCst),
            },
            Front::Tls(server) => {
                let counted = server.connections();
                Connections {
                    tls: true,
                    http2: counted.http2,
                    http1: counted.http1,
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connections_name_their_protocols_and_transport() {
        let over_tls = Connections {
            tls: true,
            http2: 1,
            http1: 0,
        };
        assert_eq!(over_tls.describe(), "1 HTTP/2, 0 HTTP/1.1 (TLS)");
        let plain = Connections {
            tls: false,
            http2: 0,
            http1: 12,
        };
        assert_eq!(plain.describe(), "0 HTTP/2, 12 HTTP/1.1 (plain HTTP)");
    }
}
