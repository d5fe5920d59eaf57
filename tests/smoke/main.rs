//! Smoke tests of `memcached-operator run` as a user runs it: the real binary, a kubeconfig, and an API
//! server, here a fake one served in-process on 127.0.0.1, over plain HTTP or, as a real API server is,
//! over TLS with HTTP/2 and HTTP/1.1 offered by ALPN ([`http2`]).
//!
//! The fake is the workspace's `fake-apiserver`, which the scale benchmark uses too: stateful, as a real
//! API server is, so what the operator writes (children, status, the Lease) comes back in its later lists
//! and watches, and a scenario shows what the operator does with its own writes read back (a settled
//! operator writes nothing more). Each test seeds it with a [`cluster::world::World`] (`default/cache`
//! by default, children and pods when a scenario needs them), can make its lists slow, take the CRD away,
//! and make it go away and come back on the same address, restarted or not. Every request is recorded, so
//! the tests check what the operator asked for, with which selectors and parameters, as well as what it
//! did with the answers: health probes, metrics, leader election (leader, standby, takeover), reconciles,
//! restarts against settled instances, caches that fill in any order or never, and a clean SIGTERM that
//! releases the Lease.
//!
//! A request to any path the fake does not serve gets a 404 and fails the test. `SMOKE_DUMP=1 cargo
//! test --test smoke -- --nocapture` prints each run's operator log and requests;
//! `SMOKE_OPERATOR=/path/to/memcached-operator` runs another build (an earlier one, to see a scenario
//! fail without the fix it checks).
//!
//! Where things are:
//!
//! - [`cluster`]: the fake API server started for a test, the objects it holds at the start, the paths
//!   the tests name, and the Lease;
//! - [`harness`]: the operator process, its scratch directory and kubeconfig, HTTP probes, waits, and
//!   the run-until-settled cycle;
//! - [`checks`]: assertions on recorded requests and metrics;
//! - [`common`]: the helpers the integration tests share; here, the real memcached of [`telemetry`];
//! - one module per scenario group: [`reconcile`], [`configuration`], [`leader_election`],
//!   [`caches`], [`secrets`], [`service_monitors`], [`outage`], [`http2`], [`telemetry`], [`crd`]. A
//!   new scenario goes in the group it belongs to, or in a new module listed here.

mod checks;
mod cluster;
#[path = "../common/mod.rs"]
mod common;
mod harness;

mod caches;
mod configuration;
mod crd;
mod http2;
mod leader_election;
mod outage;
mod reconcile;
mod secrets;
mod service_monitors;
mod telemetry;
