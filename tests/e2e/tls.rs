//! Step 18: TLS from a `kubernetes.io/tls` Secret (`-Z`), when `openssl` is on `PATH` to make a
//! certificate.

use std::fs;
use std::time::Duration;

use crate::checks::{
    check_ready_status, check_secret_volume, live_pods, memcached_container, push_err, result,
    string_list,
};
use crate::env::{E2e, delete_instance};
use crate::kubectl::{apply_yaml_ok, compact, get_required, kubectl_ok, run, secs, shell_words};
use crate::names::{API_VERSION, SECRET_HASH_ANNOTATION};

pub const TLS_NAME: &str = "memcached-tls";
pub const TLS_SECRET: &str = "memcached-tls-certs";

pub fn step_tls(env: &E2e) {
    let ns = env.ns.as_str();
    let openssl = run(
        "openssl",
        "openssl",
        &["version"],
        None,
        None,
        Duration::from_secs(10),
    );
    if !openssl.is_ok_and(|o| o.status.success()) {
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
    let commands: [&[&str]; 3] = [
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
            "-days",
            "2",
            "-subj",
            "/CN=memcached-e2e-ca",
        ],
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "tls.key",
            "-out",
            "tls.csr",
            "-subj",
            &format!("/CN={TLS_NAME}"),
        ],
        &[
            "x509",
            "-req",
            "-in",
            "tls.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-set_serial",
            "1",
            "-days",
            "2",
            "-extfile",
            "server.ext",
            "-out",
            "tls.crt",
        ],
    ];
    for args in commands {
        eprintln!("    $ openssl {}", shell_words(args));
        let out = run("openssl", "openssl", args, None, Some(&dir), secs(60))
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(
            out.status.success(),
            "`openssl {}` failed ({}): {}",
            shell_words(args),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
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
    ]);
    // The private keys are in the Secret now; the scratch dir keeps only logs.
    let _ = fs::remove_dir_all(&dir);

    apply_yaml_ok(&format!(
        "apiVersion: {API_VERSION}\nkind: Memcached\nmetadata:\n  name: {TLS_NAME}\n  namespace: {ns}\n\
         spec:\n  size: 1\n  security:\n    tls:\n      secretName: {TLS_SECRET}\n      clientAuth: false\n"
    ));
    env.wait(
        &format!("Deployment {TLS_NAME}: memcached runs with -Z and ssl_chain_cert=, the Secret mounted, a Secret hash"),
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
            if dep["spec"]["template"]["metadata"]["annotations"][SECRET_HASH_ANNOTATION]
                .as_str()
                .is_none_or(str::is_empty)
            {
                p.push(format!("no {SECRET_HASH_ANNOTATION} on the pod template"));
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
    delete_instance(env, TLS_NAME);
}
