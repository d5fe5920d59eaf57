//! memcached-operator: runs Memcached on Kubernetes through the `Memcached` custom resource.
//!
//! Reconcile is a pipeline whose middle is pure: [`resources`] turns a `Memcached` into the exact child
//! objects, [`status`] turns what exists into the status; only [`controller`] talks to the API server.
//!
//! [`manifests`] generates the CRD and the operator's RBAC from the code (`cargo xtask crd|rbac`, `make manifests`).
//! Release files built from them (the one-file install, the OLM bundle, the API reference) are generated
//! by the workspace's `xtask` crate, not by this library or its binary.

pub mod api;
pub mod check;
pub mod cli;
pub mod connection;
pub mod controller;
pub mod handover;
pub mod hashing;
pub mod manager;
pub mod manifests;
pub mod metrics;
pub mod observe;
pub mod proxy_config;
pub mod resources;
pub mod run;
pub mod status;
pub mod store;
pub mod telemetry;

/// The operator's version, which the release tooling stamps on the install and the OLM bundle.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
/// The operator's one-line description, the OLM bundle's summary of it.
pub const DESCRIPTION: &str = env!("CARGO_PKG_DESCRIPTION");
