//! Step 19: the NetworkPolicy and HorizontalPodAutoscaler of `spec.security.networkPolicy` and
//! `spec.autoscaling`: created as the spec says (the policy also admitting the operator's pods, which
//! read stats), put back after a deletion, the autoscaler scaling the Memcached through its scale
//! subresource, both removed when disabled. Enforcement of the policy needs a network plugin that
//! implements NetworkPolicy, which the suite does not assume (docs/operations.md shows how to verify it
//! by hand).

use serde_json::{Value, json};

use crate::checks::{
    check_owner, common_labels, expect_eq, expect_labels, labels, push_err, result,
};
use crate::env::{E2e, delete_instance};
use crate::events::expect_event;
use crate::kubectl::{apply_yaml_ok, get_required, gone, kubectl_ok, secs, uid_of};
use crate::names::{
    API_VERSION, APP_NAME, INSTANCE_KEY, MANAGER_NAME, MC, METRICS_PORT, NAME_KEY, OPERATOR_NS,
    PORT,
};

pub const ISOLATED: &str = "memcached-isolated";
const NETWORK_POLICY: &str = "networkpolicies.networking.k8s.io";
/// Pinned to v2: `kubectl get hpa` picks the server's preferred version, which is v1 on older servers.
const HPA: &str = "horizontalpodautoscalers.v2.autoscaling";
/// Label of the pods allowed to reach the isolated instance.
const CLIENT_LABEL: (&str, &str) = ("e2e-role", "cache-client");
const MIN_SIZE: i64 = 2;
const MAX_SIZE: i64 = 3;

/// NetworkPolicy and HorizontalPodAutoscaler: created as the spec says, put back after a deletion, the
/// autoscaler scaling the Memcached through its scale subresource (its minSize applies without any
/// metrics, so no metrics server is needed), and both removed when disabled. Whether the policy is
/// enforced depends on the network plugin, which this test does not assume; docs/operations.md shows how
/// to check it by hand.
pub fn step_isolation(env: &E2e) {
    let ns = env.ns.as_str();
    apply_yaml_ok(&format!(
        "apiVersion: {API_VERSION}\nkind: Memcached\nmetadata:\n  name: {ISOLATED}\n  namespace: {ns}\nspec:\n\
         \x20 security:\n    networkPolicy:\n      enabled: true\n      allowedClients:\n\
         \x20     - podSelector:\n          matchLabels:\n            {}: {}\n\
         \x20 monitoring:\n    exporter:\n      enabled: true\n\
         \x20 autoscaling:\n    enabled: true\n    minSize: {MIN_SIZE}\n    maxSize: {MAX_SIZE}\n\
         \x20   targetCPUUtilizationPercentage: 80\n",
        CLIENT_LABEL.0, CLIENT_LABEL.1
    ));
    let mc_uid = uid_of(MC, ns, ISOLATED);

    env.wait(
        &format!("NetworkPolicy {ISOLATED} admitting port {PORT} from the clients and {METRICS_PORT} from the namespace"),
        secs(60),
        || {
            let policy = get_required(NETWORK_POLICY, ns, ISOLATED)?;
            check_network_policy(&policy, &mc_uid)
        },
    );
    env.wait(
        &format!("HorizontalPodAutoscaler {ISOLATED} targeting Memcached {ISOLATED}"),
        secs(60),
        || {
            let hpa = get_required(HPA, ns, ISOLATED)?;
            check_autoscaler(&hpa, &mc_uid)
        },
    );
    // One Created event names every child the reconcile created.
    for kind in ["NetworkPolicy", "HorizontalPodAutoscaler"] {
        let child = format!("{kind} {ISOLATED}");
        env.wait(
            &format!("a Normal event Created naming {child}, regarding Memcached {ISOLATED}"),
            secs(30),
            || {
                expect_event(ns, |e| {
                    e.reason == "Created" && e.name == ISOLATED && e.note.contains(&child)
                })
            },
        );
    }

    // The autoscaler reads /scale (status.selector, status.replicas) and raises spec.size to minSize.
    let wait_size = |why: &str| {
        env.wait(
            &format!("the autoscaler to set spec.size of {ISOLATED} to {MIN_SIZE} ({why})"),
            secs(120),
            || {
                let mc = get_required(MC, ns, ISOLATED)?;
                expect_eq("spec.size", &mc["spec"]["size"], &json!(MIN_SIZE))
            },
        );
    };
    wait_size("minSize, from the default 1");
    env.wait(
        &format!("Deployment {ISOLATED} to follow with {MIN_SIZE} replicas"),
        secs(60),
        || {
            let dep = get_required("deployments.apps", ns, ISOLATED)?;
            expect_eq("spec.replicas", &dep["spec"]["replicas"], &json!(MIN_SIZE))
        },
    );
    // While autoscaling is on, the size is the autoscaler's: a manual scale below minSize is undone.
    kubectl_ok(&[
        "scale",
        &format!("{MC}/{ISOLATED}"),
        "--replicas=1",
        "-n",
        ns,
    ]);
    wait_size("after kubectl scale --replicas=1");

    // A deleted child is put back, like every child.
    kubectl_ok(&["delete", NETWORK_POLICY, ISOLATED, "-n", ns, "--wait=true"]);
    env.wait(
        &format!("NetworkPolicy {ISOLATED} to be recreated"),
        secs(60),
        || {
            let policy = get_required(NETWORK_POLICY, ns, ISOLATED)?;
            check_network_policy(&policy, &mc_uid)
        },
    );

    // Disabled: both go, with Deleted events, and the size stays where the autoscaler left it.
    let patch = r#"{"spec":{"security":{"networkPolicy":{"enabled":false}},"autoscaling":{"enabled":false}}}"#;
    kubectl_ok(&["patch", MC, ISOLATED, "-n", ns, "--type=merge", "-p", patch]);
    for (resource, kind) in [
        (NETWORK_POLICY, "NetworkPolicy"),
        (HPA, "HorizontalPodAutoscaler"),
    ] {
        env.wait(
            &format!("{kind} {ISOLATED} to be deleted once disabled"),
            secs(60),
            || gone(resource, ns, ISOLATED),
        );
        // Deleted in one reconcile, both are named by one Deleted event.
        let child = format!("{kind} {ISOLATED}");
        env.wait(
            &format!("a Normal event Deleted naming {child}, regarding Memcached {ISOLATED}"),
            secs(30),
            || {
                expect_event(ns, |e| {
                    e.reason == "Deleted" && e.name == ISOLATED && e.note.contains(&child)
                })
            },
        );
    }
    env.hold(
        &format!("spec.size of {ISOLATED} stays {MIN_SIZE} without the autoscaler"),
        secs(5),
        || {
            let mc = get_required(MC, ns, ISOLATED)?;
            expect_eq("spec.size", &mc["spec"]["size"], &json!(MIN_SIZE))
        },
    );
    eprintln!(
        "    (NetworkPolicy enforcement needs a network plugin that implements it; see \
         docs/operations.md#network-isolation to verify by hand)"
    );
    delete_instance(env, ISOLATED);
}

fn check_network_policy(policy: &Value, mc_uid: &str) -> Result<(), String> {
    let mut problems = Vec::new();
    push_err(&mut problems, check_owner(policy, ISOLATED, mc_uid, true));
    push_err(
        &mut problems,
        expect_labels(
            "NetworkPolicy labels",
            &policy["metadata"]["labels"],
            &common_labels(ISOLATED),
        ),
    );
    let spec = &policy["spec"];
    // The servers and the spare server a StatefulSet rollout's handover runs (another
    // app.kubernetes.io/name): the operator copies to and from it.
    push_err(
        &mut problems,
        expect_eq(
            "spec.podSelector",
            &spec["podSelector"],
            &json!({
                "matchLabels": {INSTANCE_KEY: ISOLATED},
                "matchExpressions": [{
                    "key": NAME_KEY, "operator": "In", "values": [APP_NAME, "memcached-handover"]
                }]
            }),
        ),
    );
    push_err(
        &mut problems,
        expect_eq(
            "spec.policyTypes",
            &spec["policyTypes"],
            &json!(["Ingress"]),
        ),
    );
    // The suite's operators read stats (`--stats-interval`) and say where they run (`POD_NAMESPACE`), so
    // the operator's own pods are admitted to the memcached port after the listed clients, or its reads
    // would time out where the policy is enforced.
    let operator_pods = json!({
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": OPERATOR_NS}},
        "podSelector": {"matchLabels": labels(&[(NAME_KEY, MANAGER_NAME)])},
    });
    push_err(
        &mut problems,
        expect_eq(
            "spec.ingress",
            &spec["ingress"],
            &json!([
                {"from": [{"podSelector": {"matchLabels": labels(&[CLIENT_LABEL])}}, operator_pods],
                 "ports": [{"port": PORT, "protocol": "TCP"}]},
                {"from": [{"podSelector": {}}],
                 "ports": [{"port": METRICS_PORT, "protocol": "TCP"}]}
            ]),
        ),
    );
    result(problems, policy)
}

fn check_autoscaler(hpa: &Value, mc_uid: &str) -> Result<(), String> {
    let mut problems = Vec::new();
    push_err(&mut problems, check_owner(hpa, ISOLATED, mc_uid, true));
    push_err(
        &mut problems,
        expect_labels(
            "HorizontalPodAutoscaler labels",
            &hpa["metadata"]["labels"],
            &common_labels(ISOLATED),
        ),
    );
    let spec = &hpa["spec"];
    push_err(
        &mut problems,
        expect_eq(
            "spec.scaleTargetRef",
            &spec["scaleTargetRef"],
            &json!({"apiVersion": API_VERSION, "kind": "Memcached", "name": ISOLATED}),
        ),
    );
    push_err(
        &mut problems,
        expect_eq(
            "spec.minReplicas/maxReplicas",
            &json!([spec["minReplicas"], spec["maxReplicas"]]),
            &json!([MIN_SIZE, MAX_SIZE]),
        ),
    );
    push_err(
        &mut problems,
        expect_eq(
            "spec.metrics",
            &spec["metrics"],
            &json!([{"type": "Resource", "resource": {"name": "cpu",
                     "target": {"type": "Utilization", "averageUtilization": 80}}}]),
        ),
    );
    result(problems, hpa)
}
