//! What drives the reconcile flow: the watches and the caches they fill ([`watches`], [`cache`],
//! [`compact`], [`pod_index`], [`foreign`]), their retries ([`watch_retry`]), the per-instance retry
//! backoff ([`backoff`]), whose turn it is to reconcile ([`turns`]), whether the API server answers
//! ([`connectivity`]), and read-your-writes ([`written`]).

pub mod backoff;
pub mod cache;
pub mod compact;
pub mod connectivity;
pub mod foreign;
pub mod pod_index;
pub mod turns;
mod watch_retry;
pub mod watches;
pub mod written;
