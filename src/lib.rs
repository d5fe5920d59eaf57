//! memcached-operator: runs Memcached on Kubernetes through the `Memcached` custom resource.
//!
//! Reconcile is a pipeline whose middle is pure: [`resources`] turns a `Memcached` into the exact child
//! objects, [`status`] turns what exists into the status; only [`controller`] talks to the API server.

pub mod api;
pub mod cli;
pub mod controller;
pub mod manager;
pub mod manifests;
pub mod metrics;
pub mod resources;
pub mod status;
