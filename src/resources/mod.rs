//! Pure builders: a `Memcached` in, the exact child objects the operator server-side applies out.
//!
//! Nothing here talks to the API server, so every shape decision is unit-tested with plain values.

pub mod args;
pub mod auth_file;
pub mod autoscaler;
mod defaults;
pub mod deployment;
pub mod drift;
pub mod fleet;
mod instance;
mod invalid_spec;
pub mod labels;
pub mod memory;
mod names;
pub mod network_policy;
pub mod pdb;
pub mod pod;
pub mod proxy;
pub mod quantity;
pub mod rollout;
pub mod scaling;
pub mod secrets;
pub mod servers;
pub mod service;
pub mod service_monitor;
pub mod spare;
pub mod statefulset;
#[cfg(test)]
pub(crate) mod testing;
pub mod validate;
#[cfg(test)]
pub mod vertical_pod_autoscaler;

pub use defaults::{DEFAULT_IMAGE, DEFAULT_OPERATOR_IMAGE, Defaults, OperatorPods};
pub use instance::Instance;
pub use invalid_spec::{INVALID_CONFIG, InvalidSpec};
pub use names::{MAX_NAME_LEN, MAX_STATEFULSET_NAME_LEN, REVISION_HASH_LEN, max_name_len};
