//! Expectations on the operator's objects: Deployments, Services, owner references, labels, ready
//! status and conditions. Each returns what is wrong, for the polling helpers to report.

use std::collections::BTreeSet;

use serde_json::{Value, json};

use crate::kubectl::{compact, get_required, items, try_kubectl_json};
use crate::names::{
    API_VERSION, APP_NAME, INSTANCE_KEY, MANAGED_BY_KEY, MANAGER_NAME, MC, NAME_KEY,
};

pub fn check_deployment(
    dep: &Value,
    name: &str,
    mc_uid: &str,
    size: i64,
    port: i64,
) -> Result<(), String> {
    let mut p = Vec::new();
    push_err(
        &mut p,
        expect_eq("spec.replicas", &dep["spec"]["replicas"], &json!(size)),
    );
    let selector = &dep["spec"]["selector"];
    push_err(
        &mut p,
        expect_eq(
            "spec.selector.matchLabels",
            &selector["matchLabels"],
            &selector_labels(name),
        ),
    );
    if selector["matchExpressions"]
        .as_array()
        .is_some_and(|e| !e.is_empty())
    {
        p.push(format!(
            "unexpected spec.selector.matchExpressions {}",
            compact(&selector["matchExpressions"])
        ));
    }
    push_err(
        &mut p,
        expect_labels(
            "metadata.labels",
            &dep["metadata"]["labels"],
            &common_labels(name),
        ),
    );
    let template = &dep["spec"]["template"];
    push_err(
        &mut p,
        expect_labels(
            "spec.template.metadata.labels",
            &template["metadata"]["labels"],
            &common_labels(name),
        ),
    );

    let pod = &template["spec"];
    let containers = pod["containers"].as_array().cloned().unwrap_or_default();
    if containers.len() != 1 || containers[0]["name"] != APP_NAME {
        p.push(format!(
            "expected exactly one container named memcached, got {:?}",
            containers
                .iter()
                .map(|c| c["name"].clone())
                .collect::<Vec<_>>()
        ));
    }
    match memcached_container(dep) {
        Err(e) => p.push(e),
        Ok((_, c)) => {
            let cmdline = ["command", "args"]
                .iter()
                .flat_map(|k| c[*k].as_array().cloned().unwrap_or_default())
                .map(|a| a.as_str().unwrap_or_default().to_owned())
                .collect::<Vec<_>>()
                .join(" ");
            for want in [
                format!("-p {port}"),
                "-m 64".to_owned(),
                "-o modern".to_owned(),
            ] {
                if !cmdline.contains(&want) {
                    p.push(format!("container command+args {cmdline:?} lacks {want:?}"));
                }
            }
            let ports = c["ports"].as_array().cloned().unwrap_or_default();
            if !ports
                .iter()
                .any(|x| x["name"] == APP_NAME && x["containerPort"] == port)
            {
                p.push(format!(
                    "no container port named memcached = {port}: {}",
                    compact(&c["ports"])
                ));
            }
            for probe in ["readinessProbe", "livenessProbe"] {
                if !c[probe]["tcpSocket"].is_object() {
                    p.push(format!(
                        "{probe} is not a tcpSocket probe: {}",
                        compact(&c[probe])
                    ));
                }
            }
            let sc = &c["securityContext"];
            push_err(
                &mut p,
                expect_eq(
                    "container allowPrivilegeEscalation",
                    &sc["allowPrivilegeEscalation"],
                    &json!(false),
                ),
            );
            push_err(
                &mut p,
                expect_eq(
                    "container readOnlyRootFilesystem",
                    &sc["readOnlyRootFilesystem"],
                    &json!(true),
                ),
            );
            push_err(
                &mut p,
                expect_eq(
                    "container capabilities.drop",
                    &sc["capabilities"]["drop"],
                    &json!(["ALL"]),
                ),
            );
        }
    }
    let psc = &pod["securityContext"];
    push_err(
        &mut p,
        expect_eq("pod runAsNonRoot", &psc["runAsNonRoot"], &json!(true)),
    );
    push_err(
        &mut p,
        expect_eq(
            "pod seccompProfile.type",
            &psc["seccompProfile"]["type"],
            &json!("RuntimeDefault"),
        ),
    );
    push_err(&mut p, check_owner(dep, name, mc_uid, true));
    result(p, dep)
}

pub fn check_service(svc: &Value, name: &str, mc_uid: &str, port: i64) -> Result<(), String> {
    let mut p = Vec::new();
    push_err(
        &mut p,
        expect_eq("spec.type", &svc["spec"]["type"], &json!("ClusterIP")),
    );
    let ports = svc["spec"]["ports"].as_array().cloned().unwrap_or_default();
    if !ports
        .iter()
        .any(|x| x["name"] == APP_NAME && x["port"] == port)
    {
        p.push(format!(
            "no service port named memcached = {port}: {}",
            compact(&svc["spec"]["ports"])
        ));
    }
    check_service_identity(&mut p, svc, name, mc_uid, false);
    result(p, svc)
}

/// The object must have a controller ownerReference to the Memcached (and, if `only`, no other owner).
pub fn check_owner(obj: &Value, name: &str, mc_uid: &str, only: bool) -> Result<(), String> {
    let refs = obj["metadata"]["ownerReferences"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    if only && refs.len() != 1 {
        return Err(format!(
            "expected exactly one ownerReference, got {}",
            compact(&obj["metadata"]["ownerReferences"])
        ));
    }
    let controllers: Vec<&Value> = refs.iter().filter(|r| r["controller"] == true).collect();
    match controllers.as_slice() {
        [r] if r["kind"] == "Memcached"
            && r["apiVersion"] == API_VERSION
            && r["name"] == name
            && r["uid"] == mc_uid =>
        {
            Ok(())
        }
        _ => Err(format!(
            "expected one controller ownerReference to Memcached {name} (uid {mc_uid}), got {}",
            compact(&obj["metadata"]["ownerReferences"])
        )),
    }
}

/// A settled instance: `size` ready pods listed in status, and Available=True, Progressing=False, Degraded=False.
pub fn check_ready_status(ns: &str, name: &str, size: i64) -> Result<(), String> {
    let mc = get_required(MC, ns, name)?;
    let status = &mc["status"];
    let generation = mc["metadata"]["generation"].as_i64();
    let mut p = Vec::new();
    if generation.is_none() || status["observedGeneration"].as_i64() != generation {
        p.push(format!(
            "status.observedGeneration {} != metadata.generation {}",
            status["observedGeneration"], mc["metadata"]["generation"]
        ));
    }
    push_err(
        &mut p,
        expect_eq("status.replicas", &status["replicas"], &json!(size)),
    );
    push_err(
        &mut p,
        expect_eq(
            "status.readyReplicas",
            &status["readyReplicas"],
            &json!(size),
        ),
    );

    let selector = status["selector"].as_str().unwrap_or_default();
    let got: BTreeSet<&str> = selector
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    let want_pairs = [
        format!("{NAME_KEY}={APP_NAME}"),
        format!("{INSTANCE_KEY}={name}"),
    ];
    let want: BTreeSet<&str> = want_pairs.iter().map(String::as_str).collect();
    if got != want {
        p.push(format!(
            "status.selector {selector:?} should select exactly {want_pairs:?}"
        ));
    }

    let nodes: Vec<String> = status["nodes"]
        .as_array()
        .map(|n| {
            n.iter()
                .map(|x| x.as_str().unwrap_or_default().to_owned())
                .collect()
        })
        .unwrap_or_default();
    if i64::try_from(nodes.len()).ok() != Some(size) {
        p.push(format!(
            "status.nodes has {} names, want {size}: {nodes:?}",
            nodes.len()
        ));
    } else if !nodes.windows(2).all(|w| w[0] < w[1]) {
        p.push(format!(
            "status.nodes is not sorted (or has duplicates): {nodes:?}"
        ));
    }

    for (ty, want) in [
        ("Available", "True"),
        ("Progressing", "False"),
        ("Degraded", "False"),
    ] {
        match condition(&mc, ty) {
            None => p.push(format!("condition {ty} is missing")),
            Some(c) if c["status"] != want => {
                p.push(format!("condition {ty} should be {want}: {}", compact(c)));
            }
            Some(_) => {}
        }
    }
    for c in status["conditions"].as_array().cloned().unwrap_or_default() {
        let ty = c["type"].as_str().unwrap_or("<no type>");
        if c["reason"].as_str().unwrap_or_default().is_empty() {
            p.push(format!("condition {ty} has no reason"));
        }
        if !c["message"].is_string() {
            p.push(format!("condition {ty} has no message"));
        }
        if c["lastTransitionTime"]
            .as_str()
            .unwrap_or_default()
            .is_empty()
        {
            p.push(format!("condition {ty} has no lastTransitionTime"));
        }
        if generation.is_none() || c["observedGeneration"].as_i64() != generation {
            p.push(format!(
                "condition {ty} observedGeneration {} != metadata.generation {}",
                c["observedGeneration"], mc["metadata"]["generation"]
            ));
        }
    }

    if p.is_empty() {
        // Only now (the rest is settled) check that status.nodes names real pods.
        let selector_arg = format!("{INSTANCE_KEY}={name},{NAME_KEY}={APP_NAME}");
        let pods = try_kubectl_json(&["get", "pods", "-n", ns, "-l", &selector_arg, "-o", "json"])?;
        let pod_items = items(&pods);
        let pod_names: BTreeSet<&str> = pod_items
            .iter()
            .filter_map(|x| x["metadata"]["name"].as_str())
            .collect();
        for n in &nodes {
            if !pod_names.contains(n.as_str()) {
                p.push(format!("status.nodes lists {n:?}, which is not a Pod of the instance (pods: {pod_names:?})"));
            }
        }
    }
    result(p, status)
}

pub fn memcached_container(dep: &Value) -> Result<(usize, &Value), String> {
    dep["spec"]["template"]["spec"]["containers"]
        .as_array()
        .and_then(|cs| cs.iter().enumerate().find(|(_, c)| c["name"] == APP_NAME))
        .ok_or_else(|| "the pod template has no container named memcached".to_owned())
}

pub fn labels(pairs: &[(&str, &str)]) -> Value {
    Value::Object(
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), Value::String((*v).to_owned())))
            .collect(),
    )
}

pub fn selector_labels(instance: &str) -> Value {
    labels(&[(NAME_KEY, APP_NAME), (INSTANCE_KEY, instance)])
}

pub fn common_labels(instance: &str) -> Value {
    labels(&[
        (NAME_KEY, APP_NAME),
        (INSTANCE_KEY, instance),
        (MANAGED_BY_KEY, MANAGER_NAME),
    ])
}

pub fn expect_eq(what: &str, actual: &Value, want: &Value) -> Result<(), String> {
    if actual == want {
        Ok(())
    } else {
        Err(format!(
            "{what} is {}, want {}",
            compact(actual),
            compact(want)
        ))
    }
}

/// `actual` must contain every label of `want` (more labels are fine).
pub fn expect_labels(what: &str, actual: &Value, want: &Value) -> Result<(), String> {
    let missing: Vec<String> = want
        .as_object()
        .map(|w| {
            w.iter()
                .filter(|(k, v)| actual.get(k.as_str()) != Some(*v))
                .map(|(k, v)| format!("{k}={v}"))
                .collect()
        })
        .unwrap_or_default();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{what} {} lacks {}",
            compact(actual),
            missing.join(", ")
        ))
    }
}

pub fn push_err(problems: &mut Vec<String>, check: Result<(), String>) {
    if let Err(e) = check {
        problems.push(e);
    }
}

/// `Ok` without problems, else an error listing them followed by the observed object.
pub fn result(problems: Vec<String>, observed: &Value) -> Result<(), String> {
    if problems.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{}\n    observed: {}",
            problems.join("; "),
            compact(observed)
        ))
    }
}

pub fn condition<'a>(obj: &'a Value, ty: &str) -> Option<&'a Value> {
    obj["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == ty)
}

pub fn condition_status<'a>(obj: &'a Value, ty: &str) -> Option<&'a str> {
    condition(obj, ty)?["status"].as_str()
}

/// What every Service of an instance carries: the pod selector, the common labels, the owner reference.
pub fn check_service_identity(
    p: &mut Vec<String>,
    svc: &Value,
    name: &str,
    mc_uid: &str,
    only_owner: bool,
) {
    push_err(
        p,
        expect_eq(
            "spec.selector",
            &svc["spec"]["selector"],
            &selector_labels(name),
        ),
    );
    push_err(
        p,
        expect_labels(
            "metadata.labels",
            &svc["metadata"]["labels"],
            &common_labels(name),
        ),
    );
    push_err(p, check_owner(svc, name, mc_uid, only_owner));
}

/// The pod template mounts Secret `secret` read-only into the memcached container.
pub fn check_secret_volume(dep: &Value, secret: &str) -> Result<(), String> {
    let pod = &dep["spec"]["template"]["spec"];
    let volume = pod["volumes"]
        .as_array()
        .and_then(|vs| vs.iter().find(|v| v["secret"]["secretName"] == secret))
        .ok_or_else(|| format!("no volume of Secret {secret}: {}", compact(&pod["volumes"])))?;
    let (_, c) = memcached_container(dep)?;
    let mounted = c["volumeMounts"].as_array().is_some_and(|ms| {
        ms.iter()
            .any(|m| m["name"] == volume["name"] && m["readOnly"] == true)
    });
    if mounted {
        Ok(())
    } else {
        Err(format!(
            "the memcached container does not mount volume {} read-only: {}",
            volume["name"],
            compact(&c["volumeMounts"])
        ))
    }
}

/// `Degraded=True` with `reason`, and a message containing `mention`.
pub fn expect_degraded(mc: &Value, reason: &str, mention: &str) -> Result<(), String> {
    match condition(mc, "Degraded") {
        Some(c)
            if c["status"] == "True"
                && c["reason"] == reason
                && c["message"].as_str().is_some_and(|m| m.contains(mention)) =>
        {
            Ok(())
        }
        Some(c) => Err(format!(
            "Degraded condition is {}, want True/{reason} with a message mentioning {mention:?}",
            compact(c)
        )),
        None => Err(format!(
            "no Degraded condition; status {}",
            compact(&mc["status"])
        )),
    }
}

pub fn deployment_condition<'a>(dep: &'a Value, ty: &str) -> Option<&'a Value> {
    dep["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == ty)
}

/// The instance's pods that are not being deleted.
pub fn live_pods(ns: &str, name: &str) -> Result<Vec<Value>, String> {
    let selector = format!("{INSTANCE_KEY}={name},{NAME_KEY}={APP_NAME}");
    let pods = try_kubectl_json(&["get", "pods", "-n", ns, "-l", &selector, "-o", "json"])?;
    Ok(items(&pods)
        .into_iter()
        .filter(|pod| pod["metadata"]["deletionTimestamp"].is_null())
        .collect())
}

pub fn pod_ready(pod: &Value) -> bool {
    pod["status"]["conditions"].as_array().is_some_and(|cs| {
        cs.iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "True")
    })
}

/// `command` and `args` of a container, joined by spaces.
pub fn command_line(c: &Value) -> String {
    ["command", "args"]
        .iter()
        .flat_map(|k| string_list(&c[*k]))
        .collect::<Vec<_>>()
        .join(" ")
}

pub fn string_list(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .map(|x| x.as_str().unwrap_or_default().to_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// The `name`s of a list of containers, ports, ...
pub fn names(list: &Value) -> Vec<String> {
    list.as_array()
        .map(|a| {
            a.iter()
                .map(|x| x["name"].as_str().unwrap_or_default().to_owned())
                .collect()
        })
        .unwrap_or_default()
}

pub fn named<'a>(list: &'a Value, name: &str) -> Option<&'a Value> {
    list.as_array()?.iter().find(|x| x["name"] == name)
}
