//! Steps 12 to 14, on the production sample `config/samples/cache_v1alpha1_memcached_full.yaml`: what
//! it produces under the `restricted` Pod Security Standard, the exporter sidecar toggled, and the
//! PodDisruptionBudget following size and spec.

use std::path::Path;

use serde_json::{Value, json};

use crate::checks::{
    check_owner, check_ready_status, check_service, check_service_identity, command_line,
    common_labels, condition, deployment_condition, expect_eq, expect_labels, live_pods,
    memcached_container, named, names, pod_ready, push_err, result, selector_labels, string_list,
};
use crate::env::{E2e, delete_instance};
use crate::events::expect_event;
use crate::kubectl::{
    compact, get_opt, get_required, gone, indent, kubectl_json, kubectl_ok, secs, str_at,
};
use crate::names::{
    APP_NAME, EXPORTER_NAME, MC, METRICS_PORT, METRICS_PORT_NAME, PDB, POD_SECURITY_LEVEL, PORT,
    REPO_ROOT,
};

/// The production-shaped sample, relative to the crate root, and the instance it creates.
pub const PRODUCTION_SAMPLE: &str = "config/samples/cache_v1alpha1_memcached_full.yaml";
pub const PRODUCTION: &str = "memcached-production";
pub const HOSTNAME_TOPOLOGY: &str = "kubernetes.io/hostname";

/// What the production sample asks for, read back from the applied Memcached (so the checks follow the sample).
pub struct Production {
    pub uid: String,
    pub size: i64,
    /// `spec.containerPort`: the pods' port, also the headless Service's.
    pub port: i64,
    /// `spec.service.port`, else `containerPort`: the client Service's port.
    pub service_port: i64,
    pub image: Option<String>,
    /// Pieces the memcached command line must contain, e.g. `-m 512`.
    pub args: Vec<String>,
    pub pre_stop: Value,
    pub grace_period: Value,
    pub resources: Value,
    pub service_annotations: Value,
    pub pdb_max_unavailable: Value,
}

impl Production {
    pub fn from_spec(mc: &Value) -> Self {
        let spec = &mc["spec"];
        let m = &spec["memcached"];
        let ha = &spec["highAvailability"];
        let need = |v: &Value, what: &str| -> Value {
            assert!(
                !v.is_null(),
                "{PRODUCTION_SAMPLE} no longer sets {what}, which step 12 checks; spec: {}",
                compact(spec)
            );
            v.clone()
        };
        let scalar = |v: &Value| match v {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        let mut args = vec![
            format!(
                "-m {}",
                scalar(&need(&m["maxMemoryMB"], "memcached.maxMemoryMB"))
            ),
            format!(
                "-c {}",
                scalar(&need(&m["maxConnections"], "memcached.maxConnections"))
            ),
            format!(
                "-I {}",
                scalar(&need(&m["maxItemSize"], "memcached.maxItemSize"))
            ),
            "-o modern".to_owned(),
        ];
        if !m["threads"].is_null() {
            args.push(format!("-t {}", scalar(&m["threads"])));
        }
        let extra: Vec<String> = need(&m["extraArgs"], "memcached.extraArgs")
            .as_array()
            .map(|a| a.iter().map(scalar).collect())
            .unwrap_or_default();
        args.push(extra.join(" "));
        let size = spec["size"].as_i64().unwrap_or(1);
        assert!(
            size >= 2,
            "{PRODUCTION_SAMPLE} should run at least 2 pods (it has a PodDisruptionBudget); spec.size is {size}"
        );
        let pre_stop = ha["preStopDelaySeconds"].as_i64().unwrap_or(10);
        let port = spec["containerPort"].as_i64().unwrap_or(PORT);
        Production {
            uid: str_at(mc, "/metadata/uid").to_owned(),
            size,
            port,
            service_port: spec["service"]["port"].as_i64().unwrap_or(port),
            image: spec["image"].as_str().map(str::to_owned),
            args,
            pre_stop: json!(["sleep", pre_stop.to_string()]),
            grace_period: json!(ha["terminationGracePeriodSeconds"].as_i64().unwrap_or(30)),
            resources: need(&spec["resources"], "resources"),
            service_annotations: need(&spec["service"]["annotations"], "service.annotations"),
            pdb_max_unavailable: match &ha["podDisruptionBudget"]["maxUnavailable"] {
                Value::Null => json!(1),
                v => v.clone(),
            },
        }
    }
}

pub fn step_production(env: &E2e) -> Production {
    let ns = env.ns.as_str();
    let path = Path::new(REPO_ROOT).join(PRODUCTION_SAMPLE);
    let path_arg = path.to_string_lossy().into_owned();
    let out = kubectl_ok(&["apply", "-n", ns, "-f", &path_arg]);
    eprint!("{}", indent(&out));
    let mc = kubectl_json(&["get", MC, PRODUCTION, "-n", ns, "-o", "json"]);
    let want = Production::from_spec(&mc);
    eprintln!(
        "    expecting from the sample: {} pods, memcached flags {:?}, preStop {}, grace {}s, resources {}",
        want.size,
        want.args,
        compact(&want.pre_stop),
        want.grace_period,
        compact(&want.resources)
    );

    env.wait(
        &format!("Deployment {PRODUCTION} to match the sample (strategy, flags, preStop, affinity, resources, exporter)"),
        secs(60),
        || {
            let dep = get_required("deployments.apps", ns, PRODUCTION)?;
            check_production_deployment(&dep, &want, true)
        },
    );
    env.wait(
        &format!("Service {PRODUCTION} (memcached and metrics ports, sample annotation) and {PRODUCTION}-headless"),
        secs(60),
        || {
            let svc = get_required("services", ns, PRODUCTION)?;
            check_client_service(&svc, &want, true)?;
            let headless = get_required("services", ns, &format!("{PRODUCTION}-headless"))?;
            check_headless_service(&headless, PRODUCTION, &want.uid, want.port)
        },
    );

    // The pods carry the exporter sidecar and must be admitted under the namespace's restricted standard:
    // a refusal would show as the Deployment's ReplicaFailure, reported as Degraded/ReplicaFailure.
    env.wait(
        &format!(
            "Memcached {PRODUCTION}: {} ready pods (admitted under Pod Security {POD_SECURITY_LEVEL}), Available=True",
            want.size
        ),
        secs(300),
        || {
            if let Some(mc) = get_opt(MC, ns, PRODUCTION)? {
                refuse_replica_failure(&mc);
            }
            check_ready_status(ns, PRODUCTION, want.size)
        },
    );
    let dep = kubectl_json(&[
        "get",
        "deployments.apps",
        PRODUCTION,
        "-n",
        ns,
        "-o",
        "json",
    ]);
    if let Some(c) = deployment_condition(&dep, "ReplicaFailure") {
        assert_ne!(
            c["status"],
            "True",
            "Deployment {PRODUCTION} reports ReplicaFailure (pods refused, e.g. by Pod Security admission): {}",
            compact(c)
        );
    }
    eprintln!("    ok: no ReplicaFailure; pods admitted under {POD_SECURITY_LEVEL}");

    env.wait(
        &format!(
            "PodDisruptionBudget {PRODUCTION} with maxUnavailable {} and a controller ownerReference",
            want.pdb_max_unavailable
        ),
        secs(60),
        || {
            let pdb = get_required(PDB, ns, PRODUCTION)?;
            check_pdb(&pdb, PRODUCTION, &want)
        },
    );
    let servers = env.wait(
        &format!(
            "Memcached {PRODUCTION} status.serverList: {} sorted <podIP>:{} entries of the ready pods",
            want.size, want.port
        ),
        secs(60),
        || check_server_list(ns, PRODUCTION, want.size, want.port),
    );
    eprintln!("    serverList: {servers:?}");
    want
}

pub fn step_exporter_toggle(env: &E2e, want: &Production) {
    let ns = env.ns.as_str();
    for enabled in [false, true] {
        let patch = json!({"spec": {"monitoring": {"exporter": {"enabled": enabled}}}}).to_string();
        kubectl_ok(&[
            "patch",
            MC,
            PRODUCTION,
            "-n",
            ns,
            "--type=merge",
            "-p",
            &patch,
        ]);
        let (containers, ports): (&[&str], &[&str]) = if enabled {
            (&[APP_NAME, EXPORTER_NAME], &[APP_NAME, METRICS_PORT_NAME])
        } else {
            (&[APP_NAME], &[APP_NAME])
        };
        env.wait(
            &format!(
                "exporter enabled={enabled}: pod template containers {containers:?}, Service {PRODUCTION} ports {ports:?}"
            ),
            secs(60),
            || {
                let dep = get_required("deployments.apps", ns, PRODUCTION)?;
                let svc = get_required("services", ns, PRODUCTION)?;
                let mut p = Vec::new();
                let have = names(&dep["spec"]["template"]["spec"]["containers"]);
                if have != containers {
                    p.push(format!("pod template containers are {have:?}"));
                }
                let have = names(&svc["spec"]["ports"]);
                if have != ports {
                    p.push(format!("Service ports are {have:?}"));
                }
                result(p, &json!({"containers": dep["spec"]["template"]["spec"]["containers"], "ports": svc["spec"]["ports"]}))
            },
        );
    }
    env.wait(
        &format!("Deployment {PRODUCTION} to match the sample again, exporter included"),
        secs(30),
        || {
            let dep = get_required("deployments.apps", ns, PRODUCTION)?;
            check_production_deployment(&dep, want, true)?;
            let svc = get_required("services", ns, PRODUCTION)?;
            check_client_service(&svc, want, true)
        },
    );
    env.wait(
        &format!(
            "Memcached {PRODUCTION} to finish rolling out: {} ready pods, Available=True, Progressing=False",
            want.size
        ),
        secs(300),
        || {
            if let Some(mc) = get_opt(MC, ns, PRODUCTION)? {
                refuse_replica_failure(&mc);
            }
            check_ready_status(ns, PRODUCTION, want.size)
        },
    );
}

pub fn step_pdb_lifecycle(env: &E2e, want: &Production) {
    let ns = env.ns.as_str();
    let target = format!("{MC}/{PRODUCTION}");

    kubectl_ok(&["scale", &target, "--replicas=1", "-n", ns]);
    env.wait(
        &format!("PodDisruptionBudget {PRODUCTION} to be deleted at size 1"),
        secs(60),
        || gone(PDB, ns, PRODUCTION),
    );
    env.wait(
        &format!(
            "a Normal event with reason Deleted regarding Memcached {PRODUCTION} (the budget)"
        ),
        secs(30),
        || {
            expect_event(ns, |e| {
                e.type_ == "Normal"
                    && e.reason == "Deleted"
                    && e.kind == "Memcached"
                    && e.name == PRODUCTION
                    && e.note.contains("PodDisruptionBudget")
            })
        },
    );

    kubectl_ok(&["scale", &target, "--replicas=2", "-n", ns]);
    env.wait(
        &format!("PodDisruptionBudget {PRODUCTION} to be back at size 2"),
        secs(60),
        || {
            let pdb = get_required(PDB, ns, PRODUCTION)?;
            check_pdb(&pdb, PRODUCTION, want)
        },
    );

    let patch = r#"{"spec":{"highAvailability":{"podDisruptionBudget":{"enabled":false}}}}"#;
    kubectl_ok(&[
        "patch",
        MC,
        PRODUCTION,
        "-n",
        ns,
        "--type=merge",
        "-p",
        patch,
    ]);
    env.wait(
        &format!(
            "PodDisruptionBudget {PRODUCTION} to be deleted with podDisruptionBudget.enabled=false"
        ),
        secs(60),
        || gone(PDB, ns, PRODUCTION),
    );
    env.hold(
        &format!("PodDisruptionBudget {PRODUCTION} stays deleted"),
        secs(5),
        || gone(PDB, ns, PRODUCTION),
    );

    delete_instance(env, PRODUCTION);
    let headless = format!("{PRODUCTION}-headless");
    for (resource, name) in [
        ("deployments.apps", PRODUCTION),
        ("services", PRODUCTION),
        ("services", headless.as_str()),
    ] {
        env.wait(
            &format!("{resource} {name} to be garbage-collected"),
            secs(120),
            || gone(resource, ns, name),
        );
    }
}

/// The production instance's Deployment: rollout strategy, memcached flags, graceful stop, anti-affinity,
/// resources, restricted security contexts and, when `exporter`, the exporter sidecar.
pub fn check_production_deployment(
    dep: &Value,
    want: &Production,
    exporter: bool,
) -> Result<(), String> {
    let mut p = Vec::new();
    push_err(
        &mut p,
        expect_eq("spec.replicas", &dep["spec"]["replicas"], &json!(want.size)),
    );
    push_err(
        &mut p,
        expect_eq(
            "spec.selector.matchLabels",
            &dep["spec"]["selector"]["matchLabels"],
            &selector_labels(PRODUCTION),
        ),
    );
    push_err(
        &mut p,
        expect_labels(
            "metadata.labels",
            &dep["metadata"]["labels"],
            &common_labels(PRODUCTION),
        ),
    );
    let strategy = &dep["spec"]["strategy"];
    push_err(
        &mut p,
        expect_eq(
            "spec.strategy.type",
            &strategy["type"],
            &json!("RollingUpdate"),
        ),
    );
    push_err(
        &mut p,
        expect_eq(
            "spec.strategy.rollingUpdate",
            &strategy["rollingUpdate"],
            &json!({"maxUnavailable": 0, "maxSurge": 1}),
        ),
    );

    let pod = &dep["spec"]["template"]["spec"];
    let want_containers: &[&str] = if exporter {
        &[APP_NAME, EXPORTER_NAME]
    } else {
        &[APP_NAME]
    };
    let containers = names(&pod["containers"]);
    if containers != want_containers {
        p.push(format!(
            "pod template containers are {containers:?}, want {want_containers:?}"
        ));
    }
    match memcached_container(dep) {
        Err(e) => p.push(e),
        Ok((_, c)) => {
            if let Some(image) = &want.image {
                push_err(
                    &mut p,
                    expect_eq("memcached image", &c["image"], &json!(image)),
                );
            }
            let cmdline = command_line(c);
            for piece in
                std::iter::once(format!("-p {}", want.port)).chain(want.args.iter().cloned())
            {
                if !cmdline.contains(&piece) {
                    p.push(format!(
                        "memcached command line {cmdline:?} lacks {piece:?}"
                    ));
                }
            }
            push_err(
                &mut p,
                expect_eq(
                    "memcached lifecycle.preStop.exec.command",
                    &c["lifecycle"]["preStop"]["exec"]["command"],
                    &want.pre_stop,
                ),
            );
            push_err(
                &mut p,
                expect_eq("memcached resources", &c["resources"], &want.resources),
            );
            p.extend(check_restricted("memcached", c));
        }
    }
    if exporter {
        match named(&pod["containers"], EXPORTER_NAME) {
            None => p.push("no exporter container".into()),
            Some(c) => {
                let ports = c["ports"].as_array().cloned().unwrap_or_default();
                if !ports
                    .iter()
                    .any(|x| x["name"] == METRICS_PORT_NAME && x["containerPort"] == METRICS_PORT)
                {
                    p.push(format!(
                        "exporter has no port {METRICS_PORT_NAME} = {METRICS_PORT}: {}",
                        compact(&c["ports"])
                    ));
                }
                let address = format!("--memcached.address=localhost:{}", want.port);
                if !string_list(&c["args"]).contains(&address) {
                    p.push(format!(
                        "exporter args {} lack {address}",
                        compact(&c["args"])
                    ));
                }
                p.extend(check_restricted("exporter", c));
            }
        }
    }
    push_err(
        &mut p,
        expect_eq(
            "terminationGracePeriodSeconds",
            &pod["terminationGracePeriodSeconds"],
            &want.grace_period,
        ),
    );
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
    let preferred =
        &pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"];
    match preferred.as_array().map(Vec::as_slice) {
        Some([term]) => {
            let affinity_term = &term["podAffinityTerm"];
            push_err(
                &mut p,
                expect_eq(
                    "podAntiAffinity topologyKey",
                    &affinity_term["topologyKey"],
                    &json!(HOSTNAME_TOPOLOGY),
                ),
            );
            push_err(
                &mut p,
                expect_eq(
                    "podAntiAffinity labelSelector.matchLabels",
                    &affinity_term["labelSelector"]["matchLabels"],
                    &selector_labels(PRODUCTION),
                ),
            );
        }
        _ => p.push(format!(
            "expected one preferred podAntiAffinity term (antiAffinity: soft), got {}",
            compact(&pod["affinity"])
        )),
    }
    push_err(&mut p, check_owner(dep, PRODUCTION, &want.uid, true));
    result(p, dep)
}

/// The restricted-profile container security context.
pub fn check_restricted(container: &str, c: &Value) -> Vec<String> {
    let sc = &c["securityContext"];
    let mut p = Vec::new();
    for (field, value, want) in [
        (
            "allowPrivilegeEscalation",
            &sc["allowPrivilegeEscalation"],
            json!(false),
        ),
        (
            "readOnlyRootFilesystem",
            &sc["readOnlyRootFilesystem"],
            json!(true),
        ),
        ("runAsNonRoot", &sc["runAsNonRoot"], json!(true)),
        (
            "capabilities.drop",
            &sc["capabilities"]["drop"],
            json!(["ALL"]),
        ),
    ] {
        push_err(
            &mut p,
            expect_eq(&format!("{container} {field}"), value, &want),
        );
    }
    p
}

/// The client Service of the production instance: its ports (memcached, and metrics with the exporter)
/// and the sample's annotations.
pub fn check_client_service(svc: &Value, want: &Production, exporter: bool) -> Result<(), String> {
    let mut p = Vec::new();
    push_err(
        &mut p,
        check_service(svc, PRODUCTION, &want.uid, want.service_port),
    );
    let mut expected =
        vec![json!({"name": APP_NAME, "port": want.service_port, "targetPort": APP_NAME})];
    if exporter {
        expected.push(json!({"name": METRICS_PORT_NAME, "port": METRICS_PORT, "targetPort": METRICS_PORT_NAME}));
    }
    let ports: Vec<Value> = svc["spec"]["ports"]
        .as_array()
        .map(|ports| {
            ports
                .iter()
                .map(|x| json!({"name": x["name"], "port": x["port"], "targetPort": x["targetPort"]}))
                .collect()
        })
        .unwrap_or_default();
    push_err(
        &mut p,
        expect_eq("spec.ports", &json!(ports), &json!(expected)),
    );
    push_err(
        &mut p,
        expect_labels(
            "metadata.annotations",
            &svc["metadata"]["annotations"],
            &want.service_annotations,
        ),
    );
    result(p, svc)
}

pub fn check_headless_service(
    svc: &Value,
    name: &str,
    mc_uid: &str,
    port: i64,
) -> Result<(), String> {
    let mut p = Vec::new();
    push_err(
        &mut p,
        expect_eq("spec.clusterIP", &svc["spec"]["clusterIP"], &json!("None")),
    );
    let ports = names(&svc["spec"]["ports"]);
    if ports != [APP_NAME] {
        p.push(format!(
            "headless Service ports are {ports:?}, want [memcached]"
        ));
    }
    push_err(
        &mut p,
        expect_eq(
            "spec.ports[0].port",
            &svc["spec"]["ports"][0]["port"],
            &json!(port),
        ),
    );
    check_service_identity(&mut p, svc, name, mc_uid, true);
    result(p, svc)
}

pub fn check_pdb(pdb: &Value, name: &str, want: &Production) -> Result<(), String> {
    let mut p = Vec::new();
    push_err(
        &mut p,
        expect_eq(
            "spec.maxUnavailable",
            &pdb["spec"]["maxUnavailable"],
            &want.pdb_max_unavailable,
        ),
    );
    if !pdb["spec"]["minAvailable"].is_null() {
        p.push(format!(
            "unexpected spec.minAvailable {}",
            pdb["spec"]["minAvailable"]
        ));
    }
    push_err(
        &mut p,
        expect_eq(
            "spec.selector.matchLabels",
            &pdb["spec"]["selector"]["matchLabels"],
            &selector_labels(name),
        ),
    );
    push_err(
        &mut p,
        expect_labels(
            "metadata.labels",
            &pdb["metadata"]["labels"],
            &common_labels(name),
        ),
    );
    push_err(&mut p, check_owner(pdb, name, &want.uid, true));
    result(p, pdb)
}

/// `status.serverList` must hold `size` sorted `<podIP>:<port>` entries, exactly those of the ready pods.
pub fn check_server_list(
    ns: &str,
    name: &str,
    size: i64,
    port: i64,
) -> Result<Vec<String>, String> {
    let mc = get_required(MC, ns, name)?;
    let list = string_list(&mc["status"]["serverList"]);
    let mut ready: Vec<String> = live_pods(ns, name)?
        .iter()
        .filter(|pod| pod_ready(pod))
        .filter_map(|pod| pod["status"]["podIP"].as_str().filter(|ip| !ip.is_empty()))
        .map(|ip| {
            if ip.contains(':') {
                format!("[{ip}]:{port}")
            } else {
                format!("{ip}:{port}")
            }
        })
        .collect();
    ready.sort();
    let mut p = Vec::new();
    if i64::try_from(list.len()).ok() != Some(size) {
        p.push(format!(
            "status.serverList has {} entries, want {size}: {list:?}",
            list.len()
        ));
    }
    if !list.windows(2).all(|w| w[0] < w[1]) {
        p.push(format!(
            "status.serverList is not sorted (or has duplicates): {list:?}"
        ));
    }
    if list != ready {
        p.push(format!(
            "status.serverList {list:?} != the ready pods' <podIP>:{port} {ready:?}"
        ));
    }
    if p.is_empty() {
        Ok(list)
    } else {
        Err(p.join("; "))
    }
}

/// Fails the test at once when pods are refused (the Deployment's ReplicaFailure, e.g. Pod Security
/// admission): waiting longer cannot help.
pub fn refuse_replica_failure(mc: &Value) {
    if let Some(c) = condition(mc, "Degraded")
        && c["status"] == "True"
        && c["reason"] == "ReplicaFailure"
    {
        panic!(
            "Memcached {} is Degraded with reason ReplicaFailure: its pods are refused (in a namespace \
             enforcing Pod Security {POD_SECURITY_LEVEL}): {}",
            mc["metadata"]["name"],
            compact(c)
        );
    }
}
