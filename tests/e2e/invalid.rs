//! Specs that cannot run: rejected at admission (step 9), an unpullable image that makes the instance
//! Degraded (step 10), and settings the CRD's CEL rules refuse at admission where the server evaluates
//! them, and the operator refuses (`Degraded` `InvalidConfig`) where it does not (step 16).

use serde_json::{Value, json};

use crate::checks::{
    condition, condition_status, expect_degraded, expect_eq, memcached_container, result,
};
use crate::env::{E2e, delete_instance};
use crate::events::expect_event;
use crate::kubectl::{
    apply_yaml, apply_yaml_ok, compact, get_opt, get_required, gone, kubectl, kubectl_ok, secs,
};
use crate::names::{API_VERSION, BAD_IMAGE, MC};

pub const BAD_IMAGE_NAME: &str = "memcached-badimage";
pub const BAD_CONFIG_NAME: &str = "memcached-badconfig";

pub fn step_invalid(env: &E2e) {
    let ns = env.ns.as_str();
    let cases = [
        ("bad-size-neg", "size: -1", "spec.size"),
        ("bad-size-big", "size: 1000", "spec.size"),
        (
            "bad-port-zero",
            "size: 1\n  containerPort: 0",
            "spec.containerPort",
        ),
        ("bad-size-string", "size: \"three\"", "spec.size"),
    ];
    let mut problems = Vec::new();
    for (name, spec, field) in cases {
        let yaml = format!(
            "apiVersion: {API_VERSION}\nkind: Memcached\nmetadata:\n  name: {name}\n  namespace: {ns}\nspec:\n  {spec}\n"
        );
        let out = apply_yaml(&yaml);
        let stderr = String::from_utf8_lossy(&out.stderr).trim().to_owned();
        if out.status.success() {
            problems.push(format!(
                "{name} ({spec:?}) was accepted, expected an admission error naming {field}; stdout: {}",
                String::from_utf8_lossy(&out.stdout).trim()
            ));
        } else if !stderr.contains(field) {
            problems.push(format!(
                "{name} ({spec:?}) was rejected, but stderr does not name {field}: {stderr}"
            ));
        } else {
            eprintln!("    ok: {name} rejected: {stderr}");
        }
    }
    for (name, _, _) in cases {
        match get_opt(MC, ns, name) {
            Ok(None) => {}
            Ok(Some(_)) => {
                problems.push(format!(
                    "Memcached {name} exists although it should have been rejected"
                ));
                let _ = kubectl(&["delete", MC, name, "-n", ns, "--wait=false"]);
            }
            Err(e) => problems.push(format!("cannot check whether {name} exists: {e}")),
        }
    }
    assert!(
        problems.is_empty(),
        "invalid Memcached specs were not handled as expected:\n  - {}",
        problems.join("\n  - ")
    );
}

pub fn step_degraded(env: &E2e) {
    let ns = env.ns.as_str();
    apply_yaml_ok(&format!(
        "apiVersion: {API_VERSION}\nkind: Memcached\nmetadata:\n  name: {BAD_IMAGE_NAME}\n  namespace: {ns}\n\
         spec:\n  size: 1\n  containerPort: 11211\n  image: {BAD_IMAGE}\n"
    ));
    env.wait(
        &format!("Deployment {BAD_IMAGE_NAME} to use the image {BAD_IMAGE} from spec.image"),
        secs(60),
        || {
            let dep = get_required("deployments.apps", ns, BAD_IMAGE_NAME)?;
            let (_, c) = memcached_container(&dep)?;
            expect_eq("memcached container image", &c["image"], &json!(BAD_IMAGE))
        },
    );
    let mc = env.wait(
        &format!(
            "Memcached {BAD_IMAGE_NAME}: Degraded=True with reason ImagePullFailed \
             (or ProgressDeadlineExceeded), Available=False"
        ),
        secs(180),
        || {
            let mc = get_required(MC, ns, BAD_IMAGE_NAME)?;
            let mut problems = Vec::new();
            match condition(&mc, "Degraded") {
                Some(c)
                    if c["status"] == "True"
                        && (c["reason"] == "ImagePullFailed"
                            || c["reason"] == "ProgressDeadlineExceeded") => {}
                Some(c) => problems.push(format!("Degraded condition is {}", compact(c))),
                None => problems.push("no Degraded condition".into()),
            }
            if condition_status(&mc, "Available") != Some("False") {
                problems.push(format!(
                    "Available condition is {}",
                    compact(condition(&mc, "Available").unwrap_or(&Value::Null))
                ));
            }
            result(problems, &mc["status"]).map(|()| mc)
        },
    );
    eprintln!(
        "    Degraded condition: {}",
        compact(condition(&mc, "Degraded").unwrap_or(&Value::Null))
    );

    kubectl_ok(&["delete", MC, BAD_IMAGE_NAME, "-n", ns, "--wait=false"]);
    env.wait(
        &format!("Memcached {BAD_IMAGE_NAME} to be deleted"),
        secs(60),
        || gone(MC, ns, BAD_IMAGE_NAME),
    );
}

/// One spec that the CRD's CEL rules refuse where the API server evaluates them (1.25+; on by default
/// since 1.25, GA in 1.29), and that the operator refuses itself where it does not.
struct CelCase {
    name: &'static str,
    spec: &'static str,
    /// The rule's message, as the API server quotes it in the rejection.
    rule_message: &'static str,
    /// What the operator's `Degraded` message names instead.
    degraded_mentions: &'static str,
}

const CEL_CASES: [CelCase; 4] = [
    CelCase {
        name: BAD_CONFIG_NAME,
        // -p bundled behind -C, as memcached's getopt reads it: the port, which the operator sets.
        spec: "size: 1\n  memcached:\n    extraArgs: [\"-Cp\", \"1\"]",
        rule_message: "extraArgs may not set an option the operator manages",
        degraded_mentions: "extraArgs[0]",
    },
    CelCase {
        name: "memcached-badgrace",
        spec: "size: 1\n  highAvailability:\n    preStopDelaySeconds: 30\n    terminationGracePeriodSeconds: 20",
        rule_message: "must be longer than preStopDelaySeconds",
        degraded_mentions: "terminationGracePeriodSeconds",
    },
    CelCase {
        name: "memcached-badpdb",
        spec: "size: 2\n  highAvailability:\n    podDisruptionBudget:\n      maxUnavailable: 1\n      minAvailable: 1",
        rule_message: "set maxUnavailable or minAvailable, not both",
        degraded_mentions: "both maxUnavailable and minAvailable",
    },
    CelCase {
        name: "memcached-badmonitor",
        spec: "size: 1\n  monitoring:\n    serviceMonitor:\n      enabled: true",
        rule_message: "serviceMonitor.enabled needs exporter.enabled",
        degraded_mentions: "needs spec.monitoring.exporter.enabled",
    },
];

/// Step 16: settings only CEL or the operator can refuse. Each is either rejected at admission with the
/// rule's message (a server that evaluates the CRD's CEL rules) or admitted and then reported `Degraded`
/// `InvalidConfig` with nothing applied (a server that does not); both are correct, the suite says which
/// it saw, and one server must behave the same way for every rule.
pub fn step_invalid_config(env: &E2e) {
    let ns = env.ns.as_str();
    let mut paths = Vec::new();
    for case in &CEL_CASES {
        let name = case.name;
        let yaml = format!(
            "apiVersion: {API_VERSION}\nkind: Memcached\nmetadata:\n  name: {name}\n  namespace: {ns}\n\
             spec:\n  {}\n",
            case.spec
        );
        eprintln!("    $ kubectl apply -f - <<EOF\n{yaml}    EOF");
        let out = apply_yaml(&yaml);
        let stderr = String::from_utf8_lossy(&out.stderr).trim().to_owned();
        if out.status.success() {
            eprintln!("    admitted (no CEL on this server): expecting Degraded InvalidConfig");
            expect_refused_by_operator(env, name, case.degraded_mentions);
            paths.push((name, "operator"));
        } else {
            assert!(
                stderr.contains(case.rule_message),
                "{name} was rejected, but not by its CEL rule (want a message with {:?}): {stderr}",
                case.rule_message
            );
            assert!(
                matches!(get_opt(MC, ns, name), Ok(None)),
                "{name} was rejected but exists"
            );
            eprintln!("    ok: rejected at admission by the CEL rule: {stderr}");
            paths.push((name, "CEL"));
        }
    }
    eprintln!("    paths seen: {paths:?}");
    let first = paths[0].1;
    assert!(
        paths.iter().all(|(_, path)| *path == first),
        "the API server evaluated some CEL rules and not others: {paths:?}"
    );
}

/// An admitted invalid spec: `Degraded` `InvalidConfig` naming the setting, a Warning event, no Deployment.
fn expect_refused_by_operator(env: &E2e, name: &str, mention: &str) {
    let ns = env.ns.as_str();
    let mc = env.wait(
        &format!("Memcached {name}: Degraded=True, reason InvalidConfig, naming {mention}"),
        secs(60),
        || {
            let mc = get_required(MC, ns, name)?;
            expect_degraded(&mc, "InvalidConfig", mention).map(|()| mc)
        },
    );
    eprintln!(
        "    Degraded condition: {}",
        compact(condition(&mc, "Degraded").unwrap_or(&Value::Null))
    );
    env.hold(
        &format!("no Deployment {name} is applied for an invalid config"),
        secs(5),
        || gone("deployments.apps", ns, name),
    );
    env.wait(
        &format!("a Warning event with reason InvalidConfig regarding Memcached {name}"),
        secs(30),
        || {
            expect_event(ns, |e| {
                e.type_ == "Warning"
                    && e.reason == "InvalidConfig"
                    && e.kind == "Memcached"
                    && e.name == name
            })
        },
    );
    delete_instance(env, name);
}
