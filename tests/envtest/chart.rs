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
    let answer = render("{}")?;
    assert!(
        answer["error"].is_null(),
        "the chart does not render: {}",
        answer["error"]
    );
    stream_and_deployment(&answer)
}

/// Helm's answer to rendering the chart with `values` (JSON): the files, or its `error`.
fn render(values: &str) -> Result<Value, String> {
    let out = Command::new("python3")
        .current_dir(REPO_ROOT)
        .args([
            "hack/helm_chart.py",
            "render",
            "charts/memcached-operator",
            values,
            RELEASE,
            NAMESPACE,
        ])
        .output()
        .map_err(|e| format!("cannot run python3: {e}"))?;
    if out.status.code() == Some(3) {
        return Err(String::from_utf8_lossy(&out.stderr).trim().to_owned());
    }
    Ok(serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "hack/helm_chart.py printed no JSON ({e}): {}",
            String::from_utf8_lossy(&out.stderr)
        )
    }))
}

/// The rendering's files as one YAML stream (see [`chart_rendering`]), and its Deployment.
fn stream_and_deployment(answer: &Value) -> Result<(String, Value), String> {
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

/// `fleetRolloutBudget` reaches the operator as `--fleet-rollout-budget` (the default, 5%, is the
/// operator's own and not passed), and the schema refuses a budget of nothing.
#[test]
fn the_fleet_rollout_budget_value_becomes_the_flag() {
    let flags = |values: &str| -> Option<Vec<String>> {
        let answer = match render(values) {
            Ok(answer) => answer,
            Err(why) => {
                eprintln!("skipped: {why}");
                return None;
            }
        };
        assert!(answer["error"].is_null(), "{values}: {}", answer["error"]);
        let (_, deployment) = stream_and_deployment(&answer).expect("rendered");
        let args = &deployment["spec"]["template"]["spec"]["containers"][0]["args"];
        let args = args.as_array().expect("args");
        Some(
            args.iter()
                .filter_map(Value::as_str)
                .filter(|a| a.starts_with("--fleet-rollout-budget"))
                .map(str::to_owned)
                .collect(),
        )
    };
    let Some(default) = flags("{}") else {
        return;
    };
    assert!(default.is_empty(), "{default:?}");
    assert_eq!(
        flags(r#"{"fleetRolloutBudget": 3}"#).unwrap(),
        ["--fleet-rollout-budget=3"]
    );
    assert_eq!(
        flags(r#"{"fleetRolloutBudget": "20%"}"#).unwrap(),
        ["--fleet-rollout-budget=20%"]
    );
    for refused in [
        r#"{"fleetRolloutBudget": 0}"#,
        r#"{"fleetRolloutBudget": "0%"}"#,
    ] {
        let answer = render(refused).expect("rendered");
        assert!(!answer["error"].is_null(), "{refused} was accepted");
    }
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
