//! kube-apiserver: its command line, its audit policy, and waiting for `/readyz`.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{Result, anyhow, bail};

use crate::pki::Pki;
use crate::process::Process;

/// Every request at Metadata level (who, verb, resource, response code; no bodies), without the
/// RequestReceived stage: a request then appears once when it completes (twice for a watch, which also
/// has ResponseStarted), which is what [`crate::audit`] counts.
pub const AUDIT_POLICY: &str = "\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages:
- RequestReceived
rules:
- level: Metadata
";

/// What the API server's command line is made of; kept so that a restart
/// ([`super::ControlPlane::restart_apiserver`]) starts it again exactly as before.
#[derive(Clone, Debug)]
pub struct ApiServerConfig {
    pub binary: PathBuf,
    pub port: u16,
    pub etcd_url: String,
    pub pki: Pki,
    pub token_file: PathBuf,
    pub audit_policy: PathBuf,
    pub audit_log: PathBuf,
    pub cert_dir: PathBuf,
    pub log: PathBuf,
    /// For a real node ([`super::ControlPlaneOptions::node_address`]): the address pods reach the API
    /// server at.
    pub node_address: Option<Ipv4Addr>,
}

impl ApiServerConfig {
    pub fn command(&self) -> Command {
        let p = |path: &Path| path.to_string_lossy().into_owned();
        let mut cmd = Command::new(&self.binary);
        cmd.args([
            format!("--etcd-servers={}", self.etcd_url),
            format!("--secure-port={}", self.port),
            format!("--cert-dir={}", p(&self.cert_dir)),
            format!("--tls-cert-file={}", p(&self.pki.serving_cert)),
            format!("--tls-private-key-file={}", p(&self.pki.serving_key)),
            // Client certificates signed by our CA would authenticate too.
            format!("--client-ca-file={}", p(&self.pki.ca_cert)),
            // Only so that `extension-apiserver-authentication` is complete and the controller-manager and
            // scheduler stop logging its absence: nobody holds a front-proxy-client certificate.
            format!("--requestheader-client-ca-file={}", p(&self.pki.ca_cert)),
            "--requestheader-allowed-names=front-proxy-client".to_owned(),
            "--requestheader-username-headers=X-Remote-User".to_owned(),
            "--requestheader-group-headers=X-Remote-Group".to_owned(),
            "--requestheader-extra-headers-prefix=X-Remote-Extra-".to_owned(),
            // The admin, the kubelet, the controller-manager and the scheduler authenticate by static
            // token; the operator and each controller by ServiceAccount token.
            format!("--token-auth-file={}", p(&self.token_file)),
            "--authorization-mode=RBAC".to_owned(),
            format!(
                "--service-cluster-ip-range={}",
                super::SERVICE_CLUSTER_IP_RANGE
            ),
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local".to_owned(),
            format!(
                "--service-account-key-file={}",
                p(&self.pki.service_account_pub)
            ),
            format!(
                "--service-account-signing-key-file={}",
                p(&self.pki.service_account_key)
            ),
            "--allow-privileged=true".to_owned(),
            format!("--audit-policy-file={}", p(&self.audit_policy)),
            format!("--audit-log-path={}", p(&self.audit_log)),
            "--audit-log-format=json".to_owned(),
            // Each event is written before the response is sent, so a count taken after a request has
            // returned includes it (batch mode would delay lines by a second or more).
            "--audit-log-mode=blocking".to_owned(),
            // No rotation in practice (0 means lumberjack's default, 100 MB, which a long bench reaches):
            // counts read one file.
            "--audit-log-maxsize=1000000".to_owned(),
            "--profiling=false".to_owned(),
        ]);
        match self.node_address {
            // Pods of a real node reach the API server through the `kubernetes` Service's ClusterIP,
            // whose endpoint is the node's bridge address: listen there too, and publish it.
            Some(address) => cmd.args([
                "--bind-address=0.0.0.0".to_owned(),
                format!("--advertise-address={address}"),
                // The node's name resolves nowhere: reach its kubelet (logs, exec) at its address.
                "--kubelet-preferred-address-types=InternalIP".to_owned(),
            ]),
            // Nothing routes the `kubernetes` Service's ClusterIP here, and 127.0.0.1 as its endpoint only
            // makes the reconciler complain.
            None => cmd.args([
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                "--endpoint-reconciler-type=none",
            ]),
        };
        cmd
    }

    pub fn start(&self) -> Result<Process> {
        Process::start("kube-apiserver", self.command(), &self.log)
    }
}

/// Waits until `/readyz` answers `ok`, failing early if the process exits.
pub async fn wait_ready(
    process: &Mutex<Option<Process>>,
    client: &kube::Client,
    timeout: Duration,
) -> Result<()> {
    let started = Instant::now();
    let mut last: String;
    loop {
        match process
            .lock()
            .map_err(|_| anyhow!("poisoned lock"))?
            .as_mut()
        {
            Some(p) => p.check_running()?,
            None => bail!("kube-apiserver is stopped"),
        }
        let request = http::Request::get("/readyz").body(Vec::new())?;
        match client.request_text(request).await {
            Ok(body) if body.trim() == "ok" => return Ok(()),
            Ok(body) => last = body,
            Err(e) => last = e.to_string(),
        }
        if started.elapsed() > timeout {
            bail!("kube-apiserver is not ready after {timeout:?} (last answer: {last})");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(node_address: Option<Ipv4Addr>) -> Vec<String> {
        let path = PathBuf::from("/nonexistent");
        let config = ApiServerConfig {
            binary: path.clone(),
            port: 6443,
            etcd_url: "http://127.0.0.1:2379".to_owned(),
            pki: Pki {
                ca_cert: path.clone(),
                serving_cert: path.clone(),
                serving_key: path.clone(),
                service_account_key: path.clone(),
                service_account_pub: path.clone(),
            },
            token_file: path.clone(),
            audit_policy: path.clone(),
            audit_log: path.clone(),
            cert_dir: path.clone(),
            log: path,
            node_address,
        };
        config
            .command()
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect()
    }

    #[test]
    fn loopback_only_without_a_real_node() {
        let args = args(None);
        assert!(args.contains(&"--bind-address=127.0.0.1".to_owned()));
        assert!(args.contains(&"--endpoint-reconciler-type=none".to_owned()));
    }

    #[test]
    fn reachable_from_a_real_nodes_pods() {
        let args = args(Some(Ipv4Addr::new(10, 244, 0, 1)));
        assert!(args.contains(&"--bind-address=0.0.0.0".to_owned()));
        assert!(args.contains(&"--advertise-address=10.244.0.1".to_owned()));
        assert!(args.contains(&"--kubelet-preferred-address-types=InternalIP".to_owned()));
        assert!(
            !args
                .iter()
                .any(|a| a.starts_with("--endpoint-reconciler-type"))
        );
    }
}
