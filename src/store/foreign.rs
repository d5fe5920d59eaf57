//! Objects that have a child's name but are not the operator's.
//!
//! The child caches hold only what carries the operator's `managed-by` label, so they cannot tell a child
//! that does not exist yet from an unrelated object that happens to have its name (a Deployment someone
//! created by hand, a `<name>-servers` ConfigMap of another tool). A server-side apply of a name that
//! exists changes that object, and the owner reference it adds makes garbage collection delete it with the
//! instance. Kubernetes has no create-only apply (kubernetes/kubernetes#116156), so the operator watches,
//! metadata only, the objects of each child kind that do *not* carry its label, and refuses to write a
//! child whose name one of them holds (`OwnershipConflict`). A foreign object that appears, changes or goes
//! away brings the instance of that name back to its reconcile.
//!
//! An object whose controller is the instance itself is not foreign: it is the instance's child with
//! its label taken off, and applying it puts the label back.
//!
//! Kept per object: its name and namespace, its controller owner reference, and the `managed-by` label (an
//! API server without label selectors, like the project's fakes, lists the operator's own children here
//! too, and those are not foreign). Everything else is dropped as it arrives.

use std::sync::Arc;

use futures::future::BoxFuture;
use futures::{FutureExt, Stream, StreamExt};
use kube::Resource;
use kube::api::PartialObjectMeta;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use serde::de::DeserializeOwned;

use crate::api::Memcached;
use crate::api::names::{CONFIG_MAP_SUFFIX, HEADLESS_SUFFIX};
use crate::resources::labels::{MANAGED_BY_KEY, MANAGER_NAME};

/// The label selector of the foreign watches: objects without the operator's `managed-by` label (a
/// selector `key!=value` also matches objects that lack the key).
pub fn unmanaged_selector() -> String {
    format!("{MANAGED_BY_KEY}!={MANAGER_NAME}")
}

/// The foreign objects of each watched kind. Cheap to clone; empty (nothing foreign, always ready) by
/// default, as in tests that do not watch.
#[derive(Clone, Default)]
pub struct Foreign {
    kinds: Arc<Vec<Watched>>,
}

struct Watched {
    kind: String,
    lookup: Box<dyn Lookup>,
}

/// One kind's store, behind its object type.
trait Lookup: Send + Sync {
    fn holds(&self, namespace: &str, name: &str, owner_uid: &str) -> bool;
    fn ready(&self) -> BoxFuture<'static, bool>;
}

impl<K> Lookup for Store<PartialObjectMeta<K>>
where
    K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
{
    fn holds(&self, namespace: &str, name: &str, owner_uid: &str) -> bool {
        self.get(&ObjectRef::new(name).within(namespace))
            .is_some_and(|object| is_foreign(object.as_ref(), owner_uid))
    }

    fn ready(&self) -> BoxFuture<'static, bool> {
        let store = self.clone();
        async move { store.wait_until_ready().await.is_ok() }.boxed()
    }
}

impl Foreign {
    /// Whether an object of `kind` named `name` in `namespace` exists that the operator does not manage
    /// and whose controller is not the instance of uid `owner_uid`.
    pub fn holds(&self, kind: &str, namespace: &str, name: &str, owner_uid: &str) -> bool {
        self.kinds
            .iter()
            .any(|watched| watched.kind == kind && watched.lookup.holds(namespace, name, owner_uid))
    }

    /// Resolves to `true` once every foreign watch has its initial list (a reconcile before that could
    /// take a foreign object for a missing child), `false` if one ends first.
    pub fn ready(&self) -> BoxFuture<'static, bool> {
        let waits: Vec<_> = self.kinds.iter().map(|w| w.lookup.ready()).collect();
        async move {
            futures::future::join_all(waits)
                .await
                .into_iter()
                .all(|ready| ready)
        }
        .boxed()
    }
}

/// Builds [`Foreign`] one kind at a time; each kind's watch is a stream the caller drives.
#[derive(Default)]
pub struct Builder {
    kinds: Vec<Watched>,
}

impl Builder {
    /// Keeps the foreign objects of `K` that `events` brings: a watch of `K` by metadata with the
    /// [`unmanaged_selector`], retried by the wiring. The stream it returns names the instances whose
    /// children have the name of an object that came, changed or went, among `instances`.
    pub fn watch<K, S>(
        &mut self,
        events: S,
        instances: Store<Memcached>,
    ) -> impl Stream<Item = ObjectRef<Memcached>> + Send + 'static + use<K, S>
    where
        K: Resource<DynamicType = ()>
            + Clone
            + DeserializeOwned
            + std::fmt::Debug
            + Send
            + Sync
            + 'static,
        S: Stream<Item = watcher::Result<watcher::Event<PartialObjectMeta<K>>>> + Send + 'static,
    {
        let writer = self.store::<K>();
        events
            .modify(trim)
            .reflect(writer)
            .touched_objects()
            .filter_map(|object| async move { object.ok() })
            .flat_map(move |object| futures::stream::iter(claimed_by(&instances, &object)))
    }

    /// Adds a store for the foreign objects of `K`, filled through the writer it returns: by
    /// [`Self::watch`], or directly by a test. Objects given to it should be trimmed as a watch would.
    pub fn store<K>(&mut self) -> reflector::store::Writer<PartialObjectMeta<K>>
    where
        K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
    {
        let writer = reflector::store::Writer::<PartialObjectMeta<K>>::new(());
        self.kinds.push(Watched {
            kind: K::kind(&()).into_owned(),
            lookup: Box::new(writer.as_reader()),
        });
        writer
    }

    pub fn build(self) -> Foreign {
        Foreign {
            kinds: Arc::new(self.kinds),
        }
    }
}

/// Keeps of a foreign object its name, namespace, controller owner reference and `managed-by` label.
fn trim<K>(object: &mut PartialObjectMeta<K>) {
    let meta = &mut object.metadata;
    let managed_by = meta.labels.as_mut().and_then(|l| l.remove(MANAGED_BY_KEY));
    let controller = meta
        .owner_references
        .take()
        .unwrap_or_default()
        .into_iter()
        .find(|owner| owner.controller == Some(true));
    *meta = kube::api::ObjectMeta {
        name: meta.name.take(),
        namespace: meta.namespace.take(),
        labels: managed_by.map(|value| [(MANAGED_BY_KEY.to_owned(), value)].into()),
        owner_references: controller.map(|owner| vec![owner]),
        ..Default::default()
    };
}

/// Whether `object` is foreign to the instance of uid `owner_uid`: not labelled as the operator's, and
/// not controlled by that instance.
fn is_foreign<K>(object: &PartialObjectMeta<K>, owner_uid: &str) -> bool {
    !managed(object) && !controlled_by(object, owner_uid)
}

fn controlled_by<K>(object: &PartialObjectMeta<K>, uid: &str) -> bool {
    object
        .metadata
        .owner_references
        .iter()
        .flatten()
        .any(|owner| owner.controller == Some(true) && owner.uid == uid)
}

fn managed<K>(object: &PartialObjectMeta<K>) -> bool {
    object
        .metadata
        .labels
        .as_ref()
        .and_then(|labels| labels.get(MANAGED_BY_KEY))
        .is_some_and(|value| value == MANAGER_NAME)
}

/// The instances (existing, same namespace) one of whose children would have `object`'s name.
fn claimed_by<K>(
    instances: &Store<Memcached>,
    object: &PartialObjectMeta<K>,
) -> Vec<ObjectRef<Memcached>>
where
    K: Resource<DynamicType = ()>,
{
    if managed(object) {
        return Vec::new();
    }
    let (Some(name), Some(namespace)) = (
        object.metadata.name.as_deref(),
        object.metadata.namespace.as_deref(),
    ) else {
        return Vec::new();
    };
    [
        Some(name),
        name.strip_suffix(CONFIG_MAP_SUFFIX),
        name.strip_suffix(HEADLESS_SUFFIX),
    ]
    .into_iter()
    .flatten()
    .map(|instance| ObjectRef::<Memcached>::new(instance).within(namespace))
    .filter(|instance| instances.get(instance).is_some())
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::apps::v1::Deployment;
    use k8s_openapi::api::core::v1::ConfigMap;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
    use kube::api::{ObjectMeta, PartialObjectMetaExt};

    fn object<K>(name: &str, labels: &[(&str, &str)]) -> PartialObjectMeta<K> {
        ObjectMeta {
            name: Some(name.into()),
            namespace: Some("ns".into()),
            labels: Some(
                labels
                    .iter()
                    .map(|(k, v)| ((*k).into(), (*v).into()))
                    .collect(),
            ),
            annotations: Some([("big".to_owned(), "x".repeat(1000))].into()),
            ..Default::default()
        }
        .into_response_partial()
    }

    fn foreign_of<K>(objects: Vec<PartialObjectMeta<K>>) -> Foreign
    where
        K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
    {
        let mut builder = Builder::default();
        let mut writer = builder.store::<K>();
        writer.apply_watcher_event(&watcher::Event::Init);
        for mut object in objects {
            trim(&mut object);
            writer.apply_watcher_event(&watcher::Event::InitApply(object));
        }
        writer.apply_watcher_event(&watcher::Event::InitDone);
        builder.build()
    }

    #[test]
    fn an_unlabelled_object_is_foreign_for_its_kind_only() {
        let foreign = foreign_of::<Deployment>(vec![object("cache", &[("app", "mine")])]);
        assert!(foreign.holds("Deployment", "ns", "cache", "uid-1"));
        assert!(!foreign.holds("Deployment", "other", "cache", "uid-1"));
        assert!(!foreign.holds("Deployment", "ns", "cache2", "uid-1"));
        assert!(
            !foreign.holds("Service", "ns", "cache", "uid-1"),
            "another kind"
        );
    }

    #[test]
    fn the_operators_own_children_are_not_foreign_even_when_a_server_ignores_the_selector() {
        let foreign = foreign_of::<ConfigMap>(vec![object(
            "cache-servers",
            &[(MANAGED_BY_KEY, MANAGER_NAME), ("other", "x")],
        )]);
        assert!(!foreign.holds("ConfigMap", "ns", "cache-servers", "uid-1"));
    }

    #[test]
    fn another_managers_label_value_is_foreign() {
        let foreign =
            foreign_of::<ConfigMap>(vec![object("cache-servers", &[(MANAGED_BY_KEY, "Helm")])]);
        assert!(foreign.holds("ConfigMap", "ns", "cache-servers", "uid-1"));
    }

    fn owned_by(uid: &str, controller: bool) -> OwnerReference {
        OwnerReference {
            api_version: "cache.example.com/v1alpha1".into(),
            kind: "Memcached".into(),
            name: "cache".into(),
            uid: uid.into(),
            controller: Some(controller),
            block_owner_deletion: None,
        }
    }

    #[test]
    fn a_child_of_the_instance_whose_label_was_taken_off_is_not_foreign() {
        let mut unlabelled = object::<Deployment>("cache", &[]);
        unlabelled.metadata.owner_references = Some(vec![owned_by("uid-1", true)]);
        let foreign = foreign_of(vec![unlabelled]);
        assert!(!foreign.holds("Deployment", "ns", "cache", "uid-1"));
        assert!(
            foreign.holds("Deployment", "ns", "cache", "uid-2"),
            "another instance of that name (recreated) does not take it"
        );
    }

    #[test]
    fn trimming_keeps_only_name_namespace_controller_and_managed_by() {
        let mut kept = object::<Deployment>("cache", &[(MANAGED_BY_KEY, "Helm"), ("app", "x")]);
        kept.metadata.owner_references =
            Some(vec![owned_by("uid-0", false), owned_by("uid-1", true)]);
        trim(&mut kept);
        assert_eq!(kept.metadata.name.as_deref(), Some("cache"));
        assert_eq!(kept.metadata.namespace.as_deref(), Some("ns"));
        assert_eq!(kept.metadata.labels.as_ref().map(|l| l.len()), Some(1));
        assert!(kept.metadata.annotations.is_none());
        assert_eq!(
            kept.metadata.owner_references,
            Some(vec![owned_by("uid-1", true)])
        );
    }

    #[test]
    fn a_foreign_object_brings_back_the_instance_whose_child_has_its_name() {
        let mut writer = reflector::store::Writer::<Memcached>::new(());
        for name in ["cache", "web"] {
            let mut mc = Memcached::new(name, Default::default());
            mc.metadata.namespace = Some("ns".into());
            writer.apply_watcher_event(&watcher::Event::Apply(mc));
        }
        let instances = writer.as_reader();
        let names = |name: &str| -> Vec<String> {
            claimed_by(&instances, &object::<ConfigMap>(name, &[]))
                .into_iter()
                .map(|r| r.name)
                .collect()
        };
        assert_eq!(names("cache"), ["cache"]);
        assert_eq!(names(&format!("web{CONFIG_MAP_SUFFIX}")), ["web"]);
        assert_eq!(names(&format!("cache{HEADLESS_SUFFIX}")), ["cache"]);
        assert!(names("unrelated").is_empty());
        let ours = object::<ConfigMap>("cache", &[(MANAGED_BY_KEY, MANAGER_NAME)]);
        assert!(claimed_by(&instances, &ours).is_empty());
    }
}
