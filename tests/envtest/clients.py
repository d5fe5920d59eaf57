#!/usr/bin/env python3
"""Real memcached client libraries for the envtest tier's real_clients scenarios (tests/envtest/real_clients.rs).

Each declared `spec.clients.hashing` is driven through the library docs/clients.md names, configured as it
tells users to:

  ketama      pylibmc.Client(servers, behaviors={"ketama_weighted": True})   (libmemcached)
  modula      pylibmc.Client(servers)                                         (libmemcached's defaults)
  rendezvous  pymemcache HashClient built from the published (host, port) entries, str keys
  jump        jump.hash(int(hashlib.md5(key).hexdigest(), 16), len(servers)) picking one plain
              pymemcache Client per published server, in list order
  plain       one plain pymemcache Client of the one address given (the proxy's, tests/envtest/proxy.rs);
              over TLS when the request has `tls_ca` (a PEM CA: the server's certificate is verified
              against it and the host name given), presenting the client certificate `tls_cert` (PEM,
              with its key `tls_key`) when given; keys start with `key_prefix` when given

One JSON request on stdin, one JSON answer on stdout:

  {"op": "probe", "hashing": H, "hosts": {...}}
      -> {"library": "..."} or {"unavailable": "why"}
  {"op": "fill" | "count", "hashing": H, "servers": ["host:port", ...], "keys": N, "value_len": L,
   "hosts": {"name": "ip", ...}}
      -> {"library": "...", "keys": N, "hits": n, "seconds": s}   (fill: hits = keys stored)

  {"op": "raw", "servers": [proxy], "commands": ["get k\r\n", ...], "tls_ca": .., "tls_cert": ..}
      -> {"answers": ["...", ...]}   (each command on a new connection: its first line, or "closed",
                                      or "error: ..." when the connection or handshake failed)
  {"op": "held", "servers": [...], "keys": N, "value_len": L}
      -> {"held": [[i, ...], ...]}   (per server, asked alone: the indexes of the keys it holds)
  {"op": "watch", "hashing": "plain", "servers": [proxy], "keys": N, "value_len": L, "seconds": S}
      -> {"started": t, "rounds": r, "missed": {i: [first, last]}, "errors": {i: [first, last]},
          "batch_errors": b}
      reads every key again and again for S seconds; for each key that missed (or whose read failed) at
      least once, the first and last time it did (seconds since `started`, a Unix time). A batch whose
      multi-get fails is read again key by key, each on a new client, so that each failure is put on its
      own key.

`servers` is the published list as a client reads it (the ConfigMap's `servers`, slot order). `hosts` maps
the published names that only the cluster's DNS resolves (a StatefulSet's `<pod>.<name>-headless.<ns>.svc`)
to their pods' addresses: the process then runs in a mount namespace of its own whose /etc/hosts holds
them, so the libraries resolve the names through the system resolver (libmemcached's getaddrinfo included)
as they would in the cluster, and hash the names as published.
"""

import ctypes
import hashlib
import json
import os
import sys
import tempfile
import time

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
MS_BIND = 0x1000
MS_REC = 0x4000
MS_PRIVATE = 0x40000


KEY_PREFIX = ""


def key(i):
    return f"{KEY_PREFIX}real-client-key-{i:05}"


def value(i, length):
    k = key(i) + "|"
    return (k * (length // len(k) + 1))[:length]


def stand_in_dns(hosts):
    """Makes /etc/hosts, for this process only, map each name of `hosts` to its address."""
    libc = ctypes.CDLL(None, use_errno=True)
    uid, gid = os.getuid(), os.getgid()
    if libc.unshare(CLONE_NEWNS) != 0:
        first = os.strerror(ctypes.get_errno())
        # Without CAP_SYS_ADMIN: a user namespace of our own gives it (where the kernel allows them).
        if libc.unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0:
            raise OSError(f"unshare: {first}; in a user namespace: {os.strerror(ctypes.get_errno())}")
        with open("/proc/self/setgroups", "w") as f:
            f.write("deny")
        with open("/proc/self/uid_map", "w") as f:
            f.write(f"{uid} {uid} 1")
        with open("/proc/self/gid_map", "w") as f:
            f.write(f"{gid} {gid} 1")
    if libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None) != 0:
        raise OSError(f"making / private: {os.strerror(ctypes.get_errno())}")
    fd, path = tempfile.mkstemp(prefix="envtest-hosts-")
    with os.fdopen(fd, "w") as f:
        f.write("127.0.0.1 localhost\n::1 localhost\n")
        for name, address in sorted(hosts.items()):
            f.write(f"{address} {name}\n")
    try:
        if libc.mount(path.encode(), b"/etc/hosts", None, MS_BIND, None) != 0:
            raise OSError(f"bind-mounting /etc/hosts: {os.strerror(ctypes.get_errno())}")
    finally:
        os.unlink(path)


def read_servers(lines):
    """docs/clients.md's read_servers(): (host, port) tuples, IPv6 brackets stripped."""
    servers = []
    for line in lines:
        host, port = line.rsplit(":", 1)
        servers.append((host.strip("[]"), int(port)))
    return servers


class Libmemcached:
    def __init__(self, servers, behaviors):
        import pylibmc

        self.library = f"pylibmc {pylibmc.__version__} (libmemcached {pylibmc.libmemcached_version})"
        self.client = pylibmc.Client(servers, behaviors=behaviors)

    def set_many(self, items):
        return len(items) - len(self.client.set_multi(items))

    def get_many(self, keys):
        return self.client.get_multi(keys)


class Rendezvous:
    def __init__(self, servers):
        import pymemcache
        from pymemcache.client.hash import HashClient

        self.library = f"pymemcache {pymemcache.__version__} HashClient"
        self.client = HashClient(read_servers(servers), use_pooling=True)

    def set_many(self, items):
        # noreply=False: pymemcache's default sends sets without waiting for answers and reports none
        # failed, whatever happened to them (a proxy drops those still queued when the client leaves).
        return len(items) - len(self.client.set_many(items, noreply=False))

    def get_many(self, keys):
        return {k: v.decode() for k, v in self.client.get_many(keys).items()}


class Jump:
    def __init__(self, servers):
        from importlib.metadata import version

        import jump
        import pymemcache
        from pymemcache.client.base import Client

        self.jump = jump
        self.library = (
            f"jump-consistent-hash {version('jump-consistent-hash')} over pymemcache {pymemcache.__version__} Client"
        )
        self.clients = [Client(server) for server in read_servers(servers)]

    def by_server(self, keys):
        groups = {}
        for k in keys:
            bucket = self.jump.hash(int(hashlib.md5(k.encode()).hexdigest(), 16), len(self.clients))
            groups.setdefault(bucket, []).append(k)
        return groups

    def set_many(self, items):
        stored = 0
        for bucket, keys in self.by_server(items).items():
            failed = self.clients[bucket].set_many({k: items[k] for k in keys}, noreply=False)
            stored += len(keys) - len(failed)
        return stored

    def get_many(self, keys):
        found = {}
        for bucket, group in self.by_server(keys).items():
            found.update({k: v.decode() for k, v in self.clients[bucket].get_many(group).items()})
        return found


class Plain:
    """One plain pymemcache Client of the one address given (the proxy's): no hashing, no list."""

    def __init__(self, servers, tls_ca=None, tls_cert=None):
        import pymemcache
        from pymemcache.client.base import Client

        self.library = f"pymemcache {pymemcache.__version__} Client"
        (server,) = read_servers(servers)
        self.client = Client(server, tls_context=tls_context(tls_ca, tls_cert))

    def set_many(self, items):
        # noreply=False: pymemcache's default sends sets without waiting for answers and reports none
        # failed, whatever happened to them (a proxy drops those still queued when the client leaves).
        return len(items) - len(self.client.set_many(items, noreply=False))

    def get_many(self, keys):
        return {k: v.decode() for k, v in self.client.get_many(keys).items()}


def tls_context(tls_ca, tls_cert):
    """A client TLS context trusting `tls_ca`, presenting `tls_cert` (certificate and key PEM), or None."""
    import ssl

    if not tls_ca:
        return None
    context = ssl.create_default_context(cadata=tls_ca)
    if tls_cert:
        with tempfile.NamedTemporaryFile("w", suffix=".pem") as f:
            f.write(tls_cert["cert"] + tls_cert["key"])
            f.flush()
            context.load_cert_chain(f.name)
    return context


def raw(request):
    """Each command on a new connection to the one server: the first line of its answer."""
    import socket

    (server,) = read_servers(request["servers"])
    host, port = server
    context = tls_context(request.get("tls_ca"), request.get("tls_cert"))
    answers = []
    for command in request["commands"]:
        try:
            s = socket.create_connection((host, port), timeout=5)
            if context:
                s = context.wrap_socket(s, server_hostname=host)
            s.sendall(command.encode())
            data = b""
            while b"\n" not in data:
                chunk = s.recv(4096)
                if not chunk:
                    break
                data += chunk
            s.close()
            answers.append(data.split(b"\r\n")[0].decode() if data else "closed")
        except (OSError, ValueError) as e:
            answers.append(f"error: {type(e).__name__}: {e}")
    return {"answers": answers}


def client(hashing, servers, tls_ca=None, tls_cert=None):
    if hashing == "plain":
        return Plain(servers, tls_ca, tls_cert)
    if hashing == "ketama":
        return Libmemcached(servers, {"ketama_weighted": True})
    if hashing == "modula":
        return Libmemcached(servers, {})
    if hashing == "rendezvous":
        return Rendezvous(servers)
    if hashing == "jump":
        return Jump(servers)
    raise ValueError(f"no client for hashing {hashing!r}")


BATCH = 1000


def held(request):
    """The indexes of the keys each server holds, each server asked alone."""
    n, length = request["keys"], request["value_len"]
    answer = []
    for server in request["servers"]:
        c = Plain([server])
        found = {}
        for first in range(0, n, BATCH):
            found.update(c.get_many([key(i) for i in range(first, min(first + BATCH, n))]))
        answer.append([i for i in range(n) if found.get(key(i)) == value(i, length)])
    return {"held": answer}


def watch(request):
    """Every key read through the one address again and again: when each key missed or failed."""
    import pymemcache.exceptions

    n, length, seconds = request["keys"], request["value_len"], request["seconds"]
    failures = (pymemcache.exceptions.MemcacheError, OSError)
    started, wall = time.monotonic(), time.time()
    missed, errors, rounds, batch_errors = {}, {}, 0, 0
    c = client("plain", request["servers"])

    def note(table, i):
        at = round(time.monotonic() - started, 3)
        table.setdefault(i, [at, at])[1] = at

    while time.monotonic() - started < seconds:
        for first in range(0, n, BATCH):
            indexes = range(first, min(first + BATCH, n))
            failed = set()
            try:
                found = c.get_many([key(i) for i in indexes])
            except failures:
                batch_errors += 1
                found = {}
                for i in indexes:
                    c = client("plain", request["servers"])
                    try:
                        got = c.client.get(key(i))
                    except failures:
                        note(errors, i)
                        failed.add(i)
                        continue
                    if got is not None:
                        found[key(i)] = got.decode()
                c = client("plain", request["servers"])
            for i in indexes:
                if found.get(key(i)) != value(i, length) and i not in failed:
                    note(missed, i)
        rounds += 1
    return {
        "started": wall,
        "rounds": rounds,
        "missed": missed,
        "errors": errors,
        "batch_errors": batch_errors,
    }


def run(request):
    global KEY_PREFIX
    KEY_PREFIX = request.get("key_prefix", "")
    if request.get("hosts"):
        stand_in_dns(request["hosts"])
    if request["op"] == "raw":
        return raw(request)
    if request["op"] == "held":
        return held(request)
    if request["op"] == "watch":
        return watch(request)
    if request["op"] == "probe":
        # A list the libraries accept (nothing is connected): the library is importable and configurable.
        return {"library": client(request["hashing"], ["127.0.0.1:11211"]).library}
    started = time.monotonic()
    c = client(request["hashing"], request["servers"], request.get("tls_ca"), request.get("tls_cert"))
    n, length = request["keys"], request["value_len"]
    done = 0
    for first in range(0, n, BATCH):
        indexes = range(first, min(first + BATCH, n))
        if request["op"] == "fill":
            done += c.set_many({key(i): value(i, length) for i in indexes})
        elif request["op"] == "count":
            found = c.get_many([key(i) for i in indexes])
            done += sum(1 for i in indexes if found.get(key(i)) == value(i, length))
        else:
            raise ValueError(f"unknown op {request['op']!r}")
    return {"library": c.library, "keys": n, "hits": done, "seconds": time.monotonic() - started}


def main():
    request = json.load(sys.stdin)
    try:
        answer = run(request)
    except (ImportError, OSError) as e:
        if request["op"] != "probe":
            raise
        answer = {"unavailable": f"{type(e).__name__}: {e}"}
    json.dump(answer, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
