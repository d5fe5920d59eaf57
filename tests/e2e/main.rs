//! End-to-end test of memcached-operator against a real Kubernetes API server (v1.24 or newer).
//!
//! The test is `#[ignore]`d (`cargo test` lists it as ignored, with what it needs): it runs when asked
//! for, against the cluster `KUBECONFIG` points at, and fails at once, saying so, when `KUBECONFIG` is not
//! set. `make e2e` runs it (and can start a local control plane first, see below):
//!
//! ```text
//! KUBECONFIG=~/.kube/config cargo test --test e2e -- --ignored --nocapture --test-threads=1
//! ```
//!
//! Requirements: `kubectl` (1.24+) on `PATH` (or its path in `$KUBECTL`); a kubeconfig user that may install
//! CRDs and RBAC and impersonate service accounts (cluster-admin); nodes that can pull the memcached image; and
//! no in-cluster memcached-operator Deployment running (it would compete for the leader lease).
//!
//! `make e2e` (`hack/e2e.sh`) runs it against `KUBECONFIG`'s cluster, or, when `KUBECONFIG` is unset and a
//! control plane's binaries are there (`$KUBEBUILDER_ASSETS`, else `/usr/local/kubebuilder/bin`), against
//! `envtest up --memcached`, which it starts and stops: a real control plane with envtest's stand-in kubelet
//! (`envtest/src/kubelet/`), whose pods are Debian `memcached` processes on loopback addresses of this
//! machine, with their TLS and auth files from their Secret volumes. The stand-in reports images of the
//! reserved `.invalid` domain as unpullable, as a kubelet does any image it cannot pull (step 10), and labels
//! its Nodes [`names::STAND_IN_LABEL`]; it has no `kubectl exec` and no kube-proxy, so on its nodes step 24
//! checks that the Service sends its memcached port to the pods and talks to one of them from here.
//!
//! The operator runs as a local process (this crate's binary), authenticated with a token of its own
//! ServiceAccount, so the RBAC from `config/` is exercised for real. One test, `lifecycle`, walks these steps
//! in order (they share state); each step is printed as `==> step N: ...`:
//!
//!  1. install: a test namespace that enforces the `restricted` Pod Security Standard (checked with a
//!     server-side dry run of a non-compliant pod), then `kubectl kustomize config/default` minus the
//!     Deployment; wait for the CRD
//!  2. operator: check the ServiceAccount's RBAC, write a token kubeconfig, start the operator (leader election on)
//!  3. endpoints and lease: `/healthz`, `/readyz`, `/metrics`; the leader Lease names the operator
//!  4. sample: the tutorial's Memcached produces a correct Deployment, Service, server list (created with the
//!     first ready server, never empty), status, columns, one Created event, and no finalizer
//!  5. leader election: a second operator stays standby, then takes over after the first gets SIGTERM
//!  6. scale to 3 through the scale subresource
//!  7. drift: hand edits of the Deployment are reverted
//!  8. deleted Deployment and Service are recreated
//!  9. invalid specs are rejected at admission
//! 10. an unpullable image makes the instance Degraded
//! 11. deleting the Memcached: gone at once (no finalizer), its children garbage-collected
//! 12. production sample (`config/samples/cache_v1alpha1_memcached_full.yaml`): 3 pods with the exporter sidecar
//!     are admitted under `restricted` and become ready (no ReplicaFailure); the Deployment (rollout strategy,
//!     memcached flags, preStop, grace period, anti-affinity, resources, sidecar), client and headless Services,
//!     PodDisruptionBudget and `status.serverList` match the sample
//! 13. the exporter sidecar and the Service's metrics port go away and come back with `monitoring.exporter.enabled`
//! 14. the PodDisruptionBudget goes at size 1, comes back at size 2, goes when disabled; the instance is deleted
//! 15. auth Secret: missing → `Degraded` `SecretNotFound` and nothing applied; created → ready with `-Y` and a
//!     Secret hash on the pod template; rotated → the hash changes and the pods roll; its values appear in no
//!     event, status, child object or operator log
//! 16. settings the CRD's CEL rules refuse (a managed flag in `extraArgs`, a grace period not longer than the
//!     preStop delay, both PDB bounds, a ServiceMonitor without the exporter): rejected at admission with the
//!     rule's message on a server that evaluates CEL (1.25+), else `Degraded` `InvalidConfig` with nothing
//!     applied; the suite prints which path it saw
//! 17. ServiceMonitor: created and removed with the spec where the cluster serves monitoring.coreos.com/v1,
//!     else `Degraded` `ServiceMonitorUnavailable` (the Deployment is still applied)
//! 18. TLS from a `kubernetes.io/tls` Secret (`-Z`), if `openssl` is on `PATH` to make a certificate; a
//!     renewed certificate loaded by the running server (`CertificatesReloaded`), no pod replaced
//! 19. network isolation and autoscaling: the NetworkPolicy (memcached port from the listed clients and the
//!     operator's pods, which read stats; metrics port from the namespace) and the HorizontalPodAutoscaler (targeting the `Memcached`) are created, owned
//!     and labelled; the autoscaler raises `spec.size` to `minSize` through the scale subresource and undoes a
//!     `kubectl scale` below it (no metrics server needed); a deleted policy comes back; disabled, both go with
//!     `Deleted` events and the size stays. Enforcement needs a network plugin and is not checked
//! 20. StatefulSet pool (`workload: StatefulSet`): the StatefulSet's shape, servers at stable DNS names published
//!     in slot order in `<name>-servers` (and its mcrouter config); a deleted pod comes back in its slot
//! 21. warm rollout: a changed template replaces one server at a time, highest ordinal first, each created at
//!     least `warmupSeconds` after the previous one was ready; the published list never changes
//! 22. 3 → 2 drain on the StatefulSet pool: slot 2 leaves the list (`Draining`) while its pod still runs; after
//!     `drainSeconds` exactly that pod goes (`Drained`); the instance is deleted
//! 23. Deployment pool: a replaced pod's slot goes to its replacement, the others keep theirs; 3 → 2 marks
//!     exactly the drained pod with `controller.kubernetes.io/pod-deletion-cost` and removes it after the drain
//! 24. operand telemetry: an instance with 2 real memcached pods gets sets and gets through its Service
//!     (`kubectl exec` into a pod; on a stand-in kubelet's nodes, straight to an endpoint of the Service);
//!     `status.stats`, the `HIT%`/`MEM%` columns and `/metrics` show the hits and items (where the pod IPs
//!     are routable from the machine running the operator; elsewhere: reported as not readable); its
//!     series go with it
//! 25. warm handovers, keys placed by jump hash before and read back after: a Deployment rollout of 2 servers
//!     (each new pod waits behind the handover readiness gate while the operator copies the server it
//!     replaces: condition `Copied`, one `HandedOver` event per slot), a StatefulSet rollout of 2 (through the
//!     operator's spare server), a 3 -> 2 scale-down and a 3 -> 5 scale-up declaring `clients.hashing: jump`
//!     (the keys that change server copied to their new owners, `HandedOver` events for the servers that
//!     receive them); every key is on the server that owns it afterwards (where pod IPs are not routable from the
//!     operator's machine: each copy ends cold, `Failed` and `HandoverFailed`). Then, on a stand-in
//!     kubelet's nodes only (elsewhere a NOTE says it is skipped), a rollout to servers that refuse
//!     connections (an image of `no-server.test`) with `handover.timeoutSeconds: 20`: each gate opens
//!     `Failed`, one `HandoverFailed` Warning per slot names the refusal, and the rollout is done within
//!     one copy's bound
//! 26. handing over 1 GiB (a 2-server Deployment filled with 100 KiB items from this machine, then rolled
//!     out) grows the operator's peak RSS (`VmHWM`, reset before) by less than 10 MiB, and at least 95 % of
//!     the items arrive with their values; where pod IPs are not reachable from here, skipped with a NOTE
//! 27. cleanup (always, also after a failure): see `impl Drop for E2e`
//!
//! Steps 12 to 14 run three pods requesting 250m CPU and 631Mi memory each plus their exporters (four during a
//! rollout), so the nodes need about 1.1 CPU and 2.5 GiB of requestable capacity left. Step 26 runs two
//! pods with `maxMemoryMB: 800` (three during its rollout), which request about 2.5 GiB and hold 1 GiB of
//! items each side of the copy.
//!
//! Knobs: `E2E_KEEP=1` keeps the test namespace and the installed objects (the operator is stopped anyway);
//! `E2E_TIMEOUT_SCALE=2` multiplies every timeout (slow clusters); `KUBECTL=/path/to/kubectl`.
//!
//! Every wait polls with a timeout; on timeout it panics with what it expected and the last value it saw.
//! After a failure the operator logs (last 200 lines) and the namespace's objects and events are printed.
//!
//! Where things are:
//!
//! - [`lifecycle`]: the one test, calling the steps in order;
//! - one module per scenario, holding its steps and the checks only it needs: [`sample`] (steps 4, 6
//!   to 8, 11), [`leader_election`] (5), [`invalid`] (9, 10, 16), [`production`] (12 to 14),
//!   [`secrets`] (15), [`service_monitor`] (17), [`tls`] (18), [`isolation`] (19), [`pools`] (20 to 23),
//!   [`telemetry`] (24), [`handover`] (25), [`handover_memory`] (26);
//! - shared helpers: [`env`] (setup, the operator processes, diagnostics and cleanup), [`checks`]
//!   (expectations on the operator's objects), [`events`] (events and the leader Lease), [`kubectl`]
//!   (kubectl and process helpers), [`poll`] (waits with timeouts), [`http`] (the operator's
//!   endpoints) and [`names`] (shared names and timeouts).

mod checks;
mod env;
mod events;
mod http;
mod kubectl;
mod names;
mod poll;
mod timings;

mod lifecycle;

mod handover;
mod handover_memory;
mod invalid;
mod isolation;
mod leader_election;
mod pools;
mod production;
mod sample;
mod secrets;
mod service_monitor;
mod telemetry;
mod tls;
