//! memcached-operator: runs Memcached on Kubernetes through the `Memcached` custom resource.
//!
//! Reconcile is a pipeline whose middle is pure: [`resources`] turns a `Memcached` into the exact child
//! objects, [`status`] turns what exists into the status; only [`controller`] talks to the API server.
//!
//! Distribution is generated from the same code: [`manifests`] (CRD, RBAC), [`install`] (the one-file
//! install, rendered from `config/` by [`kustomize`]), [`bundle`] (the OLM bundle) and [`docs`] (the API
//! reference), the last two by walking the CRD schema ([`schema`]).

pub mod api;
pub mod bundle;
pub mod cli;
pub mod controller;
pub mod docs;
pub mod install;
pub mod kustomize;
pub mod manager;
pub mod manifests;
pub mod metrics;
pub mod observe;
pub mod resources;
pub mod schema;
pub mod status;
