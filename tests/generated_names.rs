//! Every name and label value the operator, and the controllers of its children, derive from an
//! instance's name fits its Kubernetes limit for the longest name the API admits, per workload. A name
//! the API admits but a child cannot carry breaks silently: a 53-character StatefulSet instance was
//! admitted and never started, because its pods' `controller-revision-hash=<name>-<hash>` label passed
//! 63 characters and the StatefulSet controller created no pod (kubernetes/kubernetes#64023).
//!
//! The instance is the sample with every feature on (`config/samples/..._all_features.yaml`), at the
//! largest size and in a namespace of the longest name; the children are what the builders make of it,
//! every kind of the table included (`store::each_kind`), so a kind or a name added later is checked too.

use memcached_operator::api::{Memcached, Server, Workload};
use memcached_operator::resources::{
    Defaults, Instance, MAX_NAME_LEN, MAX_STATEFULSET_NAME_LEN, REVISION_HASH_LEN, deployment,
    max_name_len, servers, service_monitor, spare, statefulset,
};
use memcached_operator::store::{ChildKind, EachKind, each_kind};
use serde_json::Value;

const SAMPLE: &str = "config/samples/cache_v1alpha1_memcached_all_features.yaml";
/// Largest `spec.size` (and the autoscaler's `maxSize`).
const MAX_SIZE: i32 = 64;
/// Longest namespace: a DNS-1123 label.
const NAMESPACE_LEN: usize = 63;
/// A label value: at most 63 characters (Kubernetes' `validation.IsValidLabelValue`).
const LABEL_VALUE_MAX: usize = 63;
/// A DNS-1123 or DNS-1035 label (a Service name, a pod's hostname, one part of a DNS name).
const DNS_LABEL_MAX: usize = 63;
/// A DNS-1123 subdomain (most objects' names) or a whole DNS name.
const DNS_SUBDOMAIN_MAX: usize = 253;

fn is_dns1123_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= DNS_LABEL_MAX
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
}

fn is_dns1035_label(s: &str) -> bool {
    is_dns1123_label(s) && s.as_bytes()[0].is_ascii_lowercase()
}

/// Kubernetes' `IsDNS1123Subdomain`: the parts are not limited to 63 characters, the whole is.
fn is_dns1123_subdomain(s: &str) -> bool {
    s.len() <= DNS_SUBDOMAIN_MAX
        && s.split('.').all(|part| {
            let b = part.as_bytes();
            !b.is_empty()
                && b.iter()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
                && b[0].is_ascii_alphanumeric()
                && b[b.len() - 1].is_ascii_alphanumeric()
        })
}

/// A name DNS resolves: each part a label of at most 63 characters, at most 253 in all.
fn is_dns_name(s: &str) -> bool {
    s.len() <= DNS_SUBDOMAIN_MAX && s.split('.').all(is_dns1123_label)
}

fn is_label_value(s: &str) -> bool {
    let b = s.as_bytes();
    b.is_empty()
        || (b.len() <= LABEL_VALUE_MAX
            && b.iter()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
            && b[0].is_ascii_alphanumeric()
            && b[b.len() - 1].is_ascii_alphanumeric())
}

fn is_label_key(s: &str) -> bool {
    let (prefix, name) = s.rsplit_once('/').map_or((None, s), |(p, n)| (Some(p), n));
    prefix.is_none_or(is_dns1123_subdomain) && is_label_value(name) && !name.is_empty()
}

/// What a check found wrong, as `what: value (length)`.
#[derive(Default)]
struct Findings {
    checked: usize,
    wrong: Vec<String>,
}

impl Findings {
    fn check(&mut self, what: &str, value: &str, ok: bool) {
        self.checked += 1;
        if !ok {
            self.wrong
                .push(format!("{what}: {value:?} ({} characters)", value.len()));
        }
    }

    /// Every label map in `object` (`labels`, `matchLabels`, a Service's `selector`), keys and values.
    fn labels_in(&mut self, path: &str, object: &Value) {
        match object {
            Value::Object(map) => {
                for (key, value) in map {
                    let here = format!("{path}.{key}");
                    let is_labels = matches!(key.as_str(), "labels" | "matchLabels")
                        || (key == "selector" && path.ends_with("Service.spec"));
                    if let (true, Value::Object(labels)) = (is_labels, value) {
                        for (k, v) in labels {
                            self.check(&format!("{here} key"), k, is_label_key(k));
                            let v = v.as_str().unwrap_or_default();
                            self.check(&format!("{here}[{k}]"), v, is_label_value(v));
                        }
                    } else {
                        self.labels_in(&here, value);
                    }
                }
            }
            Value::Array(items) => {
                for (i, item) in items.iter().enumerate() {
                    self.labels_in(&format!("{path}[{i}]"), item);
                }
            }
            _ => {}
        }
    }

    /// An object the operator applies: its name against its kind's rule, and its labels.
    fn object(&mut self, kind: &str, object: &Value) {
        let name = object["metadata"]["name"].as_str().unwrap_or_default();
        let ok = match kind {
            // Service names are DNS-1035 labels.
            "Service" => is_dns1035_label(name),
            _ => is_dns1123_subdomain(name),
        };
        self.check(&format!("{kind} name"), name, ok);
        self.labels_in(kind, object);
    }
}

/// The sample with every feature, named `name` in the longest namespace, at the largest size.
fn instance_of(name: &str, workload: Workload) -> Memcached {
    let text = std::fs::read_to_string(format!("{}/{SAMPLE}", env!("CARGO_MANIFEST_DIR")))
        .expect("the all-features sample");
    let mut mc: Memcached = serde_saphyr::from_str(&text).expect("the sample is a Memcached");
    mc.metadata.name = Some(name.to_owned());
    mc.metadata.namespace = Some("n".repeat(NAMESPACE_LEN));
    mc.metadata.uid = Some("0b5a1d6e-7c1f-4c55-9d7e-3a2f1b0c9d8e".to_owned());
    mc.spec.size = MAX_SIZE;
    mc.spec.workload = workload;
    if let Some(autoscaling) = mc.spec.autoscaling.as_mut() {
        autoscaling.max_size = MAX_SIZE;
    }
    mc
}

/// Each kind of the table, as the reconcile builds it after the workload.
struct Built<'a> {
    instance: &'a Instance<'a>,
    objects: Vec<(&'static str, Value)>,
}

impl EachKind for Built<'_> {
    fn kind<K: ChildKind>(&mut self) {
        for (name, object) in K::desired(self.instance) {
            let object = json(&object);
            assert!(
                object.is_null() || object["metadata"]["name"] == name.as_str(),
                "{} {name}: the table's name is the object's",
                K::KIND
            );
            if !object.is_null() {
                self.objects.push((K::KIND, object));
            }
        }
    }
}

/// Everything named after `mc`: what the operator applies, and what the workload's controller makes.
fn findings(mc: &Memcached) -> Findings {
    let defaults = Defaults::default();
    let instance = Instance::new(mc, &defaults).expect("the longest admitted name is valid");
    let name = instance.name;
    let mut found = Findings::default();
    let mut built = Built {
        instance: &instance,
        objects: Vec::new(),
    };
    each_kind(&mut built);
    let mut objects = built.objects;
    let kinds: Vec<&str> = objects.iter().map(|(k, _)| *k).collect();
    for expected in [
        "Service",
        "PodDisruptionBudget",
        "NetworkPolicy",
        "HorizontalPodAutoscaler",
    ] {
        assert!(kinds.contains(&expected), "the sample builds a {expected}");
    }
    let servers: Vec<Server> = (0..MAX_SIZE)
        .map(|slot| Server {
            slot,
            pod: Some(format!("{name}-{slot}")),
            address: Some(servers::stable_address(&instance, slot)),
            ready: true,
        })
        .collect();
    objects.push(("ConfigMap", json(&servers::config_map(&instance, &servers))));
    objects.push((
        "ServiceMonitor",
        json(&service_monitor::service_monitor(&instance).expect("the sample monitors")),
    ));
    let hash = Some("0123456789abcdef");
    match mc.spec.workload {
        Workload::Deployment => {
            objects.push((
                "Deployment",
                json(&deployment::deployment(&instance, MAX_SIZE, hash)),
            ));
            // The Deployment controller's: ReplicaSets `<name>-<pod-template-hash>` (up to 10
            // characters), whose pods are `<replicaset>-<5 characters>` (the API server shortens the
            // base of a generated name as needed), labelled with the hash alone.
            let replica_set = format!("{name}-{}", "x".repeat(10));
            found.check(
                "ReplicaSet name",
                &replica_set,
                is_dns1123_subdomain(&replica_set),
            );
            let pod = format!("{replica_set}-xxxxx");
            found.check("Deployment pod name", &pod, is_dns1123_subdomain(&pod));
        }
        Workload::StatefulSet => {
            let sts = statefulset::statefulset(&instance, MAX_SIZE, hash, 0);
            let template = sts.spec.as_ref().expect("a spec").template.clone();
            objects.push(("StatefulSet", json(&sts)));
            // The warm handover's spare server, `<name>-handover`.
            objects.push(("Pod", json(&spare::spare(&instance, &template))));
            // The StatefulSet controller's: the revision label and ControllerRevision `<name>-<hash>`.
            let revision = format!("{name}-{}", "x".repeat(REVISION_HASH_LEN));
            found.check(
                "pod label controller-revision-hash",
                &revision,
                is_label_value(&revision),
            );
            found.check(
                "ControllerRevision name",
                &revision,
                is_dns1123_subdomain(&revision),
            );
            // Pods `<name>-<ordinal>`, which are also their hostnames and the
            // `statefulset.kubernetes.io/pod-name` label.
            for ordinal in [0, MAX_SIZE - 1] {
                let pod = format!("{name}-{ordinal}");
                found.check(
                    "StatefulSet pod name (hostname)",
                    &pod,
                    is_dns1123_label(&pod),
                );
                found.check(
                    "pod label statefulset.kubernetes.io/pod-name",
                    &pod,
                    is_label_value(&pod),
                );
            }
        }
    }
    for (kind, object) in &objects {
        found.object(kind, object);
    }
    // The server list's addresses: DNS names (each part a DNS label, at most 253 in all).
    for server in &servers {
        let address = server.address.as_deref().unwrap_or_default();
        let host = address.rsplit_once(':').map_or(address, |(h, _)| h);
        found.check("server address", host, is_dns_name(host));
    }
    found
}

/// A child as JSON.
fn json<T: serde::Serialize>(object: &T) -> Value {
    serde_json::to_value(object).expect("a child serialises")
}

#[test]
fn every_generated_name_and_label_fits_for_the_longest_admitted_name_of_each_workload() {
    assert_eq!(max_name_len(Workload::Deployment), MAX_NAME_LEN);
    assert_eq!(
        max_name_len(Workload::StatefulSet),
        MAX_STATEFULSET_NAME_LEN
    );
    for workload in [Workload::Deployment, Workload::StatefulSet] {
        let longest = format!("m{}", "0".repeat(max_name_len(workload) - 1));
        let mc = instance_of(&longest, workload);
        let found = findings(&mc);
        assert!(
            found.wrong.is_empty(),
            "{} instance {longest:?} ({} characters): {} of {} names and labels break their limit:\n{}",
            workload.as_str(),
            longest.len(),
            found.wrong.len(),
            found.checked,
            found.wrong.join("\n")
        );
        assert!(found.checked > 40, "{}", found.checked);
        eprintln!(
            "{}: {} names and labels fit for a {}-character name",
            workload.as_str(),
            found.checked,
            longest.len()
        );

        // One character more is refused, by the operator as by the CRD's rules (tests/manifests.rs).
        let too_long = format!("{longest}0");
        let err = Instance::new(&instance_of(&too_long, workload), &Defaults::default())
            .expect_err("one character more is refused");
        assert_eq!(err.reason, "InvalidName", "{}", err.message);
    }
}

/// What the StatefulSet limit guards against: one character more and the revision label is longer than a
/// label value may be, however short the hash.
#[test]
fn a_statefulset_name_one_longer_breaks_the_revision_label() {
    let revision = |len: usize| format!("{}-{}", "m".repeat(len), "x".repeat(REVISION_HASH_LEN));
    assert!(is_label_value(&revision(MAX_STATEFULSET_NAME_LEN)));
    assert!(!is_label_value(&revision(MAX_STATEFULSET_NAME_LEN + 1)));
    assert!(!is_label_value(&revision(MAX_NAME_LEN)));
}
