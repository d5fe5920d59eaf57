//! The harness itself against the real binaries (skipped without `KUBEBUILDER_ASSETS`): exact request
//! counts from the audit log, the stand-in kubelet's pods (readiness gates, a real memcached when
//! Debian's is installed, deletion), and a restart of the API server alone.
//!
//! ```text
//! KUBEBUILDER_ASSETS=/opt/kubebuilder-assets/bin cargo test -p envtest --test harness -- --nocapture
//! ```

use std::path::Path;
use std::time::{Duration, Instant};

use envtest::control_plane::ADMIN_USER;
use envtest::kubelet::DEBIAN_MEMCACHED;
use envtest::{Env, EnvOptions, KubeletOptions};
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod};
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const GATE: &str = "example.com/in-rotation";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_counts_pods_gates_deletion_and_an_api_server_restart() {
    let Some(assets) = envtest::assets() else {
        envtest::skip("harness");
        return;
    };
    let memcached = Path::new(DEBIAN_MEMCACHED)
        .is_file()
        .then(|| DEBIAN_MEMCACHED.into());
    let options = EnvOptions {
        kubelet: KubeletOptions {
            memcached: memcached.clone(),
            pod_start_delay: Duration::from_millis(50),
            ..KubeletOptions::default()
        },
        ..EnvOptions::default()
    };
    let env = Env::start(&assets, options).await.expect("envtest starts");
    eprintln!(
        "envtest up in {:.2}s: {:?}",
        env.started_in().as_secs_f64(),
        env.control_plane().timings()
    );
    let dir = env.control_plane().dir().to_owned();
    let client = env.client().clone();
    let nodes = Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await
        .unwrap();
    assert_eq!(nodes.items.len(), 3);

    envtest::create_namespace(&client, "harness", &[])
        .await
        .unwrap();

    // Exact counts for one user.
    let audit = env.control_plane().audit();
    let mark = audit.mark().unwrap();
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), "harness");
    for _ in 0..3 {
        let _ = configmaps.get_opt("nothing-here").await.unwrap();
    }
    configmaps.list(&ListParams::default()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let counts = audit.count_since(&mark, ADMIN_USER).unwrap();
    eprintln!("admin requests since the mark:\n{counts}");
    assert_eq!(counts.get("get", "configmaps", ""), 3);
    assert_eq!(counts.get("list", "configmaps", ""), 1);

    // A pod with a readiness gate: Running at once, Ready only once the gate passes.
    let pods: Api<Pod> = Api::namespaced(client.clone(), "harness");
    pods.create(&PostParams::default(), &gated_pod("gated"))
        .await
        .unwrap();
    let pod = wait_pod(&pods, "gated", |p| phase(p) == "Running").await;
    let ip = pod.status.as_ref().and_then(|s| s.pod_ip.clone()).unwrap();
    assert!(ip.starts_with("127.1."), "{ip}");
    assert_eq!(condition(&pod, "Ready"), "False");
    assert_eq!(condition(&pod, "ContainersReady"), "True");
    if memcached.is_some() {
        let stats = memcached_stats(&ip, 11311).await;
        assert!(stats.contains("STAT pid"), "{stats}");
        eprintln!("memcached answers on {ip}:11311");
    }
    let gate = json!({"status": {"conditions": [{"type": GATE, "status": "True"}]}});
    pods.patch_status("gated", &PatchParams::default(), &Patch::Strategic(&gate))
        .await
        .unwrap();
    let pod = wait_pod(&pods, "gated", |p| condition(p, "Ready") == "True").await;
    assert_eq!(
        condition(&pod, GATE),
        "True",
        "the gate's condition is kept"
    );

    // Deletion: gone for good, its memcached with it.
    let deleted = Instant::now();
    pods.delete("gated", &Default::default()).await.unwrap();
    wait_until("the pod to be gone", || async {
        pods.get_opt("gated").await.unwrap().is_none()
    })
    .await;
    eprintln!("pod deleted in {:.2}s", deleted.elapsed().as_secs_f64());
    if memcached.is_some() {
        assert!(
            tokio::net::TcpStream::connect((ip.as_str(), 11311))
                .await
                .is_err()
        );
    }

    // The API server alone restarts; clients and the kubelet carry on.
    let took = env
        .control_plane()
        .restart_apiserver()
        .await
        .expect("restart");
    eprintln!("kube-apiserver restarted in {:.2}s", took.as_secs_f64());
    // The old client's connection died with the server: the first request may fail, a retry must not.
    let mut created = pods
        .create(&PostParams::default(), &gated_pod("after"))
        .await;
    if let Err(e) = &created {
        eprintln!("first request after the restart: {e}");
        created = pods
            .create(&PostParams::default(), &gated_pod("after"))
            .await;
    }
    created.expect("a pod created after the restart");
    let pods_after = pods.clone();
    wait_pod(&pods_after, "after", |p| phase(p) == "Running").await;

    env.stop().await;
    assert!(!dir.exists() || std::env::var("ENVTEST_KEEP").is_ok_and(|v| v == "1"));
}

fn gated_pod(name: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "readinessGates": [{"conditionType": GATE}],
            "containers": [{
                "name": "memcached", "image": "memcached:1.6",
                "args": ["-p", "11311", "-m", "32", "-o", "modern"],
                "ports": [{"name": "memcached", "containerPort": 11311}],
            }],
        },
    }))
    .unwrap()
}

fn phase(pod: &Pod) -> &str {
    pod.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("")
}

fn condition<'a>(pod: &'a Pod, kind: &str) -> &'a str {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == kind))
        .map_or("", |c| c.status.as_str())
}

async fn wait_pod(pods: &Api<Pod>, name: &str, done: impl Fn(&Pod) -> bool) -> Pod {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let pod = pods.get(name).await.unwrap();
        if done(&pod) {
            return pod;
        }
        assert!(Instant::now() < deadline, "pod {name}: {:?}", pod.status);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn wait_until<F: std::future::Future<Output = bool>>(what: &str, check: impl Fn() -> F) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !check().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn memcached_stats(ip: &str, port: u16) -> String {
    let mut stream = tokio::net::TcpStream::connect((ip, port)).await.unwrap();
    stream.write_all(b"stats\r\nquit\r\n").await.unwrap();
    let mut out = String::new();
    stream.read_to_string(&mut out).await.unwrap();
    out
}
