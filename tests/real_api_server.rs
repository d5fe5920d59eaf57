//! What the operator wants, compared with what a real API server returned for it.
//!
//! `tests/fixtures/real-api-server/v1.28.7/` holds, for three instances (the default sample, every optional
//! feature on, a StatefulSet pool), the last server-side apply body the operator sent for each child and the
//! child as a Kubernetes v1.28.7 API server returned it afterwards (managedFields, defaults and all). The
//! drift check must find each child up to date: when it does not, the operator re-applies that child on
//! every reconcile (a zero-valued `omitempty` field such as `minReadySeconds: 0` did exactly that).
//!
//! These are one server version's answers, not a specification: the envtest tier checks the same against
//! whichever server `KUBEBUILDER_ASSETS` provides.

use std::path::PathBuf;

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use kube::ResourceExt;
use memcached_operator::api::{Memcached, MemcachedStatus};
use memcached_operator::resources::{
    Defaults, Instance, autoscaler, deployment, drift, network_policy, pdb, servers, service,
    statefulset,
};
use serde::Serialize;
use serde_json::Value;

const VERSION: &str = "v1.28.7";

fn dir(which: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/real-api-server")
        .join(VERSION)
        .join(which)
}

fn load(which: &str, file: &str) -> Value {
    let path = dir(which).join(file);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Leaves out what differs by design between a desired object and the live one: the hash of the desired
/// object (an older build stamped the live one) and the owner's uid (objects of different runs).
fn without_identity(mut object: Value) -> Value {
    if let Some(annotations) = object
        .pointer_mut("/metadata/annotations")
        .and_then(Value::as_object_mut)
    {
        annotations.remove(drift::DESIRED_HASH_ANNOTATION);
    }
    if let Some(owners) = object
        .pointer_mut("/metadata/ownerReferences")
        .and_then(Value::as_array_mut)
    {
        for owner in owners {
            if let Some(owner) = owner.as_object_mut() {
                owner.remove("uid");
            }
        }
    }
    object
}

/// The paths at which `desired` is not found in `live`, for the failure message.
fn missing(live: &Value, desired: &Value, path: &str, out: &mut Vec<String>) {
    match (live, desired) {
        (Value::Object(l), Value::Object(d)) => {
            for (key, want) in d {
                match l.get(key) {
                    Some(have) => missing(have, want, &format!("{path}.{key}"), out),
                    None => {
                        if !drift::contains(
                            &Value::Object(Default::default()),
                            &serde_json::json!({ key: want }),
                        ) {
                            out.push(format!("{path}.{key}: absent, want {want}"));
                        }
                    }
                }
            }
        }
        (Value::Array(l), Value::Array(d)) if l.len() == d.len() => {
            for (i, (have, want)) in l.iter().zip(d).enumerate() {
                missing(have, want, &format!("{path}[{i}]"), out);
            }
        }
        _ if drift::contains(live, desired) => {}
        _ => out.push(format!("{path}: live {live}, want {desired}")),
    }
}

fn assert_found(file: &str, live: &Value, desired: &Value) {
    let (live, desired) = (
        without_identity(live.clone()),
        without_identity(desired.clone()),
    );
    if !drift::contains(&live, &desired) {
        let mut out = Vec::new();
        missing(&live, &desired, "", &mut out);
        panic!(
            "{file}: the API server's answer does not hold what the operator applied, so the operator \
             would apply it on every reconcile:\n  {}",
            out.join("\n  ")
        );
    }
}

#[test]
fn every_child_the_operator_applied_is_found_in_what_the_server_returned() {
    let mut checked = 0;
    let mut files: Vec<_> = std::fs::read_dir(dir("applied"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    files.sort();
    for file in files {
        // The status is compared by value (see below), not applied as a child.
        if file.starts_with("memcacheds.status.") {
            continue;
        }
        let mut applied = load("applied", &file);
        let live = load("live", &file);
        if file.starts_with(&format!(
            "{}.",
            <ConfigMap as k8s_openapi::Resource>::URL_PATH_SEGMENT
        )) {
            // The recorded server lists are of different moments (a pod was replaced in between); their
            // data is the operator's own text, compared exactly by the tests below.
            applied.as_object_mut().unwrap().remove("data");
        }
        assert_found(&file, &live, &applied);
        checked += 1;
    }
    // ConfigMaps (3), Deployments (2), HPA, NetworkPolicy, PDBs (2), Services (6), StatefulSet.
    assert_eq!(checked, 16, "every recorded child was compared");
}

/// The recording of the object `name` of kind `K`: `<plural>.<name>.json`.
fn fixture<K: k8s_openapi::Resource>(name: &str) -> String {
    format!("{}.{name}.json", K::URL_PATH_SEGMENT)
}

/// The recording of `object`.
fn fixture_of<K: k8s_openapi::Resource + kube::Resource>(object: &K) -> String {
    fixture::<K>(&object.name_any())
}

fn instance(name: &str) -> Memcached {
    serde_json::from_value(load("live", &format!("memcacheds.{name}.json")))
        .unwrap_or_else(|e| panic!("memcacheds.{name}.json: {e}"))
}

fn live<K: serde::de::DeserializeOwned>(file: &str) -> (Value, K) {
    let value = load("live", file);
    let object = serde_json::from_value(value.clone()).unwrap_or_else(|e| panic!("{file}: {e}"));
    (value, object)
}

/// Deliberate changes to a child since the recording (file, JSON pointer, why): an upgrade from the
/// recording's build writes each once. Here the recorded value stands in for the new one; the envtest
/// tier's settled scenarios check on a live server that the new form, once applied, is left alone.
const CHANGED_SINCE_RECORDING: &[(&str, &str, &str)] = &[
    (
        "deployments.memcached-secure.json",
        "/spec/template/spec/containers/0/args/12",
        "servers that verify client certificates start with memcached's TLS session cache, without which \
         a client resuming a session is refused",
    ),
    (
        "networkpolicies.memcached-secure.json",
        "/spec/podSelector",
        "the policy selects the StatefulSet rollout's spare server too, whose app.kubernetes.io/name differs",
    ),
    (
        "deployments.memcached-secure.json",
        "/spec/template/spec/containers/0/volumeMounts",
        "the auth file is mounted by subPath (a running pod keeps the file it started with)",
    ),
    (
        "deployments.memcached-secure.json",
        "/spec/template/spec/containers/1/args",
        "the exporter verifies memcached by its namespaced Service name instead of skipping verification",
    ),
    (
        "deployments.memcached-secure.json",
        "/spec/template/spec/containers/1/volumeMounts",
        "the exporter mounts its own view of the TLS Secret",
    ),
    (
        "deployments.memcached-secure.json",
        "/spec/template/spec/volumes",
        "the exporter's TLS volume holds only the keys it reads",
    ),
    (
        "deployments.memcached-sample.json",
        "/spec/template/spec/containers/0/resources",
        "the derived memory covers the slab pages memcached takes beyond -m and its grown hash table",
    ),
    (
        "statefulsets.memcached-pool.json",
        "/spec/template/spec/containers/0/resources",
        "the derived memory covers the slab pages memcached takes beyond -m and its grown hash table",
    ),
];

/// Builds each child of `name` as the operator of this tree would, and checks that the recorded live
/// child already holds it: a settled instance causes no write after an upgrade to this build beyond the
/// one that moves the desired hash.
fn check_built_children(name: &str) {
    let mc = instance(name);
    let defaults = Defaults::default();
    let instance = Instance::new(&mc, &defaults).expect("a valid recorded instance");
    let status = mc.status.clone().unwrap_or_default();
    let size = mc.spec.size;
    let stamp = |file: &str, mut desired: Value| {
        let (live, _): (Value, Value) = live(file);
        for (changed, pointer, why) in CHANGED_SINCE_RECORDING {
            if *changed != file {
                continue;
            }
            let recorded = live.pointer(pointer).cloned().unwrap_or(Value::Null);
            let wanted = desired
                .pointer_mut(pointer)
                .unwrap_or_else(|| panic!("{file}: the operator sets no {pointer}"));
            assert_ne!(
                *wanted, recorded,
                "{file}: {pointer} is no longer changed since the recording ({why}): drop its entry"
            );
            *wanted = recorded;
        }
        assert_found(file, &live, &desired);
    };
    let json = |object: &dyn erased::Json| object.json();

    if mc.spec.workload == memcached_operator::api::Workload::StatefulSet {
        let file = fixture::<StatefulSet>(name);
        let (_, sts): (Value, StatefulSet) = live(&file);
        let hash = template_secret_hash(sts.spec.as_ref().map(|s| &s.template.metadata));
        stamp(
            &file,
            json(&drift::stamp(statefulset::statefulset(
                &instance,
                size,
                hash.as_deref(),
                0,
            ))),
        );
    } else {
        let file = fixture::<Deployment>(name);
        let (_, d): (Value, Deployment) = live(&file);
        let hash = template_secret_hash(d.spec.as_ref().map(|s| &s.template.metadata));
        stamp(
            &file,
            json(&drift::stamp(deployment::deployment(
                &instance,
                size,
                hash.as_deref(),
            ))),
        );
    }
    for desired in [service::service(&instance), service::headless(&instance)] {
        let file = fixture::<Service>(&desired.name_any());
        let _: (Value, Service) = live(&file);
        stamp(&file, json(&drift::stamp(desired)));
    }
    let list = servers::config_map(&instance, &status.servers);
    let file = fixture::<ConfigMap>(&list.name_any());
    let _: (Value, ConfigMap) = live(&file);
    stamp(&file, json(&drift::stamp(list)));
    if let Some(desired) = pdb::pdb(&instance) {
        stamp(&fixture_of(&desired), json(&drift::stamp(desired)));
    }
    if let Some(desired) = network_policy::network_policy(&instance) {
        stamp(&fixture_of(&desired), json(&drift::stamp(desired)));
    }
    if let Some(desired) = autoscaler::autoscaler(&instance) {
        stamp(&fixture_of(&desired), json(&drift::stamp(desired)));
    }
}

fn template_secret_hash(
    meta: Option<&Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta>>,
) -> Option<String> {
    meta?
        .as_ref()?
        .annotations
        .as_ref()?
        .get(deployment::SECRET_HASH_ANNOTATION)
        .cloned()
}

/// Serializing any child through one signature.
mod erased {
    pub trait Json {
        fn json(&self) -> serde_json::Value;
    }
    impl<T: serde::Serialize> Json for T {
        fn json(&self) -> serde_json::Value {
            serde_json::to_value(self).expect("a child serializes")
        }
    }
}

#[test]
fn the_default_sample_built_now_is_up_to_date_on_the_server() {
    check_built_children("memcached-sample");
}

#[test]
fn every_optional_feature_built_now_is_up_to_date_on_the_server() {
    check_built_children("memcached-secure");
}

#[test]
fn a_statefulset_pool_built_now_is_up_to_date_on_the_server() {
    check_built_children("memcached-pool");
}

/// The status is written when the computed one differs from the stored one; the stored one must therefore
/// read back exactly as it was written. Each status the operator applied, read as the operator reads it,
/// gives the same JSON back, and the server's copy of it keeps every field the operator sets.
#[test]
fn the_status_reads_back_as_it_was_written() {
    for name in ["memcached-sample", "memcached-secure", "memcached-pool"] {
        let applied = load("applied", &format!("memcacheds.status.{name}.json"));
        let body = applied["status"].clone();
        let read: MemcachedStatus =
            serde_json::from_value(body.clone()).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(
            to_value(&read),
            body,
            "{name}: the applied status round-trips"
        );

        let stored = instance(name).status.expect("a stored status");
        let stored = to_value(&MemcachedStatus {
            stats: None,
            ..stored
        });
        let server = load("live", &format!("memcacheds.{name}.json"))["status"].clone();
        let mut server = server.as_object().cloned().unwrap_or_default();
        server.remove("stats");
        assert_eq!(
            stored,
            Value::Object(server),
            "{name}: the status as the operator reads it is the server's, field for field"
        );
        // Same keys at the top level as the applied body (values differ: the recordings are of one run).
        let keys = |v: &Value| {
            let mut k: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
            k.sort();
            k
        };
        assert_eq!(
            keys(&stored),
            keys(&body),
            "{name}: no field dropped or added"
        );
    }
}

fn to_value<T: Serialize>(value: &T) -> Value {
    serde_json::to_value(value).unwrap()
}
