//! The Helm chart installed, upgraded, rolled back and uninstalled with Helm's own actions (Helm v4's
//! library from PyPI's helm-python-sdk, through hack/helm_chart.py) against a real control plane.
//!
//! Helm creates every object of the chart, its Deployment included; the stand-in kubelet runs no operator
//! image, so each release's operator runs as a process instead, with exactly the arguments and
//! environment of the Deployment Helm stored in the release (read back with `helm status`), under a token
//! of the release's ServiceAccount: what the release's RBAC does not allow fails here as in a cluster.
//!
//! `helm test` runs the chart's test pod for real: the stand-in kubelet runs a pod of the operator's image
//! that runs once as the operator binary (`memcached-operator check`) under a token of the pod's
//! ServiceAccount, and reports it Succeeded or Failed by its exit code (`envtest::kubelet::oneshot`).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use envtest::{Env, Mark, Operator};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, Client};
use memcached_operator::api::Memcached;
use serde_json::{Value, json};

use crate::instances::{conditions, settled};
use crate::{FIELD_MANAGER, OPERATOR_BIN, REPO_ROOT, options, wait_for};
use envtest::kubelet::oneshot;

const CHART: &str = "charts/memcached-operator";
/// The chart as it is on main before the templated CRD (crds/ directory), packaged from git by
/// `hack/helm_chart.py package-from-git 3ab9e5e tests/fixtures/chart`.
const MAIN_CHART: &str = "tests/fixtures/chart/memcached-operator-0.1.0-main-3ab9e5e.tgz";
const CRD: &str = "memcacheds.cache.example.com";
/// The operator's default Lease name (`--leader-election-id`).
const DEFAULT_LEASE: &str = "memcached-operator.cache.example.com";

/// A control plane of the scenario's own (the releases create cluster-scoped objects and the CRD), or
/// `None` after printing the skip line.
async fn start(name: &str) -> Option<Env> {
    let Some(assets) = envtest::assets() else {
        envtest::skip(name);
        return None;
    };
    if let Err(reason) = helm_available() {
        envtest::skip_because(name, &reason);
        return None;
    }
    let env = Env::start(&assets, options())
        .await
        .unwrap_or_else(|e| panic!("envtest for {name}: {e:#}"));
    eprintln!(
        "[{name}] control plane up in {:.2}s ({})",
        env.started_in().as_secs_f64(),
        env.control_plane().dir().display()
    );
    Some(env)
}

fn helm_available() -> Result<(), String> {
    let out = Command::new("python3")
        .args(["-c", "import helm_python"])
        .output()
        .map_err(|e| format!("cannot run python3: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err("helm-python-sdk is not installed (pip install helm-python-sdk)".into())
    }
}

/// One Helm action through hack/helm_chart.py: its JSON answer, or Helm's error message.
fn helm(env: &Env, args: &[&str]) -> Result<Value, String> {
    helm_with(env.kubeconfig(), args)
}

/// `helm test` of the release, off the test's runtime: the stand-in kubelet's tasks run on it, and
/// must run the test pod while Helm waits for it.
async fn helm_test(env: &Env, release: &str, namespace: &str) -> Result<Value, String> {
    let kubeconfig = env.kubeconfig().to_owned();
    let args = [release.to_owned(), namespace.to_owned()];
    tokio::task::spawn_blocking(move || {
        helm_with(&kubeconfig, &["test", &args[0], &args[1], "120"])
    })
    .await
    .expect("helm test ran")
}

fn helm_with(kubeconfig: &Path, args: &[&str]) -> Result<Value, String> {
    let (verb, rest) = args.split_first().expect("a verb");
    let out = Command::new("python3")
        .current_dir(REPO_ROOT)
        .arg("hack/helm_chart.py")
        .arg(verb)
        .arg(kubeconfig)
        .args(rest)
        .output()
        .expect("python3 runs");
    let answer: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "helm {verb}: no JSON ({e}): {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    match answer["error"].as_str() {
        Some(error) => Err(error.to_owned()),
        None => Ok(answer),
    }
}

fn install(env: &Env, chart: &str, release: &str, namespace: &str, values: Value) -> Value {
    helm(
        env,
        &["install", chart, release, namespace, &values.to_string()],
    )
    .unwrap_or_else(|e| panic!("helm install {release} -n {namespace} {values}: {e}"))
}

fn upgrade(env: &Env, chart: &str, release: &str, namespace: &str, values: Value) -> Value {
    helm(
        env,
        &["upgrade", chart, release, namespace, &values.to_string()],
    )
    .unwrap_or_else(|e| panic!("helm upgrade {release} -n {namespace} {values}: {e}"))
}

/// The objects of the release's current manifest, as Helm stored it.
fn manifest(env: &Env, release: &str, namespace: &str) -> Vec<Value> {
    let status = helm(env, &["status", release, namespace]).unwrap();
    let text = status["manifest"].as_str().expect("a manifest").to_owned();
    serde_saphyr::from_multiple::<Value>(&text)
        .expect("the manifest is YAML")
        .into_iter()
        .filter(|o| !o.is_null())
        .collect()
}

/// A release's operator, run as its Deployment says, under its ServiceAccount.
struct ReleaseOperator {
    operator: Operator,
    /// The user the API server sees.
    user: String,
    /// The Lease it leads.
    lease: String,
}

async fn start_operator(env: &Env, release: &str, namespace: &str, pod: &str) -> ReleaseOperator {
    let objects = manifest(env, release, namespace);
    let deployment = objects
        .iter()
        .find(|o| o["kind"] == "Deployment")
        .expect("the release's Deployment");
    let spec = &deployment["spec"]["template"]["spec"];
    let container = &spec["containers"][0];
    let args: Vec<String> = container["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_owned())
        // `run` is the process's; the ports are free ones on loopback (many operators share the host).
        .filter(|a| {
            a != "run"
                && !a.starts_with("--metrics-bind-address")
                && !a.starts_with("--health-probe-bind-address")
        })
        .collect();
    let mut vars = vec![
        ("POD_NAME".to_owned(), pod.to_owned()),
        ("POD_NAMESPACE".to_owned(), namespace.to_owned()),
    ];
    for var in container["env"].as_array().unwrap() {
        let name = var["name"].as_str().unwrap();
        let value = match (&var["value"], &var["valueFrom"]["fieldRef"]["fieldPath"]) {
            (Value::String(v), _) => v.clone(),
            (_, Value::String(path)) if path == "metadata.namespace" => namespace.to_owned(),
            _ => continue, // POD_NAME, set above
        };
        if name != "POD_NAME" && name != "POD_NAMESPACE" {
            vars.push((name.to_owned(), value));
        }
    }
    let account = spec["serviceAccountName"].as_str().unwrap();
    let client = env.client();
    let token = wait_for(
        &format!("a token of {namespace}/{account}"),
        Duration::from_secs(20),
        || async {
            envtest::install::service_account_token(client, namespace, account)
                .await
                .map_err(|e| format!("{e:#}"))
        },
    )
    .await;
    let user = format!("system:serviceaccount:{namespace}:{account}");
    let plane = env.control_plane();
    let kubeconfig = plane
        .dir()
        .join(format!("{namespace}-{release}.kubeconfig"));
    envtest::kubeconfig::write(
        &kubeconfig,
        plane.server(),
        plane.ca_cert(),
        (&user, &token),
        Some(namespace),
    )
    .unwrap();
    let log = plane
        .dir()
        .join(format!("operator-{namespace}-{release}.log"));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let vars: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let mut operator =
        Operator::start_with_env(Path::new(OPERATOR_BIN), &kubeconfig, &args, &vars, &log)
            .unwrap_or_else(|e| panic!("{e:#}"));
    operator
        .wait_ready(Duration::from_secs(60))
        .await
        .unwrap_or_else(|e| panic!("{release} in {namespace}: {e:#}\n{}", operator.log_tail(40)));
    let lease = args
        .iter()
        .find_map(|a| a.strip_prefix("--leader-election-id="))
        .unwrap_or(DEFAULT_LEASE)
        .to_owned();
    ReleaseOperator {
        operator,
        user,
        lease,
    }
}

/// Waits until `pod` holds the Lease `name` in `namespace`.
async fn wait_leads(client: &Client, namespace: &str, name: &str, pod: &str) {
    let leases: Api<Lease> = Api::namespaced(client.clone(), namespace);
    wait_for(
        &format!("{pod} to hold Lease {namespace}/{name}"),
        Duration::from_secs(60),
        || async {
            let lease = leases.get_opt(name).await.map_err(|e| e.to_string())?;
            let holder = lease.and_then(|l| l.spec).and_then(|s| s.holder_identity);
            match holder {
                Some(h) if h == pod => Ok(()),
                other => Err(format!("holder {other:?}")),
            }
        },
    )
    .await;
}

async fn apply_instance(client: &Client, namespace: &str, name: &str, spec: Value) {
    let api: Api<Memcached> = Api::namespaced(client.clone(), namespace);
    let object = json!({
        "apiVersion": "cache.example.com/v1alpha1",
        "kind": "Memcached",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    });
    api.patch(
        name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&object),
    )
    .await
    .unwrap_or_else(|e| panic!("applying Memcached {namespace}/{name}: {e}"));
}

async fn wait_instance_settled(client: &Client, namespace: &str, name: &str) -> Memcached {
    let api: Api<Memcached> = Api::namespaced(client.clone(), namespace);
    wait_for(
        &format!("Memcached {namespace}/{name} to settle"),
        Duration::from_secs(90),
        || async {
            let mc = api.get(name).await.map_err(|e| e.to_string())?;
            if settled(&mc) {
                Ok(mc)
            } else {
                Err(conditions(&mc))
            }
        },
    )
    .await
}

/// The users that wrote (patch, update, create) Memcached objects or their status in `namespace` since
/// `mark`.
fn instance_writers(env: &Env, mark: &Mark, namespace: &str) -> BTreeSet<String> {
    env.control_plane()
        .audit()
        .read_since(mark)
        .expect("the audit log")
        .into_iter()
        .filter(|e| {
            e.resource == "memcacheds"
                && e.namespace == namespace
                && ["patch", "update", "create"].contains(&e.verb.as_str())
                && e.user.starts_with("system:serviceaccount:")
        })
        .map(|e| e.user)
        .collect()
}

/// `(uid, name)` of the memcached pods of instance `name`.
async fn pod_uids(client: &Client, namespace: &str, name: &str) -> BTreeSet<(String, String)> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let selector = format!("app.kubernetes.io/instance={name}");
    pods.list(&ListParams::default().labels(&selector))
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|p| (p.metadata.uid.unwrap(), p.metadata.name.unwrap()))
        .collect()
}

/// Names of the ClusterRoles and ClusterRoleBindings labelled as release `release`'s.
async fn cluster_scoped(client: &Client, release: &str) -> BTreeSet<String> {
    let selector =
        format!("app.kubernetes.io/instance={release},app.kubernetes.io/managed-by=Helm");
    let params = ListParams::default().labels(&selector);
    let roles: Api<ClusterRole> = Api::all(client.clone());
    let bindings: Api<ClusterRoleBinding> = Api::all(client.clone());
    let mut names: BTreeSet<String> = roles
        .list(&params)
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|r| format!("ClusterRole/{}", r.metadata.name.unwrap()))
        .collect();
    names.extend(
        bindings
            .list(&params)
            .await
            .unwrap()
            .items
            .into_iter()
            .map(|b| format!("ClusterRoleBinding/{}", b.metadata.name.unwrap())),
    );
    names
}

/// The cluster-scoped objects (CRD aside) a release's manifest lists.
fn manifest_cluster_scoped(objects: &[Value]) -> BTreeSet<String> {
    objects
        .iter()
        .filter(|o| o["kind"] == "ClusterRole" || o["kind"] == "ClusterRoleBinding")
        .map(|o| {
            format!(
                "{}/{}",
                o["kind"].as_str().unwrap(),
                o["metadata"]["name"].as_str().unwrap()
            )
        })
        .collect()
}

fn repo_path(path: &str) -> String {
    PathBuf::from(REPO_ROOT).join(path).display().to_string()
}

#[tokio::test]
async fn chart_releases_side_by_side_each_lead_and_reconcile_their_own() {
    const NAME: &str = "chart_releases_side_by_side";
    let Some(env) = start(NAME).await else {
        return;
    };
    let client = env.client().clone();
    for namespace in ["team-a", "team-b", "ops", "apps-a", "apps-b"] {
        envtest::create_namespace(&client, namespace, &[])
            .await
            .unwrap();
    }
    let chart = repo_path(CHART);
    // Two tenants' releases of the same name, each watching its own namespace; two releases in one
    // namespace, each watching a namespace of its own.
    let releases = [
        (
            "cache",
            "team-a",
            json!({"watch": {"scope": "namespace"}}),
            "team-a",
        ),
        (
            "cache",
            "team-b",
            json!({"watch": {"scope": "namespace"}}),
            "team-b",
        ),
        (
            "a",
            "ops",
            json!({"watch": {"scope": "namespace", "namespace": "apps-a"}}),
            "apps-a",
        ),
        (
            "b",
            "ops",
            json!({"watch": {"scope": "namespace", "namespace": "apps-b"}}),
            "apps-b",
        ),
    ];
    for (release, namespace, values, _) in &releases {
        let answer = install(&env, &chart, release, namespace, values.clone());
        assert_eq!(answer["status"], "deployed", "{answer}");
    }
    eprintln!("[{NAME}] four releases installed by helm install");
    // The CRD belongs to the first release; the others left it alone and said so.
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd = crds.get(CRD).await.unwrap();
    let annotations = crd.metadata.annotations.unwrap_or_default();
    assert_eq!(annotations["meta.helm.sh/release-namespace"], "team-a");
    assert_eq!(annotations["helm.sh/resource-policy"], "keep");

    let mark = env.control_plane().audit().mark().unwrap();
    let mut operators = Vec::new();
    for (release, namespace, _, _) in &releases {
        let pod = format!("{release}-{namespace}-pod");
        let operator = start_operator(&env, release, namespace, &pod).await;
        wait_leads(&client, namespace, &operator.lease, &pod).await;
        operators.push(operator);
    }
    let leases: BTreeSet<(String, String)> = releases
        .iter()
        .zip(&operators)
        .map(|((_, ns, _, _), o)| ((*ns).to_owned(), o.lease.clone()))
        .collect();
    assert_eq!(leases.len(), 4, "one Lease per release: {leases:?}");
    eprintln!("[{NAME}] each release's operator leads its own Lease: {leases:?}");

    for (_, _, _, watched) in &releases {
        apply_instance(&client, watched, "cache", json!({"size": 1})).await;
    }
    for ((_, _, _, watched), operator) in releases.iter().zip(&operators) {
        wait_instance_settled(&client, watched, "cache").await;
        let writers = instance_writers(&env, &mark, watched);
        assert_eq!(
            writers,
            BTreeSet::from([operator.user.clone()]),
            "only the watching release's operator writes the instances of {watched}"
        );
    }
    eprintln!("[{NAME}] each instance settled, written by its own release's operator only");
    for mut operator in operators {
        operator.operator.stop();
    }
}

#[tokio::test]
async fn chart_upgrade_from_main_rollback_and_uninstall() {
    const NAME: &str = "chart_upgrade_from_main";
    let Some(env) = start(NAME).await else {
        return;
    };
    let client = env.client().clone();
    let (release, namespace) = ("memcached-operator", "memcached-operator-system");
    envtest::create_namespace(&client, namespace, &[])
        .await
        .unwrap();
    envtest::create_namespace(&client, "apps", &[])
        .await
        .unwrap();

    // The chart as it is on main: the CRD from crds/, which Helm installs once and never upgrades.
    install(&env, &repo_path(MAIN_CHART), release, namespace, json!({}));
    let installed_by_main = cluster_scoped(&client, release).await;
    let mut operator = start_operator(&env, release, namespace, "op-1").await;
    // An instance using the newest fields of the API.
    let spec = json!({"size": 2, "clients": {"hashing": "ketama"}, "handover": {"enabled": true}});
    apply_instance(&client, "apps", "cache", spec.clone()).await;
    wait_instance_settled(&client, "apps", "cache").await;
    let pods_before = pod_uids(&client, "apps", "cache").await;
    assert_eq!(pods_before.len(), 2);
    eprintln!("[{NAME}] main's chart installed; instance settled on {pods_before:?}");

    // helm upgrade to this chart: nothing applied by hand.
    let mark = env.control_plane().audit().mark().unwrap();
    let answer = upgrade(&env, &repo_path(CHART), release, namespace, json!({}));
    assert_eq!(answer["status"], "deployed", "{answer}");
    let notes = answer["notes"].as_str().unwrap_or_default();
    assert!(notes.contains("CRD was installed or updated"), "{notes}");
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd = crds.get(CRD).await.unwrap();
    let annotations = crd.metadata.annotations.clone().unwrap_or_default();
    assert_eq!(annotations["meta.helm.sh/release-name"], release);
    // The CRD was written by Helm during the upgrade (the hook that takes it over from crds/).
    let crd_writes = env
        .control_plane()
        .audit()
        .read_since(&mark)
        .unwrap()
        .into_iter()
        .filter(|e| e.resource == "customresourcedefinitions" && e.name == CRD)
        .filter(|e| ["patch", "update", "create"].contains(&e.verb.as_str()))
        .count();
    assert!(crd_writes > 0, "the upgrade did not write the CRD");
    // A second upgrade adopts it as a template of the release.
    upgrade(&env, &repo_path(CHART), release, namespace, json!({}));
    assert!(
        manifest(&env, release, namespace)
            .iter()
            .any(|o| o["kind"] == "CustomResourceDefinition"),
        "the CRD is part of the release after the second upgrade"
    );
    eprintln!("[{NAME}] upgraded twice: the CRD taken over from crds/, then adopted");

    // The new operator (a rollout of the operator's Deployment) takes over the running instance.
    operator.operator.stop();
    let mut operator = start_operator(&env, release, namespace, "op-2").await;
    wait_instance_settled(&client, "apps", "cache").await;
    let api: Api<Memcached> = Api::namespaced(client.clone(), "apps");
    let mc = serde_json::to_value(api.get("cache").await.unwrap()).unwrap();
    assert_eq!(mc["spec"]["clients"]["hashing"], "ketama");
    assert_eq!(mc["spec"]["handover"]["enabled"], true);
    assert_eq!(
        pod_uids(&client, "apps", "cache").await,
        pods_before,
        "no memcached pod replaced by the upgrade"
    );
    eprintln!("[{NAME}] fields kept, no pod replaced");

    // Rollback to main's chart: the cluster-scoped objects are main's again, nothing left over; the CRD
    // (resource-policy keep) and the instance stay.
    helm(&env, &["rollback", release, namespace, "1"]).unwrap();
    assert_eq!(cluster_scoped(&client, release).await, installed_by_main);
    assert_eq!(
        manifest_cluster_scoped(&manifest(&env, release, namespace)),
        installed_by_main
    );
    assert!(crds.get_opt(CRD).await.unwrap().is_some());
    assert!(api.get_opt("cache").await.unwrap().is_some());
    eprintln!("[{NAME}] rolled back: {installed_by_main:?}");

    // Forward again, then uninstall: no ClusterRole or binding of the release remains; the CRD and the
    // instance stay.
    upgrade(&env, &repo_path(CHART), release, namespace, json!({}));
    helm(&env, &["uninstall", release, namespace]).unwrap();
    assert_eq!(cluster_scoped(&client, release).await, BTreeSet::new());
    assert!(crds.get_opt(CRD).await.unwrap().is_some(), "crds.keep");
    assert!(api.get_opt("cache").await.unwrap().is_some());
    eprintln!("[{NAME}] uninstalled: no cluster-scoped object left; CRD and instance kept");

    // A bad value is refused by the schema, naming the key, and installs nothing.
    let refused = helm(
        &env,
        &[
            "install",
            &repo_path(CHART),
            release,
            namespace,
            &json!({"crds": {"keep": "yes"}}).to_string(),
        ],
    )
    .expect_err("the schema refuses crds.keep: yes");
    assert!(refused.contains("/crds/keep"), "{refused}");
    assert_eq!(cluster_scoped(&client, release).await, BTreeSet::new());
    operator.operator.stop();
}

/// The name of a ready pod of release `release`'s operator Deployment (the stand-in kubelet reports it
/// Running and Ready, and runs nothing in it).
async fn operator_pod(client: &Client, namespace: &str, release: &str) -> String {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let selector = format!("control-plane=controller-manager,app.kubernetes.io/instance={release}");
    wait_for(
        &format!("a ready pod of {namespace}/{release}'s operator Deployment"),
        Duration::from_secs(60),
        || async {
            let list = pods
                .list(&ListParams::default().labels(&selector))
                .await
                .map_err(|e| e.to_string())?;
            list.items
                .into_iter()
                .find(|p| {
                    p.status
                        .as_ref()
                        .and_then(|s| s.conditions.as_ref())
                        .is_some_and(|cs| {
                            cs.iter().any(|c| c.type_ == "Ready" && c.status == "True")
                        })
                })
                .map(|p| p.metadata.name.unwrap_or_default())
                .ok_or_else(|| "none ready yet".to_owned())
        },
    )
    .await
}

/// What the test pod's process wrote since `from` bytes into its log.
fn check_output(env: &Env, namespace: &str, pod: &str, from: usize) -> String {
    let log = oneshot::log_path(&env.control_plane().dir().join("kubelet"), namespace, pod);
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    text.get(from..).unwrap_or_default().to_owned()
}

#[tokio::test]
async fn chart_helm_test_passes_only_while_the_operator_answers() {
    const NAME: &str = "chart_helm_test";
    let Some(env) = start(NAME).await else {
        return;
    };
    let client = env.client().clone();
    let (release, namespace) = ("cache", "cache-system");
    let test_pod = "cache-memcached-operator-helm-test";
    // The "restricted" Pod Security Standard enforced: the API server admits the test pod (and the
    // operator's, and the sample's memcached pod) only if it meets it.
    envtest::create_namespace(
        &client,
        namespace,
        &[("pod-security.kubernetes.io/enforce", "restricted")],
    )
    .await
    .unwrap();
    let answer = install(
        &env,
        &repo_path(CHART),
        release,
        namespace,
        json!({"tests": {"timeout": "40s"}}),
    );
    let notes = answer["notes"].as_str().unwrap_or_default();
    assert!(notes.contains("helm test cache -n cache-system"), "{notes}");
    let pod = operator_pod(&client, namespace, release).await;
    eprintln!(
        "[{NAME}] installed; the operator's pod {pod} is ready as status only, no operator runs"
    );

    // No operator: its Deployment looks available, but nobody leads, so the test fails.
    let failed = helm_test(&env, release, namespace)
        .await
        .expect_err("helm test must fail while no operator runs");
    let output = check_output(&env, namespace, test_pod, 0);
    assert!(
        output.contains("ok: Deployment cache-system/cache-memcached-operator-controller-manager")
            && output.contains("check failed: the leader Lease cache-system/cache-memcached-operator.cache.example.com"),
        "the check must fail on the Lease:\n{output}\nhelm: {failed}"
    );
    let instances: Api<Memcached> = Api::namespaced(client.clone(), namespace);
    assert!(
        instances.get_opt(test_pod).await.unwrap().is_none(),
        "no sample instance is left behind"
    );
    eprintln!(
        "[{NAME}] helm test failed without an operator: {}",
        output.trim()
    );

    // The operator runs as the Deployment's pod (its identity in the Lease): the test passes.
    let mut operator = start_operator(&env, release, namespace, &pod).await;
    let mark = env.control_plane().audit().mark().unwrap();
    let from = output.len();
    let passed = helm_test(&env, release, namespace).await;
    let output = check_output(&env, namespace, test_pod, from);
    let answer = passed.unwrap_or_else(|e| {
        panic!(
            "helm test: {e}\n{output}\n{}",
            operator.operator.log_tail(30)
        )
    });
    for line in [
        "ok: Deployment cache-system/cache-memcached-operator-controller-manager: 1 of 1 replicas available",
        &format!(
            "ok: Lease cache-system/cache-memcached-operator.cache.example.com: held and renewed by pod {pod}"
        ),
        "ok: Memcached cache-system/cache-memcached-operator-helm-test: Available",
        "ok: Memcached cache-system/cache-memcached-operator-helm-test deleted",
    ] {
        assert!(
            output.contains(line),
            "{line:?} missing from:\n{output}\n{answer}"
        );
    }
    eprintln!("[{NAME}] helm test passed:\n{}", output.trim());

    // Least privilege that is enough: the test's ServiceAccount created the sample and was refused
    // nothing; the operator made it Available.
    let tester = format!("system:serviceaccount:{namespace}:{test_pod}");
    let events = env.control_plane().audit().read_since(&mark).unwrap();
    let refused: Vec<String> = events
        .iter()
        .filter(|e| e.user == tester && e.code == 403)
        .map(|e| format!("{} {} {}", e.verb, e.resource, e.name))
        .collect();
    assert!(refused.is_empty(), "the test pod was refused {refused:?}");
    assert!(
        events.iter().any(|e| e.user == tester
            && e.verb == "create"
            && e.resource == "memcacheds"
            && e.code == 201),
        "the test pod created the sample itself"
    );
    assert!(
        events
            .iter()
            .any(|e| e.user == operator.user && e.resource == "memcacheds" && e.name == test_pod),
        "the operator reconciled the sample"
    );
    // The hooks went with the passed test (hook-succeeded), and the sample with the check.
    assert!(instances.get_opt(test_pod).await.unwrap().is_none());
    let gone = |found: bool, what: &str| assert!(!found, "{what} {test_pod} is left");
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    wait_for(
        "the test pod to be deleted",
        Duration::from_secs(30),
        || async {
            match pods.get_opt(test_pod).await {
                Ok(None) => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), namespace);
    gone(
        accounts.get_opt(test_pod).await.unwrap().is_some(),
        "ServiceAccount",
    );
    let roles: Api<Role> = Api::namespaced(client.clone(), namespace);
    gone(roles.get_opt(test_pod).await.unwrap().is_some(), "Role");
    let bindings: Api<RoleBinding> = Api::namespaced(client.clone(), namespace);
    gone(
        bindings.get_opt(test_pod).await.unwrap().is_some(),
        "RoleBinding",
    );
    operator.operator.stop();
}
