//! The `Memcached` custom resource (`cache.example.com/v1alpha1`).
//!
//! Field names and defaults follow the Kubebuilder and Operator SDK memcached tutorials, so their sample
//! manifests (`spec: {size: 1, containerPort: 11211}`) apply unchanged. Every limit that the API server can
//! check is plain OpenAPI schema, so the CRD works on every server from v1.24 up; the CEL rules (1.25+)
//! repeat checks the operator also makes itself.

mod clients;
pub mod external;
mod features;
pub mod flags;
mod handover;
mod isolation;
mod memcached;
pub mod names;
mod pools;
mod proxy;
mod stats;

pub use clients::*;
pub use features::*;
pub use handover::*;
pub use isolation::*;
pub use memcached::{
    DEFAULT_CONTAINER_PORT, DEFAULT_SIZE, FINALIZER, GROUP, MAX_SIZE, Memcached, MemcachedSpec,
    MemcachedStatus, VERSION,
};
pub use pools::*;
pub use proxy::*;
pub use stats::*;
