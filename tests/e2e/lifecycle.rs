//! The one ordered test, `lifecycle`: it walks the steps listed in the crate doc, in order, on one
//! installed operator. Each step is a function in the module of its scenario.

use crate::env::{E2e, preflight};
use crate::events::holder_contains;
use crate::handover::step_handover;
use crate::handover_memory::step_handover_memory;
use crate::invalid::{step_degraded, step_invalid, step_invalid_config};
use crate::isolation::step_isolation;
use crate::kubectl::{cluster_configured, secs};
use crate::leader_election::step_leader_handover;
use crate::names::{CLEANUP_STEP, LEASE, NO_CLUSTER, OPERATOR_NS};
use crate::pools::{
    step_deployment_pool, step_statefulset_drain, step_statefulset_pool, step_warm_rollout,
};
use crate::production::{step_exporter_toggle, step_pdb_lifecycle, step_production};
use crate::sample::{step_delete, step_drift, step_recreate, step_sample, step_scale};
use crate::secrets::step_auth_secret;
use crate::service_monitor::{service_monitors_served, step_service_monitor};
use crate::telemetry::step_telemetry;
use crate::tls::step_tls;

#[test]
#[ignore = "needs a cluster: `make e2e`, or KUBECONFIG=... cargo test --test e2e -- --ignored"]
fn lifecycle() {
    assert!(cluster_configured(), "{NO_CLUSTER}");

    preflight();
    let mut env = E2e::new();
    eprintln!(
        "test namespace: {}\nscratch dir (operator logs): {}",
        env.ns,
        env.dir.display()
    );

    env.step(
        1,
        "a test namespace enforcing the restricted Pod Security Standard; install the CRD, RBAC and \
         namespace from config/default (without the Deployment)",
    );
    env.create_test_namespace();
    env.check_pod_security();
    env.install();

    env.step(
        2,
        "run the operator locally with its ServiceAccount's permissions",
    );
    env.check_rbac();
    env.write_operator_kubeconfig();
    // The operator looks for the ServiceMonitor API once, when it starts (step 17 depends on it).
    let service_monitors_at_start = service_monitors_served();
    eprintln!(
        "    monitoring.coreos.com ServiceMonitors served at operator start: {service_monitors_at_start}"
    );
    let first = env.start_operator("first");

    env.step(3, "health, readiness and metrics endpoints; leader lease");
    env.wait_http(&first, "/healthz", secs(60));
    env.wait_http(&first, "/readyz", secs(60));
    env.wait_http(&first, "/metrics", secs(30));
    env.wait(
        &format!(
            "Lease {OPERATOR_NS}/{LEASE} to be held by the operator ({})",
            first.identity
        ),
        // A Lease left over by an earlier run has to expire first.
        secs(90),
        || holder_contains(&first.identity),
    );

    env.step(
        4,
        "tutorial sample memcached-sample (size 1) gets a Deployment, Service, server list and status, no finalizer",
    );
    step_sample(&env, &first);

    env.step(
        5,
        "leader election: a second operator waits, then takes over after SIGTERM to the first",
    );
    let current = step_leader_handover(&env, &first);

    env.step(
        6,
        "scale memcached-sample to 3 through the scale subresource",
    );
    step_scale(&env, &current);

    env.step(7, "drift: hand edits of the Deployment are reverted");
    step_drift(&env);

    env.step(8, "deleted Deployment and Service are recreated");
    step_recreate(&env);

    env.step(9, "invalid specs are rejected at admission");
    step_invalid(&env);

    env.step(10, "an unpullable image makes the instance Degraded");
    step_degraded(&env);

    env.step(
        11,
        "deleting memcached-sample: gone at once (no finalizer), its children garbage-collected",
    );
    step_delete(&env);

    env.step(
        12,
        "production sample memcached-production (3 pods with the exporter sidecar) is admitted under the \
         restricted Pod Security Standard and matches the sample",
    );
    let production = step_production(&env);

    env.step(
        13,
        "exporter sidecar and metrics port follow spec.monitoring.exporter.enabled",
    );
    step_exporter_toggle(&env, &production);

    env.step(
        14,
        "PodDisruptionBudget follows size and highAvailability.podDisruptionBudget.enabled; delete memcached-production",
    );
    step_pdb_lifecycle(&env, &production);

    env.step(
        15,
        "auth Secret: missing -> SecretNotFound, created -> ready, rotated -> rollout; values never leak",
    );
    step_auth_secret(&env);

    env.step(
        16,
        "settings CEL refuses: rejected at admission (CEL) or Degraded InvalidConfig (no CEL), nothing applied",
    );
    step_invalid_config(&env);

    env.step(
        17,
        "ServiceMonitor created and removed, or ServiceMonitorUnavailable without its API",
    );
    step_service_monitor(&env, service_monitors_at_start);

    env.step(18, "TLS from a kubernetes.io/tls Secret (needs openssl)");
    step_tls(&env);

    env.step(
        19,
        "NetworkPolicy and HorizontalPodAutoscaler follow spec.security.networkPolicy and spec.autoscaling",
    );
    step_isolation(&env);

    env.step(
        20,
        "StatefulSet pool memcached-pool: stable addresses published in slot order; a deleted pod keeps its slot",
    );
    step_statefulset_pool(&env);

    env.step(
        21,
        "warm rollout: one server at a time, warmupSeconds between replacements, the list unchanged",
    );
    step_warm_rollout(&env);

    env.step(
        22,
        "3 -> 2 drain: the list shrinks first, the highest ordinal goes after drainSeconds; delete the pool",
    );
    step_statefulset_drain(&env);

    env.step(
        23,
        "Deployment pool: a replaced pod keeps the slot; the drained pod is marked with the deletion cost and removed",
    );
    step_deployment_pool(&env);

    env.step(
        24,
        "operand telemetry: sets and gets through the Service show in status.stats and /metrics",
    );
    step_telemetry(&env, &current);

    env.step(
        25,
        "warm handovers: Deployment and StatefulSet rollouts, a scale-down and a scale-up under a declared \
         hashing, a rollout to servers that refuse connections",
    );
    step_handover(&env);

    env.step(
        26,
        "handing over a 1 GiB cache grows the operator's peak RSS by less than 10 MiB",
    );
    step_handover_memory(&env, &current);

    eprintln!(
        "\n==> all steps passed [t+{}s]; step {CLEANUP_STEP} (cleanup) follows",
        env.started.elapsed().as_secs()
    );
}
