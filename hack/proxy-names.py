#!/usr/bin/env python3
"""Measures how memcached's proxy (routelib) reaches a backend named by DNS name versus by IP address.

The question (docs/clients.md, "How the proxy names a StatefulSet's servers"): should the proxy's route
list a StatefulSet's servers by their stable DNS names (`<name>-<slot>.<name>-headless.<ns>.svc`) or by
the pods' addresses? memcached's proxy (1.6.45, vendor/mcmc/mcmc.c `mcmc_connect`) resolves a backend's
name with a blocking getaddrinfo() (AF_INET, then AF_INET6 if that fails) on the thread that owns the
backend: a worker thread, as routelib does not turn on `use_iothread`. It resolves at every (re)connect:
after a failure at once, and after three failures every `backend_retry_waittime` (3 s).

Everything runs in a network namespace of its own, on its loopback:
  - a tiny DNS server (raw UDP, 127.0.0.53:53) answering A records for the test names, with an injected
    delay and an NXDOMAIN mode; the namespace's resolv.conf (/etc/netns/<ns>/resolv.conf) points at it,
    with a Kubernetes pod's search list and `ndots:5`, so a lookup walks the search list as in a pod;
  - two servers (Debian's memcached, or the proxy binary as a plain server): slot 0 named by IP, slot 1
    by name or by IP depending on the case;
  - the proxy, `-t 1` (one worker: every client and backend on the same thread), with the route the
    operator renders (one pool, route_direct), reloaded as the configuration writer does it (rewrite the
    file, SIGHUP).

Needs root (ip netns) and the binaries; skips with a message otherwise.

Usage: sudo MEMCACHED_PROXY_BINARY=<memcached 1.6.23+ built with --enable-proxy> python3 hack/proxy-names.py
  (or --proxy PATH; the servers: --server PATH, default $MEMCACHED_BINARY, else /usr/bin/memcached)
"""

import argparse
import os
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time

NAME = "cache-1.cache-headless.ns.svc"
DNS_ADDR = ("127.0.0.53", 53)
PROXY_PORT = 11311
SERVER_PORT = 11211
SEARCH = "ns.svc.cluster.local svc.cluster.local cluster.local"


def skip(message):
    print(f"SKIP: {message}")
    sys.exit(0)


# --- the DNS server -------------------------------------------------------------------------------------


class Dns:
    """Answers A queries for `records` (absolute names only; the search-list expansions get NXDOMAIN as
    from a cluster's DNS), after `delay` seconds; names in `nxdomain` get NXDOMAIN."""

    def __init__(self):
        self.records = {}
        self.nxdomain = set()
        self.delay = 0.0
        self.queries = 0
        self.lock = threading.Lock()
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(DNS_ADDR)
        threading.Thread(target=self.serve, daemon=True).start()

    def serve(self):
        while True:
            data, peer = self.sock.recvfrom(512)
            threading.Thread(target=self.answer, args=(data, peer), daemon=True).start()

    def answer(self, data, peer):
        with self.lock:
            self.queries += 1
            delay = self.delay
        if len(data) < 12:
            return
        qid, _flags, qdcount = struct.unpack("!HHH", data[:6])
        labels, i = [], 12
        while i < len(data) and data[i] != 0:
            n = data[i]
            labels.append(data[i + 1 : i + 1 + n].decode("ascii", "replace"))
            i += 1 + n
        qname = ".".join(labels).lower()
        qtype = struct.unpack("!H", data[i + 1 : i + 3])[0] if i + 3 <= len(data) else 0
        question = data[12 : i + 5]
        if delay:
            time.sleep(delay)
        ip = self.records.get(qname)
        if ip is None or qname in self.nxdomain:
            flags, ancount, answer = 0x8183, 0, b""  # response, RD, RA, NXDOMAIN
        elif qtype != 1:
            flags, ancount, answer = 0x8180, 0, b""  # the name exists, no record of that type
        else:
            flags, ancount = 0x8180, 1
            answer = struct.pack("!HHHIH", 0xC00C, 1, 1, 0, 4) + socket.inet_aton(ip)
        header = struct.pack("!HHHHHH", qid, flags, qdcount, ancount, 0, 0)
        self.sock.sendto(header + question + answer, peer)


# --- memcached processes and a client -------------------------------------------------------------------


class Server:
    def __init__(self, binary, ip):
        self.binary, self.ip, self.proc = binary, ip, None

    def start(self):
        self.proc = subprocess.Popen(
            [self.binary, "-u", "nobody", "-l", self.ip, "-p", str(SERVER_PORT), "-m", "16"]
        )
        wait_port(self.ip, SERVER_PORT)

    def kill(self):
        if self.proc:
            self.proc.kill()
            self.proc.wait()
            self.proc = None


def wait_port(ip, port, timeout=5.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            socket.create_connection((ip, port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.02)
    raise RuntimeError(f"nothing listens on {ip}:{port}")


def route_lua(hosts):
    backends = "".join(f'            {{ host = "{h}", port = {SERVER_PORT} }},\n' for h in hosts)
    return (
        "pools{\n    servers = {\n        backends = {\n"
        + backends
        + "        },\n    },\n}\nroutes{\n    default = route_direct{ child = \"servers\" },\n}\n"
    )


class Proxy:
    def __init__(self, binary, directory):
        self.binary, self.dir, self.proc = binary, directory, None
        self.path = os.path.join(directory, "proxy.lua")

    def write(self, hosts):
        with open(self.path + ".tmp", "w") as f:
            f.write(route_lua(hosts))
        os.chmod(self.path + ".tmp", 0o644)
        os.replace(self.path + ".tmp", self.path)

    def start(self, hosts):
        self.write(hosts)
        self.proc = subprocess.Popen(
            [self.binary, "-u", "nobody", "-t", "1", "-l", "127.0.0.1", "-p", str(PROXY_PORT),
             "-o", f"proxy_config=routelib,proxy_arg={self.path}"],
            stdin=subprocess.DEVNULL,
        )
        wait_port("127.0.0.1", PROXY_PORT)

    def reload(self, hosts):
        self.write(hosts)
        self.proc.send_signal(signal.SIGHUP)

    def stop(self):
        if self.proc:
            self.proc.kill()
            self.proc.wait()
            self.proc = None


class Client:
    def __init__(self, port=PROXY_PORT, ip="127.0.0.1"):
        self.sock = socket.create_connection((ip, port), timeout=30)
        self.buf = b""

    def line(self):
        while b"\r\n" not in self.buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("closed")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line.decode()

    def get(self, key):
        """The value, None on a miss, or the error line."""
        self.sock.sendall(f"get {key}\r\n".encode())
        first = self.line()
        if first == "END":
            return None
        if not first.startswith("VALUE"):
            return ("error", first)
        value = self.line()
        assert self.line() == "END"
        return value

    def set(self, key, value):
        self.sock.sendall(f"set {key} 0 0 {len(value)}\r\n{value}\r\n".encode())
        return self.line()


def is_error(reply):
    return isinstance(reply, tuple)


# --- the measurements -----------------------------------------------------------------------------------


class Probe:
    """A client on the proxy getting a key of the healthy slot in a loop: its latency shows whether the
    proxy's worker is blocked."""

    def __init__(self, key):
        self.key, self.lat, self.stop, self.client = key, [], False, Client()

    def run(self):
        while not self.stop:
            t = time.monotonic()
            self.client.get(self.key)
            self.lat.append(time.monotonic() - t)
            time.sleep(0.005)

    def __enter__(self):
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *_):
        self.stop = True
        self.thread.join()

    def summary(self):
        lat = sorted(self.lat)
        p99 = lat[int(len(lat) * 0.99) - 1] if lat else 0
        stalls = [x for x in lat if x > 0.05]
        return (f"{len(lat)} gets, median {statistics.median(lat) * 1e3:.2f} ms, p99 {p99 * 1e3:.1f} ms, "
                f"max {lat[-1] * 1e3:.0f} ms, {len(stalls)} over 50 ms totalling "
                f"{sum(stalls) * 1e3:.0f} ms")


def keys_by_slot(servers):
    """Sets keys through the proxy and finds which slot's server got each."""
    c = Client()
    slots = {0: [], 1: []}
    direct = [Client(SERVER_PORT, s.ip) for s in servers]
    for i in range(200):
        k = f"key-{i}"
        c.set(k, "v")
        for slot, d in enumerate(direct):
            if d.get(k) == "v":
                slots[slot].append(k)
    return slots


def lookup_cost(dns, delay, name):
    dns.delay = delay
    before = dns.queries
    t = time.monotonic()
    try:
        socket.getaddrinfo(name, SERVER_PORT, socket.AF_INET, socket.SOCK_STREAM)
        ok = True
    except socket.gaierror:
        ok = False
        # mcmc_connect tries AF_INET6 after AF_INET fails.
        try:
            socket.getaddrinfo(name, SERVER_PORT, socket.AF_INET6, socket.SOCK_STREAM)
        except socket.gaierror:
            pass
    took = time.monotonic() - t
    dns.delay = 0
    return ok, took, dns.queries - before


def outage(dns, proxy, servers, slot_keys, by_name, delay, nxdomain, down=7.0, not_ready=2.0):
    """Slot 1's server goes away for `down` s (its name NXDOMAIN if `nxdomain`), comes back on the same
    address; `not_ready` s later its name resolves again (when it ever stopped). Returns the probe's
    latency summary, what slot-1 clients saw, and how long after the name resolved (or the server came
    back, by IP) the proxy served slot 1 again."""
    hosts = [servers[0].ip, NAME if by_name else servers[1].ip]
    proxy.reload(hosts)
    time.sleep(1.0)
    dns.delay = delay
    key1 = slot_keys[1][0]
    user = Client()
    errors, seen, slowest = 0, set(), 0.0
    queries, before = dns.queries, proxy_stats()
    with Probe(slot_keys[0][0]) as probe:
        servers[1].kill()
        if nxdomain:
            dns.nxdomain.add(NAME)
        end = time.monotonic() + down
        while time.monotonic() < end:
            t = time.monotonic()
            r = user.get(key1)
            slowest = max(slowest, time.monotonic() - t)
            if is_error(r):
                errors += 1
                seen.add(r[1])
            time.sleep(0.02)
        servers[1].start()
        back = time.monotonic()
        if nxdomain:
            time.sleep(not_ready)
            dns.nxdomain.discard(NAME)
            back = time.monotonic()
        served = None
        while time.monotonic() - back < 15:
            r = user.get(key1)
            if not is_error(r):
                served = time.monotonic() - back
                break
            time.sleep(0.02)
    dns.delay = 0
    dns.nxdomain.discard(NAME)
    after = proxy_stats()
    stats = {k: after[k] - before.get(k, 0) for k in after}
    return probe.summary(), errors, seen, slowest, served, dns.queries - queries, stats


def address_change(proxy, servers, slot_keys, new_ip, server_binary):
    """Slot 1 by IP; its server is replaced by one at `new_ip`; the route is republished with the new IP
    once that one is up (rewrite + SIGHUP). Returns how long after the SIGHUP slot 1 is served."""
    proxy.reload([servers[0].ip, servers[1].ip])
    time.sleep(1.0)
    key1 = slot_keys[1][0]
    user = Client()
    with Probe(slot_keys[0][0]) as probe:
        servers[1].kill()
        time.sleep(2.0)
        replacement = Server(server_binary, new_ip)
        replacement.start()
        t = time.monotonic()
        proxy.reload([servers[0].ip, new_ip])
        served = None
        while time.monotonic() - t < 10:
            r = user.get(key1)
            if not is_error(r):
                served = time.monotonic() - t
                break
            time.sleep(0.005)
    servers[1].ip = new_ip
    servers[1].proc = replacement.proc
    return probe.summary(), served


def proxy_stats():
    """The proxy's backend counters (`stats`: proxy_backend_marked_bad, proxy_backend_failed)."""
    c = Client()
    c.sock.sendall(b"stats\r\n")
    out = {}
    while True:
        line = c.line()
        if line == "END":
            return out
        _, k, v = line.split(" ", 2)
        if k in ("proxy_backend_marked_bad", "proxy_backend_failed"):
            out[k.removeprefix("proxy_backend_")] = int(v)


def inside(args):
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    dns = Dns()
    servers = [Server(args.server, "127.0.0.2"), Server(args.server, "127.0.0.3")]
    dns.records[NAME] = servers[1].ip
    for s in servers:
        s.start()
    work = tempfile.mkdtemp(prefix="proxy-names-")
    os.chmod(work, 0o755)
    proxy = Proxy(args.proxy, work)
    try:
        proxy.start([servers[0].ip, NAME])
        time.sleep(0.5)
        version = subprocess.run([args.proxy, "-V"], capture_output=True, text=True).stdout.strip()
        print(f"proxy: {version}; {os.cpu_count()} cores")
        slot_keys = keys_by_slot(servers)
        print(f"keys: {len(slot_keys[0])} on slot 0, {len(slot_keys[1])} on slot 1")

        print("\n1. One lookup of the name, as the proxy does it (getaddrinfo AF_INET, then AF_INET6 "
              "if that fails), search list of a pod, ndots:5:")
        for delay in (0.0, 0.2, 1.0):
            for nx in (False, True):
                if nx:
                    dns.nxdomain.add(NAME)
                runs = [lookup_cost(dns, delay, NAME) for _ in range(3)]
                dns.nxdomain.discard(NAME)
                ok, _, queries = runs[0]
                took = statistics.median(r[1] for r in runs)
                print(f"   resolver delay {delay * 1e3:4.0f} ms, {'NXDOMAIN' if nx else 'answers '}: "
                      f"{took * 1e3:7.1f} ms, {queries} queries, {'resolved' if ok else 'failed'}")

        print("\n2. Slot 1's server down 7 s and back; a second client gets a slot-0 key every 5 ms "
              "on the same proxy worker (-t 1):")
        cases = [
            ("by IP                          ", False, 0.0, False),
            ("by name, resolver    0 ms      ", True, 0.0, False),
            ("by name, resolver  200 ms      ", True, 0.2, False),
            ("by name, resolver 1000 ms      ", True, 1.0, False),
            ("by name, NXDOMAIN, resolver 0 ms", True, 0.0, True),
            ("by name, NXDOMAIN, resolver 200 ms", True, 0.2, True),
        ]
        for label, by_name, delay, nx in cases:
            summary, errors, seen, slowest, served, queries, stats = outage(
                dns, proxy, servers, slot_keys, by_name, delay, nx
            )
            back = "name resolves again" if nx else "server back"
            print(f"   {label}: other client: {summary}")
            print(f"      slot-1 client: {errors} errors {sorted(seen)}, slowest reply {slowest * 1e3:.0f} ms; served "
                  f"{'never' if served is None else f'{served * 1e3:.0f} ms'} after the {back}; "
                  f"{queries} DNS queries; backends {stats}")

        print("\n3. Slot 1 by IP, its server replaced at a new address, the route republished "
              "(rewrite + SIGHUP) once the new one is up:")
        for n, ip in enumerate(("127.0.0.4", "127.0.0.5", "127.0.0.6")):
            summary, served = address_change(proxy, servers, slot_keys, ip, args.server)
            print(f"   run {n + 1}: served {'never' if served is None else f'{served * 1e3:.0f} ms'} "
                  f"after the SIGHUP; other client: {summary}")
    finally:
        proxy.stop()
        for s in servers:
            s.kill()
        shutil.rmtree(work, ignore_errors=True)


def outside(args):
    if os.geteuid() != 0:
        skip("needs root (ip netns)")
    if not args.proxy or not os.access(args.proxy, os.X_OK):
        skip("MEMCACHED_PROXY_BINARY (or --proxy) does not name a proxy-capable memcached")
    if not os.access(args.server, os.X_OK):
        skip(f"no memcached at {args.server} (set MEMCACHED_BINARY or --server)")
    if not shutil.which("ip"):
        skip("no `ip` (iproute2)")
    ns = f"proxy-names-{os.getpid()}"
    etc = f"/etc/netns/{ns}"
    if subprocess.run(["ip", "netns", "add", ns]).returncode != 0:
        skip("cannot create a network namespace")
    try:
        os.makedirs(etc, exist_ok=True)
        with open(f"{etc}/resolv.conf", "w") as f:
            f.write(f"nameserver {DNS_ADDR[0]}\nsearch {SEARCH}\noptions ndots:5\n")
        # /etc/hosts as it is: the name is not in it.
        cmd = ["ip", "netns", "exec", ns, sys.executable, os.path.abspath(__file__), "--inside",
               "--proxy", args.proxy, "--server", args.server]
        sys.exit(subprocess.run(cmd).returncode)
    finally:
        subprocess.run(["ip", "netns", "delete", ns])
        shutil.rmtree(etc, ignore_errors=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--proxy", default=os.environ.get("MEMCACHED_PROXY_BINARY"))
    parser.add_argument("--server", default=os.environ.get("MEMCACHED_BINARY") or "/usr/bin/memcached")
    parser.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inside:
        inside(args)
    else:
        outside(args)


if __name__ == "__main__":
    main()
