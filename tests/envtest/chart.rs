//! The Helm chart on a real server: its default rendering (`helm install memcached-operator
//! charts/memcached-operator -n memcached-operator-system`, rendered by Helm's engine through
//! hack/helm_chart.py) is applied server-side, its Deployment passes the API server's validation, and the
//! operator, running under the chart's ServiceAccount and RBAC, settles an instance with no request refused.

use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use kube::Api;
use kube::api::PostParams;
use serde_json::{Value, json};

use crate::instances::{apply, wait_settled};
use crate::{REPO_ROOT, Scenario};

const RELEASE: &str = "memcached-operator";
const NAMESPACE: &str = "memcached-operator-system";

/// The chart's default rendering as one YAML stream, `crds/` first as Helm installs them, after the
/// Namespace `--create-namespace` would make; or why it cannot be rendered here.
fn chart_rendering() -> Result<(String, Value), String> {
    let out = Command::new("python3")
        .current_dir(REPO_ROOT)
        .args([
            "hack/helm_chart.py",
            "render",
            "charts/memcached-operator",
            "{}",
            RELEASE,
            NAMESPACE,
        ])
        .output()
        .map_err(|e| format!("cannot run python3: {e}"))?;
    if out.status.code() == Some(3) {
        return Err(String::from_utf8_lossy(&out.stderr).trim().to_owned());
    }
    let answer: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "hack/helm_chart.py printed no JSON ({e}): {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    assert!(
        answer["error"].is_null(),
        "the chart does not render: {}",
        answer["error"]
    );
    let mut stream =
        format!("---\napiVersion: v1\nkind: Namespace\nmetadata:\n  name: {NAMESPACE}\n");
    for key in ["crds", "manifests"] {
        // The test hooks are `helm test`'s, not the install's (chart_actions.rs runs them).
        for text in answer[key]
            .as_object()
            .into_iter()
            .flatten()
            .filter(|(path, _)| !path.contains("/templates/tests/"))
            .filter_map(|(_, t)| t.as_str())
        {
            stream.push_str("---\n");
            stream.push_str(text);
            stream.push('\n');
        }
    }
    let deployment = serde_saphyr::from_multiple::<Value>(&stream)
        .expect("the rendering is YAML")
        .into_iter()
        .find(|o| o["kind"] == "Deployment")
        .expect("the chart renders the operator's Deployment");
    Ok((stream, deployment))
}

#[tokio::test]
async fn the_charts_default_rendering_installs_and_runs_an_instance() {
    const NAME: &str = "chart";
    if envtest::assets().is_none() {
        envtest::skip(NAME);
        return;
    }
    let (rendering, deployment) = match chart_rendering() {
        Ok(rendered) => rendered,
        Err(reason) => return envtest::skip_because(NAME, &reason),
    };
    let Some(s) =
        Scenario::start_from_rendering(NAME, rendering, "the Helm chart's rendering").await
    else {
        return;
    };
    s.step("the chart's CRD, ServiceAccount, roles, bindings and Service applied server-side");

    // The stand-in kubelet runs memcached, not the operator's image: the Deployment is checked by the
    // API server (schema, defaults, admission) without being stored, and the operator runs as a process
    // under the chart's ServiceAccount instead.
    let deployment: Deployment = serde_json::from_value(deployment).expect("a Deployment");
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    Api::<Deployment>::namespaced(s.client.clone(), NAMESPACE)
        .create(&dry_run, &deployment)
        .await
        .unwrap_or_else(|e| panic!("the API server refuses the chart's Deployment: {e}"));
    s.step("the API server accepts the chart's Deployment (server-side dry run)");

    apply(&s, "cache", json!({"size": 2})).await;
    wait_settled(&s, "cache", Duration::from_secs(90)).await;
    s.step("an instance settled under the chart's RBAC");

    let refused = s.refused_requests();
    assert!(
        refused.is_empty(),
        "requests the chart's RBAC refused: {refused:?}"
    );
    s.step("no request of the operator was refused");
}
