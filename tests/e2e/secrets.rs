//! Step 15: the auth Secret, missing, created and rotated; its values never leak into events, status,
//! child objects or the operator's log.

use std::fs;

use serde_json::Value;

use crate::checks::{
    check_ready_status, check_secret_volume, command_line, condition, expect_degraded, live_pods,
    memcached_container, push_err, result,
};
use crate::env::{E2e, delete_instance};
use crate::events::{expect_event, list_events};
use crate::kubectl::{
    apply_yaml_ok, base64, compact, get_required, gone, kubectl, kubectl_json, kubectl_ok, secs,
};
use crate::names::{API_VERSION, MC, SECRET_HASH_ANNOTATION};
use crate::telemetry::session_through_service;

pub const AUTH_NAME: &str = "memcached-auth";
pub const AUTH_SECRET: &str = "memcached-auth-creds";

/// Credentials written into the auth Secret, then rotated; neither may show up anywhere the operator writes.
pub const AUTH_CREDENTIALS: &str = "app:s3cret";
pub const ROTATED_CREDENTIALS: &str = "app:r0tated";
pub const AUTH_FILE_ARG: &str = "-Y /etc/memcached/auth/auth-file";

pub fn step_auth_secret(env: &E2e) {
    let ns = env.ns.as_str();
    let _ = kubectl(&[
        "delete",
        "secret",
        AUTH_SECRET,
        "-n",
        ns,
        "--ignore-not-found",
    ]);
    apply_yaml_ok(&format!(
        "apiVersion: {API_VERSION}\nkind: Memcached\nmetadata:\n  name: {AUTH_NAME}\n  namespace: {ns}\n\
         spec:\n  size: 1\n  security:\n    auth:\n      secretName: {AUTH_SECRET}\n"
    ));
    let mc = env.wait(
        &format!("Memcached {AUTH_NAME}: Degraded=True, reason SecretNotFound, naming Secret {AUTH_SECRET}"),
        secs(60),
        || {
            let mc = get_required(MC, ns, AUTH_NAME)?;
            expect_degraded(&mc, "SecretNotFound", AUTH_SECRET).map(|()| mc)
        },
    );
    eprintln!(
        "    Degraded condition: {}",
        compact(condition(&mc, "Degraded").unwrap_or(&Value::Null))
    );
    env.hold(
        &format!("no Deployment or Service {AUTH_NAME} is applied while the Secret is missing"),
        secs(5),
        || {
            gone("deployments.apps", ns, AUTH_NAME)?;
            gone("services", ns, AUTH_NAME)
        },
    );
    env.wait(
        &format!("a Warning event with reason SecretNotFound regarding Memcached {AUTH_NAME}"),
        secs(30),
        || {
            expect_event(ns, |e| {
                e.type_ == "Warning"
                    && e.reason == "SecretNotFound"
                    && e.kind == "Memcached"
                    && e.name == AUTH_NAME
            })
        },
    );

    // The Secret as people make it from a literal, without a final newline: memcached 1.6.18 and older
    // would drop the last character of the password, so the instance is refused, with the reason.
    put_auth_secret(ns, AUTH_CREDENTIALS);
    env.wait(
        &format!("Memcached {AUTH_NAME}: Degraded=True, reason SecretInvalid, the file lacks its final newline"),
        secs(60),
        || {
            let mc = get_required(MC, ns, AUTH_NAME)?;
            expect_degraded(&mc, "SecretInvalid", "does not end with a newline")
        },
    );
    env.hold(
        &format!(
            "no Deployment {AUTH_NAME} is applied while the auth file is one memcached misreads"
        ),
        secs(3),
        || gone("deployments.apps", ns, AUTH_NAME),
    );

    // The samples' recipe: `--from-literal=auth-file=$'app:s3cret\n'`.
    replace_auth_secret(ns, AUTH_CREDENTIALS);
    env.wait(
        &format!(
            "Memcached {AUTH_NAME} to recover: Degraded=False once Secret {AUTH_SECRET} exists"
        ),
        secs(60),
        || {
            let mc = get_required(MC, ns, AUTH_NAME)?;
            match condition(&mc, "Degraded") {
                Some(c) if c["status"] == "False" => Ok(()),
                other => Err(format!(
                    "Degraded condition is {}",
                    compact(other.unwrap_or(&Value::Null))
                )),
            }
        },
    );
    env.wait(
        &format!("Memcached {AUTH_NAME} status: 1 ready pod, Available=True"),
        secs(180),
        || check_ready_status(ns, AUTH_NAME, 1),
    );
    let first_hash = env.wait(
        &format!(
            "Deployment {AUTH_NAME}: {SECRET_HASH_ANNOTATION} on the pod template, `{AUTH_FILE_ARG}`, Secret volume"
        ),
        secs(30),
        || {
            let dep = get_required("deployments.apps", ns, AUTH_NAME)?;
            check_auth_deployment(&dep)
        },
    );
    eprintln!("    {SECRET_HASH_ANNOTATION}: {first_hash}");

    login(env, AUTH_CREDENTIALS);

    // Rotate the credentials the way people do it: render the Secret again and apply it over the old one.
    replace_auth_secret(ns, ROTATED_CREDENTIALS);
    let second_hash = env.wait(
        &format!("the pod template's {SECRET_HASH_ANNOTATION} to change after the Secret rotation"),
        secs(60),
        || {
            let dep = get_required("deployments.apps", ns, AUTH_NAME)?;
            let hash = check_auth_deployment(&dep)?;
            if hash == first_hash {
                Err(format!("{SECRET_HASH_ANNOTATION} is still {hash}"))
            } else {
                Ok(hash)
            }
        },
    );
    eprintln!("    {SECRET_HASH_ANNOTATION}: {second_hash}");
    env.wait(
        &format!("the rollout to finish: 1 ready pod carrying the new hash {second_hash}"),
        secs(180),
        || {
            check_ready_status(ns, AUTH_NAME, 1)?;
            let pods = live_pods(ns, AUTH_NAME)?;
            let stale: Vec<String> = pods
                .iter()
                .filter(|p| {
                    p["metadata"]["annotations"][SECRET_HASH_ANNOTATION] != second_hash.as_str()
                })
                .map(|p| p["metadata"]["name"].as_str().unwrap_or("?").to_owned())
                .collect();
            if pods.is_empty() || !stale.is_empty() {
                Err(format!(
                    "pods without the new hash: {stale:?} (of {})",
                    pods.len()
                ))
            } else {
                Ok(())
            }
        },
    );
    login(env, ROTATED_CREDENTIALS);

    check_no_leak(env, AUTH_NAME);
    delete_instance(env, AUTH_NAME);
}

/// Creates or replaces the auth Secret as the all-features sample says, with `credentials` as its one
/// line (`kubectl create secret generic ... --from-literal=auth-file=$'user:password\n'`), rendered and
/// applied over the old one.
fn replace_auth_secret(ns: &str, credentials: &str) {
    put_auth_secret(ns, &format!("{credentials}\n"));
}

/// Creates or replaces the auth Secret with `file` as its auth file, as `kubectl create secret generic
/// --from-literal` makes it, rendered and applied over the old one.
fn put_auth_secret(ns: &str, file: &str) {
    let literal = format!("--from-literal=auth-file={file}");
    let yaml = kubectl_ok(&[
        "create",
        "secret",
        "generic",
        AUTH_SECRET,
        &literal,
        "-n",
        ns,
        "--dry-run=client",
        "-o",
        "yaml",
    ]);
    apply_yaml_ok(&yaml);
}

/// A client logs in with `credentials` (memcached's ASCII auth: a `set` whose data is `user password`)
/// and is then served; with a wrong password it is refused.
fn login(env: &E2e, credentials: &str) {
    let ns = env.ns.as_str();
    let (user, password) = credentials.split_once(':').unwrap_or((credentials, ""));
    let pods = live_pods(ns, AUTH_NAME).unwrap_or_else(|e| panic!("{e}"));
    let session = |password: &str| {
        let data = format!("{user} {password}");
        let script = format!(
            "set auth 0 0 {}\r\n{data}\r\nversion\r\nquit\r\n",
            data.len()
        );
        session_through_service(env, ns, AUTH_NAME, &pods, &script)
    };
    let answer = session(password);
    assert!(
        answer.starts_with("STORED\r\nVERSION "),
        "a client with the Secret's credentials is not served: {answer:?}"
    );
    let refused = session("wrong");
    assert!(
        refused.starts_with("CLIENT_ERROR") && !refused.contains("STORED"),
        "a wrong password is not refused: {refused:?}"
    );
    eprintln!(
        "    a client logs in as {user} with the Secret's password ({:?}); a wrong one is refused ({:?})",
        answer.lines().next().unwrap_or_default(),
        refused.lines().next().unwrap_or_default()
    );
}

/// Neither the credentials nor their base64 form may appear in events, in the instance (status included),
/// its Deployment, or the operator logs.
pub fn check_no_leak(env: &E2e, name: &str) {
    let ns = env.ns.as_str();
    let mut needles = Vec::new();
    for credentials in [AUTH_CREDENTIALS, ROTATED_CREDENTIALS] {
        let password = credentials.split_once(':').map_or(credentials, |(_, p)| p);
        needles.push(password.to_owned());
        needles.push(base64(credentials.as_bytes()));
    }
    let mut haystacks: Vec<(String, String)> = Vec::new();
    let events = list_events(ns).unwrap_or_else(|e| panic!("cannot list events: {e}"));
    for e in &events {
        haystacks.push((
            format!("event {} {} {}/{}", e.type_, e.reason, e.kind, e.name),
            format!("{} {}", e.reason, e.note),
        ));
    }
    for (resource, what) in [(MC, "Memcached"), ("deployments.apps", "Deployment")] {
        let obj = kubectl_json(&["get", resource, name, "-n", ns, "-o", "json"]);
        haystacks.push((format!("{what} {name}"), obj.to_string()));
    }
    for (label, path) in env.operator_logs() {
        let text = fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
        haystacks.push((
            format!("log of operator '{label}' ({})", path.display()),
            text,
        ));
    }
    let leaks: Vec<String> = haystacks
        .iter()
        .flat_map(|(what, text)| {
            needles
                .iter()
                .filter(|n| text.contains(n.as_str()))
                .map(move |n| format!("{what} contains {n:?}"))
        })
        .collect();
    assert!(
        leaks.is_empty(),
        "Secret values leaked:\n  - {}",
        leaks.join("\n  - ")
    );
    eprintln!(
        "    ok: no Secret value in {} events, the Memcached and Deployment, or {} operator log(s)",
        events.len(),
        env.operator_logs().len()
    );
}

/// The auth instance's Deployment: the Secret hash annotation (returned), `-Y`, and the Secret volume.
pub fn check_auth_deployment(dep: &Value) -> Result<String, String> {
    let mut p = Vec::new();
    let hash = dep["spec"]["template"]["metadata"]["annotations"][SECRET_HASH_ANNOTATION]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    if hash.len() != 64 || !hash.bytes().all(|b| b.is_ascii_hexdigit()) {
        p.push(format!(
            "pod template annotation {SECRET_HASH_ANNOTATION} is {hash:?}, want a SHA-256 in hex"
        ));
    }
    match memcached_container(dep) {
        Err(e) => p.push(e),
        Ok((_, c)) => {
            let cmdline = command_line(c);
            if !cmdline.contains(AUTH_FILE_ARG) {
                p.push(format!(
                    "memcached command line {cmdline:?} lacks {AUTH_FILE_ARG:?}"
                ));
            }
        }
    }
    // The pods load the operator's copy of the user's file (with the operator's own entry), never the
    // user's Secret itself.
    push_err(
        &mut p,
        check_secret_volume(dep, &format!("{AUTH_NAME}-auth-file")),
    );
    result(p, &dep["spec"]["template"]).map(|()| hash)
}
