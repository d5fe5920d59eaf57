//! The pure side of warm handover: what to copy, and when the rollout or the scale may go on.
//!
//! One question is asked of every change of the published list, whatever caused it (a Deployment
//! rollout's replaced pod, a scale-up, a scale-down, or both at once): the list changes from `old` to
//! `new` (entries `host:port` in slot order) under the clients' hashing, so which keys must move where?
//! [`copies`] answers with one [`Copy`] per (source, target) pair of servers between which keys move,
//! with the key filter of that pair, computed by [`crate::hashing`], which reproduces the client
//! libraries exactly:
//!
//! - under a declared scheme a key is copied from the server that owns it under `old` to the one that
//!   owns it under `new`, when those are different servers (different entries). A Deployment rollout
//!   changes the replaced slot's address: under `ketama` and `rendezvous`, which hash the address, that
//!   reshuffles keys between the other servers too (the replaced server's keys spread over the others,
//!   the new server takes keys from each of them), and every such pair is a copy; under `jump` and
//!   `modula`, which place by slot index, the replaced slot's keys all go to its new server;
//! - with `hashing: unknown` nothing is known of the clients but the slot order: a slot whose address
//!   changed hands every item to the new server at that slot (what clients hashing over slot order
//!   need), and a scale copies nothing.
//!
//! The rest are the decisions around the copies, by cause: [`rollout`] (the Deployment's handover gate
//! and which waiting pod takes over which slot), [`spare`] (the StatefulSet rollout's spare server), and
//! [`scale`] (the change a scale makes, and whether it waits for its copies).

mod moves;
pub mod rollout;
pub mod scale;
pub mod spare;

pub use moves::{Copy, Pair, copies, filter, pairs, published};
