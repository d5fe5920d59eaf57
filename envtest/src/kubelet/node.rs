//! The stand-in kubelet's Nodes: registered Ready, with capacity, untainted.

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};

use super::FIELD_MANAGER;
use super::status::HOST_IP;

/// Label on every node of the stand-in kubelet.
pub const STAND_IN_LABEL: &str = "envtest.memcached-operator/stand-in-kubelet";

/// Creates (or takes over) the Node `name` and makes it Ready and schedulable.
///
/// The not-ready taint that the API server's TaintNodesByCondition admission puts on every new Node is
/// removed here, because the controller that would remove it (node lifecycle) is off: it would evict
/// pods from nodes that post no heartbeats.
pub async fn register(client: &Client, name: &str, capacity: &Capacity) -> Result<()> {
    let api: Api<Node> = Api::all(client.clone());
    let node: Node = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": arch(),
                STAND_IN_LABEL: "true",
            },
        },
    }))?;
    match api.create(&PostParams::default(), &node).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => return Err(e).with_context(|| format!("cannot create Node {name}")),
    }
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..PatchParams::default()
    };
    let untaint = json!({"spec": {"taints": null}});
    api.patch(name, &params, &Patch::Merge(&untaint))
        .await
        .with_context(|| format!("cannot untaint Node {name}"))?;
    api.patch_status(name, &params, &Patch::Merge(&status(name, capacity)))
        .await
        .with_context(|| format!("cannot set the status of Node {name}"))?;
    Ok(())
}

/// What each node offers the scheduler.
#[derive(Clone, Debug)]
pub struct Capacity {
    pub cpu: String,
    pub memory: String,
    pub pods: u32,
}

impl Default for Capacity {
    /// Enough for the operator's production sample (three pods of 250m and 631Mi with exporters) on every
    /// node, and for a few hundred small instances over three nodes.
    fn default() -> Self {
        Capacity {
            cpu: "16".to_owned(),
            memory: "64Gi".to_owned(),
            pods: 110,
        }
    }
}

fn status(name: &str, capacity: &Capacity) -> Value {
    let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Timestamp::now());
    let resources = json!({
        "cpu": capacity.cpu,
        "memory": capacity.memory,
        "pods": capacity.pods.to_string(),
        "ephemeral-storage": "100Gi",
    });
    let condition = |kind: &str, status: &str, reason: &str| {
        json!({
            "type": kind, "status": status, "reason": reason,
            "lastHeartbeatTime": now, "lastTransitionTime": now,
        })
    };
    json!({
        "status": {
            "capacity": resources,
            "allocatable": resources,
            "phase": "Running",
            "conditions": [
                condition("MemoryPressure", "False", "KubeletHasSufficientMemory"),
                condition("DiskPressure", "False", "KubeletHasNoDiskPressure"),
                condition("PIDPressure", "False", "KubeletHasSufficientPID"),
                condition("Ready", "True", "KubeletReady"),
            ],
            "addresses": [
                {"type": "InternalIP", "address": HOST_IP},
                {"type": "Hostname", "address": name},
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 0}},
            "nodeInfo": {
                "machineID": name, "systemUUID": name, "bootID": name,
                "kernelVersion": "envtest", "osImage": "envtest",
                "containerRuntimeVersion": "envtest://0",
                "kubeletVersion": "v1.28.0-envtest", "kubeProxyVersion": "v1.28.0-envtest",
                "operatingSystem": "linux", "architecture": arch(),
            },
        }
    })
}

/// The architecture as Kubernetes spells it (GOARCH).
fn arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}
