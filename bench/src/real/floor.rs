//! `--real --floor`: what the control plane alone allows. The same instances, created the same way on the
//! same control plane, but no operator: a stand-in controller in the bench process writes, for each new
//! instance as soon as its watch sees it, the same four children the operator keeps for an instance of
//! size 1 (its Deployment, its Service and headless Service, its server list ConfigMap), then its first
//! status, [`CONCURRENCY`] instances at a time in the order seen, as the operator's default `--concurrency`
//! allows. No events, no reads of the pods, no second status: the delays it measures are the least an
//! operator could show on this machine (the "fair floor"), so a figure of the operator's can be
//! read against them (on a 2-core machine the control plane's own work is most of the time).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use kube::api::{DynamicObject, Patch, PatchParams, PostParams};
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, ResourceExt};
use serde::Serialize;
use serde_json::json;
use tokio::sync::mpsc;

use super::{
    CONTROL_PLANE, NAMESPACE, Prepared, Progress, Watches, cpu_since, create_instances, lock,
    memcached_resource, prepare, start_env,
};
use crate::{Delays, WATCHES_OPEN, process};

/// Instances the stand-in writes for at once: the operator's default `--concurrency`.
pub const CONCURRENCY: usize = 64;

/// What `--floor` needs.
#[derive(Clone, Debug)]
pub struct FloorOptions {
    pub instances: usize,
    pub pod_start: Duration,
    pub timeout: Duration,
    pub creates_in_flight: usize,
    pub config_dir: std::path::PathBuf,
}

/// The floor's figures (seconds from t0, the first create, unless said otherwise).
#[derive(Clone, Debug, Serialize)]
pub struct FloorReport {
    pub server: String,
    pub instances: usize,
    pub concurrency: usize,
    /// All creates answered.
    pub created_seconds: f64,
    /// Every instance's Deployment seen by the admin's watch.
    pub workloads_seconds: f64,
    /// Per instance, from its create's answer to its Deployment seen.
    pub workload_after_create: Option<Delays>,
    /// Per instance, from its create's answer to its first status seen.
    pub first_status_after_create: Option<Delays>,
    /// Every instance's pod Ready.
    pub pods_ready_seconds: Option<f64>,
    /// The stand-in's requests that failed (each is retried once its instance is seen again: never).
    pub failed_writes: usize,
    pub control_plane_cpu_seconds: std::collections::BTreeMap<String, f64>,
}

impl std::fmt::Display for FloorReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let delays = |d: &Option<Delays>| {
            d.as_ref().map_or("–".to_owned(), |d| {
                format!("{:.2} s / {:.2} s", d.median, d.max)
            })
        };
        writeln!(
            f,
            "floor on {}: {} instances, no operator; a stand-in writes each one's four children and first \
             status, {} at a time",
            self.server, self.instances, self.concurrency
        )?;
        writeln!(
            f,
            "{:<44} {:.2} s",
            "all creates answered", self.created_seconds
        )?;
        writeln!(
            f,
            "{:<44} {:.2} s",
            "all Deployments seen", self.workloads_seconds
        )?;
        writeln!(
            f,
            "{:<44} {}",
            "Deployment after create (median / max)",
            delays(&self.workload_after_create)
        )?;
        writeln!(
            f,
            "{:<44} {}",
            "first status after create (median / max)",
            delays(&self.first_status_after_create)
        )?;
        writeln!(
            f,
            "{:<44} {}",
            "all pods ready",
            self.pods_ready_seconds
                .map_or("–".to_owned(), |s| format!("{s:.2} s"))
        )?;
        writeln!(
            f,
            "{:<44} {}",
            "stand-in writes that failed", self.failed_writes
        )?;
        let cpu: Vec<String> = self
            .control_plane_cpu_seconds
            .iter()
            .map(|(name, s)| format!("{name} {s:.1} s"))
            .collect();
        write!(f, "{:<44} {}", "control plane CPU", cpu.join(", "))
    }
}

/// Starts a control plane, measures the floor, stops it.
pub async fn run(options: &FloorOptions) -> Result<FloorReport, String> {
    let env = start_env(options.instances, options.pod_start).await?;
    let report = measure(&env, options).await;
    env.stop().await;
    report
}

async fn measure(env: &envtest::Env, options: &FloorOptions) -> Result<FloorReport, String> {
    // The operator's ServiceAccount too: the stand-in writes as the operator does, so that the API
    // server's priority and fairness treat its requests alike (an admin's are exempt).
    let Prepared {
        client,
        version,
        credentials,
    } = prepare(env, &options.config_dir).await?;

    let names: Vec<String> = (0..options.instances)
        .map(|i| format!("bench-{i:05}"))
        .collect();
    let progress = Arc::new(Mutex::new(Progress {
        expected: names.iter().cloned().collect(),
        ..Progress::default()
    }));
    let watches = Watches::start(&client, &progress).await?;
    // A client of its own, as an operator process would have, with the operator's token.
    let stand_in_client = envtest::kubeconfig::client(&credentials.kubeconfig)
        .await
        .map_err(|e| format!("{e:#}"))?;
    let failed = Arc::new(Mutex::new(0usize));
    let stand_in = tokio::spawn(stand_in(stand_in_client, failed.clone()));
    tokio::time::sleep(WATCHES_OPEN).await;

    let plane_cpu_start = process::children_cpu_seconds(&CONTROL_PLANE);
    let t0 = Instant::now();
    let created = create_instances(&client, &names, options.creates_in_flight).await?;
    let created_seconds = t0.elapsed().as_secs_f64();
    lock(&progress).created = created.into_iter().collect();

    let deadline = t0 + options.timeout;
    let workloads_at = loop {
        {
            let p = lock(&progress);
            let statuses = p.status_seen.len() == p.expected.len();
            if let (true, true, Some(_)) = (p.all(&p.workloads), statuses, p.pods_ready_at) {
                break p.workload_seen.values().max().copied().unwrap_or(t0);
            }
        }
        env.control_plane()
            .check_running()
            .map_err(|e| format!("{e:#}"))?;
        if Instant::now() > deadline {
            let p = lock(&progress);
            return Err(format!(
                "after {:?}, {} of {} instances have their Deployment, {} a first status and {} a Ready pod",
                options.timeout,
                p.workloads.len(),
                options.instances,
                p.status_seen.len(),
                p.pods_ready.len()
            ));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let control_plane_cpu_seconds = cpu_since(
        &plane_cpu_start,
        &process::children_cpu_seconds(&CONTROL_PLANE),
    );
    stand_in.abort();
    drop(watches);
    let failed_writes = *failed.lock().unwrap_or_else(|e| e.into_inner());
    let p = lock(&progress);
    Ok(FloorReport {
        server: format!("real kube-apiserver {version}"),
        instances: options.instances,
        concurrency: CONCURRENCY,
        created_seconds,
        workloads_seconds: (workloads_at - t0).as_secs_f64(),
        workload_after_create: p.after_create(&p.workload_seen),
        first_status_after_create: p.after_create(&p.status_seen),
        pods_ready_seconds: p.pods_ready_at.map(|at| (at - t0).as_secs_f64()),
        failed_writes,
        control_plane_cpu_seconds,
    })
}

/// The stand-in controller: every instance its watch sees for the first time gets its Deployment, then its
/// first status, [`CONCURRENCY`] instances at a time, in the order seen.
async fn stand_in(client: Client, failed: Arc<Mutex<usize>>) {
    let memcacheds: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), NAMESPACE, &memcached_resource());
    let (due, queue) = mpsc::unbounded_channel::<DynamicObject>();
    let watch = {
        let memcacheds = memcacheds.clone();
        async move {
            let mut seen = std::collections::HashSet::new();
            let mut events = watcher::watcher(memcacheds, watcher::Config::default()).boxed();
            while let Some(event) = events.next().await {
                if let Ok(Event::Apply(mc) | Event::InitApply(mc)) = event
                    && seen.insert(mc.name_any())
                    && due.send(mc).is_err()
                {
                    return;
                }
            }
        }
    };
    let children = Children::new(&client);
    let work = futures::stream::unfold(queue, |mut queue| async move {
        queue.recv().await.map(|mc| (mc, queue))
    })
    .for_each_concurrent(CONCURRENCY, |mc| {
        let (children, memcacheds, failed) = (children.clone(), memcacheds.clone(), failed.clone());
        async move {
            let name = mc.name_any();
            let mut results = children.create(&mc).await;
            let status = json!({"status": {"conditions": [{
                "type": "Progressing", "status": "True", "reason": "Creating",
                "message": "creating the Deployment; waiting for its controller to start the pods",
                "lastTransitionTime": k8s_openapi::jiff::Timestamp::now().to_string(),
            }]}});
            let written = memcacheds
                .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
                .await
                .map(drop);
            results.push(written);
            for result in results {
                if let Err(e) = result {
                    eprintln!("warning: the stand-in's write for {name}: {e}");
                    *failed.lock().unwrap_or_else(|e| e.into_inner()) += 1;
                }
            }
        }
    });
    tokio::join!(watch, work);
}

/// The stand-in's clients of the four kinds it creates.
#[derive(Clone)]
struct Children {
    deployments: Api<Deployment>,
    services: Api<Service>,
    config_maps: Api<ConfigMap>,
}

impl Children {
    fn new(client: &Client) -> Self {
        Children {
            deployments: Api::namespaced(client.clone(), NAMESPACE),
            services: Api::namespaced(client.clone(), NAMESPACE),
            config_maps: Api::namespaced(client.clone(), NAMESPACE),
        }
    }

    /// Creates `mc`'s four children, one request each, all at once (the least time a client can take:
    /// the operator writes them one after another); the result of each.
    async fn create(&self, mc: &DynamicObject) -> Vec<kube::Result<()>> {
        let post = PostParams::default();
        let (deployment, service, headless, servers) = (
            deployment(mc),
            service(mc, false),
            service(mc, true),
            server_list(mc),
        );
        let (deployment, service, headless, servers) = tokio::join!(
            self.deployments.create(&post, &deployment),
            self.services.create(&post, &service),
            self.services.create(&post, &headless),
            self.config_maps.create(&post, &servers),
        );
        vec![
            deployment.map(drop),
            service.map(drop),
            headless.map(drop),
            servers.map(drop),
        ]
    }
}

/// The labels and controller reference of every child of `mc`, as the operator writes them.
fn child_metadata(mc: &DynamicObject, name: &str) -> serde_json::Value {
    let instance = mc.name_any();
    json!({
        "name": name, "namespace": NAMESPACE,
        "labels": labels(&instance),
        "ownerReferences": [{
            "apiVersion": "cache.example.com/v1alpha1", "kind": "Memcached", "name": instance,
            "uid": mc.uid().unwrap_or_default(), "controller": true, "blockOwnerDeletion": true,
        }],
    })
}

fn labels(instance: &str) -> serde_json::Value {
    json!({
        "app.kubernetes.io/name": "memcached",
        "app.kubernetes.io/instance": instance,
        "app.kubernetes.io/managed-by": "memcached-operator",
    })
}

/// The instance's Service (`<name>`, ClusterIP) or headless Service (`<name>-headless`).
fn service(mc: &DynamicObject, headless: bool) -> Service {
    let instance = mc.name_any();
    let name = if headless {
        format!("{instance}-headless")
    } else {
        instance.clone()
    };
    let mut spec = json!({
        "selector": {"app.kubernetes.io/name": "memcached", "app.kubernetes.io/instance": instance},
        "ports": [{"name": "memcached", "port": 11211, "targetPort": "memcached"}],
    });
    if headless {
        spec["clusterIP"] = json!("None");
        spec["publishNotReadyAddresses"] = json!(true);
    }
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": child_metadata(mc, &name), "spec": spec,
    }))
    .unwrap_or_else(|e| unreachable!("a constant Service's shape: {e}"))
}

/// The instance's server list, `<name>-servers`, with one server, as its first ready pod makes it.
fn server_list(mc: &DynamicObject) -> ConfigMap {
    let name = format!("{}-servers", mc.name_any());
    let server = "10.0.0.1:11211";
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": child_metadata(mc, &name),
        "data": {"servers": format!("{server}\n"), "servers.json": json!([server]).to_string()},
    }))
    .unwrap_or_else(|e| unreachable!("a constant ConfigMap's shape: {e}"))
}

/// A Deployment like the operator's for a default instance of size 1 (one memcached container, its port,
/// probes and resources), controlled by `mc` so that the admin's watch counts it as its workload.
fn deployment(mc: &DynamicObject) -> Deployment {
    let name = mc.name_any();
    let labels = labels(&name);
    serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": child_metadata(mc, &name),
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app.kubernetes.io/name": "memcached", "app.kubernetes.io/instance": name}},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{
                    "name": "memcached", "image": "memcached:1.6.38-alpine",
                    "args": ["-m", "64", "-c", "1024", "-p", "11211"],
                    "ports": [{"name": "memcached", "containerPort": 11211}],
                    "readinessProbe": {"tcpSocket": {"port": "memcached"}, "periodSeconds": 5},
                    "livenessProbe": {"tcpSocket": {"port": "memcached"}, "periodSeconds": 10},
                    "resources": {"requests": {"cpu": "100m", "memory": "80Mi"}, "limits": {"memory": "80Mi"}},
                }]},
            },
        },
    }))
    .unwrap_or_else(|e| unreachable!("a constant Deployment's shape: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stand_ins_deployment_is_controlled_by_its_instance() {
        let mut mc = DynamicObject::new("bench-00001", &memcached_resource()).within(NAMESPACE);
        mc.metadata.uid = Some("u-1".into());
        let deployment = deployment(&mc);
        assert_eq!(
            super::super::controller(&deployment).as_deref(),
            Some("bench-00001")
        );
        assert_eq!(deployment.spec.and_then(|s| s.replicas), Some(1));
    }
}
