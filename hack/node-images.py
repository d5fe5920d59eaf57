#!/usr/bin/env python3
"""Assembles the real node's images from binaries already on this machine, without a registry.

One OCI image archive per image, each a single layer of the binary, the shared libraries `ldd` lists
for it (with the dynamic loader) and an /etc/passwd naming the unprivileged user the pods run as:

- memcached:1.6-alpine      Debian's memcached (and `sleep`, which the preStop hook runs), the image the
                            operator gives every Memcached that sets none;
- memcached-proxy:local     the proxy-capable memcached ($MEMCACHED_PROXY_BINARY), when there is one;
- memcached-exporter        Prometheus' memcached_exporter (--exporter, default $MEMCACHED_EXPORTER_BINARY
                            or `memcached_exporter` on PATH), under the operator's default exporter image
                            name (src/api/features.rs DEFAULT_EXPORTER_IMAGE), when there is one;
- controller:latest         the operator's binary (--operator), the image config/default deploys;
- registry.k8s.io/pause:3.9 the sandbox image: a static binary that sleeps until a signal (--pause).

Usage: node-images.py OUT_DIR --operator BIN --pause BIN [--proxy BIN] [--exporter BIN]
Writes OUT_DIR/<file>.tar and prints "<archive> <image name>" per image, for `ctr images import`.
Nothing is downloaded, and the archives are not meant to be committed.
"""

import argparse
import gzip
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile

# The user the operator's pods run as (src/resources/pod.rs RUN_AS_USER) and the operator's own.
PASSWD = "root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65532:65532:nobody:/:/sbin/nologin\n" \
         "memcache:x:11211:11211:memcache:/:/sbin/nologin\n"
GROUP = "root:x:0:\nnobody:x:65532:\nmemcache:x:11211:\n"


def libraries(binary):
    """The shared libraries (and loader) `ldd` lists for `binary`; none for a static binary."""
    result = subprocess.run(["ldd", binary], capture_output=True, text=True)
    if result.returncode != 0:
        return []
    paths = []
    for line in result.stdout.splitlines():
        match = re.search(r"(/\S+) \(0x", line)
        if match:
            paths.append(match.group(1))
    return paths


def layer(files, symlinks):
    """A gzipped tar of `files` (image path -> host path) and `symlinks` (image path -> target):
    (bytes, diff id, digest). Fixed times and owners, so the same inputs make the same layer."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        dirs = set()
        for path in list(files) + list(symlinks):
            parent = os.path.dirname(path.lstrip("/"))
            while parent and parent not in dirs:
                dirs.add(parent)
                parent = os.path.dirname(parent)
        for d in sorted(dirs):
            info = tarfile.TarInfo(d)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)
        for path, source in sorted(files.items()):
            info = tarfile.TarInfo(path.lstrip("/"))
            if isinstance(source, bytes):
                data, info.mode = source, 0o644
            else:
                with open(source, "rb") as f:
                    data = f.read()
                info.mode = 0o755
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for path, target in sorted(symlinks.items()):
            info = tarfile.TarInfo(path.lstrip("/"))
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
    diff_id = "sha256:" + hashlib.sha256(raw.getvalue()).hexdigest()
    compressed = gzip.compress(raw.getvalue(), compresslevel=1, mtime=0)
    return compressed, diff_id, "sha256:" + hashlib.sha256(compressed).hexdigest()


def blob(tar, data):
    digest = hashlib.sha256(data).hexdigest()
    info = tarfile.TarInfo(f"blobs/sha256/{digest}")
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))
    return "sha256:" + digest, len(data)


def image(out, file_name, name, binaries, entrypoint, user, extra_links=None):
    """Writes OUT/file_name: an OCI archive of `binaries` (image path -> host path) with their libraries."""
    files = {"/etc/passwd": PASSWD.encode(), "/etc/group": GROUP.encode(), "/tmp/.keep": b""}
    for path, source in binaries.items():
        files[path] = source
        for lib in libraries(source):
            files[lib] = os.path.realpath(lib)
    layer_data, diff_id, layer_digest = layer(files, extra_links or {})
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {
            "Entrypoint": entrypoint,
            "Env": ["PATH=/usr/local/bin:/usr/bin:/bin"],
            "User": user,
            "WorkingDir": "/",
        },
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
    }
    path = os.path.join(out, file_name)
    with tarfile.open(path, "w") as tar:
        config_digest, config_size = blob(tar, json.dumps(config, sort_keys=True).encode())
        blob(tar, layer_data)
        manifest = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                       "digest": config_digest, "size": config_size},
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                        "digest": layer_digest, "size": len(layer_data)}],
        }
        manifest_digest, manifest_size = blob(tar, json.dumps(manifest, sort_keys=True).encode())
        index = {
            "schemaVersion": 2,
            "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json",
                           "digest": manifest_digest, "size": manifest_size,
                           "annotations": {"io.containerd.image.name": name,
                                           "org.opencontainers.image.ref.name": name}}],
        }
        for member, data in (("oci-layout", b'{"imageLayoutVersion":"1.0.0"}'),
                             ("index.json", json.dumps(index).encode())):
            info = tarfile.TarInfo(member)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    print(f"{path} {name}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--operator", required=True)
    parser.add_argument("--pause", required=True)
    parser.add_argument("--memcached", default="/usr/bin/memcached")
    parser.add_argument("--proxy", default=os.environ.get("MEMCACHED_PROXY_BINARY"))
    parser.add_argument("--exporter", default=os.environ.get("MEMCACHED_EXPORTER_BINARY")
                        or shutil.which("memcached_exporter"))
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    sleep = subprocess.run(["sh", "-c", "command -v sleep"], capture_output=True, text=True).stdout.strip()
    image(args.out, "pause.tar", "registry.k8s.io/pause:3.9", {"/pause": args.pause}, ["/pause"], "65535")
    # busybox, when there is one, for `sh` and `nc` in the pods (`kubectl exec`), as the alpine image has
    # (hack/real-node.sh requires it).
    busybox = subprocess.run(["sh", "-c", "command -v busybox"], capture_output=True, text=True).stdout.strip()
    tools = {"/bin/busybox": busybox} if busybox else {}
    links = {f"/bin/{tool}": "busybox" for tool in ("sh", "nc", "cat", "ls")} if busybox else {}
    image(args.out, "memcached.tar", "docker.io/library/memcached:1.6-alpine",
          {"/usr/bin/memcached": args.memcached, "/bin/sleep": sleep, **tools}, ["memcached"], "11211", links)
    # A memcached that exits at start (coreutils' `false` in its place): every configuration the operator
    # admits starts, so a crash-looping server comes from its image, as with a build that lacks an option.
    false = shutil.which("false")  # the program, not the shell's builtin
    image(args.out, "memcached-exits.tar", "docker.io/library/memcached-exits:local",
          {"/usr/bin/memcached": false}, ["memcached"], "11211")
    image(args.out, "operator.tar", "docker.io/library/controller:latest",
          {"/memcached-operator": args.operator}, ["/memcached-operator"], "65532")
    if args.proxy and os.access(args.proxy, os.X_OK):
        image(args.out, "memcached-proxy.tar", "docker.io/library/memcached-proxy:local",
              {"/usr/bin/memcached": args.proxy, "/bin/sleep": sleep, **tools}, ["memcached"], "11211",
              links)
    if args.exporter and os.access(args.exporter, os.X_OK):
        image(args.out, "memcached-exporter.tar", "docker.io/" + default_exporter_image(),
              {"/bin/memcached_exporter": args.exporter}, ["/bin/memcached_exporter"], "65534")
    return 0


def default_exporter_image():
    """The exporter image the operator gives a Memcached that names none, read from its source."""
    source = os.path.join(os.path.dirname(__file__), "..", "src", "api", "features.rs")
    with open(source) as f:
        match = re.search(r'DEFAULT_EXPORTER_IMAGE: &str = "([^"]+)"', f.read())
    if not match:
        raise SystemExit("node-images.py: DEFAULT_EXPORTER_IMAGE not found in src/api/features.rs")
    return match.group(1)


if __name__ == "__main__":
    sys.exit(main())
