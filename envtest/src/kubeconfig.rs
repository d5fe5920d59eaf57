//! Kubeconfig files (one cluster, one token user) and clients made from them.
//!
//! Files rather than in-memory configs, because the consumers are other processes too: the
//! controller-manager, the scheduler, kubectl, the operator binary, and a person running `envtest up`.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};
use kube::config::{KubeConfigOptions, Kubeconfig};

/// Writes a kubeconfig for `server` (verified against the CA in `ca_file`) authenticating as `user` with
/// a bearer `token`, its context in `namespace` when given (as a ServiceAccount's in-cluster config is in
/// the account's namespace). Mode 0600: it holds the token.
pub fn write(
    path: &Path,
    server: &str,
    ca_file: &Path,
    (user, token): (&str, &str),
    namespace: Option<&str>,
) -> Result<()> {
    let q = |s: &str| serde_json::Value::from(s).to_string();
    let namespace = namespace
        .map(|ns| format!("\n    namespace: {}", q(ns)))
        .unwrap_or_default();
    let text = format!(
        "apiVersion: v1\n\
         kind: Config\n\
         clusters:\n\
         - name: envtest\n  \
           cluster:\n    \
             server: {server}\n    \
             certificate-authority: {ca}\n\
         users:\n\
         - name: {user}\n  \
           user:\n    \
             token: {token}\n\
         contexts:\n\
         - name: envtest\n  \
           context:\n    \
             cluster: envtest\n    \
             user: {user}{namespace}\n\
         current-context: envtest\n",
        server = q(server),
        ca = q(&ca_file.to_string_lossy()),
        user = q(user),
        token = q(token),
    );
    crate::pki::write_file(path, &text, 0o600)
}

/// A client for the kubeconfig at `path`, in the caller's Tokio runtime (a client's connections belong to
/// the runtime it was made in, so every test makes its own).
pub async fn client(path: &Path) -> Result<kube::Client> {
    let kubeconfig = Kubeconfig::read_from(path)
        .with_context(|| format!("cannot read the kubeconfig {}", path.display()))?;
    let mut config =
        kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .with_context(|| format!("cannot use the kubeconfig {}", path.display()))?;
    // Requests fail fast during an API server outage instead of hanging for kube's default.
    config.connect_timeout = Some(Duration::from_secs(5));
    // Lost connections are retried (see [`crate::retry`]).
    let builder = kube::client::ClientBuilder::try_from(config).context("cannot build a client")?;
    Ok(builder.with_layer(&crate::retry::RetryLayer).build())
}
