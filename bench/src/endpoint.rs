//! Where the operator reaches the fake API server (its kubeconfig), and the connections it opened there.
//! TLS offering HTTP/2 and HTTP/1.1 by ALPN ([`fake_apiserver::tls`]) by default, as a real API server
//! does, which is the only way to see whether the operator's requests share one HTTP/2 connection; with
//! `--plain-http`, plain HTTP, as the figures before the operator spoke HTTP/2 were measured.

use std::path::Path;

use fake_apiserver::Fake;
use serde::Serialize;

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

/// The `cluster:` entry of a kubeconfig for `fake`: its URL and, over TLS, the CA to trust.
pub fn kubeconfig_cluster(fake: &Fake) -> String {
    let server = fake.url();
    match fake.certificate_authority_data() {
        Some(ca) => format!("    server: {server}\n    certificate-authority-data: {ca}\n"),
        None => format!("    server: {server}\n"),
    }
}

/// Writes a kubeconfig for `fake` to `path`: its `cluster:` entry, and a token the fake ignores.
pub fn write_kubeconfig(fake: &Fake, path: &Path) -> Result<(), String> {
    let yaml = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: bench\n  cluster:\n{}\
         users:\n- name: bench\n  user:\n    token: bench\ncontexts:\n- name: bench\n  context:\n    \
         cluster: bench\n    user: bench\n    namespace: default\ncurrent-context: bench\n",
        kubeconfig_cluster(fake)
    );
    std::fs::write(path, yaml).map_err(|e| format!("cannot write the kubeconfig: {e}"))
}

/// The connections `fake` accepted so far.
pub fn connections(fake: &Fake) -> Connections {
    let counted = fake.connections();
    Connections {
        tls: fake.certificate_authority_data().is_some(),
        http2: counted.http2,
        http1: counted.http1,
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
