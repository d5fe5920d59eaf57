//! The reconciler against a mocked API server: every request it makes, in order, per scenario.
//!
//! The stores stand in for the watch caches: each test puts in them what a real cluster would have, runs
//! one reconcile, and the mock checks the requests (method, path, body) and answers them. When the
//! reconcile returns, the mock asserts nothing else was sent.
//!
//! One file per scenario: an instance's usual life (`lifecycle`), the finalizer of earlier builds
//! (`finalizer`), failures and how they are reported (`failures`), objects of a child's name that are
//! not the operator's (`ownership`), the Secrets (`secrets`), the optional children (`features`); the
//! instances and Secrets several of them start from are in `fixtures`. A new scenario is a file next to
//! this one (`mod <name>;` below) whose tests begin with `let mut cluster = Cluster::new();`.

#[path = "../common/mod.rs"]
mod common;
mod failures;
mod features;
mod finalizer;
mod fixtures;
mod lifecycle;
mod ownership;
mod secrets;

use std::time::Duration;

use common::mock::*;
use fixtures::*;
