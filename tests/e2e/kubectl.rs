//! Running kubectl and other processes, and small helpers on their JSON and YAML output.

use std::io::{Read, Write};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};
use std::{fs, thread};

use serde_json::Value;

use crate::names::KUBECTL_TIMEOUT_SECS;
use crate::secrets::AUTH_CREDENTIALS;

/// Whether a cluster to test against is configured (the suite never falls back to `~/.kube/config`, which
/// may be someone's production cluster).
pub fn cluster_configured() -> bool {
    std::env::var("KUBECONFIG").is_ok_and(|v| !v.trim().is_empty())
}

/// A timeout, multiplied by `E2E_TIMEOUT_SCALE` (at least 1) for slow clusters.
pub fn secs(n: u64) -> Duration {
    let scale = std::env::var("E2E_TIMEOUT_SCALE")
        .ok()
        .and_then(|s| s.trim().parse::<f64>().ok())
        .filter(|f| f.is_finite() && *f >= 1.0)
        .unwrap_or(1.0);
    Duration::from_secs_f64(n as f64 * scale)
}

pub fn kubectl_bin() -> String {
    std::env::var("KUBECTL")
        .ok()
        .filter(|s| !s.trim().is_empty())
        .unwrap_or_else(|| "kubectl".to_owned())
}

/// Runs a program with an optional stdin and working directory, killing it after `timeout`.
pub fn run(
    name: &str,
    program: &str,
    args: &[&str],
    stdin: Option<&str>,
    dir: Option<&Path>,
    timeout: Duration,
) -> Result<Output, String> {
    let mut cmd = Command::new(program);
    cmd.args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(dir) = dir {
        cmd.current_dir(dir);
    }
    let mut child = cmd.spawn().map_err(|e| {
        format!("cannot run `{name}` ({program}): {e}; is it installed and on PATH?")
    })?;
    let writer = match (stdin, child.stdin.take()) {
        (Some(data), Some(mut pipe)) => {
            let data = data.to_owned();
            Some(thread::spawn(move || {
                let _ = pipe.write_all(data.as_bytes());
            }))
        }
        _ => None,
    };
    let stdout = drain(child.stdout.take());
    let stderr = drain(child.stderr.take());
    let deadline = Instant::now() + timeout;
    let mut timed_out = false;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() >= deadline => {
                timed_out = true;
                let _ = child.kill();
                break child
                    .wait()
                    .map_err(|e| format!("waiting for `{name} {}`: {e}", shell_words(args)))?;
            }
            Ok(None) => thread::sleep(Duration::from_millis(20)),
            Err(e) => return Err(format!("waiting for `{name} {}`: {e}", shell_words(args))),
        }
    };
    if let Some(writer) = writer {
        let _ = writer.join();
    }
    let stdout = stdout.join().unwrap_or_default();
    let mut stderr = stderr.join().unwrap_or_default();
    if timed_out {
        stderr.extend_from_slice(format!("\n[e2e] killed after {}s", timeout.as_secs()).as_bytes());
    }
    Ok(Output {
        status,
        stdout,
        stderr,
    })
}

pub fn drain<R: Read + Send + 'static>(pipe: Option<R>) -> thread::JoinHandle<Vec<u8>> {
    thread::spawn(move || {
        let mut buf = Vec::new();
        if let Some(mut pipe) = pipe {
            let _ = pipe.read_to_end(&mut buf);
        }
        buf
    })
}

pub fn run_kubectl(args: &[&str], stdin: Option<&str>) -> Output {
    run(
        "kubectl",
        &kubectl_bin(),
        args,
        stdin,
        None,
        secs(KUBECTL_TIMEOUT_SECS),
    )
    .unwrap_or_else(|e| panic!("{e}"))
}

/// kubectl that never panics (for cleanup code).
pub fn quiet_kubectl(args: &[&str], stdin: Option<&str>) -> Option<Output> {
    match run(
        "kubectl",
        &kubectl_bin(),
        args,
        stdin,
        None,
        secs(KUBECTL_TIMEOUT_SECS),
    ) {
        Ok(out) => Some(out),
        Err(e) => {
            eprintln!("    {e}");
            None
        }
    }
}

/// Runs kubectl (silently) and returns its output, whatever the exit status.
pub fn kubectl(args: &[&str]) -> Output {
    run_kubectl(args, None)
}

pub fn describe_failure(args: &[&str], out: &Output) -> String {
    format!(
        "`kubectl {}` failed ({}): {}{}",
        shell_words(args),
        out.status,
        String::from_utf8_lossy(&out.stderr).trim(),
        String::from_utf8_lossy(&out.stdout).trim()
    )
}

/// stdout of a successful kubectl run, or a description of the failure.
pub fn try_kubectl(args: &[&str]) -> Result<String, String> {
    let out = kubectl(args);
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(describe_failure(args, &out))
    }
}

/// Echoes and runs a kubectl command that must succeed; returns its stdout.
pub fn kubectl_ok(args: &[&str]) -> String {
    eprintln!("    $ kubectl {}", shell_words(args));
    try_kubectl(args).unwrap_or_else(|e| panic!("{e}"))
}

pub fn try_kubectl_json(args: &[&str]) -> Result<Value, String> {
    let text = try_kubectl(args)?;
    if text.trim().is_empty() {
        return Ok(Value::Null);
    }
    serde_json::from_str(&text).map_err(|e| {
        format!(
            "`kubectl {}` printed invalid JSON ({e}): {}",
            shell_words(args),
            truncate(&text, 500)
        )
    })
}

pub fn kubectl_json(args: &[&str]) -> Value {
    try_kubectl_json(args).unwrap_or_else(|e| panic!("{e}"))
}

/// `kubectl apply -f -` with the YAML on stdin; the caller checks the outcome.
pub fn apply_yaml(yaml: &str) -> Output {
    run_kubectl(&["apply", "-f", "-"], Some(yaml))
}

pub fn apply_yaml_ok(yaml: &str) {
    eprintln!("    $ kubectl apply -f - <<EOF\n{}    EOF", indent(yaml));
    let out = apply_yaml(yaml);
    assert!(
        out.status.success(),
        "kubectl apply failed: {}\n{yaml}",
        String::from_utf8_lossy(&out.stderr)
    );
    eprint!("{}", indent(&String::from_utf8_lossy(&out.stdout)));
}

/// The object, `None` if it does not exist, or an error if kubectl failed otherwise.
pub fn get_opt(resource: &str, ns: &str, name: &str) -> Result<Option<Value>, String> {
    let v = try_kubectl_json(&[
        "get",
        resource,
        name,
        "-n",
        ns,
        "--ignore-not-found",
        "-o",
        "json",
    ])?;
    Ok(if v.is_null() { None } else { Some(v) })
}

pub fn get_required(resource: &str, ns: &str, name: &str) -> Result<Value, String> {
    get_opt(resource, ns, name)?.ok_or_else(|| format!("{resource} {ns}/{name} not found"))
}

pub fn gone(resource: &str, ns: &str, name: &str) -> Result<(), String> {
    match get_opt(resource, ns, name)? {
        None => Ok(()),
        Some(o) => Err(format!(
            "still exists: deletionTimestamp {}, finalizers {}",
            o["metadata"]["deletionTimestamp"],
            compact(&o["metadata"]["finalizers"])
        )),
    }
}

pub fn uid_of(resource: &str, ns: &str, name: &str) -> String {
    let obj = kubectl_json(&["get", resource, name, "-n", ns, "-o", "json"]);
    str_at(&obj, "/metadata/uid").to_owned()
}

pub fn str_at<'a>(v: &'a Value, pointer: &str) -> &'a str {
    v.pointer(pointer)
        .and_then(Value::as_str)
        .unwrap_or_else(|| panic!("{pointer} missing in {}", compact(v)))
}

/// The items of a List (or the object itself when kubectl printed a single object).
pub fn items(v: &Value) -> Vec<Value> {
    match v {
        Value::Null => Vec::new(),
        _ if v["kind"] == "List" || v["items"].is_array() => {
            v["items"].as_array().cloned().unwrap_or_default()
        }
        _ => vec![v.clone()],
    }
}

/// "Kind/namespace/name" of an object.
pub fn object_key(o: &Value) -> String {
    format!(
        "{}/{}/{}",
        o["kind"].as_str().unwrap_or_default(),
        o["metadata"]["namespace"].as_str().unwrap_or_default(),
        o["metadata"]["name"].as_str().unwrap_or_default()
    )
}

/// Splits multi-document YAML (as printed by kustomize) at `---` lines, dropping empty documents.
pub fn split_yaml_documents(text: &str) -> Vec<String> {
    let mut docs = Vec::new();
    let mut current = String::new();
    for line in text.lines() {
        if line.trim_end() == "---" {
            docs.push(std::mem::take(&mut current));
        } else {
            current.push_str(line);
            current.push('\n');
        }
    }
    docs.push(current);
    docs.retain(|d| {
        d.lines()
            .any(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
    });
    docs
}

/// The value of the unindented `kind:` line of a YAML document.
pub fn top_level_kind(doc: &str) -> Option<String> {
    doc.lines()
        .find_map(|l| l.strip_prefix("kind:"))
        .map(|k| k.trim().trim_matches(|c| c == '"' || c == '\'').to_owned())
}

/// A YAML double-quoted scalar (JSON string syntax is valid YAML).
pub fn yaml_str(s: &str) -> String {
    Value::String(s.to_owned()).to_string()
}

/// `certificate-authority` paths are relative to the kubeconfig file they come from.
pub fn absolute_ca_path(file: &str) -> String {
    let path = Path::new(file);
    if path.is_absolute() {
        return file.to_owned();
    }
    let kubeconfig = std::env::var("KUBECONFIG").unwrap_or_default();
    let first = std::env::split_paths(&kubeconfig)
        .next()
        .unwrap_or_default();
    first
        .parent()
        .map(|dir| dir.join(path))
        .unwrap_or_else(|| path.to_path_buf())
        .to_string_lossy()
        .into_owned()
}

/// Writes a file readable by the owner only (it holds a token).
pub fn write_private(path: &Path, content: &str) {
    let mut options = fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    let mut file = options
        .open(path)
        .unwrap_or_else(|e| panic!("cannot create {}: {e}", path.display()));
    file.write_all(content.as_bytes())
        .unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
}

pub fn shell_words(args: &[&str]) -> String {
    args.iter()
        .map(|a| {
            if !a.is_empty()
                && a.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_./:=,@%+".contains(c))
            {
                (*a).to_owned()
            } else {
                format!("'{}'", a.replace('\'', r"'\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

pub fn indent(text: &str) -> String {
    text.lines().map(|l| format!("      {l}\n")).collect()
}

pub fn truncate(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        s.to_owned()
    } else {
        format!("{}...", s.chars().take(max).collect::<String>())
    }
}

pub fn compact(v: &Value) -> String {
    truncate(&v.to_string(), 2000)
}

/// Standard base64 with padding, as Secret `data` holds values (to look for leaked values in that form too).
pub fn base64(data: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let byte = |i: usize| u32::from(chunk.get(i).copied().unwrap_or(0));
        let group = (byte(0) << 16) | (byte(1) << 8) | byte(2);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(
                    ALPHABET[((group >> (18 - 6 * i)) & 63) as usize],
                ));
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[test]
fn base64_matches_secret_data_encoding() {
    assert_eq!(base64(b""), "");
    assert_eq!(base64(b"a"), "YQ==");
    assert_eq!(base64(b"ab"), "YWI=");
    assert_eq!(base64(b"abc"), "YWJj");
    assert_eq!(base64(AUTH_CREDENTIALS.as_bytes()), "YXBwOnMzY3JldA==");
}
