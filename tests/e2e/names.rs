//! Names, images and timeouts the steps share: the installed objects, the tutorial sample, labels and
//! ports. Names only one scenario uses live in that scenario's module.

use std::time::Duration;

pub const NO_CLUSTER: &str = "the e2e suite needs a cluster: set KUBECONFIG to a disposable test cluster's \
     kubeconfig, or run `make e2e`, which starts a local control plane from $KUBEBUILDER_ASSETS";
pub const OPERATOR_BIN: &str = env!("CARGO_BIN_EXE_memcached-operator");
pub const REPO_ROOT: &str = env!("CARGO_MANIFEST_DIR");
pub const OPERATOR_NS: &str = "memcached-operator-system";
pub const SERVICE_ACCOUNT: &str = "memcached-operator-controller-manager";
pub const CRD: &str = "memcacheds.cache.example.com";

/// Fully qualified resource name used with kubectl, so no other `memcached` resource can be picked by mistake.
pub const MC: &str = "memcacheds.cache.example.com";
pub const API_VERSION: &str = "cache.example.com/v1alpha1";
pub const LEASE: &str = "memcached-operator.cache.example.com";
pub const SAMPLE: &str = "memcached-sample";
pub const BAD_IMAGE: &str = "registry.invalid/does-not-exist:0.0.0";
pub const PORT: i64 = 11211;
pub const EXPORTER_NAME: &str = "exporter";
pub const METRICS_PORT_NAME: &str = "metrics";
pub const METRICS_PORT: i64 = 9150;
pub const SECRET_HASH_ANNOTATION: &str = "cache.example.com/secret-hash";
pub const PDB: &str = "poddisruptionbudgets.policy";
pub const SERVICE_MONITORS: &str = "servicemonitors.monitoring.coreos.com";

/// Label on the Nodes of envtest's stand-in kubelet (`envtest/src/kubelet/node.rs`): pods there are
/// local processes on loopback addresses, with no `kubectl exec` and no kube-proxy.
pub const STAND_IN_LABEL: &str = "envtest.memcached-operator/stand-in-kubelet";

/// Pod Security Standard the test namespace enforces (and warns and audits with).
pub const POD_SECURITY_LEVEL: &str = "restricted";

/// Number of the cleanup step, printed by `impl Drop for E2e`.
pub const CLEANUP_STEP: u32 = 27;
pub const NAME_KEY: &str = "app.kubernetes.io/name";
pub const INSTANCE_KEY: &str = "app.kubernetes.io/instance";
pub const MANAGED_BY_KEY: &str = "app.kubernetes.io/managed-by";
pub const APP_NAME: &str = "memcached";
pub const MANAGER_NAME: &str = "memcached-operator";

/// Interval between two checks of a poll loop.
pub const POLL: Duration = Duration::from_secs(1);

/// Upper bound in seconds for a single kubectl invocation (so a hung API server cannot hang the test).
pub const KUBECTL_TIMEOUT_SECS: u64 = 120;

/// Field manager for what the test applies server-side.
pub const FIELD_MANAGER: &str = "memcached-operator-e2e";
