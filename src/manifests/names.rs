//! The names the install gives the operator's objects: the namespace and name prefix of
//! `config/default`, and the names of its roles.

/// The namespace and name prefix `config/default` gives every object, which the namespaced overlay's own
/// objects carry already (an overlay's prefix would apply to `config/default`'s objects a second time).
pub const INSTALL_NAMESPACE: &str = "memcached-operator-system";
pub const NAME_PREFIX: &str = "memcached-operator-";

/// Name of the ClusterRole holding what the controller calls.
pub const MANAGER_ROLE: &str = "manager-role";
/// Name of the ClusterRole that lets the operator check who scrapes `/metrics`.
pub const METRICS_AUTH_ROLE: &str = "metrics-auth-role";
/// Name of the namespaced Role for the leader-election Lease and the digest key Secret.
pub const LEADER_ELECTION_ROLE: &str = "leader-election-role";
