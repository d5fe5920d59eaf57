//! The wiring: the watches that fill the storage layer's caches, their retries, whether the API server
//! answers, and the controller stream that calls the reconciler. Above the reconciler and telemetry;
//! the manager starts it.
//!
//! - [`watches`]: every watch, the stores they fill, and the controller's run;
//! - [`watch_retry`]: a watch's retries, counted;
//! - [`connectivity`]: whether the API server answers, from what the requests saw.

pub mod connectivity;
mod permissions;
mod watch_retry;
pub mod watches;

pub use watches::{RunOptions, Watches, pod_owner, run, watch};
