//! The wiring: the watches that fill the storage layer's caches, their retries, whether the API server
//! answers, and the controller stream that calls the reconciler. Above the reconciler and telemetry;
//! the manager starts it.
//!
//! - [`caches`]: the watches of everything the reconciler reads, the stores they fill, and the streams
//!   of what changed;
//! - [`cached_watch`]: one kind's retried watch, the cache it fills and the stream of what it touched;
//! - [`triggers`]: which instances a changed child, pod or Secret triggers;
//! - [`discovery`]: whether the cluster serves an API it may not (a CRD's), asked at start;
//! - [`first_lists`]: no reconcile before every cache holds its first complete list;
//! - [`controller_loop`]: the instances' watch and the controller's run;
//! - [`watch_retry`]: a watch's retries, counted;
//! - [`retry_pause`]: the pause between them, cut short when the API server grants requests again;
//! - [`connectivity`]: whether the API server answers, from what the requests saw.

mod cached_watch;
pub mod caches;
pub mod connectivity;
pub mod controller_loop;
mod discovery;
mod first_lists;
mod permissions;
mod retry_pause;
pub mod triggers;
mod watch_retry;

pub use caches::{Watches, watch};
pub use controller_loop::{RunOptions, run};
pub use triggers::pod_owner;
