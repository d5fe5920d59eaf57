//! What one reconcile reads of one instance: the instance as its cache holds it now, its pods (read once
//! per reconcile), and where each of its children is read from (the child caches, or the answer to this
//! operator's own newer write, and the objects of the same names it does not manage).

use std::hash::Hash;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};

use super::Context;
use super::children::Source;
use crate::api::Memcached;
use crate::resources::Instance;
use crate::store::{Cache, ChildKind, Stores, Written};

/// The instance being reconciled, its pods, and where its children are read from.
pub(super) struct View<'a> {
    pub instance: &'a Instance<'a>,
    pub mc: &'a Memcached,
    /// The instance's pods in the cache, decoded once for the whole reconcile.
    pub pods: Vec<Arc<Pod>>,
    stores: &'a Stores,
    written: &'a Written,
}

impl<'a> View<'a> {
    /// Reads the instance's pods from the cache.
    pub fn read(ctx: &'a Context, mc: &'a Memcached, instance: &'a Instance<'a>) -> Self {
        Self {
            instance,
            mc,
            pods: pods(&ctx.stores, mc),
            stores: &ctx.stores,
            written: &ctx.written,
        }
    }

    /// Where children of the table's kind `K` are read from.
    pub fn source<K: ChildKind>(&self) -> Source<'a, K> {
        self.source_of(K::cache(&self.stores.children), &())
    }

    /// Where children kept in `store` are read from (a kind outside the table, such as ServiceMonitors).
    pub fn source_of<'s, K>(&self, store: &'s Cache<K>, dt: &'s K::DynamicType) -> Source<'s, K>
    where
        'a: 's,
        K: Resource + 'static,
        K::DynamicType: Eq + Hash,
    {
        Source {
            store,
            written: self.written,
            dt,
            foreign: &self.stores.foreign,
        }
    }

    /// The cluster's ServiceMonitors, when it serves their API.
    pub fn service_monitors(&self) -> Option<&'a Cache<kube::api::DynamicObject>> {
        self.stores.service_monitors.as_ref()
    }
}

/// The instance's pods in the cache.
pub(super) fn pods(stores: &Stores, mc: &Memcached) -> Vec<Arc<Pod>> {
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
pub(super) fn latest(ctx: &Context, mc: Arc<Memcached>) -> Arc<Memcached> {
    ctx.stores
        .memcacheds
        .get(&ObjectRef::from_obj(mc.as_ref()))
        .unwrap_or(mc)
}
