//! The wait for the caches' first complete lists: no reconcile runs before every cache holds one (a
//! reconcile on a half-filled cache would take existing children for missing ones), and a shutdown that
//! comes first ends the wait.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use futures::FutureExt;
use futures::future::{BoxFuture, Shared};
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use tokio::sync::watch;
use tracing::info;

use crate::api::Memcached;
use crate::controller::{Context, Error, reconcile};
use crate::store::Stores;
use crate::store::kinds::{ChildCaches, ChildKind, EachKind, each_kind};

/// The waits for each child cache's first complete list.
struct ChildrenListed<'a> {
    caches: &'a ChildCaches,
    waits: Vec<BoxFuture<'static, Result<(), crate::store::cache::WriterDropped>>>,
}

impl EachKind for ChildrenListed<'_> {
    fn kind<K: ChildKind>(&mut self) {
        let cache = K::cache(self.caches).clone();
        self.waits
            .push(async move { cache.wait_until_ready().await }.boxed());
    }
}

/// Resolves to `true` once every child, pod and Secret cache holds its initial list, `false` if shutdown
/// comes first or one never will. A reflector store wakes only the latest task waiting for it to become
/// ready, so each store gets this one waiter, shared by everyone who needs to know.
pub(super) type Synced = Shared<BoxFuture<'static, bool>>;

pub(super) fn children_synced(stores: &Stores, shutdown: Shared<BoxFuture<'static, ()>>) -> Synced {
    let stores = stores.clone();
    async move {
        let mut children = ChildrenListed {
            caches: &stores.children,
            waits: Vec::new(),
        };
        each_kind(&mut children);
        let mut waits = children.waits;
        waits.extend([
            stores.pods.wait_until_ready().boxed(),
            stores
                .secrets
                .wait_until_ready()
                .map(|ready| ready.map_err(|_| crate::store::cache::WriterDropped))
                .boxed(),
        ]);
        let foreign = stores
            .foreign
            .ready()
            .map(|ready| {
                ready
                    .then_some(())
                    .ok_or(crate::store::cache::WriterDropped)
            })
            .boxed();
        waits.push(foreign);
        let all = futures::future::try_join_all(waits);
        tokio::select! {
            ready = all => ready.is_ok(),
            () = shutdown => false,
        }
    }
    .boxed()
    .shared()
}

/// [`reconcile`], once the other caches hold their initial lists. The controller itself waits only for
/// the Memcached cache; a reconcile that ran before the others are filled would take existing children
/// for missing ones (re-applying them and recording "Created" events), report existing Secrets as missing,
/// and compute the status without the pods. The caches keep filling while a reconcile waits here, so the
/// instance is read again from its cache afterwards.
pub(super) async fn reconcile_when_synced(
    mc: Arc<Memcached>,
    ctx: Arc<Context>,
    children_synced: Synced,
) -> Result<Action, Error> {
    if !children_synced.await {
        return Ok(Action::await_change());
    }
    match ctx.stores.memcacheds.get(&ObjectRef::from_obj(mc.as_ref())) {
        Some(latest) => reconcile(latest, ctx).await,
        // Deleted while waiting: nothing left to reconcile.
        None => Ok(Action::await_change()),
    }
}

/// Resolves when shutdown comes before the instances' first complete list (`listed` still false); pends
/// otherwise. kube's controller starts no reconcile before its cache of instances holds that list, and
/// until then it does not end either: its runner waits for the list even after a graceful shutdown has
/// ended its queue. Without the CRD (or with an API server that never answered) the list never comes, and
/// the process waited for it after SIGTERM until killed. Nothing is in flight then, so nothing is lost by
/// ending the controller at once.
pub(super) async fn stopped_before_listing(
    shutdown: Shared<BoxFuture<'static, ()>>,
    listed: watch::Receiver<bool>,
) {
    shutdown.await;
    if *listed.borrow() {
        std::future::pending::<()>().await;
    }
}

pub(super) async fn mark_synced(all: impl Future<Output = bool>, synced: Arc<AtomicBool>) {
    if all.await {
        info!("caches synced");
        synced.store(true, Ordering::Release);
    }
}
