//! Watched objects in compact form: the metadata read on every event as a struct (identity and version
//! for the watch and read-your-writes, owner references for the owner mapping, and for pods the labels
//! and annotations the pod index and the trim read) and everything else as the JSON text the API server
//! sent, packed, decoded only when a reconcile reads the object. `managedFields` are not kept at all: the
//! operator never reads them. The caches keep the struct packed too (see [`cache`](super::cache)).
//!
//! A k8s-openapi struct is sized for every field its kind could have: a `Deployment` takes 2.4 kB before
//! any of its content (each container 2.1 kB more, a pod 2.2 kB even with its spec dropped), plus a heap
//! allocation per string and map node. Its JSON text is a third to a quarter of that. The caches hold
//! one object per child, several per instance, for as long as the operator runs, while a reconcile reads
//! only one instance's children, once: the decoding a read costs (microseconds) is paid where it is
//! needed, the memory saved is every instance's, all the time.
//!
//! The text is kept LZ4-packed against a dictionary of its kind: the text of the first object of that
//! kind this process packed. Objects of one kind written by one operator share nearly all of their text
//! (keys, labels, the pod template, probes), so what is left of each is mostly its names and versions: a
//! 2.8 kB Deployment packs into under 200 bytes, where LZ4 alone leaves 1.6 kB and deflate 1.1 kB (the
//! `make bench` objects). Packing and unpacking take microseconds.

use std::any::TypeId;
use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt;
use std::marker::PhantomData;
use std::sync::{Arc, LazyLock, Mutex};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use serde::de::{DeserializeOwned, IgnoredAny, MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{Map, Value};

use crate::api::Memcached;
use crate::resources::servers::DELETION_COST_ANNOTATION;

/// A kind the caches keep compact, and which of its top-level fields they never need.
pub trait Compactable: Resource + Clone + Serialize + DeserializeOwned + 'static {
    /// Top-level fields (besides `apiVersion`, `kind` and `metadata`) left out of the cached copy.
    const UNREAD: &'static [&'static str] = &[];
    /// Whether labels and annotations stay in the struct (read on every event) instead of the text.
    const LABELS_IN_META: bool = false;
    /// Drops from the metadata kept in the struct what the operator never reads of this kind.
    fn trim(_metadata: &mut ObjectMeta) {}
    /// Drops from the rest of the metadata (kept in the text) what the operator never reads of this kind.
    fn trim_rest(_metadata: &mut ObjectMeta) {}
}

/// Instances are kept compact only as answers to this operator's own writes (read-your-writes); the
/// controller's cache holds them whole, trimmed by the same rule ([`trim_instance`]): their
/// annotations go (`kubectl apply` keeps a copy of the whole object in one).
impl Compactable for Memcached {
    fn trim_rest(metadata: &mut ObjectMeta) {
        metadata.annotations = None;
    }
}
/// A pod's spec is the largest part of it and is never read: slots, status and stats read its metadata
/// and status. Of its annotations only the drained pod-deletion cost is read (it tells whether a drained
/// pod is marked yet).
impl Compactable for Pod {
    const UNREAD: &'static [&'static str] = &["spec"];
    const LABELS_IN_META: bool = true;

    fn trim(metadata: &mut ObjectMeta) {
        metadata.annotations = metadata
            .annotations
            .take()
            .map(|mut annotations| {
                annotations.retain(|key, _| key == DELETION_COST_ANNOTATION);
                annotations
            })
            .filter(|annotations| !annotations.is_empty());
    }
}

/// One cached object: the metadata its cache reads, and the rest of it as compact JSON text.
pub struct Compact<K> {
    /// Name, namespace, resourceVersion and owner references (and for [`Compactable::LABELS_IN_META`]
    /// kinds labels and annotations); the rest of the metadata is in `body`. The uid is in the text: nothing
    /// reads a child's uid on its events.
    metadata: ObjectMeta,
    /// A JSON object of every top-level field but `metadata`, `apiVersion`, `kind` and the unread ones,
    /// packed.
    body: Packed,
    kind: PhantomData<fn() -> K>,
}

impl<K> Clone for Compact<K> {
    fn clone(&self) -> Self {
        Self {
            metadata: self.metadata.clone(),
            body: self.body.clone(),
            kind: PhantomData,
        }
    }
}

impl<K> fmt::Debug for Compact<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Compact")
            .field("metadata", &self.metadata)
            .field("body", &self.body)
            .finish()
    }
}

/// JSON text, LZ4-packed (its length first) against the dictionary it names. Each packed text holds its
/// own reference to its dictionary, so it unpacks whatever dictionary later texts of its kind get.
#[derive(Clone)]
struct Packed {
    dictionary: Arc<[u8]>,
    bytes: Box<[u8]>,
}

/// The longest dictionary: the texts the caches keep are a few kB; a larger first object is only
/// partly useful as one.
const MAX_DICTIONARY: usize = 16 * 1024;

/// Per kind (the compact type), the dictionary its texts are packed against.
static DICTIONARIES: LazyLock<Mutex<HashMap<TypeId, Arc<[u8]>>>> = LazyLock::new(Default::default);

impl Packed {
    /// Packs `text`, an object of kind `K`, against its kind's dictionary; the first text of a kind
    /// becomes the dictionary.
    fn pack<K: 'static>(text: &[u8]) -> Self {
        let dictionary = DICTIONARIES
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(TypeId::of::<K>())
            .or_insert_with(|| Arc::from(&text[..text.len().min(MAX_DICTIONARY)]))
            .clone();
        let bytes = lz4_flex::block::compress_prepend_size_with_dict(text, &dictionary);
        Self {
            dictionary,
            bytes: bytes.into_boxed_slice(),
        }
    }

    /// The text. Fails only on bytes that `pack` did not produce.
    fn unpack(&self) -> Result<Vec<u8>, lz4_flex::block::DecompressError> {
        lz4_flex::block::decompress_size_prepended_with_dict(&self.bytes, &self.dictionary)
    }
}

impl fmt::Debug for Packed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.unpack() {
            Ok(text) => write!(f, "{}", String::from_utf8_lossy(&text)),
            Err(error) => write!(
                f,
                "<{} bytes that do not unpack: {error}>",
                self.bytes.len()
            ),
        }
    }
}

impl<K: Compactable> Compact<K> {
    /// The object as its own type (without `managedFields`). Fails only on text that did not come from an
    /// object of this kind.
    pub fn decode(&self) -> Result<K, serde_json::Error> {
        decode(self.metadata.clone(), &self.body)
    }

    /// The compact copy of `object` (what the watch would have cached of it).
    pub fn encode(object: &K) -> Result<Self, serde_json::Error> {
        let Value::Object(mut fields) = serde_json::to_value(object)? else {
            return Err(serde::ser::Error::custom("not a JSON object"));
        };
        let metadata = match fields.remove("metadata") {
            Some(metadata) => serde_json::from_value(metadata)?,
            None => ObjectMeta::default(),
        };
        fields.retain(|key, _| kept::<K>(key));
        split::<K>(metadata, fields).map_err(serde::ser::Error::custom)
    }
}

/// The object of the metadata a compact object `kept` in its struct and its packed `body`.
fn decode<K: Compactable>(kept: ObjectMeta, body: &Packed) -> Result<K, serde_json::Error> {
    let mut object: K = unpacked(body)?;
    let meta = object.meta_mut();
    meta.name = kept.name;
    meta.namespace = kept.namespace;
    meta.resource_version = kept.resource_version;
    meta.owner_references = kept.owner_references;
    if K::LABELS_IN_META {
        meta.labels = kept.labels;
        meta.annotations = kept.annotations;
    }
    Ok(object)
}

/// The value of a packed JSON text.
fn unpacked<T: DeserializeOwned>(packed: &Packed) -> Result<T, serde_json::Error> {
    let text = packed.unpack().map_err(serde::de::Error::custom)?;
    // Read as a `str`, as kube reads its answers: `from_slice` would build every kind's deserializer a
    // second time for another reader (400 kB more code).
    let text = std::str::from_utf8(&text).map_err(serde::de::Error::custom)?;
    serde_json::from_str(text)
}

/// The compact object of `metadata` and the other kept `fields`: the metadata the cache reads stays in
/// the struct, the rest goes into the text under `metadata`.
fn split<K: Compactable>(
    metadata: ObjectMeta,
    mut fields: Map<String, Value>,
) -> Result<Compact<K>, serde_json::Error> {
    let mut rest = metadata;
    rest.managed_fields = None;
    let mut kept = ObjectMeta {
        name: rest.name.take(),
        namespace: rest.namespace.take(),
        resource_version: rest.resource_version.take(),
        owner_references: rest.owner_references.take(),
        ..ObjectMeta::default()
    };
    if K::LABELS_IN_META {
        kept.labels = rest.labels.take();
        kept.annotations = rest.annotations.take();
    }
    K::trim(&mut kept);
    K::trim_rest(&mut rest);
    if rest != ObjectMeta::default() {
        fields.insert("metadata".to_owned(), serde_json::to_value(rest)?);
    }
    Ok(Compact {
        metadata: kept,
        body: Packed::pack::<Compact<K>>(&serde_json::to_vec(&Value::Object(fields))?),
        kind: PhantomData,
    })
}

/// Whether the cached copy keeps top-level field `key`.
fn kept<K: Compactable>(key: &str) -> bool {
    match key {
        // Every kind cached knows its own type.
        "metadata" | "apiVersion" | "kind" => false,
        _ => !K::UNREAD.contains(&key),
    }
}

impl<K: Resource> Resource for Compact<K> {
    type DynamicType = K::DynamicType;
    type Scope = K::Scope;

    fn kind(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::kind(dt)
    }
    fn group(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::group(dt)
    }
    fn version(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::version(dt)
    }
    fn api_version(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::api_version(dt)
    }
    fn plural(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::plural(dt)
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// Reads an object field by field: `metadata` into its struct, the kept fields into the body, the others
/// skipped without building anything. Works with any self-describing format, not only serde_json's own
/// reader (a watch event whose `object` comes before its `type` is read through serde's buffer).
impl<'de, K: Compactable> Deserialize<'de> for Compact<K> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Fields<K>(PhantomData<fn() -> K>);

        impl<'de, K: Compactable> Visitor<'de> for Fields<K> {
            type Value = Compact<K>;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "a Kubernetes object")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut metadata = None;
                let mut fields = Map::new();
                while let Some(key) = map.next_key::<Cow<'de, str>>()? {
                    if key == "metadata" {
                        metadata = Some(map.next_value::<ObjectMeta>()?);
                    } else if kept::<K>(&key) {
                        fields.insert(key.into_owned(), map.next_value::<Value>()?);
                    } else {
                        map.next_value::<IgnoredAny>()?;
                    }
                }
                split(metadata.unwrap_or_default(), fields).map_err(serde::de::Error::custom)
            }
        }

        deserializer.deserialize_map(Fields(PhantomData))
    }
}

/// A compact object as a cache keeps it: everything packed, the metadata kept in its struct too (against
/// a dictionary of its own), so that nothing of the 360-byte `ObjectMeta` stays in memory.
pub(super) struct Stored {
    metadata: Packed,
    body: Packed,
}

/// Marks the dictionary of the metadata of kind `K` (see [`Stored`]).
struct MetadataOf<K>(PhantomData<fn() -> K>);

impl Stored {
    pub(super) fn new<K: Compactable>(compact: &Compact<K>) -> Result<Self, serde_json::Error> {
        Ok(Self {
            metadata: Packed::pack::<MetadataOf<K>>(&serde_json::to_vec(&compact.metadata)?),
            body: compact.body.clone(),
        })
    }

    /// The object as its own type. Fails only on text that did not come from an object of kind `K`.
    pub(super) fn decode<K: Compactable>(&self) -> Result<K, serde_json::Error> {
        decode(unpacked(&self.metadata)?, &self.body)
    }

    /// Bytes this object holds on the heap: its two packed texts (the dictionaries are shared per kind).
    pub(super) fn heap_bytes(&self) -> usize {
        self.metadata.bytes.len() + self.body.bytes.len()
    }
}

/// Keeps of an instance everything but its annotations, which the operator never reads, and which
/// hold the whole object again when it was created with `kubectl apply` (`last-applied-configuration`).
pub fn trim_instance(mc: &mut Memcached) {
    mc.metadata.managed_fields = None;
    // The same rule as for the compact answers to this operator's own writes.
    <Memcached as Compactable>::trim_rest(&mut mc.metadata);
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::apps::v1::Deployment;
    use k8s_openapi::api::core::v1::Service;
    use serde_json::json;

    fn text<K>(compact: &Compact<K>) -> String {
        String::from_utf8(compact.body.unpack().unwrap()).unwrap()
    }

    fn deployment() -> Value {
        json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "cache", "namespace": "ns", "resourceVersion": "7",
                         "labels": {"app.kubernetes.io/instance": "cache"}},
            "spec": {"replicas": 2, "selector": {"matchLabels": {"a": "b"}},
                     "template": {"spec": {"containers": [{"name": "memcached", "image": "memcached:1.6"}]}}},
            "status": {"readyReplicas": 1}
        })
    }

    #[test]
    fn a_compact_object_decodes_to_the_object_it_was_read_from() {
        let compact: Compact<Deployment> = serde_json::from_value(deployment()).unwrap();
        let whole: Deployment = serde_json::from_value(deployment()).unwrap();
        assert_eq!(compact.decode().unwrap(), whole);
        assert_eq!(compact.meta().name.as_deref(), Some("cache"));
        let body = text(&compact);
        assert!(
            !body.contains("apiVersion") && !body.contains("\"name\":\"cache\""),
            "type and metadata are not kept twice: {body}"
        );
        let encoded = Compact::encode(&whole).unwrap();
        assert_eq!(encoded.decode().unwrap(), whole);
        assert_eq!(text(&encoded), body);
    }

    #[test]
    fn the_cache_reads_identity_and_owners_from_the_struct_and_nothing_keeps_managed_fields() {
        let mut object = deployment();
        object["metadata"]["ownerReferences"] = json!([{"apiVersion": "cache.example.com/v1alpha1", "kind": "Memcached", "name": "cache",
                    "uid": "u1", "controller": true}]);
        object["metadata"]["managedFields"] = json!([{"manager": "memcached-operator"}]);
        object["metadata"]["annotations"] = json!({"cache.example.com/desired-hash": "abc"});
        let compact: Compact<Deployment> = serde_json::from_value(object).unwrap();
        let meta = compact.meta();
        assert_eq!(
            (meta.namespace.as_deref(), meta.resource_version.as_deref()),
            (Some("ns"), Some("7"))
        );
        assert_eq!(meta.owner_references.as_ref().map(Vec::len), Some(1));
        assert!(meta.labels.is_none() && meta.annotations.is_none());
        assert!(!text(&compact).contains("manager"), "{compact:?}");
        let decoded = compact.decode().unwrap();
        assert!(decoded.metadata.managed_fields.is_none());
        assert_eq!(
            decoded.metadata.annotations.unwrap()["cache.example.com/desired-hash"],
            "abc"
        );
        assert_eq!(decoded.metadata.owner_references.unwrap()[0].uid, "u1");
        assert_eq!(
            decoded.metadata.labels.unwrap()["app.kubernetes.io/instance"],
            "cache"
        );
    }

    #[test]
    fn a_pods_spec_is_not_kept() {
        let pod = json!({
            "metadata": {"name": "cache-x", "namespace": "ns"},
            "spec": {"containers": [{"name": "memcached", "image": "memcached:1.6"}]},
            "status": {"podIP": "10.0.0.1", "phase": "Running"}
        });
        let compact: Compact<Pod> = serde_json::from_value(pod.clone()).unwrap();
        let decoded = compact.decode().unwrap();
        assert!(decoded.spec.is_none());
        assert_eq!(
            decoded.status.and_then(|s| s.pod_ip).as_deref(),
            Some("10.0.0.1")
        );
        let encoded = Compact::<Pod>::encode(&serde_json::from_value(pod).unwrap()).unwrap();
        assert!(encoded.decode().unwrap().spec.is_none());
    }

    #[test]
    fn of_a_pods_annotations_only_the_drain_mark_is_kept() {
        let marked: Compact<Pod> = serde_json::from_value(json!({
            "metadata": {"name": "p", "annotations": {"a": "b", DELETION_COST_ANNOTATION: "-1000"}}
        }))
        .unwrap();
        assert_eq!(
            marked.meta().annotations,
            Some([(DELETION_COST_ANNOTATION.to_owned(), "-1000".to_owned())].into()),
            "the drain mark stays, nothing else"
        );
        let pod: Compact<Pod> = serde_json::from_value(json!({
            "metadata": {"name": "p", "annotations": {"a": "b"}, "managedFields": [{"manager": "kubelet"}]},
            "spec": {"containers": [{"name": "memcached"}]},
            "status": {"phase": "Running"}
        }))
        .unwrap();
        let pod = pod.decode().unwrap();
        assert!(
            pod.spec.is_none()
                && pod.metadata.annotations.is_none()
                && pod.metadata.managed_fields.is_none()
        );
        assert_eq!(pod.status.unwrap().phase.as_deref(), Some("Running"));
    }

    #[test]
    fn a_watch_event_with_its_object_first_is_read_too() {
        // serde buffers the object of an adjacently tagged enum whose tag comes second.
        let event = json!({"object": deployment(), "type": "ADDED"}).to_string();
        let event: kube::api::WatchEvent<Compact<Deployment>> =
            serde_json::from_str(&event).unwrap();
        let kube::api::WatchEvent::Added(compact) = event else {
            panic!("not an ADDED event")
        };
        assert_eq!(
            compact.decode().unwrap().status.unwrap().ready_replicas,
            Some(1)
        );
    }

    #[test]
    fn a_compact_deployment_is_several_times_smaller_than_the_struct() {
        let compact: Compact<Deployment> = serde_json::from_value(deployment()).unwrap();
        let body = text(&compact).len();
        assert!(
            body * 4 < std::mem::size_of::<Deployment>(),
            "{body} bytes of text against a {}-byte struct",
            std::mem::size_of::<Deployment>()
        );
    }

    #[test]
    fn objects_of_a_kind_pack_against_the_first_ones_text() {
        let first: Compact<Deployment> = serde_json::from_value(deployment()).unwrap();
        let mut other = deployment();
        other["metadata"]["name"] = json!("other");
        other["spec"]["replicas"] = json!(3);
        other["status"]["readyReplicas"] = json!(3);
        let other: Compact<Deployment> = serde_json::from_value(other).unwrap();
        assert!(Arc::ptr_eq(&first.body.dictionary, &other.body.dictionary));
        let (packed, body) = (other.body.bytes.len(), text(&other).len());
        assert!(
            packed * 3 < body,
            "{body} bytes of text packed into {packed}"
        );
        assert_eq!(other.decode().unwrap().spec.unwrap().replicas, Some(3));
        assert_eq!(first.decode().unwrap().spec.unwrap().replicas, Some(2));
    }

    #[test]
    fn each_kind_has_its_own_dictionary_and_a_text_unlike_it_still_round_trips() {
        let deployment: Compact<Deployment> = serde_json::from_value(deployment()).unwrap();
        let service = json!({"metadata": {"name": "cache", "namespace": "ns"},
                             "spec": {"ports": [{"port": 11211}], "clusterIP": "None"}});
        let service: Compact<Service> = serde_json::from_value(service).unwrap();
        assert!(!Arc::ptr_eq(
            &deployment.body.dictionary,
            &service.body.dictionary
        ));
        let odd =
            json!({"metadata": {"name": "odd"}, "spec": {"paused": true, "minReadySeconds": 7}});
        let odd: Compact<Deployment> = serde_json::from_value(odd).unwrap();
        let spec = odd.decode().unwrap().spec.unwrap();
        assert_eq!((spec.paused, spec.min_ready_seconds), (Some(true), Some(7)));
    }
}
