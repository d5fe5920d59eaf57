//! What the caches of children and pods hold per instance: the operator's packed caches
//! (`store::cache`) against kube's reflector stores fed trimmed objects, the way kube-rs
//! recommends (`.modify()` dropping `managedFields`, and of a pod its spec and the annotations nobody
//! reads), so that the code can say which measurement keeps the packed caches.
//!
//! The objects are what a real v1.28.7 API server returned for a default instance
//! (tests/fixtures/real-api-server/v1.28.7/live: its Deployment, two Services, server list ConfigMap and
//! one pod), copied per instance with their own name, uid, resource version and addresses. Memory is
//! counted by the allocator (bytes requested and still held, without allocator overhead), around
//! filling each kind of cache from the same objects; building the objects is not counted.
//!
//! `cargo run --release --example cache_memory -- [INSTANCES...]` (default 300 and 3000), or
//! `make bench-caches`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Service};
use kube::runtime::{reflector, watcher};
use memcached_operator::resources::servers::DELETION_COST_ANNOTATION;
use memcached_operator::store::{Compact, Compactable, cache};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

/// The system allocator, counting the bytes held.
struct Counting;

static HELD: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is passed on to the system allocator unchanged; only a counter is kept beside it.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        HELD.fetch_add(layout.size(), Ordering::Relaxed);
        // SAFETY: the caller's contract for `alloc` is passed on.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        HELD.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: the caller's contract for `dealloc` is passed on.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        HELD.fetch_add(new_size, Ordering::Relaxed);
        HELD.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: the caller's contract for `realloc` is passed on.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const FIXTURES: &str = "tests/fixtures/real-api-server/v1.28.7/live";

/// One instance's cached objects, as the API server sends them.
struct Objects {
    deployment: Deployment,
    services: [Service; 2],
    config_map: ConfigMap,
    pod: Pod,
}

fn fixture(name: &str) -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(FIXTURES)
        .join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// `template` as instance `i`'s: every value that differs between instances replaced.
fn object<K: DeserializeOwned>(template: &Value, i: usize, name: &str) -> K {
    let mut object = template.clone();
    let text = object.to_string();
    // The instance's name wherever it appears (labels, selectors, owner references, the server list).
    let text = text.replace("memcached-sample", &format!("instance-{i:05}"));
    object = serde_json::from_str(&text).expect("still JSON");
    let metadata = &mut object["metadata"];
    metadata["name"] = json!(name);
    metadata["uid"] = json!(format!("{:08x}-1c2d-4e5f-8a9b-{:012x}", i, i * 7919));
    metadata["resourceVersion"] = json!(format!("{}", 100_000 + i * 13));
    if let Some(owners) = metadata["ownerReferences"].as_array_mut() {
        for owner in owners {
            owner["uid"] = json!(format!("{:08x}-aaaa-4bbb-8ccc-{:012x}", i, i));
        }
    }
    let (a, b) = (i / 250, i % 250);
    if object["spec"]["clusterIP"].is_string() && object["spec"]["clusterIP"] != "None" {
        object["spec"]["clusterIP"] = json!(format!("10.0.{a}.{b}"));
        object["spec"]["clusterIPs"] = json!([format!("10.0.{a}.{b}")]);
    }
    if object["status"]["podIP"].is_string() {
        object["status"]["podIP"] = json!(format!("10.1.{a}.{b}"));
        object["status"]["podIPs"] = json!([{"ip": format!("10.1.{a}.{b}")}]);
    }
    serde_json::from_value(object).expect("the fixture's kind")
}

fn objects(instances: usize) -> Vec<Objects> {
    let deployment = fixture("deployments.memcached-sample.json");
    let service = fixture("services.memcached-sample.json");
    let headless = fixture("services.memcached-sample-headless.json");
    let config_map = fixture("configmaps.memcached-sample-servers.json");
    let pod = fixture("pods.memcached-sample-74446c7c89-mgt7d.json");
    (0..instances)
        .map(|i| {
            let name = format!("instance-{i:05}");
            Objects {
                deployment: object(&deployment, i, &name),
                services: [
                    object(&service, i, &name),
                    object(&headless, i, &format!("{name}-headless")),
                ],
                config_map: object(&config_map, i, &format!("{name}-servers")),
                pod: object(&pod, i, &format!("{name}-74446c7c89-{i:05x}")),
            }
        })
        .collect()
}

/// What kube-rs recommends for a reflector's memory: no `managedFields`; of a pod, no spec and only the
/// annotation the operator reads.
fn trimmed<K: kube::Resource>(mut object: K) -> K {
    object.meta_mut().managed_fields = None;
    object
}

fn trimmed_pod(pod: Pod) -> Pod {
    let mut pod = trimmed(pod);
    pod.spec = None;
    if let Some(annotations) = pod.metadata.annotations.as_mut() {
        annotations.retain(|key, _| key == DELETION_COST_ANNOTATION);
    }
    pod
}

/// Bytes held by kube's reflector stores of the objects.
fn reflector_stores(all: &[Objects]) -> usize {
    let (deployments, mut deployments_w) = reflector::store::<Deployment>();
    let (services, mut services_w) = reflector::store::<Service>();
    let (config_maps, mut config_maps_w) = reflector::store::<ConfigMap>();
    let (pods, mut pods_w) = reflector::store::<Pod>();
    let before = HELD.load(Ordering::Relaxed);
    for o in all {
        // As a watch delivers them: each object decoded, trimmed, handed over, and dropped after.
        let event = watcher::Event::Apply(trimmed(o.deployment.clone()));
        deployments_w.apply_watcher_event(&event);
        for service in &o.services {
            services_w.apply_watcher_event(&watcher::Event::Apply(trimmed(service.clone())));
        }
        config_maps_w.apply_watcher_event(&watcher::Event::Apply(trimmed(o.config_map.clone())));
        pods_w.apply_watcher_event(&watcher::Event::Apply(trimmed_pod(o.pod.clone())));
    }
    let held = HELD.load(Ordering::Relaxed) - before;
    let count = deployments.len() + services.len() + config_maps.len() + pods.len();
    assert_eq!(count, all.len() * 5, "every object cached");
    held
}

/// Bytes held by the operator's packed caches of the objects.
fn packed_caches(all: &[Objects]) -> usize {
    fn apply<K: Compactable>(writer: &mut memcached_operator::store::CacheWriter<K>, o: &K) {
        let mut o = o.clone();
        o.meta_mut().managed_fields = None;
        let compact = Compact::encode(&o).expect("encodes");
        writer.apply_watcher_event(&watcher::Event::Apply(compact));
    }
    // The dictionaries of each kind are taken from the first object packed, once per process: made here
    // before counting, as a running operator has them.
    let (deployments, mut deployments_w) = cache::<Deployment>();
    let (services, mut services_w) = cache::<Service>();
    let (config_maps, mut config_maps_w) = cache::<ConfigMap>();
    let (pods, mut pods_w) = cache::<Pod>();
    let before = HELD.load(Ordering::Relaxed);
    for o in all {
        apply(&mut deployments_w, &o.deployment);
        for service in &o.services {
            apply(&mut services_w, service);
        }
        apply(&mut config_maps_w, &o.config_map);
        apply(&mut pods_w, &o.pod);
    }
    let held = HELD.load(Ordering::Relaxed) - before;
    let count = deployments.len() + services.len() + config_maps.len() + pods.len();
    assert_eq!(count, all.len() * 5, "every object cached");
    held
}

fn mib(bytes: usize) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

fn main() {
    let counts: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("a number of instances"))
        .collect();
    let counts = if counts.is_empty() {
        vec![300, 3000]
    } else {
        counts
    };
    // The packing dictionaries are per process, made from the first object of each kind: warmed up with
    // one instance, as a running operator's are after its first list.
    packed_caches(&objects(1));
    println!(
        "caches of an instance's Deployment, two Services, server list and pod (real v1.28.7 objects)"
    );
    println!(
        "{:>9}  {:>22}  {:>22}  {:>10}",
        "instances", "kube stores, trimmed", "packed caches", "difference"
    );
    for n in counts {
        let all = objects(n);
        let kube = reflector_stores(&all);
        let packed = packed_caches(&all);
        println!(
            "{n:>9}  {:>10.1} MiB {:>5.2} kB  {:>10.1} MiB {:>5.2} kB  {:>6.1} MiB",
            mib(kube),
            kube as f64 / n as f64 / 1000.0,
            mib(packed),
            packed as f64 / n as f64 / 1000.0,
            mib(kube.saturating_sub(packed)),
        );
    }
}
