//! Warm handover: copying memcached servers' items to the servers that take their keys over, so a
//! server that takes keys over starts with them instead of empty. The whole feature lives here:
//!
//! - [`plan`], pure: the one planner ([`plan::copies`]: the published list changes from A to B under the
//!   clients' hashing; which keys must move where?), whatever caused the change (a Deployment rollout's
//!   replaced pod, a scale, both), and the decisions around it: the Deployment's handover gate and
//!   takeovers ([`plan::rollout`]), the StatefulSet rollout's spare server ([`plan::spare`]), the scale's
//!   change and how long it waits ([`plan::scale`]);
//! - [`Handover`], the orchestrator the controller holds (`orchestrator`), asked at two moments of a
//!   reconcile: before the list is published, [`Handover::hold`] (the change of the list a scale makes,
//!   and what it holds while its copies run) and [`Handover::gate`] (the readiness gate on the pod
//!   template); once the list is applied, [`Handover::step`], with a [`View`] of the instance, which
//!   answers a [`Step`]. The watches take [`Handover::triggers`], and an instance that is gone has its
//!   copies cancelled ([`Handover::forget_instance`]). It needs no more of the operator than its
//!   [`Deps`] (client, event publisher, metrics, the Secret and pod caches, the cluster domain, a clock)
//!   and fails with its own [`Error`];
//! - the causes, plain functions over one engine (`engine`): `scale` (a scale's copies), `rollout` (a
//!   Deployment rollout's takeovers and gates), `spare` (a StatefulSet rollout's spare server). Each is a
//!   change of the servers that hold the keys (`transition`), whose copies the engine prepares one way
//!   and says so in events (`HandedOver`, `HandoverFailed`) and [`metrics`];
//! - one registry of running copies (`tasks`), shared by rollouts, scales and the spare: every copy in
//!   a task of its own, at most [`MOST_COPIES`] at once, cancelled when its pod or instance goes or the
//!   operator stops;
//! - the copy: one [`Copier`] ([`copier`]) copies one source server to one target server:
//!   [`dump`] (the source's items, listed by `lru_crawler metadump all`, read a line at a time),
//!   [`copy`](mod@copy) (each batch of keys fetched from the source with `mg`: value, client flags,
//!   remaining TTL; and stored on the target with `ms` in add mode, so a value a client wrote on the
//!   target since is never overwritten; then a sweep, a second walk that copies only what the target
//!   still lacks, for the items the first walk did not list), [`rate`] (the byte rate limit,
//!   `spec.handover.maxBytesPerSecond`) and [`progress`] (counters readable while the copy runs, and the
//!   final summary).
//!
//! Connections are opened as the stats collector opens them ([`crate::connection`]): TLS verified against
//! the instance's CA, memcached's ASCII authentication. A copy is bounded in time as a whole
//! ([`Settings::timeout`]) and per request ([`Settings::request_timeout`]), so a server that refuses or
//! stops answering ends it with a [`Failure`] that says why and how far it got. Dropping the future
//! cancels the copy (its connections close).

pub mod bounds;
pub mod copier;
pub mod copy;
pub mod dump;
mod engine;
mod error;
pub mod metrics;
mod orchestrator;
pub mod plan;
pub mod progress;
pub mod rate;
mod rollout;
mod scale;
mod spare;
mod tasks;
mod transition;
mod view;

pub use bounds::{
    COPY_MEMORY_BOUND, DEFAULT_MAX_TIMEOUT_SECONDS, DEFAULT_REQUEST_TIMEOUT, KeyFilter,
    MAX_VALUE_BYTES, MIN_BYTES_PER_WINDOW, PROGRESS_WINDOW, Settings,
};
pub use copier::Copier;
pub use engine::Deps;
pub use error::{CopyError, Error, Failure, Side};
pub use orchestrator::{Handover, Holding, PROGRESS_EVERY, Step};
pub use plan::rollout::GATE;
pub use progress::{Progress, Snapshot};
pub use tasks::MOST_COPIES;
pub use view::{Hold, Rollout, View};
