//! The collections the fake serves, with the API group and version a request must name. A path that
//! names another group, version or plural is not served (404), as on an API server that does not know the
//! resource.
//!
//! The fake knows its own few ([`OWN`]: the operator's resource, pods, Secrets, events, Leases); the kinds
//! of children the operator creates come from its caller ([`crate::Options::children`]), which builds
//! them from the operator's table of kinds, so the fake never lists them. A kind of a CRD the cluster may
//! not serve ([`Collection::crd`]) is served only where the caller says its CRD is installed
//! ([`crate::Options::installed`]); the discovery of its group says which it serves.

/// One collection: its group/version (`v1` for the core group), plural and kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Collection {
    pub api_version: &'static str,
    pub plural: &'static str,
    pub kind: &'static str,
    /// A CRD's: served only when the fake is told its CRD is installed.
    pub crd: bool,
}

impl Collection {
    /// A collection of an API every cluster serves.
    pub const fn new(api_version: &'static str, plural: &'static str, kind: &'static str) -> Self {
        Self {
            api_version,
            plural,
            kind,
            crd: false,
        }
    }

    /// This collection, a CRD's (`crd`) or not.
    pub const fn of_crd(self, crd: bool) -> Self {
        Self { crd, ..self }
    }
}

/// The collections the fake serves whoever starts it.
pub const OWN: &[Collection] = &[
    Collection::new("cache.example.com/v1alpha1", "memcacheds", "Memcached"),
    Collection::new("v1", "pods", "Pod"),
    Collection::new("v1", "secrets", "Secret"),
    Collection::new("events.k8s.io/v1", "events", "Event"),
    Collection::new("coordination.k8s.io/v1", "leases", "Lease"),
];

/// The API group of the operator's own resource: [`crate::Fake::set_crd_missing`] takes it away.
pub const OPERATOR_GROUP: &str = "cache.example.com";
