//! Helpers shared by the integration tests: the repository's files and binaries ([`files`], which
//! xtask's tests share), the one scripted API server ([`scripted`]: a script in order, or standing rules),
//! the reconciler's world around it ([`mock`]), the table of child kinds as the fakes need it
//! ([`kinds`]), memcached, real and fake, for the telemetry tests ([`memcached`]), a proxy-capable
//! memcached run as a child process ([`proxy`]), and a hostile memcached for the handover copies
//! ([`hostile`]).
#![allow(dead_code, unused_imports)] // each test crate uses its own subset

mod files;
pub use files::{metric_names, output_of, read, repo, yaml_docs};

pub mod hostile;
pub mod kinds;
pub mod memcached;
pub mod mock;
pub mod pki;
pub mod proxy;
pub mod scripted;
