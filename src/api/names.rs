//! The names of an instance's children that other parts of the operator (and clients) derive from the
//! instance's name: the headless Service, the published server list, the proxy. Kept here, with the API, so that
//! the builders, the connections to servers and the storage layer all take them from one place.

/// Suffix of the headless Service's name.
pub const HEADLESS_SUFFIX: &str = "-headless";

/// Name of the headless Service of `instance`.
pub fn headless_name(instance: &str) -> String {
    format!("{instance}{HEADLESS_SUFFIX}")
}

/// Suffix of the published server list's ConfigMap.
pub const CONFIG_MAP_SUFFIX: &str = "-servers";

/// Name of the ConfigMap holding the published server list of `instance`.
pub fn config_map_name(instance: &str) -> String {
    format!("{instance}{CONFIG_MAP_SUFFIX}")
}

/// Suffix of the Secret holding the auth file the servers load (`spec.security.auth`): the user's
/// entries and the operator's own.
pub const SERVED_AUTH_SUFFIX: &str = "-auth-file";

/// Name of the Secret holding the auth file the servers of `instance` load.
pub fn served_auth_name(instance: &str) -> String {
    format!("{instance}{SERVED_AUTH_SUFFIX}")
}

/// Suffix of the proxy's children: its Deployment, Service, route configuration (ConfigMap),
/// PodDisruptionBudget and the ServiceAccount, Role and RoleBinding of its configuration reloader.
pub const PROXY_SUFFIX: &str = "-proxy";

/// Name of the proxy's children of `instance` (one of each kind).
pub fn proxy_name(instance: &str) -> String {
    format!("{instance}{PROXY_SUFFIX}")
}
