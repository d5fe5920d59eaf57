//! Helpers shared by the integration tests: the repository's files and binaries ([`files`], which
//! xtask's tests share) and the mocked API server ([`mock`]).
#![allow(dead_code, unused_imports)] // each test crate uses its own subset

mod files;
pub use files::{output_of, read, repo, yaml_docs};

pub mod mock;
