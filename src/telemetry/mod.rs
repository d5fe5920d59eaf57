//! Operand telemetry: the operator reads memcached's own `stats` from every ready pod.
//!
//! - [`stats`]: the pure parser of a `stats` reply.
//! - [`client`]: one connection to one server (plain TCP or TLS, ASCII auth), bounded by a timeout.

pub mod client;
pub mod stats;
