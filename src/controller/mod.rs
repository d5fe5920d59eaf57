//! The reconciler: the reconcile flow, and the context it runs in.
//!
//! The flow, in the order one reconcile goes: [`reconcile`] (take a turn, then validate, plan, apply,
//! report), [`view`] (what it reads once), [`pool`] (slots, drain marks), [`secrets`] (the referenced
//! Secrets' hashes, the served auth file), [`apply`] and [`children`] (apply only what differs; the
//! workload's template through [`fleet_turn`]: warm handover's gate and the fleet rollout's turn),
//! [`changes`] (what changed, said once), [`report`] (the status, only when it differs) and [`error`];
//! warm handover is [`crate::handover`]'s, which the context holds.
//!
//! The [`context`] every reconcile shares: its [`settings`], the stores, the writer, and the [`memory`]
//! of each instance: the retry [`backoff`], the status [`pace`] and the [`turns`] reconciles take.
//!
//! Everything the reconciler reads comes from in-memory caches (reflector stores) fed by label-scoped
//! watches, so a reconcile makes no read requests; it writes only when something differs.

mod apply;
pub mod backoff;
mod changes;
mod children;
mod context;
mod error;
pub mod fleet;
mod fleet_turn;
mod legacy_finalizer;
mod memory;
pub mod pace;
mod pool;
mod reconcile;
mod report;
mod secrets;
mod settings;
pub mod turns;
mod view;

pub use backoff::Backoff;
pub use context::{Context, system_clock};
pub use error::Error;
pub use memory::Memory;
pub use reconcile::{error_policy, reconcile};
pub use settings::{DEFAULT_CONCURRENCY, Settings};
pub use turns::Turns;

pub use crate::store::Clock;
