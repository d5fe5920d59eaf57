//! Storage: what the operator knows of the cluster, kept in memory, and the write side that keeps it
//! true. Below both the reconciler and telemetry; it imports neither.
//!
//! - [`kinds`]: the table of the kinds of children, and their caches ([`ChildCaches`]);
//! - [`cache`] and [`compact`]: caches that keep each object LZ4-packed (the measurements that justify
//!   packing are in `compact`);
//! - [`pod_index`]: each instance's pods, by name;
//! - [`foreign`]: objects that have a child's name but are not the operator's;
//! - [`written`]: read-your-writes, the answers to the operator's own writes until the caches catch up;
//! - [`secrets`]: the one reader of Secrets' values and its one cache, for the reconciler, the stats
//!   collector and warm handover: read once per version, dropped with the instances that name them;
//! - [`digest_key`]: the operator's key for the Secrets' hash in pod templates;
//! - [`events`]: the event publisher;
//! - [`writer`]: the client, read-your-writes and the publisher: every write of the operator's goes
//!   through it.
//!
//! The watches that fill the caches are built above, with the wiring (`crate::run`).

pub mod cache;
pub mod compact;
pub mod digest_key;
pub mod events;
pub mod foreign;
pub mod kinds;
pub mod pod_index;
pub mod secrets;
pub mod writer;
pub mod written;

use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::PartialObjectMeta;
use kube::runtime::reflector::Store;

pub use cache::{Cache, CacheWriter, Footprint, cache};
pub use compact::{Compact, Compactable};
pub use events::{Publisher, REPORTER};
pub use foreign::Foreign;
pub use kinds::{
    ChildCaches, ChildKind, EachKind, KindName, MakeCache, Served, Unserved, each_kind, kind_names,
};
pub use pod_index::PodIndex;
pub use secrets::{SecretCache, SecretReader};
pub use writer::{Clock, Force, WriteError, Writer};
pub use written::Written;

use crate::api::Memcached;

/// Caches the reconciler and the stats collector read instead of calling the API server. Children and
/// pods are kept packed (see [`cache`]); the instances whole, as the controller hands them to `reconcile`.
#[derive(Clone)]
pub struct Stores {
    pub memcacheds: Store<Memcached>,
    /// One cache per kind of child (see [`kinds`]).
    pub children: ChildCaches,
    pub pods: Cache<Pod>,
    /// The pods of each instance, by name (fed by the pod watch beside `pods`).
    pub pod_index: PodIndex,
    /// Secrets by metadata only: which exist, and their resourceVersion.
    pub secrets: Store<PartialObjectMeta<Secret>>,
    /// What was read of the Secrets' values, for every reader of them (see [`secrets`]).
    pub secret_cache: SecretCache,
    /// Objects with a child's name that the operator does not manage (see [`foreign`]).
    pub foreign: Foreign,
}
