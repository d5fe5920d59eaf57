//! The cluster the smoke tests run the operator against: the workspace's fake API server
//! ([`fake_apiserver`], stateful: what the operator writes comes back in its lists and watches), holding
//! a [`world::World`], and the paths ([`paths`]) and objects the tests name. It serves the kinds of
//! children of the operator's table ([`crate::common::kinds`]).

pub mod paths;
pub mod world;

use std::sync::Arc;

use fake_apiserver::{Fake, Options};
use serde_json::Value;

use crate::cluster::world::World;
use crate::common::kinds;

/// Where the operator's Lease lives, and its name.
pub const LEASE_NAMESPACE: &str = "op-system";
pub const LEASE_NAME: &str = "memcached-operator.cache.example.com";

/// A fake API server on 127.0.0.1 over plain HTTP holding the default world (one instance); `lease` is
/// a Lease that exists from the start.
pub async fn start(lease: Option<Value>) -> Arc<Fake> {
    start_with(World::default(), lease).await
}

/// [`start`] holding `world`.
pub async fn start_with(world: World, lease: Option<Value>) -> Arc<Fake> {
    serve(world, lease, false).await
}

/// [`start_with`] over TLS, offering HTTP/2 and HTTP/1.1 by ALPN, with a certificate from a CA made now,
/// which [`crate::harness::Scratch::kubeconfig`] writes into the kubeconfig.
pub async fn start_tls(world: World, lease: Option<Value>) -> Arc<Fake> {
    serve(world, lease, true).await
}

/// Every fake of the smoke tests can go away and come back ([`Fake::outage`], [`Fake::back`]).
async fn serve(world: World, lease: Option<Value>, tls: bool) -> Arc<Fake> {
    let fake = Fake::start(Options {
        tls,
        outages: true,
        installed: world.installed.clone(),
        children: kinds::collections(),
        ..Options::default()
    })
    .await
    .expect("the fake API server starts");
    world.seed(&fake);
    if let Some(lease) = lease {
        fake.store()
            .create("leases", lease)
            .expect("the Lease is stored");
    }
    fake
}

/// The operator's Lease, once created.
pub fn lease(fake: &Fake) -> Option<Value> {
    fake.store()
        .get("leases", LEASE_NAMESPACE, LEASE_NAME)
        .cloned()
}

pub fn lease_holder(fake: &Fake) -> Option<String> {
    lease(fake).and_then(|l| l["spec"]["holderIdentity"].as_str().map(str::to_owned))
}

/// Changes the Lease as another replica would, through the store: a new resource version, and an event
/// for watches.
pub fn change_lease(fake: &Fake, change: impl FnOnce(&mut Value)) -> Value {
    fake.store()
        .modify("leases", LEASE_NAMESPACE, LEASE_NAME, change)
        .expect("a Lease to change")
}

/// A `Memcached` created now: listed from now on, and delivered to watches.
pub fn add_memcached(fake: &Fake, mc: Value) {
    fake.store()
        .create("memcacheds", mc)
        .expect("a new instance");
}
