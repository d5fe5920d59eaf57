//! Secret volumes of the container the stand-in runs as a process (`memcached`): each Secret volume it
//! mounts is written, as a kubelet writes it, to a directory of the pod's own under the kubelet's
//! directory (the Secret's keys, or its `items` at their paths, with `defaultMode` or the item's
//! `mode`), and paths under the container's `mountPath` in its arguments are mapped there. So memcached
//! loads the pod's real TLS certificate and auth file, and fails to start where they are wrong, as it
//! would in a container.
//!
//! A Secret that cannot be read (missing and not `optional`) fails the mount; the pod waits for it, as a
//! kubelet keeps a pod in `ContainerCreating` until its volumes mount. Other volume kinds are not
//! written (the stand-in mounts nothing else).
//!
//! A `subPath` mount is a copy of the file as it was when the pod started (`<volume>.subpath/<subPath>`),
//! never updated: a kubelet bind-mounts the file's inode at container start and keeps that mount for the
//! pod's life, container restarts included (kubernetes#89629), so a Secret changed later never reaches it.
//!
//! While the pod runs, [`mount`] is called again now and then (the kubelet's sync): a changed Secret is
//! written into the running pod's volume the way a kubelet's atomic writer does it, so that a process
//! never sees half an update: the files live in a directory of their own (`..<timestamp>`), reached
//! through the symlink `..data`, and each top-level name is a symlink into `..data`; an update writes a
//! new directory and renames a new `..data` symlink over the old one. Unchanged content is not
//! rewritten.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::{Container, Pod, Secret, SecretVolumeSource};
use kube::{Api, Client, ResourceExt};

/// The mode of a Secret volume's files when the volume names none (the API's default, 0644).
const DEFAULT_MODE: i32 = 0o644;

/// The Secret volumes of one container, written out: `mountPath` → local directory.
#[derive(Debug, Default)]
pub struct Mounts {
    mounts: Vec<(String, PathBuf)>,
    /// `subPath` mounts: the container's file path → the pinned local file.
    files: Vec<(String, PathBuf)>,
}

impl Mounts {
    /// Whether no Secret volume was written.
    pub fn is_empty(&self) -> bool {
        self.mounts.is_empty()
    }

    /// `arg` with every path under a mount (`/etc/memcached/tls/tls.crt`, also inside
    /// `ssl_key=/etc/...`) replaced by the file written for it.
    pub fn map(&self, arg: &str) -> String {
        let mut out = arg.to_owned();
        for (mount_path, local) in &self.files {
            if out == *mount_path || out.ends_with(&format!("={mount_path}")) {
                out = format!(
                    "{}{}",
                    &out[..out.len() - mount_path.len()],
                    local.display()
                );
            }
        }
        for (mount_path, local) in &self.mounts {
            let from = format!("{}/", mount_path.trim_end_matches('/'));
            let to = format!("{}/", local.display());
            out = replace_at_path_starts(&out, &from, &to);
        }
        out
    }

    /// Mounts from (mountPath, local directory) pairs.
    pub fn from_pairs(pairs: &[(&str, &str)]) -> Mounts {
        Mounts {
            mounts: pairs
                .iter()
                .map(|(m, l)| ((*m).to_owned(), PathBuf::from(l)))
                .collect(),
            files: Vec::new(),
        }
    }
}

/// Replaces `from` where it begins a path: at the start of `text`, or after `=` or `,`.
fn replace_at_path_starts(text: &str, from: &str, to: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    let mut at_start = true;
    while !rest.is_empty() {
        if at_start && rest.starts_with(from) {
            out.push_str(to);
            rest = &rest[from.len()..];
            at_start = false;
            continue;
        }
        let c = rest.chars().next().unwrap_or_default();
        out.push(c);
        at_start = c == '=' || c == ',';
        rest = &rest[c.len_utf8()..];
    }
    out
}

/// Writes the Secret volumes that `container` of `pod` mounts under `dir` (one subdirectory per volume,
/// replaced if it exists) and returns where each mount went.
pub async fn mount(
    client: &Client,
    pod: &Pod,
    container: &Container,
    dir: &Path,
) -> Result<Mounts> {
    let namespace = pod.namespace().unwrap_or_default();
    let volumes = pod
        .spec
        .as_ref()
        .and_then(|s| s.volumes.as_deref())
        .unwrap_or_default();
    let api: Api<Secret> = Api::namespaced(client.clone(), &namespace);
    let mut mounts = Mounts::default();
    for volume_mount in container.volume_mounts.iter().flatten() {
        let Some(source) = volumes
            .iter()
            .find(|v| v.name == volume_mount.name)
            .and_then(|v| v.secret.as_ref())
        else {
            continue;
        };
        let name = source.secret_name.clone().unwrap_or_default();
        let secret = api
            .get_opt(&name)
            .await
            .with_context(|| format!("cannot read secret {namespace}/{name}"))?;
        let secret = match secret {
            Some(secret) => secret,
            None if source.optional == Some(true) => Secret::default(),
            None => bail!(
                "MountVolume.SetUp failed for volume {:?} : secret {name:?} not found",
                volume_mount.name
            ),
        };
        let files =
            files(source, &secret).with_context(|| format!("volume {:?}", volume_mount.name))?;
        let local = dir.join(&volume_mount.name);
        write(&local, &files)
            .with_context(|| format!("cannot write volume {:?}", volume_mount.name))?;
        match volume_mount.sub_path.as_deref().filter(|p| !p.is_empty()) {
            Some(sub_path) => {
                let pinned = pin(dir, &volume_mount.name, &local, sub_path)?;
                mounts.files.push((volume_mount.mount_path.clone(), pinned));
            }
            None => mounts.mounts.push((volume_mount.mount_path.clone(), local)),
        }
    }
    Ok(mounts)
}

/// The pinned copy of `sub_path` of the volume written at `local`: made the first time, then kept as it
/// is (see the module documentation).
fn pin(dir: &Path, volume: &str, local: &Path, sub_path: &str) -> Result<PathBuf> {
    if sub_path.starts_with('/') || sub_path.split('/').any(|p| p == "..") {
        bail!("volume {volume:?}: subPath {sub_path:?} leaves the volume");
    }
    let pinned = dir.join(format!("{volume}.subpath")).join(sub_path);
    if !pinned.exists() {
        if let Some(parent) = pinned.parent() {
            fs::create_dir_all(parent)?;
        }
        fs::copy(local.join(sub_path), &pinned)
            .with_context(|| format!("volume {volume:?}: subPath {sub_path:?}"))?;
    }
    Ok(pinned)
}

/// The files a Secret volume holds: relative path → (content, mode).
fn files(source: &SecretVolumeSource, secret: &Secret) -> Result<BTreeMap<String, (Vec<u8>, u32)>> {
    let mut data: BTreeMap<String, Vec<u8>> = secret
        .data
        .iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.0.clone()))
        .collect();
    for (k, v) in secret.string_data.iter().flatten() {
        data.insert(k.clone(), v.clone().into_bytes());
    }
    let default_mode = source.default_mode.unwrap_or(DEFAULT_MODE);
    let mode = |m: i32| u32::try_from(m).unwrap_or(0o644) & 0o777;
    let mut files = BTreeMap::new();
    match &source.items {
        Some(items) if !items.is_empty() => {
            for item in items {
                let Some(content) = data.get(&item.key) else {
                    if source.optional == Some(true) {
                        continue;
                    }
                    bail!("key {:?} is not in the secret", item.key);
                };
                if item.path.starts_with('/') || item.path.split('/').any(|p| p == "..") {
                    bail!("item path {:?} leaves the volume", item.path);
                }
                files.insert(
                    item.path.clone(),
                    (content.clone(), mode(item.mode.unwrap_or(default_mode))),
                );
            }
        }
        _ => {
            for (key, content) in data {
                files.insert(key, (content, mode(default_mode)));
            }
        }
    }
    Ok(files)
}

/// The symlink to the directory holding the current files (the kubelet's name).
const DATA: &str = "..data";

/// Writes `files` into the volume directory `dir` atomically (see the module documentation); nothing
/// when they are what it holds already.
fn write(dir: &Path, files: &BTreeMap<String, (Vec<u8>, u32)>) -> Result<()> {
    let data = dir.join(DATA);
    if data.exists() && holds(&data, files) {
        return Ok(());
    }
    fs::create_dir_all(dir)?;
    let previous = fs::read_link(&data).ok();
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    let version = format!("..{nanos}");
    let staged = dir.join(&version);
    fs::create_dir_all(&staged)?;
    for (path, (content, mode)) in files {
        let file = staged.join(path);
        if let Some(parent) = file.parent() {
            fs::create_dir_all(parent)?;
        }
        fs::write(&file, content)?;
        fs::set_permissions(&file, fs::Permissions::from_mode(*mode))?;
    }
    let link = dir.join("..data_tmp");
    let _ = fs::remove_file(&link);
    std::os::unix::fs::symlink(&version, &link)?;
    fs::rename(&link, &data)?;
    // Top-level names point into ..data; names no longer in the Secret go.
    let top: std::collections::BTreeSet<String> = files
        .keys()
        .filter_map(|path| path.split('/').next().map(str::to_owned))
        .collect();
    for name in &top {
        let entry = dir.join(name);
        if fs::symlink_metadata(&entry).is_err() {
            std::os::unix::fs::symlink(Path::new(DATA).join(name), &entry)?;
        }
    }
    for entry in fs::read_dir(dir)?.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with("..") && !top.contains(&name) {
            let _ = match entry.file_type() {
                Ok(kind) if kind.is_dir() => fs::remove_dir_all(entry.path()),
                _ => fs::remove_file(entry.path()),
            };
        }
    }
    if let Some(previous) = previous {
        let _ = fs::remove_dir_all(dir.join(previous));
    }
    Ok(())
}

/// Whether the directory `data` holds exactly `files` (content and mode).
fn holds(data: &Path, files: &BTreeMap<String, (Vec<u8>, u32)>) -> bool {
    files.iter().all(|(path, (content, mode))| {
        let file = data.join(path);
        fs::read(&file).is_ok_and(|held| held == *content)
            && fs::metadata(&file).is_ok_and(|m| m.permissions().mode() & 0o7777 == *mode)
    }) && count_files(data) == files.len()
}

fn count_files(dir: &Path) -> usize {
    fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .map(|entry| match entry.file_type() {
                    Ok(kind) if kind.is_dir() => count_files(&entry.path()),
                    _ => 1,
                })
                .sum()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_sub_path_mount_keeps_the_file_the_pod_started_with() {
        let dir = std::env::temp_dir().join(format!("envtest-subpath-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let volume = dir.join("auth");
        let files = |content: &str| {
            BTreeMap::from([("users".to_owned(), (content.as_bytes().to_vec(), 0o440))])
        };
        write(&volume, &files("u:p\n")).unwrap();
        let pinned = pin(&dir, "auth", &volume, "users").unwrap();
        write(&volume, &files("u:q")).unwrap();
        assert_eq!(fs::read(volume.join("users")).unwrap(), b"u:q");
        assert_eq!(pin(&dir, "auth", &volume, "users").unwrap(), pinned);
        assert_eq!(fs::read(&pinned).unwrap(), b"u:p\n", "the pod's file stays");
        let mounts = Mounts {
            mounts: vec![],
            files: vec![("/etc/memcached/auth/users".into(), pinned.clone())],
        };
        assert_eq!(
            mounts.map("/etc/memcached/auth/users"),
            pinned.display().to_string()
        );
        assert!(pin(&dir, "auth", &volume, "../x").is_err());
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn an_update_swaps_the_files_at_once_and_unchanged_content_is_left_alone() {
        let dir =
            std::env::temp_dir().join(format!("envtest-volume-update-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let files = |crt: &str| {
            BTreeMap::from([
                ("tls.crt".to_owned(), (crt.as_bytes().to_vec(), 0o440)),
                ("tls.key".to_owned(), (b"key".to_vec(), 0o440)),
            ])
        };
        write(&dir, &files("one")).unwrap();
        assert_eq!(fs::read_to_string(dir.join("tls.crt")).unwrap(), "one");
        assert!(
            fs::symlink_metadata(dir.join("tls.crt"))
                .unwrap()
                .is_symlink()
        );
        let first = fs::read_link(dir.join(DATA)).unwrap();
        write(&dir, &files("one")).unwrap();
        assert_eq!(
            fs::read_link(dir.join(DATA)).unwrap(),
            first,
            "not rewritten"
        );

        // A process holding the old file open keeps reading the old content; a new open sees the new.
        let mut open = fs::File::open(dir.join("tls.crt")).unwrap();
        write(&dir, &files("two")).unwrap();
        assert_eq!(fs::read_to_string(dir.join("tls.crt")).unwrap(), "two");
        let mut old = String::new();
        std::io::Read::read_to_string(&mut open, &mut old).unwrap();
        assert_eq!(old, "one");
        assert!(
            !dir.join(&first).exists(),
            "the previous version is removed"
        );

        let fewer = BTreeMap::from([("tls.key".to_owned(), (b"key".to_vec(), 0o440))]);
        write(&dir, &fewer).unwrap();
        assert!(
            fs::symlink_metadata(dir.join("tls.crt")).is_err(),
            "a removed key goes"
        );
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn paths_under_a_mount_are_mapped_where_a_path_begins() {
        let mounts = Mounts::from_pairs(&[
            ("/etc/memcached/tls", "/k/p/tls"),
            ("/etc/memcached/auth/", "/k/p/auth"),
        ]);
        assert_eq!(
            mounts.map("modern,ssl_chain_cert=/etc/memcached/tls/tls.crt,ssl_key=/etc/memcached/tls/tls.key"),
            "modern,ssl_chain_cert=/k/p/tls/tls.crt,ssl_key=/k/p/tls/tls.key"
        );
        assert_eq!(
            mounts.map("/etc/memcached/auth/auth-file"),
            "/k/p/auth/auth-file"
        );
        assert_eq!(mounts.map("/etc/memcached/tlsx/a"), "/etc/memcached/tlsx/a");
        assert_eq!(mounts.map("x/etc/memcached/tls/a"), "x/etc/memcached/tls/a");
        assert_eq!(mounts.map("-m"), "-m");
    }

    #[test]
    fn a_volume_holds_every_key_or_the_items_at_their_paths() {
        let secret: Secret = serde_json::from_value(json!({
            "data": {"tls.crt": "Y2VydA==", "tls.key": "a2V5"},
            "stringData": {"ca.crt": "ca"},
        }))
        .unwrap();
        let all: SecretVolumeSource =
            serde_json::from_value(json!({"secretName": "s", "defaultMode": 0o400})).unwrap();
        let files = files(&all, &secret).unwrap();
        assert_eq!(
            files.keys().map(String::as_str).collect::<Vec<_>>(),
            ["ca.crt", "tls.crt", "tls.key"]
        );
        assert_eq!(files["tls.crt"], (b"cert".to_vec(), 0o400));

        let some: SecretVolumeSource = serde_json::from_value(json!({
            "secretName": "s",
            "items": [{"key": "tls.key", "path": "keys/server.key", "mode": 0o600}],
        }))
        .unwrap();
        let files = super::files(&some, &secret).unwrap();
        assert_eq!(files.len(), 1);
        assert_eq!(files["keys/server.key"], (b"key".to_vec(), 0o600));

        let missing: SecretVolumeSource = serde_json::from_value(json!({
            "secretName": "s", "items": [{"key": "nope", "path": "x"}],
        }))
        .unwrap();
        assert!(super::files(&missing, &secret).is_err());
        let escaping: SecretVolumeSource = serde_json::from_value(json!({
            "secretName": "s", "items": [{"key": "tls.key", "path": "../x"}],
        }))
        .unwrap();
        assert!(super::files(&escaping, &secret).is_err());
    }

    #[test]
    fn files_are_written_with_their_modes_replacing_an_earlier_volume() {
        let dir = std::env::temp_dir().join(format!("envtest-volume-{}", std::process::id()));
        fs::create_dir_all(dir.join("stale")).unwrap();
        let files = BTreeMap::from([
            ("a".to_owned(), (b"1".to_vec(), 0o600)),
            ("d/b".to_owned(), (b"2".to_vec(), 0o644)),
        ]);
        write(&dir, &files).unwrap();
        assert_eq!(fs::read(dir.join("d/b")).unwrap(), b"2");
        let mode = fs::metadata(dir.join("a")).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert!(!dir.join("stale").exists());
        fs::remove_dir_all(&dir).unwrap();
    }
}
