//! The test environment: the namespace, the install, the operator processes, diagnostics after a
//! failure, and the cleanup that runs when [`E2e`] is dropped (also after a failed assertion).

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use std::{fs, thread};

use serde_json::{Value, json};

use crate::http::{http_get, port_for, two_free_ports};
use crate::kubectl::{
    absolute_ca_path, apply_yaml_ok, compact, gone, indent, items, kubectl, kubectl_bin,
    kubectl_json, kubectl_ok, object_key, quiet_kubectl, run, run_kubectl, secs, shell_words,
    split_yaml_documents, top_level_kind, truncate, try_kubectl, try_kubectl_json, write_private,
    yaml_str,
};
use crate::names::{
    BAD_IMAGE, CLEANUP_STEP, CRD, FIELD_MANAGER, KUBECTL_TIMEOUT_SECS, LEASE, MC, OPERATOR_BIN,
    OPERATOR_NS, PDB, POD_SECURITY_LEVEL, POLL, REPO_ROOT, SERVICE_ACCOUNT, SERVICE_MONITORS,
};
use crate::poll::{hold_for, wait_for};
use crate::timings::Timings;

/// One operator process started by the test.
pub struct Operator {
    pub info: OpInfo,
    pub child: Child,
    /// False once the test stops it on purpose, so its exit is not reported as a crash.
    pub expect_running: bool,
}

/// What the test needs to know about an operator process.
#[derive(Clone)]
pub struct OpInfo {
    pub index: usize,
    pub label: String,
    /// The POD_NAME given to it; the leader Lease's holderIdentity must contain it.
    pub identity: String,
    pub pid: u32,
    pub probe_port: u16,
    pub metrics_port: u16,
    pub log: PathBuf,
}

/// Shared state of the run; its `Drop` is the cleanup step, so it also runs after a failed assertion.
pub struct E2e {
    pub started: Instant,
    pub ns: String,
    pub dir: PathBuf,
    pub keep: bool,
    pub ns_created: bool,
    pub kubeconfig: Option<PathBuf>,
    /// The rendered install manifest (without the Deployment), once written.
    pub install_manifest: Option<PathBuf>,
    /// Install objects ("Kind/namespace/name") that existed before the test; they are left in place.
    /// `None` means this could not be determined, and then nothing is uninstalled.
    pub preexisting: Option<BTreeSet<String>>,
    pub operators: RefCell<Vec<Operator>>,
    pub timings: RefCell<Timings>,
}

impl E2e {
    pub fn new() -> Self {
        let pid = std::process::id();
        let stamp = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or_default();
        let ns = format!("memcached-e2e-{pid}-{}", stamp % 1_000_000);
        let dir = std::env::temp_dir().join(format!("memcached-e2e-{pid}-{stamp}"));
        fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
        let started = Instant::now();
        E2e {
            started,
            timings: RefCell::new(Timings::new(started)),
            ns,
            dir,
            keep: std::env::var("E2E_KEEP").is_ok_and(|v| v == "1"),
            ns_created: false,
            kubeconfig: None,
            install_manifest: None,
            preexisting: None,
            operators: RefCell::new(Vec::new()),
        }
    }

    pub fn step(&self, n: u32, title: &str) {
        self.timings.borrow_mut().begin(n, title);
        eprintln!(
            "\n==> step {n}: {title}  [t+{}s]",
            self.started.elapsed().as_secs()
        );
    }

    /// Creates the test namespace, enforcing (and warning and auditing with) the `restricted` Pod Security
    /// Standard, so every pod the operator makes in it must meet that standard to be admitted.
    pub fn create_test_namespace(&mut self) {
        self.ns_created = true;
        let psa: String = ["enforce", "warn", "audit"]
            .iter()
            .map(|mode| {
                format!(
                    "    pod-security.kubernetes.io/{mode}: {POD_SECURITY_LEVEL}\n    \
                     pod-security.kubernetes.io/{mode}-version: latest\n"
                )
            })
            .collect();
        apply_yaml_ok(&format!(
            "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {}\n  labels:\n    app.kubernetes.io/created-by: {FIELD_MANAGER}\n{psa}",
            self.ns
        ));
    }

    /// The namespace carries the Pod Security labels, and the API server enforces them: a server-side dry run
    /// of a pod without any security context must be refused. Where it is not (Pod Security admission
    /// disabled), the later "admitted under restricted" checks prove nothing, which is reported loudly.
    pub fn check_pod_security(&self) {
        let ns = self.ns.as_str();
        let namespace = kubectl_json(&["get", "namespace", ns, "-o", "json"]);
        for mode in ["enforce", "warn", "audit"] {
            let key = format!("pod-security.kubernetes.io/{mode}");
            assert_eq!(
                namespace["metadata"]["labels"][&key],
                json!(POD_SECURITY_LEVEL),
                "namespace {ns} should be labelled {key}={POD_SECURITY_LEVEL}: {}",
                compact(&namespace["metadata"]["labels"])
            );
        }
        let probe = format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: e2e-psa-probe\n  namespace: {ns}\n\
             spec:\n  containers:\n  - name: probe\n    image: {BAD_IMAGE}\n"
        );
        let out = run_kubectl(&["apply", "--dry-run=server", "-f", "-"], Some(&probe));
        let stderr = String::from_utf8_lossy(&out.stderr).trim().to_owned();
        if out.status.success() {
            eprintln!(
                "    WARNING: a pod without a security context was admitted (server-side dry run) in {ns}: Pod \
                 Security admission does not enforce here, so steps 12 to 18 cannot show that the operator's \
                 pods meet the restricted standard"
            );
        } else if stderr.contains("PodSecurity") {
            eprintln!(
                "    ok: Pod Security admission refuses a non-compliant pod in {ns}: {}",
                truncate(&stderr, 300)
            );
        } else {
            panic!(
                "the server-side dry run of a non-compliant pod in {ns} failed, but not because of Pod \
                 Security admission: {stderr}"
            );
        }
    }

    /// Renders config/default, applies everything except Deployments, and waits for the CRD.
    pub fn install(&mut self) {
        let render = run(
            "kubectl",
            &kubectl_bin(),
            &["kustomize", "config/default"],
            None,
            Some(Path::new(REPO_ROOT)),
            secs(KUBECTL_TIMEOUT_SECS),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert!(
            render.status.success(),
            "`kubectl kustomize config/default` failed in {REPO_ROOT}:\n{}",
            String::from_utf8_lossy(&render.stderr)
        );
        let rendered = String::from_utf8_lossy(&render.stdout).into_owned();
        let mut kept = Vec::new();
        let mut kinds = Vec::new();
        for doc in split_yaml_documents(&rendered) {
            let kind = top_level_kind(&doc).unwrap_or_default();
            if kind == "Deployment" {
                eprintln!(
                    "    not applying the operator Deployment (the operator runs as a local process)"
                );
                continue;
            }
            kinds.push(kind);
            kept.push(doc);
        }
        for needed in [
            "Namespace",
            "CustomResourceDefinition",
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
            "Role",
            "RoleBinding",
        ] {
            assert!(
                kinds.iter().any(|k| k == needed),
                "`kubectl kustomize config/default` rendered no {needed} (kinds: {kinds:?})"
            );
        }
        eprintln!("    applying {} objects: {}", kinds.len(), kinds.join(", "));
        let manifest = kept.iter().map(|d| format!("---\n{d}")).collect::<String>();
        let path = self.dir.join("install.yaml");
        fs::write(&path, &manifest)
            .unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
        let path_arg = path.to_string_lossy().into_owned();

        // Remember what exists already, so that cleanup removes only what this test created.
        self.preexisting = match try_kubectl_json(&[
            "get",
            "-f",
            &path_arg,
            "--ignore-not-found",
            "-o",
            "json",
        ]) {
            Ok(v) => Some(items(&v).iter().map(object_key).collect()),
            Err(e) => {
                eprintln!(
                    "    WARNING: cannot tell which install objects exist already ({e}); they will not be uninstalled"
                );
                None
            }
        };
        if let Some(pre) = self.preexisting.as_ref().filter(|p| !p.is_empty()) {
            eprintln!("    already present (left in place on cleanup): {pre:?}");
        }
        self.install_manifest = Some(path);

        let out = run_kubectl(
            &[
                "apply",
                "--server-side",
                "--force-conflicts",
                "--field-manager",
                FIELD_MANAGER,
                "-f",
                "-",
            ],
            Some(&manifest),
        );
        assert!(
            out.status.success(),
            "applying the install manifest failed:\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        eprint!("{}", indent(&String::from_utf8_lossy(&out.stdout)));

        kubectl_ok(&[
            "wait",
            "--for=condition=Established",
            &format!("crd/{CRD}"),
            &format!("--timeout={}s", secs(60).as_secs()),
        ]);
        let ns = self.ns.clone();
        self.wait(
            "kubectl to discover the memcacheds resource",
            secs(30),
            || try_kubectl(&["get", MC, "-n", &ns]).map(drop),
        );
    }

    /// Sanity check of the RBAC the operator will run with (cluster admins may impersonate).
    pub fn check_rbac(&self) {
        let ns = self.ns.as_str();
        let checks: [(&[&str], bool, bool); 12] = [
            (&["create", "deployments.apps", "-n", ns], true, true),
            (&["delete", "namespaces"], false, true),
            // Secrets are read (for their hash); the one the operator writes is the servers' auth file,
            // `<name>-auth-file` (the opt-in admission policy confines it to labelled Secrets).
            (&["get", "secrets", "-n", ns], true, true),
            (&["watch", "secrets", "-n", ns], true, true),
            (&["create", "secrets", "-n", ns], true, true),
            // No binding of roles it does not hold, no escalation.
            (&["bind", "clusterroles", "-n", ns], false, true),
            (&["delete", PDB, "-n", ns], true, true),
            (&["create", SERVICE_MONITORS, "-n", ns], true, false),
            (&["create", "services", "-n", ns], true, false),
            (&["watch", MC, "-n", ns], true, false),
            (
                &["patch", MC, "--subresource=status", "-n", ns],
                true,
                false,
            ),
            // Leader election gets, creates and patches its Lease (never updates it).
            (
                &["patch", "leases.coordination.k8s.io", "-n", OPERATOR_NS],
                true,
                false,
            ),
        ];
        let who = format!("--as=system:serviceaccount:{OPERATOR_NS}:{SERVICE_ACCOUNT}");
        for (args, want, hard) in checks {
            let mut full = vec!["auth", "can-i", who.as_str()];
            full.extend_from_slice(args);
            let out = kubectl(&full);
            let answer = String::from_utf8_lossy(&out.stdout).trim().to_owned();
            let allowed = if answer.starts_with("yes") {
                true
            } else if answer.starts_with("no") {
                false
            } else {
                panic!(
                    "`kubectl {}` gave no answer (is impersonation allowed?): {}",
                    shell_words(&full),
                    String::from_utf8_lossy(&out.stderr)
                );
            };
            let verdict = if allowed == want {
                "ok"
            } else if hard {
                "FAIL"
            } else {
                "WARN"
            };
            eprintln!(
                "    {verdict}: can-i {} -> {answer} (want {})",
                args.join(" "),
                if want { "yes" } else { "no" }
            );
            assert!(
                !hard || allowed == want,
                "ServiceAccount {OPERATOR_NS}/{SERVICE_ACCOUNT}: `can-i {}` is {answer:?}, want {}",
                args.join(" "),
                if want { "yes" } else { "no" }
            );
        }
    }

    /// Writes a kubeconfig for the current cluster that authenticates as the operator's ServiceAccount.
    pub fn write_operator_kubeconfig(&mut self) {
        let with_duration = kubectl(&[
            "create",
            "token",
            SERVICE_ACCOUNT,
            "-n",
            OPERATOR_NS,
            "--duration=2h",
        ]);
        let token = if with_duration.status.success() {
            String::from_utf8_lossy(&with_duration.stdout)
                .trim()
                .to_owned()
        } else {
            eprintln!(
                "    `kubectl create token --duration=2h` failed ({}); retrying without --duration",
                String::from_utf8_lossy(&with_duration.stderr).trim()
            );
            kubectl_ok(&["create", "token", SERVICE_ACCOUNT, "-n", OPERATOR_NS])
                .trim()
                .to_owned()
        };
        assert!(!token.is_empty(), "`kubectl create token` printed no token");

        let config = kubectl_json(&["config", "view", "--minify", "--flatten", "-o", "json"]);
        let cluster = &config["clusters"][0]["cluster"];
        let server = cluster["server"]
            .as_str()
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| {
                panic!(
                    "current kubeconfig context has no cluster server: {}",
                    compact(&config["clusters"])
                )
            });
        let mut cluster_yaml = format!("    server: {}\n", yaml_str(server));
        if let Some(data) = cluster["certificate-authority-data"].as_str() {
            cluster_yaml += &format!("    certificate-authority-data: {}\n", yaml_str(data));
        } else if let Some(file) = cluster["certificate-authority"].as_str() {
            cluster_yaml += &format!(
                "    certificate-authority: {}\n",
                yaml_str(&absolute_ca_path(file))
            );
        }
        if cluster["insecure-skip-tls-verify"] == true {
            cluster_yaml += "    insecure-skip-tls-verify: true\n";
        }
        for key in ["tls-server-name", "proxy-url"] {
            if let Some(v) = cluster[key].as_str() {
                cluster_yaml += &format!("    {key}: {}\n", yaml_str(v));
            }
        }
        let kubeconfig = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: e2e\n  cluster:\n{cluster_yaml}\
             users:\n- name: {SERVICE_ACCOUNT}\n  user:\n    token: {}\n\
             contexts:\n- name: e2e\n  context:\n    cluster: e2e\n    user: {SERVICE_ACCOUNT}\n    namespace: {}\n\
             current-context: e2e\n",
            yaml_str(&token),
            yaml_str(&self.ns)
        );
        let path = self.dir.join("operator.kubeconfig");
        self.kubeconfig = Some(path.clone());
        write_private(&path, &kubeconfig);
        eprintln!(
            "    operator kubeconfig (ServiceAccount token for {server}): {}",
            path.display()
        );
    }

    /// Starts `memcached-operator run` as a local process with the ServiceAccount kubeconfig.
    pub fn start_operator(&self, label: &str) -> OpInfo {
        let kubeconfig = self
            .kubeconfig
            .clone()
            .expect("operator kubeconfig is written first");
        let identity = format!("e2e-{}-{label}", std::process::id());
        let (probe_port, metrics_port) = two_free_ports();
        let metrics = format!("127.0.0.1:{metrics_port}");
        let probe = format!("127.0.0.1:{probe_port}");
        let args = [
            "run",
            "--namespace",
            &self.ns,
            "--leader-elect",
            "--leader-election-namespace",
            OPERATOR_NS,
            "--metrics-bind-address",
            &metrics,
            // Plain HTTP on loopback, read by the harness (the envtest tier checks the secure endpoint).
            "--metrics-secure=false",
            "--health-probe-bind-address",
            &probe,
            "--log-level",
            "debug",
            // Step 24 (operand telemetry) waits for stats; idle caches cause no writes either way.
            "--stats-interval=2s",
            "--stats-status-interval=5s",
        ];
        let log = self.dir.join(format!("operator-{label}.log"));
        let mut file = fs::File::create(&log)
            .unwrap_or_else(|e| panic!("cannot create {}: {e}", log.display()));
        let _ = writeln!(
            file,
            "# e2e: KUBECONFIG={} POD_NAME={identity} {OPERATOR_BIN} {}",
            kubeconfig.display(),
            shell_words(&args)
        );
        let stderr = file
            .try_clone()
            .unwrap_or_else(|e| panic!("cannot reopen {}: {e}", log.display()));
        let child = Command::new(OPERATOR_BIN)
            .args(args)
            .env("KUBECONFIG", &kubeconfig)
            .env("POD_NAME", &identity)
            .env("POD_NAMESPACE", OPERATOR_NS)
            .stdin(Stdio::null())
            .stdout(file)
            .stderr(stderr)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {OPERATOR_BIN}: {e}"));
        let mut operators = self.operators.borrow_mut();
        let info = OpInfo {
            index: operators.len(),
            label: label.to_owned(),
            identity,
            pid: child.id(),
            probe_port,
            metrics_port,
            log,
        };
        eprintln!(
            "    started operator '{label}' pid {} POD_NAME={} probes {probe} metrics {metrics}, log {}",
            info.pid,
            info.identity,
            info.log.display()
        );
        operators.push(Operator {
            info: info.clone(),
            child,
            expect_running: true,
        });
        info
    }

    /// Label and log file of every operator started so far.
    pub fn operator_logs(&self) -> Vec<(String, PathBuf)> {
        self.operators
            .borrow()
            .iter()
            .map(|o| (o.info.label.clone(), o.info.log.clone()))
            .collect()
    }

    /// Panics right away if an operator that should be running has exited.
    pub fn assert_operators_alive(&self) {
        let mut crashed = None;
        for op in self
            .operators
            .borrow_mut()
            .iter_mut()
            .filter(|o| o.expect_running)
        {
            if let Ok(Some(status)) = op.child.try_wait() {
                op.expect_running = false;
                crashed = Some(format!(
                    "operator '{}' (pid {}) exited unexpectedly with {status}; log: {}",
                    op.info.label,
                    op.info.pid,
                    op.info.log.display()
                ));
                break;
            }
        }
        if let Some(message) = crashed {
            panic!("{message}");
        }
    }

    /// `wait_for`, failing fast when an operator process dies meanwhile.
    pub fn wait<T>(
        &self,
        desc: &str,
        timeout: Duration,
        mut check: impl FnMut() -> Result<T, String>,
    ) -> T {
        wait_for(desc, timeout, || {
            self.assert_operators_alive();
            check()
        })
    }

    /// `hold_for`, failing fast when an operator process dies meanwhile.
    pub fn hold(
        &self,
        desc: &str,
        duration: Duration,
        mut check: impl FnMut() -> Result<(), String>,
    ) {
        hold_for(desc, duration, || {
            self.assert_operators_alive();
            check()
        })
    }

    pub fn wait_http(&self, op: &OpInfo, path: &str, timeout: Duration) {
        self.wait(
            &format!(
                "GET http://127.0.0.1:{}{path} of operator '{}' to return 200",
                port_for(op, path),
                op.label
            ),
            timeout,
            || match http_get(port_for(op, path), path)? {
                (200, _) => Ok(()),
                (code, body) => Err(format!("HTTP {code}: {}", truncate(&body, 500))),
            },
        );
    }

    /// Sends SIGTERM and waits for the process to exit; returns its exit status.
    pub fn terminate(&self, op: &OpInfo, timeout: Duration) -> ExitStatus {
        self.operators.borrow_mut()[op.index].expect_running = false;
        eprintln!("    $ kill -TERM {}  (operator '{}')", op.pid, op.label);
        let out = run(
            "kill",
            "kill",
            &["-TERM", &op.pid.to_string()],
            None,
            None,
            Duration::from_secs(10),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert!(
            out.status.success(),
            "kill -TERM {} failed: {}",
            op.pid,
            String::from_utf8_lossy(&out.stderr)
        );
        wait_for(
            &format!(
                "operator '{}' (pid {}) to exit after SIGTERM",
                op.label, op.pid
            ),
            timeout,
            || match self.operators.borrow_mut()[op.index].child.try_wait() {
                Ok(Some(status)) => Ok(status),
                Ok(None) => Err("still running".into()),
                Err(e) => Err(format!("cannot query the process: {e}")),
            },
        )
    }

    // --- cleanup -----------------------------------------------------------------------------------------

    pub fn dump_diagnostics(&mut self) {
        for op in self.operators.get_mut().iter() {
            eprintln!(
                "\n---- last 200 lines of operator '{}' log ({}) ----",
                op.info.label,
                op.info.log.display()
            );
            match fs::read_to_string(&op.info.log) {
                Ok(text) => {
                    let lines: Vec<&str> = text.lines().collect();
                    for line in &lines[lines.len().saturating_sub(200)..] {
                        eprintln!("{line}");
                    }
                }
                Err(e) => eprintln!("(cannot read: {e})"),
            }
        }
        let all = format!("all,{MC},{PDB},events");
        let lease = format!("leases.coordination.k8s.io/{LEASE}");
        let commands: [&[&str]; 3] = [
            &["get", &all, "-n", &self.ns, "-o", "wide"],
            &["get", MC, "-n", &self.ns, "-o", "yaml"],
            &["get", &lease, "-n", OPERATOR_NS, "-o", "yaml"],
        ];
        for args in commands {
            eprintln!("\n---- kubectl {} ----", shell_words(args));
            match quiet_kubectl(args, None) {
                Some(out) => eprint!(
                    "{}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                ),
                None => eprintln!("(kubectl could not be run)"),
            }
        }
        eprintln!("---- end of diagnostics ----\n");
    }

    pub fn any_operator_running(&mut self) -> bool {
        self.operators
            .get_mut()
            .iter_mut()
            .any(|o| matches!(o.child.try_wait(), Ok(None)))
    }

    pub fn remaining_memcacheds(&self) -> Option<Vec<String>> {
        let out = quiet_kubectl(&["get", MC, "-n", &self.ns, "-o", "name"], None)?;
        out.status.success().then(|| {
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .map(str::to_owned)
                .collect()
        })
    }

    /// Deletes the test's Memcached objects while an operator still runs. They carry no finalizer, so this
    /// needs no operator; one still running removes the finalizer an instance could have from an earlier
    /// build (a cluster shared with one), which [`E2e::strip_finalizers`] otherwise does.
    pub fn delete_memcacheds(&mut self) {
        if !self.ns_created || self.install_manifest.is_none() {
            return;
        }
        match self.remaining_memcacheds() {
            Some(names) if !names.is_empty() => {
                if !self.any_operator_running() {
                    eprintln!("    no operator running; finalizers of {names:?} will be stripped");
                    return;
                }
                eprintln!(
                    "    deleting remaining Memcached objects {names:?} while the operator runs"
                );
                let _ = quiet_kubectl(
                    &["delete", MC, "--all", "-n", &self.ns, "--wait=false"],
                    None,
                );
                let deadline = Instant::now() + secs(60);
                while Instant::now() < deadline
                    && self.remaining_memcacheds().is_some_and(|n| !n.is_empty())
                {
                    thread::sleep(POLL);
                }
            }
            _ => {}
        }
    }

    pub fn stop_operators(&mut self) {
        for op in self.operators.get_mut().iter_mut() {
            if !matches!(op.child.try_wait(), Ok(None)) {
                continue;
            }
            let _ = run(
                "kill",
                "kill",
                &["-TERM", &op.info.pid.to_string()],
                None,
                None,
                Duration::from_secs(10),
            );
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline && matches!(op.child.try_wait(), Ok(None)) {
                thread::sleep(Duration::from_millis(200));
            }
            if matches!(op.child.try_wait(), Ok(None)) {
                eprintln!(
                    "    operator '{}' ignored SIGTERM for 10s; killing it",
                    op.info.label
                );
                let _ = op.child.kill();
            }
            match op.child.wait() {
                Ok(status) => eprintln!(
                    "    operator '{}' (pid {}) stopped: {status}",
                    op.info.label, op.info.pid
                ),
                Err(e) => eprintln!(
                    "    operator '{}' (pid {}): {e}",
                    op.info.label, op.info.pid
                ),
            }
        }
    }

    pub fn strip_finalizers(&self) {
        for name in self.remaining_memcacheds().unwrap_or_default() {
            eprintln!("    removing finalizers of {name}");
            let _ = quiet_kubectl(
                &[
                    "patch",
                    &name,
                    "-n",
                    &self.ns,
                    "--type=merge",
                    "-p",
                    r#"{"metadata":{"finalizers":null}}"#,
                ],
                None,
            );
        }
    }

    /// Deletes the install objects that did not exist before the test.
    pub fn uninstall(&self) {
        let (Some(manifest), Some(pre)) = (&self.install_manifest, &self.preexisting) else {
            return;
        };
        let path = manifest.to_string_lossy().into_owned();
        let Some(out) = quiet_kubectl(
            &["get", "-f", &path, "--ignore-not-found", "-o", "json"],
            None,
        ) else {
            return;
        };
        let present: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        let created: Vec<Value> = items(&present)
            .iter()
            .filter(|o| !pre.contains(&object_key(o)))
            .map(|o| {
                let mut metadata = json!({"name": o["metadata"]["name"]});
                if let Some(ns) = o["metadata"]["namespace"].as_str() {
                    metadata["namespace"] = json!(ns);
                }
                json!({"apiVersion": o["apiVersion"], "kind": o["kind"], "metadata": metadata})
            })
            .collect();
        if created.is_empty() {
            return;
        }
        let names: Vec<String> = created.iter().map(object_key).collect();
        eprintln!("    uninstalling {names:?}");
        let list = json!({"apiVersion": "v1", "kind": "List", "items": created}).to_string();
        let out = quiet_kubectl(
            &["delete", "-f", "-", "--ignore-not-found", "--wait=false"],
            Some(&list),
        );
        if let Some(out) = out.filter(|o| !o.status.success()) {
            eprintln!(
                "    uninstall failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}

impl Drop for E2e {
    /// The last step, cleanup. Runs after success and after a failure (panic); must not panic itself.
    /// Every Memcached left in the test namespace (whichever step created it) is deleted, and any finalizer
    /// left on one stripped (see [`E2e::delete_memcacheds`]); the Secrets the test created go with the
    /// namespace.
    fn drop(&mut self) {
        let failed = thread::panicking();
        let failed_step = failed.then(|| self.timings.get_mut().current()).flatten();
        self.timings.get_mut().begin(CLEANUP_STEP, "cleanup");
        eprintln!(
            "\n==> step {CLEANUP_STEP}: cleanup{}  [t+{}s]",
            if failed {
                " after a FAILURE (diagnostics first)"
            } else {
                ""
            },
            self.started.elapsed().as_secs()
        );
        if failed {
            self.dump_diagnostics();
        }
        if !self.keep {
            self.delete_memcacheds();
        }
        self.stop_operators();
        if let Some(path) = &self.kubeconfig {
            let _ = fs::remove_file(path); // holds a ServiceAccount token
        }
        if self.keep {
            eprintln!(
                "    E2E_KEEP=1: keeping namespace {ns} and the installed objects. Clean up later with:\n      \
                 kubectl get {MC} -n {ns} -o name | xargs -r -n1 kubectl patch -n {ns} --type=merge -p '{{\"metadata\":{{\"finalizers\":null}}}}'\n      \
                 kubectl delete namespace {ns}\n      kubectl kustomize {REPO_ROOT}/config/default | kubectl delete -f - --ignore-not-found",
                ns = self.ns
            );
        } else {
            self.strip_finalizers();
            if self.ns_created {
                let _ = quiet_kubectl(
                    &[
                        "delete",
                        "namespace",
                        &self.ns,
                        "--wait=false",
                        "--ignore-not-found",
                    ],
                    None,
                );
            }
            self.uninstall();
        }
        eprintln!(
            "    operator logs and manifests are in {}",
            self.dir.display()
        );
        self.timings.get_mut().report(&self.dir, failed_step);
    }
}

/// Checks that cannot wait until after setup: tools, server version, and no competing in-cluster operator.
pub fn preflight() {
    let version = kubectl_json(&["version", "-o", "json"]);
    let minor = |v: &Value| -> u32 {
        v["minor"]
            .as_str()
            .unwrap_or_default()
            .chars()
            .take_while(char::is_ascii_digit)
            .collect::<String>()
            .parse()
            .unwrap_or(0)
    };
    let server = &version["serverVersion"];
    eprintln!(
        "kubectl {} against API server {}",
        version["clientVersion"]["gitVersion"]
            .as_str()
            .unwrap_or("?"),
        server["gitVersion"].as_str().unwrap_or("?")
    );
    assert!(
        server["major"] == "1" && minor(server) >= 24,
        "the e2e test needs a Kubernetes API server v1.24 or newer, got {}",
        compact(server)
    );
    assert!(
        minor(&version["clientVersion"]) >= 24,
        "the e2e test needs kubectl v1.24 or newer (for `kubectl create token`), got {}",
        compact(&version["clientVersion"])
    );

    let can = kubectl(&[
        "auth",
        "can-i",
        "create",
        "customresourcedefinitions.apiextensions.k8s.io",
    ]);
    assert!(
        String::from_utf8_lossy(&can.stdout)
            .trim()
            .starts_with("yes"),
        "the kubeconfig user must be allowed to install CRDs and RBAC (cluster-admin); `kubectl auth can-i create crd` says {:?}",
        String::from_utf8_lossy(&can.stdout).trim()
    );

    let deployments = kubectl_json(&["get", "deployments.apps", "-n", OPERATOR_NS, "-o", "json"]);
    let deployment_items = items(&deployments);
    let running: Vec<&str> = deployment_items
        .iter()
        .filter(|d| d["spec"]["replicas"].as_i64().unwrap_or(1) > 0)
        .filter_map(|d| d["metadata"]["name"].as_str())
        .collect();
    assert!(
        running.is_empty(),
        "Deployment(s) {running:?} run in {OPERATOR_NS}; an in-cluster operator would compete with the test's \
         operator for the leader Lease. Scale it to 0 (kubectl scale deployment --all --replicas=0 -n {OPERATOR_NS}) \
         or use a clean cluster."
    );

    let help = run(
        "memcached-operator",
        OPERATOR_BIN,
        &["run", "--help"],
        None,
        None,
        Duration::from_secs(30),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let help_text =
        String::from_utf8_lossy(&help.stdout).into_owned() + &String::from_utf8_lossy(&help.stderr);
    assert!(
        help.status.success(),
        "`memcached-operator run --help` failed:\n{help_text}"
    );
    for flag in [
        "--namespace",
        "--leader-elect",
        "--leader-election-namespace",
        "--metrics-bind-address",
        "--metrics-secure",
        "--health-probe-bind-address",
        "--log-level",
        "--stats-interval",
        "--stats-status-interval",
    ] {
        assert!(
            help_text.contains(flag),
            "`memcached-operator run --help` does not list {flag}, which the e2e test passes:\n{help_text}"
        );
    }
}

/// Deletes a Memcached and waits until it is gone (it carries no finalizer).
pub fn delete_instance(env: &E2e, name: &str) {
    let ns = env.ns.as_str();
    kubectl_ok(&["delete", MC, name, "-n", ns, "--wait=false"]);
    env.wait(&format!("Memcached {name} to be deleted"), secs(60), || {
        gone(MC, ns, name)
    });
}
