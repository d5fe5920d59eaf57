//! The operator-wide settings that shape the children of every instance ([`Defaults`]): the images it
//! runs, where its own pods are, whether it reads stats.

/// Image used when neither `spec.image` nor `MEMCACHED_IMAGE` says otherwise.
pub const DEFAULT_IMAGE: &str = "memcached:1.6-alpine";

/// The operator's own image, as the release tooling tags it: what runs the proxy's configuration writer
/// unless `--operator-image` says otherwise.
pub const DEFAULT_OPERATOR_IMAGE: &str = concat!(
    "registry.example.com/memcached-operator:v",
    env!("CARGO_PKG_VERSION")
);

/// Operator-wide settings that shape the children of every instance.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Defaults {
    /// Image for instances whose spec has none (`MEMCACHED_IMAGE`).
    pub image: String,
    /// Where the operator's own pods run: an instance's NetworkPolicy admits them to the memcached port
    /// while the operator connects to its servers (stats reads, handover copies). `None` when the
    /// operator does not run in a pod.
    pub operator_pods: Option<OperatorPods>,
    /// Whether the operator reads its instances' stats (`--stats-interval` not 0), wherever it runs:
    /// the collector is what asks servers to reload a rotated certificate
    /// ([`secrets::tls_reload`](super::secrets::tls_reload)).
    pub stats_collected: bool,
    /// The operator's own image: the proxy's configuration writer runs it (see [`proxy`](super::proxy)).
    pub operator_image: String,
}

/// The operator's pods, as a NetworkPolicy peer: those labelled
/// [`labels::OPERATOR_POD_LABEL`](super::labels::OPERATOR_POD_LABEL) in `namespace` (the install's
/// manager Deployment carries the label).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OperatorPods {
    pub namespace: String,
}

impl Default for Defaults {
    fn default() -> Self {
        Self {
            image: DEFAULT_IMAGE.to_owned(),
            operator_pods: None,
            stats_collected: true,
            operator_image: DEFAULT_OPERATOR_IMAGE.to_owned(),
        }
    }
}
