//! Step 18: TLS from a `kubernetes.io/tls` Secret (`-Z`), when `openssl` is on `PATH` to make a
//! certificate; then the certificate is rotated (a new one from the same CA) and the running server loads
//! it without a restart (`CertificatesReloaded`).

use std::fs;
use std::time::Duration;

use crate::checks::{
    check_ready_status, check_secret_volume, live_pods, memcached_container, push_err, result,
    string_list,
};
use crate::env::{E2e, delete_instance};
use crate::events::list_events;
use crate::kubectl::{apply_yaml_ok, compact, get_required, kubectl_ok, run, secs, shell_words};
use crate::names::{API_VERSION, SECRET_HASH_ANNOTATION};

pub const TLS_NAME: &str = "memcached-tls";
pub const TLS_SECRET: &str = "memcached-tls-certs";

pub fn step_tls(env: &E2e) {
    let ns = env.ns.as_str();
    let version = run(
        "openssl",
        "openssl",
        &["version"],
        None,
        None,
        Duration::from_secs(10),
    );
    if !version.is_ok_and(|o| o.status.success()) {
        eprintln!(
            "    SKIP: openssl is not on PATH, so no certificate can be made for the TLS step"
        );
        return;
    }
    let dir = env.dir.join("tls");
    fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
    fs::write(
        dir.join("server.ext"),
        format!("subjectAltName=DNS:{TLS_NAME},DNS:{TLS_NAME}.{ns}.svc\n"),
    )
    .unwrap_or_else(|e| panic!("cannot write {}: {e}", dir.join("server.ext").display()));
    openssl(&dir, &ca_commands());
    openssl(&dir, &leaf_commands(1));
    apply_yaml_ok(&secret_yaml(&dir, ns));

    apply_yaml_ok(&format!(
        "apiVersion: {API_VERSION}\nkind: Memcached\nmetadata:\n  name: {TLS_NAME}\n  namespace: {ns}\n\
         spec:\n  size: 1\n  security:\n    tls:\n      secretName: {TLS_SECRET}\n      clientAuth: false\n"
    ));
    env.wait(
        &format!("Deployment {TLS_NAME}: memcached runs with -Z and ssl_chain_cert=, the Secret mounted, no Secret hash"),
        secs(60),
        || {
            let dep = get_required("deployments.apps", ns, TLS_NAME)?;
            let (_, c) = memcached_container(&dep)?;
            let args = string_list(&c["args"]);
            let mut p = Vec::new();
            if !args.iter().any(|a| a == "-Z") {
                p.push(format!("memcached args {args:?} lack -Z"));
            }
            if !args.iter().any(|a| a.contains("ssl_chain_cert=")) {
                p.push(format!("memcached args {args:?} lack ssl_chain_cert="));
            }
            if args.iter().any(|a| a.contains("ssl_ca_cert=")) {
                p.push(format!("memcached args {args:?} ask for client certificates, but clientAuth is false"));
            }
            push_err(&mut p, check_secret_volume(&dep, TLS_SECRET));
            // The operator reads stats (`--stats-interval`), so a rotated certificate is reloaded in place:
            // the TLS Secret's content is not in the pod template.
            if let Some(hash) =
                dep["spec"]["template"]["metadata"]["annotations"][SECRET_HASH_ANNOTATION].as_str()
            {
                p.push(format!("{SECRET_HASH_ANNOTATION} {hash} on the pod template"));
            }
            result(p, &dep["spec"]["template"])
        },
    );
    env.wait(
        &format!("Memcached {TLS_NAME}: 1 ready pod (memcached started with TLS), Available=True"),
        secs(180),
        || check_ready_status(ns, TLS_NAME, 1),
    );
    let pods = live_pods(ns, TLS_NAME).unwrap_or_else(|e| panic!("{e}"));
    for pod in &pods {
        let restarts: i64 = pod["status"]["containerStatuses"]
            .as_array()
            .map(|cs| cs.iter().filter_map(|c| c["restartCount"].as_i64()).sum())
            .unwrap_or_default();
        assert_eq!(
            restarts,
            0,
            "pod {} restarted {restarts} times (memcached failing to load the certificate?): {}",
            pod["metadata"]["name"],
            compact(&pod["status"]["containerStatuses"])
        );
    }
    eprintln!("    ok: {} TLS pod(s) ready without restarts", pods.len());

    // A renewed certificate (new key, same CA), as cert-manager writes it: the running server loads it.
    let uids = |pods: &[serde_json::Value]| {
        let mut uids: Vec<String> = pods
            .iter()
            .map(|p| p["metadata"]["uid"].as_str().unwrap_or_default().to_owned())
            .collect();
        uids.sort();
        uids
    };
    let before = uids(&pods);
    openssl(&dir, &leaf_commands(2));
    apply_yaml_ok(&secret_yaml(&dir, ns));
    // The private keys are in the Secret now; the scratch dir keeps only logs.
    let _ = fs::remove_dir_all(&dir);
    env.wait(
        &format!(
            "a CertificatesReloaded event for {TLS_NAME}: the server loaded the renewed certificate"
        ),
        secs(90),
        || {
            let events = list_events(ns)?;
            match events
                .iter()
                .find(|e| e.reason == "CertificatesReloaded" && e.name == TLS_NAME)
            {
                Some(e) => {
                    eprintln!("    event: {}", e.note);
                    Ok(())
                }
                None => Err("no CertificatesReloaded event yet".to_owned()),
            }
        },
    );
    let after = live_pods(ns, TLS_NAME).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(uids(&after), before, "the rotation replaced a pod");
    eprintln!("    ok: the same pod serves the renewed certificate");
    delete_instance(env, TLS_NAME);
}

/// Runs openssl in `dir` for each of `commands`, failing the step on an error.
fn openssl(dir: &std::path::Path, commands: &[Vec<String>]) {
    for args in commands {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        eprintln!("    $ openssl {}", shell_words(&args));
        let out = run("openssl", "openssl", &args, None, Some(dir), secs(60))
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(
            out.status.success(),
            "`openssl {}` failed ({}): {}",
            shell_words(&args),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// A CA, `ca.crt` and `ca.key`.
fn ca_commands() -> Vec<Vec<String>> {
    let words = "req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 2 -subj /CN=memcached-e2e-ca";
    vec![words.split(' ').map(str::to_owned).collect()]
}

/// A server certificate `tls.crt` with a new key `tls.key`, from the CA, with serial `serial`.
fn leaf_commands(serial: u32) -> Vec<Vec<String>> {
    let split = |s: &str| s.split(' ').map(str::to_owned).collect::<Vec<_>>();
    vec![
        split(&format!(
            "req -newkey rsa:2048 -nodes -keyout tls.key -out tls.csr -subj /CN={TLS_NAME}"
        )),
        split(&format!(
            "x509 -req -in tls.csr -CA ca.crt -CAkey ca.key -set_serial {serial} -days 2 \
             -extfile server.ext -out tls.crt"
        )),
    ]
}

/// The `kubernetes.io/tls` Secret with the files in `dir`, as YAML for an apply.
fn secret_yaml(dir: &std::path::Path, ns: &str) -> String {
    let file = |key: &str| format!("--from-file={key}={}", dir.join(key).display());
    let (crt, key, ca) = (file("tls.crt"), file("tls.key"), file("ca.crt"));
    kubectl_ok(&[
        "create",
        "secret",
        "generic",
        TLS_SECRET,
        "--type=kubernetes.io/tls",
        &crt,
        &key,
        &ca,
        "-n",
        ns,
        "--dry-run=client",
        "-o",
        "yaml",
    ])
}
