//! etcd, kube-controller-manager and kube-scheduler command lines.

use std::path::Path;
use std::process::Command;

use crate::pki::Pki;

/// Controllers that would fight the stand-in kubelet, need a cloud, or can only fail here: node
/// lifecycle would taint and evict the nodes because they post no heartbeats (the kubelet does not renew
/// Leases), node IPAM needs a pod CIDR, routes and load balancers need a cloud provider, and attach/detach
/// needs real volumes.
///
/// The endpoint controllers (Endpoints, EndpointSlices, their mirroring) are off too: the stand-in
/// kubelet's pod IPs are loopback addresses ([`crate::kubelet::ip`]), which the API server refuses in
/// Endpoints and EndpointSlices, so every write of a Service's endpoints was refused (422) and retried
/// with a Warning event, for as long as the Service lived. Measured with `make bench-real` (300 instances,
/// v1.28.7, 2026-11-26): about 4 500 of the run's requests were those refusals and their events, load
/// that a real cluster, whose endpoint controllers write each Service's endpoints a few times, never
/// carries (the control plane's CPU for the run fell from 56 s to 39-47 s without it). Nothing the
/// operator does reads endpoints, and nothing in the tests did (they never held an address).
///
/// Everything the operator relies on stays on: deployments, replica sets, stateful sets, the garbage
/// collector, namespaces, disruption (PodDisruptionBudget status), the horizontal pod autoscaler (its
/// scale writes), and the service-account and token controllers.
pub const CONTROLLERS: &str = "*,\
-node-ipam-controller,\
-node-lifecycle-controller,\
-cloud-node-lifecycle-controller,\
-node-route-controller,\
-service-lb-controller,\
-persistentvolume-attach-detach-controller,\
-endpoints-controller,\
-endpointslice-controller,\
-endpointslice-mirroring-controller";

/// [`CONTROLLERS`] for a real node (`crate::ControlPlaneOptions::node_address`): its pods have routable
/// addresses, and kube-proxy routes a Service's ClusterIP by its EndpointSlices, so the endpoint
/// controllers run. Node lifecycle stays off (the harness lifts the node's `not-ready` taint itself).
pub const REAL_NODE_CONTROLLERS: &str = "*,\
-node-ipam-controller,\
-node-lifecycle-controller,\
-cloud-node-lifecycle-controller,\
-node-route-controller,\
-service-lb-controller,\
-persistentvolume-attach-detach-controller";

pub fn etcd(binary: &Path, data_dir: &Path, client_port: u16, peer_port: u16) -> Command {
    let mut cmd = Command::new(binary);
    cmd.args([
        format!("--data-dir={}", data_dir.display()),
        format!("--listen-client-urls=http://127.0.0.1:{client_port}"),
        format!("--advertise-client-urls=http://127.0.0.1:{client_port}"),
        format!("--listen-peer-urls=http://127.0.0.1:{peer_port}"),
        format!("--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}"),
        format!("--initial-cluster=default=http://127.0.0.1:{peer_port}"),
        // Less memory and disk for a cluster that lives minutes (the defaults suit months).
        "--snapshot-count=5000".to_owned(),
    ]);
    cmd
}

pub fn controller_manager(
    binary: &Path,
    kubeconfig: &Path,
    pki: &Pki,
    port: u16,
    real_node: bool,
) -> Command {
    let kc = kubeconfig.display();
    let mut cmd = Command::new(binary);
    cmd.args([
        format!("--kubeconfig={kc}"),
        format!("--authentication-kubeconfig={kc}"),
        format!("--authorization-kubeconfig={kc}"),
        "--bind-address=127.0.0.1".to_owned(),
        format!("--secure-port={port}"),
        "--leader-elect=false".to_owned(),
        // The token controller signs ServiceAccount token Secrets, and publishes the CA to every namespace.
        format!(
            "--service-account-private-key-file={}",
            pki.service_account_key.display()
        ),
        format!("--root-ca-file={}", pki.ca_cert.display()),
        // Each controller acts under its own identity (system:serviceaccount:kube-system:<controller>), as
        // in a real cluster: RBAC applies to it, and the audit log tells the controllers apart.
        "--use-service-account-credentials=true".to_owned(),
        format!(
            "--service-cluster-ip-range={}",
            super::SERVICE_CLUSTER_IP_RANGE
        ),
        format!(
            "--controllers={}",
            if real_node {
                REAL_NODE_CONTROLLERS
            } else {
                CONTROLLERS
            }
        ),
        // The client-side rate limits (default 20/s, bursts of 30) would make the controllers, not the
        // operator, the bottleneck of a test with hundreds of pods: 300 replicas took 15 s to create.
        "--kube-api-qps=200".to_owned(),
        "--kube-api-burst=400".to_owned(),
        "--profiling=false".to_owned(),
    ]);
    cmd
}

pub fn scheduler(binary: &Path, kubeconfig: &Path, port: u16) -> Command {
    let kc = kubeconfig.display();
    let mut cmd = Command::new(binary);
    cmd.args([
        format!("--kubeconfig={kc}"),
        format!("--authentication-kubeconfig={kc}"),
        format!("--authorization-kubeconfig={kc}"),
        "--bind-address=127.0.0.1".to_owned(),
        format!("--secure-port={port}"),
        "--leader-elect=false".to_owned(),
        "--kube-api-qps=200".to_owned(),
        "--kube-api-burst=400".to_owned(),
        "--profiling=false".to_owned(),
    ]);
    cmd
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_controllers_run_for_a_real_node_only() {
        for off in ["-endpoints-controller", "-endpointslice-controller"] {
            assert!(CONTROLLERS.split(',').any(|c| c == off));
            assert!(!REAL_NODE_CONTROLLERS.split(',').any(|c| c == off));
        }
        assert!(
            REAL_NODE_CONTROLLERS
                .split(',')
                .any(|c| c == "-node-lifecycle-controller")
        );
    }
}
