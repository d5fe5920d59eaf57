//! The operator's install, as `make deploy` would do it minus the Deployment: `config/default` rendered
//! by kustomize (CRD, Namespace, ServiceAccount, ClusterRole and bindings, all with the namespace and name
//! prefix of `config/default`), applied server-side, and a token of the ServiceAccount in a kubeconfig.
//!
//! Why the operator runs under that token and not as admin: the RBAC in `config/rbac` is then exercised
//! for real, and a permission the operator lacks fails the test as it would fail in a cluster.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::PostParams;
use kube::{Api, Client};
use serde_json::{Value, json};

use crate::control_plane::ControlPlane;

/// The field manager of the install.
pub const FIELD_MANAGER: &str = "envtest";

/// Who the operator is and how it authenticates.
#[derive(Clone, Debug)]
pub struct OperatorCredentials {
    /// The namespace of its ServiceAccount (`memcached-operator-system`).
    pub namespace: String,
    pub service_account: String,
    /// The user name the API server sees, as in the audit log:
    /// `system:serviceaccount:<namespace>:<service account>`.
    pub user: String,
    /// A kubeconfig holding a token of the ServiceAccount, valid for 24 hours.
    pub kubeconfig: PathBuf,
}

/// Renders `<config_dir>/default`, applies everything but the Deployment server-side as the admin, waits
/// for the CRDs to be established, and writes `operator.kubeconfig` into the control plane's directory.
pub async fn install_operator_rbac(
    control_plane: &ControlPlane,
    client: &Client,
    config_dir: &Path,
) -> Result<OperatorCredentials> {
    install_operator_overlay(control_plane, client, config_dir, "default").await
}

/// [`install_operator_rbac`] from another kustomization of `config_dir` (`namespaced`, say).
pub async fn install_operator_overlay(
    control_plane: &ControlPlane,
    client: &Client,
    config_dir: &Path,
    overlay: &str,
) -> Result<OperatorCredentials> {
    let kubectl = crate::assets()
        .map(|a| a.kubectl())
        .unwrap_or_else(|| PathBuf::from("kubectl"));
    let rendered = run(
        &kubectl,
        &["kustomize".as_ref(), config_dir.join(overlay).as_os_str()],
        None,
    )?;
    install_operator_manifest(
        control_plane,
        client,
        &rendered,
        &format!("config/{overlay}"),
    )
    .await
}

/// [`install_operator_rbac`] from a rendering made elsewhere (`source` names it in errors), such as the
/// Helm chart's: everything but the Deployment is applied. The Namespace of its ServiceAccount must be in
/// the rendering or exist.
pub async fn install_operator_manifest(
    control_plane: &ControlPlane,
    client: &Client,
    rendered: &str,
    source: &str,
) -> Result<OperatorCredentials> {
    let kubectl = crate::assets()
        .map(|a| a.kubectl())
        .unwrap_or_else(|| PathBuf::from("kubectl"));
    let manifest: String = split_documents(rendered)
        .into_iter()
        .filter(|doc| top_level_kind(doc) != Some("Deployment"))
        .map(|doc| format!("---\n{doc}\n"))
        .collect();
    let kubeconfig = control_plane.kubeconfig().as_os_str();
    let applied = run(
        &kubectl,
        &[
            "--kubeconfig".as_ref(),
            kubeconfig,
            "apply".as_ref(),
            "--server-side".as_ref(),
            "--force-conflicts".as_ref(),
            format!("--field-manager={FIELD_MANAGER}").as_ref(),
            "-o".as_ref(),
            "json".as_ref(),
            "-f".as_ref(),
            "-".as_ref(),
        ],
        Some(&manifest),
    )?;
    let applied: Value =
        serde_json::from_str(&applied).context("kubectl apply -o json printed no JSON")?;
    let items = applied["items"]
        .as_array()
        .cloned()
        .unwrap_or_else(|| vec![applied.clone()]);
    let of_kind = |kind: &str| {
        items
            .iter()
            .filter(|o| o["kind"] == kind)
            .cloned()
            .collect::<Vec<Value>>()
    };
    for crd in of_kind("CustomResourceDefinition") {
        let name = crd["metadata"]["name"].as_str().unwrap_or_default();
        wait_established(client, name).await?;
    }
    let account = of_kind("ServiceAccount")
        .into_iter()
        .next()
        .ok_or_else(|| anyhow!("{source} renders no ServiceAccount"))?;
    let name = account["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let namespace = account["metadata"]["namespace"]
        .as_str()
        .unwrap_or_default()
        .to_owned();

    let token = service_account_token(client, &namespace, &name).await?;
    let path = control_plane.dir().join("operator.kubeconfig");
    let user = format!("system:serviceaccount:{namespace}:{name}");
    crate::kubeconfig::write(
        &path,
        control_plane.server(),
        control_plane.ca_cert(),
        (&user, &token),
        // In a pod the account's namespace is the client's default namespace, where the operator keeps
        // its own objects (the digest key) when POD_NAMESPACE is not set.
        Some(&namespace),
    )?;
    Ok(OperatorCredentials {
        namespace,
        service_account: name,
        user,
        kubeconfig: path,
    })
}

/// A token of the ServiceAccount from the TokenRequest API, as `kubectl create token` gets one.
pub async fn service_account_token(client: &Client, namespace: &str, name: &str) -> Result<String> {
    let api: Api<ServiceAccount> = Api::namespaced(client.clone(), namespace);
    let request: TokenRequest = serde_json::from_value(json!({
        "spec": {"audiences": [], "expirationSeconds": 86_400},
    }))?;
    let answer = api
        .create_token_request(name, &PostParams::default(), &request)
        .await
        .with_context(|| format!("cannot get a token for ServiceAccount {namespace}/{name}"))?;
    answer
        .status
        .map(|s| s.token)
        .filter(|t| !t.is_empty())
        .ok_or_else(|| anyhow!("the TokenRequest for {namespace}/{name} returned no token"))
}

async fn wait_established(client: &Client, name: &str) -> Result<()> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let crd = api.get(name).await?;
        let established = crd
            .status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "Established" && c.status == "True");
        if established {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("CRD {name} is not Established after 30s");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Runs `program` with `stdin`, returning stdout; an error carries stderr.
fn run(program: &Path, args: &[&std::ffi::OsStr], stdin: Option<&str>) -> Result<String> {
    let mut child = Command::new(program)
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot run {}", program.display()))?;
    if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(text.as_bytes())?;
    }
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!(
            "`{} {}` failed ({}): {}",
            program.display(),
            args.iter()
                .map(|a| a.to_string_lossy())
                .collect::<Vec<_>>()
                .join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The documents of a multi-document YAML stream (split at `---` lines), without empty ones.
fn split_documents(yaml: &str) -> Vec<String> {
    let mut docs = vec![String::new()];
    for line in yaml.lines() {
        if line.trim_end() == "---" {
            docs.push(String::new());
        } else if let Some(doc) = docs.last_mut() {
            doc.push_str(line);
            doc.push('\n');
        }
    }
    docs.retain(|d| {
        d.lines()
            .any(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
    });
    docs
}

/// The `kind:` at the top level of a YAML document.
fn top_level_kind(doc: &str) -> Option<&str> {
    doc.lines()
        .find_map(|l| l.strip_prefix("kind:"))
        .map(|k| k.trim().trim_matches('"'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documents_and_their_kinds() {
        let yaml = "# head\n---\napiVersion: v1\nkind: Namespace\n---\n---\napiVersion: apps/v1\nkind: \"Deployment\"\nspec:\n  kind: x\n";
        let docs = split_documents(yaml);
        assert_eq!(docs.len(), 2);
        assert_eq!(top_level_kind(&docs[0]), Some("Namespace"));
        assert_eq!(top_level_kind(&docs[1]), Some("Deployment"));
    }
}
