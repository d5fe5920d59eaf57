//! Plays the Deployment and StatefulSet controllers, the scheduler and the kubelet: for each workload
//! whose spec changed, it creates the pods (Pending) and reports the rollout as progressing at once, then,
//! after the pod start-up delay, marks the pods Running and Ready and the workload Available, in the two
//! steps, and with the status fields, the real controllers write.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::mpsc;

use fake_apiserver::{ChangeKind, Fake, TIMESTAMP};

/// A workload to bring up: collection (`deployments` or `statefulsets`), namespace, name.
type Workload = (&'static str, String, String);

/// Brings up every workload of `fake` whose spec is written from now on, pods ready after `start_up`.
pub fn start(fake: &Arc<Fake>, start_up: Duration) {
    let (sender, mut workloads) = mpsc::unbounded_channel::<Workload>();
    fake.store().on_change(Box::new(move |change| {
        let workload = matches!(change.plural, "deployments" | "statefulsets");
        if workload && change.spec_changed && change.kind != ChangeKind::Deleted {
            let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
            let meta = &change.object["metadata"];
            let _ = sender.send((change.plural, text(&meta["namespace"]), text(&meta["name"])));
        }
    }));
    let fake = fake.clone();
    tokio::spawn(async move {
        while let Some(workload) = workloads.recv().await {
            tokio::spawn(bring_up(fake.clone(), workload, start_up));
        }
    });
}

async fn bring_up(fake: Arc<Fake>, (plural, namespace, name): Workload, start_up: Duration) {
    // The controllers react within a moment of the write.
    tokio::time::sleep(Duration::from_millis(20)).await;
    if step(&fake, plural, &namespace, &name, false).is_none() {
        return;
    }
    tokio::time::sleep(start_up).await;
    step(&fake, plural, &namespace, &name, true);
}

/// Makes the workload's pods match its replicas, `ready` or still starting, and reports it. `None` when
/// the workload is gone.
fn step(fake: &Fake, plural: &'static str, namespace: &str, name: &str, ready: bool) -> Option<()> {
    let mut store = fake.store();
    let workload = store.get(plural, namespace, name)?.clone();
    let replicas = workload["spec"]["replicas"].as_u64().unwrap_or(1);
    let template = &workload["spec"]["template"];
    for i in 0..replicas {
        let pod_name = match plural {
            "statefulsets" => format!("{name}-{i}"),
            _ => format!("{name}-5d8f7c9b4-{i:05}"),
        };
        let pod = pod(&workload, template, namespace, &pod_name, i, ready);
        let existing = store.get("pods", namespace, &pod_name).cloned();
        let result = match existing {
            None => store.create("pods", pod).map(drop),
            Some(mut old) => {
                old["metadata"]["labels"] = pod["metadata"]["labels"].clone();
                old["spec"] = pod["spec"].clone();
                old["status"] = pod["status"].clone();
                store.update("pods", old).map(drop)
            }
        };
        result.ok()?;
    }
    // Pods beyond the replicas go (a scale-down).
    for i in replicas.. {
        let pod_name = match plural {
            "statefulsets" => format!("{name}-{i}"),
            _ => format!("{name}-5d8f7c9b4-{i:05}"),
        };
        if store.get("pods", namespace, &pod_name).is_none() {
            break;
        }
        store.delete("pods", namespace, &pod_name);
    }
    let mut updated = workload.clone();
    updated["status"] = workload_status(plural, &workload, replicas, ready);
    store.update(plural, updated).ok().map(drop)
}

fn pod(
    workload: &Value,
    template: &Value,
    namespace: &str,
    name: &str,
    i: u64,
    ready: bool,
) -> Value {
    let mut labels = template["metadata"]["labels"].clone();
    if workload["kind"] == "StatefulSet" {
        labels["statefulset.kubernetes.io/pod-name"] = json!(name);
    }
    let uid = workload["metadata"]["uid"].as_str().unwrap_or_default();
    // A stable address per pod, different for every workload, in the loopback range: the operator
    // connects to ready pods' addresses (operand telemetry), and nothing may leave this machine.
    let seed = uid
        .bytes()
        .fold(0u32, |h, b| h.wrapping_mul(31).wrapping_add(b.into()));
    let ip = format!("127.{}.{}.{}", (seed >> 8) % 250, seed % 250, i % 250 + 1);
    let condition = |kind: &str, on: bool| json!({"type": kind, "status": if on { "True" } else { "False" }, "lastTransitionTime": TIMESTAMP});
    let containers: Vec<Value> = template["spec"]["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            let state = if ready {
                json!({"running": {"startedAt": TIMESTAMP}})
            } else {
                json!({"waiting": {"reason": "ContainerCreating"}})
            };
            json!({"name": c["name"], "image": c["image"], "imageID": "", "ready": ready,
                   "started": ready, "restartCount": 0, "state": state})
        })
        .collect();
    let status = if ready {
        json!({"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}], "hostIP": "127.0.0.1",
               "startTime": TIMESTAMP, "containerStatuses": containers,
               "conditions": [condition("PodScheduled", true), condition("Initialized", true),
                              condition("ContainersReady", true), condition("Ready", true)]})
    } else {
        json!({"phase": "Pending", "hostIP": "127.0.0.1", "startTime": TIMESTAMP,
               "containerStatuses": containers,
               "conditions": [condition("PodScheduled", true), condition("Initialized", true),
                              condition("ContainersReady", false), condition("Ready", false)]})
    };
    json!({
        "metadata": {"name": name, "namespace": namespace, "labels": labels,
                     "annotations": template["metadata"]["annotations"]},
        "spec": template["spec"],
        "status": status,
    })
}

fn workload_status(plural: &str, workload: &Value, replicas: u64, ready: bool) -> Value {
    let generation = workload["metadata"]["generation"].clone();
    let ready_replicas = if ready { replicas } else { 0 };
    let condition = |kind: &str, on: bool, reason: &str| {
        json!({"type": kind, "status": if on { "True" } else { "False" }, "reason": reason,
               "lastUpdateTime": TIMESTAMP, "lastTransitionTime": TIMESTAMP})
    };
    if plural == "statefulsets" {
        return json!({"observedGeneration": generation, "replicas": replicas,
                      "readyReplicas": ready_replicas, "currentReplicas": replicas,
                      "updatedReplicas": replicas, "availableReplicas": ready_replicas,
                      "currentRevision": format!("{}-1", workload["metadata"]["name"].as_str().unwrap_or_default()),
                      "updateRevision": format!("{}-1", workload["metadata"]["name"].as_str().unwrap_or_default())});
    }
    let mut status = json!({
        "observedGeneration": generation, "replicas": replicas, "updatedReplicas": replicas,
        "conditions": [
            if ready {
                condition("Available", true, "MinimumReplicasAvailable")
            } else {
                condition("Available", false, "MinimumReplicasUnavailable")
            },
            if ready {
                condition("Progressing", true, "NewReplicaSetAvailable")
            } else {
                condition("Progressing", true, "ReplicaSetUpdated")
            },
        ],
    });
    if ready {
        status["readyReplicas"] = json!(replicas);
        status["availableReplicas"] = json!(replicas);
    } else {
        status["unavailableReplicas"] = json!(replicas);
    }
    status
}
