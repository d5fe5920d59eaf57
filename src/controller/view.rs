//! What one reconcile reads of one instance, once: the instance as its cache holds it now, its pods, the
//! hash of the Secrets it names, and where each of its children is read from (the child caches, or the
//! answer to this operator's own newer write, and the objects of the same names it does not manage).
//! Reading it is the reconcile's first step; what stops it there (a workload of the other kind, a
//! missing Secret) is reported as the reconcile's outcome, and nothing is applied.

use std::sync::Arc;

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::runtime::reflector::ObjectRef;

use super::children::{self, Source};
use super::error::Error;
use super::secrets::{self, Resolved};
use crate::api::names::proxy_name;
use crate::api::{Memcached, Workload};
use crate::resources::Instance;
use crate::resources::proxy::identities::{ClientCa, Material, recorded, trust};
use crate::status::{Problem, WorkloadStatus};
use crate::store::compact::Compactable;
use crate::store::{Cache, ChildKind, SecretReader, Stores, Written};

/// What every reconcile reads of its instance first, whether its spec is valid or not: its pods and the
/// state of the workload it runs.
pub(super) struct Reads {
    /// The instance's pods in the cache, decoded once for the whole reconcile.
    pub pods: Vec<Arc<Pod>>,
    /// The workload it runs, as cached (see [`cached_workload`]).
    pub workload: Option<WorkloadStatus>,
}

impl Reads {
    pub fn of(stores: &Stores, mc: &Memcached) -> Self {
        Self {
            pods: pods(stores, mc),
            workload: cached_workload(stores, mc),
        }
    }
}

/// Why a reconcile stops at reading its instance, before anything is applied.
pub(super) enum Stop {
    /// Until something changes (the spec, a Secret): a problem to report, then wait.
    Held(Problem),
    /// A failed read, retried after a backoff.
    Failed(Error),
}

/// The instance being reconciled, its pods, and where its children are read from.
pub(super) struct View<'a> {
    pub instance: &'a Instance<'a>,
    pub mc: &'a Memcached,
    /// The instance's pods in the cache (see [`Reads`]).
    pub pods: &'a [Arc<Pod>],
    /// The hash of the referenced Secrets' content, for the pod template (`None`: none referenced).
    pub secret_hash: Option<String>,
    /// The same for the proxy's pod template (see `Instance::proxy_secret_hash`).
    pub proxy_secret_hash: Option<String>,
    /// With `spec.security.auth`: the user's auth file (see `secrets::serve_auth_file`).
    pub auth_file: Option<secrets::UserFile>,
    /// With `spec.proxy.access`: the client CA the proxy trusts and the trust its Deployment records,
    /// read once for the route (the publish step) and the Deployment (the children).
    pub proxy_access: Option<Arc<Material>>,
    stores: &'a Stores,
    written: &'a Written,
}

impl<'a> View<'a> {
    /// Reads what the reconcile of `instance` needs, or the outcome that stops it before anything is
    /// applied: a workload of the other kind (`spec.workload` changed on a live instance), a Secret or key
    /// that is missing (the Secret watch brings the instance back when it appears), or a failed read.
    /// The children are read from `stores`, or from `written` where it holds a newer answer; the
    /// Secrets' values through `reader`.
    pub async fn read(
        stores: &'a Stores,
        written: &'a Written,
        reader: &SecretReader,
        mc: &'a Memcached,
        instance: &'a Instance<'a>,
        reads: &'a Reads,
    ) -> Result<Self, Stop> {
        if let Some(changed) = workload_changed(stores, instance, mc) {
            return Err(Stop::Held(changed));
        }
        let hashes = match secrets::resolve(reader, instance).await {
            Ok(Resolved::Ready(hashes)) => hashes,
            Ok(Resolved::Missing(missing)) => return Err(Stop::Held(missing.into())),
            Err(error) => return Err(Stop::Failed(error)),
        };
        let mut view = Self {
            instance,
            mc,
            pods: &reads.pods,
            secret_hash: hashes.servers,
            proxy_secret_hash: hashes.proxy,
            auth_file: hashes.auth_file,
            proxy_access: None,
            stores,
            written,
        };
        if let Some(ca) = hashes.client_ca {
            view.proxy_access = Some(Arc::new(view.access(ca).map_err(Stop::Failed)?));
        }
        Ok(view)
    }

    /// With `spec.proxy.access`: the client CA read and the trust to record, from what the live proxy
    /// Deployment records (see `resources::proxy::identities::trust`).
    fn access(&self, ca: ClientCa) -> Result<Material, Error> {
        let instance = self.instance;
        let live =
            children::cached::<Deployment>(instance, &proxy_name(instance.name), &self.source())?;
        let previous = live.as_deref().map(recorded);
        let previous = previous.as_ref().map(|(t, e)| (t.as_str(), e.as_str()));
        let trust = trust(previous, &ca);
        Ok(Material { ca, trust })
    }

    /// Where children of the table's kind `K` are read from.
    pub fn source<K: ChildKind>(&self) -> Source<'a, K> {
        Source {
            store: K::cache(&self.stores.children),
            written: self.written,
            dt: &(),
            foreign: &self.stores.foreign,
        }
    }

    /// Whether the cluster served `K`'s API when the operator started (see `store::kinds::Served`).
    pub fn served<K: crate::store::kinds::ChildKind>(&self) -> bool {
        self.stores.children.served::<K>()
    }
}

/// The instance's pods in the cache.
fn pods(stores: &Stores, mc: &Memcached) -> Vec<Arc<Pod>> {
    let namespace = mc.namespace().unwrap_or_default();
    stores
        .pod_index
        .pods(&stores.pods, &namespace, &mc.name_any())
}

/// The instance as its cache holds it now, or `mc` if the cache no longer holds it (deleted meanwhile: the
/// reconcile goes on from `mc`, as it did before this was asked, and the deletion is handled as it comes).
///
/// The copy a reconcile was started with was read when it was queued, and may be older than the cache by
/// the time the reconcile asks `written` for the fresher of the two: if the watch has meanwhile brought this
/// operator's own status write, `written` has dropped its kept answer (the cache caught up), and the old
/// copy, without that status, would be taken for the latest and the same status written again. The
/// cache's current copy closes that window.
pub(super) fn latest(stores: &Stores, mc: Arc<Memcached>) -> Arc<Memcached> {
    stores
        .memcacheds
        .get(&ObjectRef::from_obj(mc.as_ref()))
        .unwrap_or(mc)
}

/// The instance's child of kind `K` in the cache; none when there is none, or it cannot be read (the
/// reconcile's own read of it reports that).
fn cached<K: Compactable<DynamicType = ()>>(store: &Cache<K>, mc: &Memcached) -> Option<Arc<K>> {
    let namespace = mc.namespace().unwrap_or_default();
    store.get(&namespace, &mc.name_any()).ok().flatten()
}

/// The cached workload the instance runs: of the kind `spec.workload` names, or else of the other kind
/// (after a refused workload change the old one still runs and is what the status should describe).
fn cached_workload(stores: &Stores, mc: &Memcached) -> Option<WorkloadStatus> {
    let deployment =
        || cached(&stores.children.deployments, mc).map(|d| WorkloadStatus::from(d.as_ref()));
    let statefulset =
        || cached(&stores.children.statefulsets, mc).map(|s| WorkloadStatus::from(s.as_ref()));
    match mc.spec.workload {
        Workload::Deployment => deployment().or_else(statefulset),
        Workload::StatefulSet => statefulset().or_else(deployment),
    }
}

/// The instance's proxy Deployment (`<name>-proxy`): the newer of its cached copy and the answer to this
/// operator's last write of it (`written`); none when there is none, or it cannot be read.
pub(super) fn proxy_workload(
    stores: &Stores,
    written: &Written,
    mc: &Memcached,
) -> Option<WorkloadStatus> {
    let namespace = mc.namespace().unwrap_or_default();
    let name = proxy_name(&mc.name_any());
    let cached = (stores.children.deployments)
        .get(&namespace, &name)
        .ok()
        .flatten();
    let fresher = written.fresher(&namespace, &name, &(), cached);
    fresher
        .object
        .map(|d: Arc<Deployment>| WorkloadStatus::from(d.as_ref()))
}

/// A workload of the other kind that this instance controls: `spec.workload` was changed on a live
/// instance (possible where the API server does not run the CEL rule). Nothing is applied then.
fn workload_changed(stores: &Stores, instance: &Instance<'_>, mc: &Memcached) -> Option<Problem> {
    let ours = |owners: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference]| {
        owners
            .iter()
            .any(|o| o.controller == Some(true) && o.uid == instance.uid())
    };
    let (existing, other) = match instance.spec.workload {
        Workload::Deployment => (
            cached::<StatefulSet>(&stores.children.statefulsets, mc)
                .is_some_and(|s| ours(s.owner_references())),
            Workload::StatefulSet,
        ),
        Workload::StatefulSet => (
            cached::<Deployment>(&stores.children.deployments, mc)
                .is_some_and(|d| ours(d.owner_references())),
            Workload::Deployment,
        ),
    };
    existing.then(|| Problem {
        reason: "WorkloadChanged".into(),
        message: format!(
            "spec.workload is {} but this instance runs a {} {}; the workload cannot change on a live \
             instance: set spec.workload back to {}, or create a new instance with the other workload and \
             move clients to it",
            instance.spec.workload.as_str(),
            other.as_str(),
            instance.name,
            other.as_str()
        ),
    })
}
