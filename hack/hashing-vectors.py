#!/usr/bin/env python3
"""Writes tests/fixtures/hashing/*.json: which server real client libraries pick for a key.

tests/hashing.rs checks the operator's `spec.clients.hashing` schemes (src/hashing/) against these files,
so each file records what the library itself chose, never what this script computes. The script only
uses installed packages:

  - pymemcache (pip install pymemcache) for `rendezvous`: HashClient's default RendezvousHash;
  - jump-consistent-hash (pip install jump-consistent-hash) for `jump`;
  - pylibmc over libmemcached (apt-get install python3-pylibmc, Debian's build) for `ketama` and
    `modula`. pylibmc's Client.hash(key) returns libmemcached's memcached_generate_hash(): the index of
    the server the key goes to. Debian's pylibmc is installed for Debian's python3, which may not be the
    interpreter running this script: that part runs in a child process of $PYLIBMC_PYTHON
    (default /usr/bin/python3).

Usage: python3 hack/hashing-vectors.py [OUTPUT_DIR]   (default tests/fixtures/hashing)
"""

import hashlib
import json
import os
import subprocess
import sys

OUTPUT_DIR = "tests/fixtures/hashing"

# Server lists as the operator publishes them (ConfigMap `<name>-servers`, key `servers`, slot order):
# `podIP:port` for a Deployment, the pod's stable DNS name for a StatefulSet, a non-default port, and
# a bracketed IPv6 pod address.
SERVER_LISTS = [
    ["10.244.0.17:11211"],
    ["10.244.1.5:11211", "10.244.2.9:11211", "10.244.3.14:11211"],
    [f"memcached-pool-{i}.memcached-pool-headless.default.svc:11211" for i in range(4)],
    [f"cache-{i}.cache-headless.prod.svc:11211" for i in range(5)],
    ["10.0.0.1:11211", "10.0.0.2:11211", "10.0.0.3:11211", "10.0.0.4:11211", "10.0.0.5:11211"],
    ["10.1.2.3:11311", "10.1.2.4:11311", "10.1.2.5:11311"],
    ["[fd00:10:244::5]:11211", "[fd00:10:244::6]:11211", "[fd00:10:244::7]:11211", "[fd00:10:244::8]:11211"],
    # Sizes where libmemcached's float arithmetic gives ketama 156 points per server instead of 160.
    [f"big-{i}.big-headless.default.svc:11211" for i in range(25)],
    [f"10.8.{i // 200}.{i % 200 + 1}:11211" for i in range(50)],
]


def keys():
    """About 200 keys memcached accepts (no space or control byte, at most 250 bytes): short and long,
    every length 1-16 (MurmurHash3's tail cases), UTF-8 text, and bytes that are not UTF-8."""
    out = []
    out += [b"a", b"Z", b"0", b"_", b"~", b"-", b":"]
    out += [b"k" * n for n in range(1, 17)]
    out += [b"user:%d" % i for i in range(60)]
    out += [b"session:" + hashlib.sha1(b"%d" % i).hexdigest().encode() for i in range(30)]
    out += [b"page:/products/%d?lang=en" % i for i in range(20)]
    out += [b"x" * 250, b"y" * 249, b"z" * 248, b"w" * 247]
    out += [(b"long:%d:" % i + hashlib.sha256(b"%d" % i).hexdigest().encode() * 4)[:250] for i in range(10)]
    text = ["café:1", "ключ:42", "キー:7", "clé-ü", "🔑:secret", "naïve", "Ωmega", "日本語のキー", "ñandú:3", "€uro"]
    out += [t.encode("utf-8") for t in text]
    out += [("ключ:%d" % i).encode("utf-8") for i in range(10)]
    raw = [bytes([0x80 + i, 0x41, 0xFF - i]) for i in range(10)] + [b"\xff", b"\x80", b"key\xc3", b"\xfe\xfd\xfc\xfb\xfa"]
    out += raw
    out += [bytes(range(0x21, 0x7F)), bytes(range(0x80, 0x100))]
    assert len(out) == len(set(out))
    for k in out:
        assert 0 < len(k) <= 250 and all(b > 0x20 and b != 0x7F for b in k), k
    return out


def is_utf8(key):
    try:
        key.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


def rendezvous(server_lists, all_keys):
    """pymemcache's HashClient as docs/clients.md builds it: the published `host:port` strings, str
    keys (UTF-8 on the wire, allow_unicode_keys for non-ASCII ones). The pick is the client object
    HashClient._get_client returns, the one every command of HashClient uses."""
    import pymemcache
    from pymemcache.client.hash import HashClient

    key_list = [k for k in all_keys if is_utf8(k)]
    cases = []
    for servers in server_lists:
        client = HashClient(servers, allow_unicode_keys=True)
        by_server = [client.clients[node] for node in client.hasher.nodes]
        assert len(by_server) == len(servers)
        picks = []
        for key in key_list:
            chosen = client._get_client(key.decode("utf-8"))
            picks.append(next(i for i, c in enumerate(by_server) if c is chosen))
        cases.append({"servers": servers, "picks": picks})
    return {
        "scheme": "rendezvous",
        "library": f"pymemcache {pymemcache.__version__}",
        "settings": "pymemcache.client.hash.HashClient(servers, allow_unicode_keys=True), default hasher "
        "RendezvousHash (murmur3_32, seed 0); servers given as the published `host:port` strings; keys "
        "passed as str",
        "keys": [k.hex() for k in key_list],
        "cases": cases,
    }


def jump_vectors(server_lists, all_keys):
    """jump-consistent-hash with the key turned into an integer the way its README shows first:
    int(hashlib.md5(key).hexdigest(), 16); buckets are slot indexes."""
    from importlib.metadata import version

    import jump

    cases = []
    for servers in server_lists:
        picks = [jump.hash(int(hashlib.md5(k).hexdigest(), 16), len(servers)) for k in all_keys]
        cases.append({"servers": servers, "picks": picks})
    return {
        "scheme": "jump",
        "library": f"jump-consistent-hash {version('jump-consistent-hash')} (C extension: "
        f"{jump.c_hash is not None})",
        "settings": "jump.hash(int(hashlib.md5(key).hexdigest(), 16), len(servers)); the bucket is the "
        "slot index",
        "keys": [k.hex() for k in all_keys],
        "cases": cases,
    }


PYLIBMC_CHILD = r"""
import json, sys
import pylibmc
request = json.load(sys.stdin)
keys = [bytes.fromhex(k) for k in request["keys"]]
out = {"pylibmc": pylibmc.__version__, "libmemcached": pylibmc.libmemcached_version, "schemes": {}}
for name, behaviors in request["behaviors"].items():
    cases = []
    for servers in request["server_lists"]:
        client = pylibmc.Client(servers, behaviors=behaviors)
        got = client.get_behaviors()
        picks = [client.hash(k) for k in keys]
        assert all(0 <= p < len(servers) for p in picks)
        cases.append({"servers": servers, "picks": picks})
    out["schemes"][name] = {"behaviors": {k: got[k] for k in ("hash", "distribution", "ketama", "ketama_weighted")}, "cases": cases}
json.dump(out, sys.stdout)
"""


def debian_package_version(package):
    try:
        return subprocess.run(
            ["dpkg-query", "-W", "-f=${Version}", package], check=True, capture_output=True, text=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def libmemcached_vectors(server_lists, all_keys):
    python = os.environ.get("PYLIBMC_PYTHON", "/usr/bin/python3")
    behaviors = {"ketama": {"ketama_weighted": True}, "modula": {}}
    request = {"keys": [k.hex() for k in all_keys], "server_lists": server_lists, "behaviors": behaviors}
    result = subprocess.run(
        [python, "-c", PYLIBMC_CHILD], input=json.dumps(request), capture_output=True, text=True, check=True
    )
    answer = json.loads(result.stdout)
    library = (
        f"pylibmc {answer['pylibmc']} over libmemcached (Debian libmemcached11 "
        f"{debian_package_version('libmemcached11')}, reports {answer['libmemcached']})"
    )
    settings = {
        "ketama": "pylibmc.Client(servers, behaviors={'ketama_weighted': True}), i.e. "
        "MEMCACHED_BEHAVIOR_KETAMA_WEIGHTED as PHP's Memcached::OPT_LIBKETAMA_COMPATIBLE sets it",
        "modula": "pylibmc.Client(servers) with libmemcached's defaults (MEMCACHED_DISTRIBUTION_MODULA, "
        "MEMCACHED_HASH_DEFAULT)",
    }
    files = {}
    for name, scheme in answer["schemes"].items():
        files[name] = {
            "scheme": name,
            "library": library,
            "settings": settings[name] + f"; the library reported behaviors {scheme['behaviors']}",
            "keys": [k.hex() for k in all_keys],
            "cases": scheme["cases"],
        }
    return files


def render(content):
    """JSON with one line per field, key and list: small diffs when a library version changes picks."""
    lines = ["{"]
    for field in ("about", "scheme", "library", "settings"):
        lines.append(f" {json.dumps(field)}: {json.dumps(content[field], ensure_ascii=False)},")
    lines.append(' "keys": [')
    lines.append(",\n".join(f"  {json.dumps(k)}" for k in content["keys"]))
    lines.append(" ],")
    lines.append(' "cases": [')
    cases = [
        f'  {{"servers": {json.dumps(c["servers"])},\n   "picks": {json.dumps(c["picks"], separators=(",", ":"))}}}'
        for c in content["cases"]
    ]
    lines.append(",\n".join(cases))
    lines.append(" ]")
    lines.append("}")
    return "\n".join(lines) + "\n"


def main():
    output_dir = sys.argv[1] if len(sys.argv) > 1 else OUTPUT_DIR
    all_keys = keys()
    files = {"rendezvous": rendezvous(SERVER_LISTS, all_keys), "jump": jump_vectors(SERVER_LISTS, all_keys)}
    files.update(libmemcached_vectors(SERVER_LISTS, all_keys))
    os.makedirs(output_dir, exist_ok=True)
    for name, content in sorted(files.items()):
        content = {
            "about": "Produced by hack/hashing-vectors.py from the library named in `library`; checked by "
            "tests/hashing.rs. Keys are hex; picks[i] is the index, in `servers`, of the server the "
            "library chose for keys[i].",
            **content,
        }
        with open(os.path.join(output_dir, f"{name}.json"), "w") as f:
            f.write(render(content))
        print(f"{name}: {len(content['keys'])} keys x {len(content['cases'])} lists ({content['library']})")


if __name__ == "__main__":
    main()
