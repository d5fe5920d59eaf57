#!/usr/bin/env bash
# A real Kubernetes node on this machine, against the envtest crate's control plane, for as long as a
# command runs: `hack/real-node.sh COMMAND...` starts everything, runs COMMAND with KUBECONFIG exported
# (and REAL_NODE_DIR, the scratch directory), then stops everything and removes what it made, also when
# COMMAND fails or the run is interrupted. Without a command it runs until Ctrl+C.
#
# What runs (every file, socket and log under one scratch directory):
#   - the control plane: `envtest up --real-node-address`, no stand-in kubelet; the API server reachable
#     from pods at the bridge's address, the endpoint controllers on;
#   - containerd (its own config, root, state and socket; the CRI plugin, cgroupfs, overlayfs) with runc
#     behind a small wrapper that clamps negative `oomScoreAdj` values in the OCI bundle before runc reads
#     it: where a process may not lower its oom_score_adj, runc fails every sandbox otherwise ("can't get
#     final child's PID from pipe: EOF"; the kubelet asks -998 for sandboxes);
#   - CNI: a bridge with host-local addresses, loopback and portmap; no masquerade, no route out: pod
#     traffic stays on this machine;
#   - the images the manifests name, assembled from binaries on this machine (hack/node-images.py) and
#     imported, so `IfNotPresent` finds them and nothing is pulled;
#   - the kubelet (node `real-node`; its `not-ready` taint lifted once Ready, as the node-lifecycle
#     controller, which is off, would), kube-proxy in iptables mode, and kube-dns as a host process on the
#     bridge's address, port 53, which is the kubelet's --cluster-dns.
#
# Binaries: kubelet, kube-proxy and kube-dns from $REAL_NODE_BIN (else beside the control plane's binaries,
# else beside the kubelet on PATH); the
# control plane from $KUBEBUILDER_ASSETS (or /usr/local/kubebuilder/bin); containerd, ctr, containerd-shim-runc-v2, runc,
# iptables and ip from PATH; the CNI plugins from $CNI_BIN_DIR (or /usr/lib/cni, /opt/cni/bin). When one is
# missing it says which and exits 0 (a skip), unless REAL_NODE_REQUIRED=1.
# Needs root (network namespaces, iptables, mounts). Environment: CARGO (cargo), REAL_NODE_KEEP=1 (keep the
# scratch directory and its logs), OPERATOR_BINARY (the operator's binary for its image; default: a release
# build if there is one, else the debug build), MEMCACHED_PROXY_BINARY (the proxy-capable memcached's image),
# MEMCACHED_EXPORTER_BINARY (the exporter sidecar's image; default: memcached_exporter on PATH).
set -euo pipefail

cd "$(dirname "$0")/.."
CARGO=${CARGO:-cargo}
started=$(date +%s.%N)
elapsed() { awk -v s="$started" -v n="$(date +%s.%N)" 'BEGIN { printf "%.1f", n - s }'; }
say() { echo "real-node: [$(elapsed)s] $*" >&2; }

# The pod network: the bridge's address is the node's address, the API server's address for pods and the
# cluster DNS; the Service range is the control plane's (envtest/src/control_plane).
BRIDGE=mcnode0
NODE_IP=10.244.0.1
POD_CIDR=10.244.0.0/24
SERVICE_CIDR=10.0.0.0/16
NODE_NAME=real-node

skip() {
    echo "real-node: skipped: $*" >&2
    if [ "${REAL_NODE_REQUIRED:-}" = 1 ]; then exit 1; fi
    exit 0
}

# Finding the binaries.
assets=${KUBEBUILDER_ASSETS:-/usr/local/kubebuilder/bin}
node_bin=${REAL_NODE_BIN:-}
if [ -z "$node_bin" ] && [ -x "$assets/kubelet" ]; then
    node_bin=$assets
elif [ -z "$node_bin" ] && command -v kubelet >/dev/null 2>&1; then
    node_bin=$(dirname "$(command -v kubelet)")
fi
[ -n "$node_bin" ] || skip "no kubelet: REAL_NODE_BIN is not set, $assets has none and none is on PATH (REAL_NODE_BIN: a directory holding kubelet, kube-proxy and kube-dns)"
for b in "$node_bin/kubelet" "$node_bin/kube-proxy" "$node_bin/kube-dns" "$assets/etcd" \
    "$assets/kube-apiserver" "$assets/kube-controller-manager" "$assets/kube-scheduler"; do
    [ -x "$b" ] || skip "$b is missing"
done
for b in containerd ctr containerd-shim-runc-v2 runc iptables ip gcc python3 busybox kubectl; do
    command -v "$b" >/dev/null 2>&1 || skip "$b is not on PATH"
done
cni_bin=${CNI_BIN_DIR:-}
if [ -z "$cni_bin" ]; then
    for d in /usr/lib/cni /opt/cni/bin; do [ -x "$d/bridge" ] && cni_bin=$d && break; done
fi
for p in bridge host-local loopback portmap; do
    [ -n "$cni_bin" ] && [ -x "$cni_bin/$p" ] || skip "the CNI plugin $p is missing (set CNI_BIN_DIR)"
done
[ "$(id -u)" = 0 ] || skip "not root"
# One real node per machine (kube-proxy's iptables chains are the machine's).
if ip link show "$BRIDGE" >/dev/null 2>&1; then
    skip "the bridge $BRIDGE exists: another real node runs on this machine (or a killed one left it: ip link del $BRIDGE)"
fi

if grep -qE '^:(KUBE|CNI)-' <<<"$(iptables-save 2>/dev/null || true)"; then
    skip "iptables has KUBE-* or CNI-* chains: a Kubernetes node runs on this machine (or a killed run left them)"
fi

D=$(mktemp -d "${TMPDIR:-/tmp}/memcached-real-node.XXXXXX")
export REAL_NODE_DIR=$D
pids=()
cleanup() {
    local status=$?
    trap - EXIT INT TERM
    say "stopping (status $status)"
    if [ -n "${command_pid:-}" ] && kill -0 "$command_pid" 2>/dev/null; then
        kill -TERM -- "-$command_pid" 2>/dev/null || true
        for _ in $(seq 100); do kill -0 "$command_pid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL -- "-$command_pid" 2>/dev/null || true
    fi
    # The kubelet first, so it restarts nothing; then every pod sandbox and container.
    for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
        local name=${pids[i]%%:*} pid=${pids[i]#*:}
        if [ "$name" = containerd ]; then
            crictl_stop_all
        fi
        kill -TERM "$pid" 2>/dev/null || true
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
    # Shims outlive containerd; they are ours when their socket is under $D.
    for pid in $(pgrep -f "containerd-shim-runc-v2 -namespace k8s.io" || true); do
        if tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q -- "-address $D/"; then
            kill -KILL "$pid" 2>/dev/null || true
        fi
    done
    "$node_bin/kube-proxy" --cleanup >/dev/null 2>&1 || true
    remove_chains
    iptables -D FORWARD -i "$BRIDGE" ! -o "$BRIDGE" -j DROP 2>/dev/null || true
    ip route del "$SERVICE_CIDR" dev "$BRIDGE" 2>/dev/null || true
    ip link del "$BRIDGE" 2>/dev/null || true
    grep " $D/" /proc/mounts | awk '{ print $2 }' | sort -r | while read -r m; do umount -l "$m" 2>/dev/null || true; done
    if [ "$status" -ne 0 ] || [ "${REAL_NODE_KEEP:-}" = 1 ]; then
        say "logs kept in $D"
    else
        rm -rf "$D"
    fi
    exit "$status"
}
# Every KUBE-* and CNI-* iptables chain (kube-proxy's, the kubelet's, the portmap plugin's) and the jumps
# to them; there were none before the start (checked there).
remove_chains() {
    local t rule chain chains rules
    for t in filter nat mangle; do
        rules=$(iptables -t "$t" -S 2>/dev/null || true)
        while read -r rule; do
            if [ -n "$rule" ]; then eval "iptables -t $t ${rule/#-A /-D }" 2>/dev/null || true; fi
        done <<<"$(grep -E '^-A [A-Z]+ .*-j (KUBE|CNI)-' <<<"$rules" || true)"
        chains=$(sed -n -E 's/^-N ((KUBE|CNI)-[^ ]*)$/\1/p' <<<"$rules")
        for chain in $chains; do iptables -t "$t" -F "$chain" 2>/dev/null || true; done
        for chain in $chains; do iptables -t "$t" -X "$chain" 2>/dev/null || true; done
    done
}
crictl_stop_all() {
    local c
    for c in $(ctr -a "$D/containerd.sock" -n k8s.io tasks ls -q 2>/dev/null); do
        ctr -a "$D/containerd.sock" -n k8s.io tasks kill -s SIGKILL "$c" >/dev/null 2>&1 || true
    done
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

start() { # start NAME LOG COMMAND...: in the background, remembered for cleanup
    local name=$1 log=$2
    shift 2
    "$@" >"$log" 2>&1 &
    pids+=("$name:$!")
}
wait_for() { # wait_for WHAT SECONDS COMMAND...
    local what=$1 seconds=$2
    shift 2
    for _ in $(seq $((seconds * 5))); do
        if "$@" >/dev/null 2>&1; then return 0; fi
        sleep 0.2
    done
    echo "real-node: error: $what not within ${seconds}s" >&2
    return 1
}

# The bridge first: the API server's address for pods, and the kubelet's node address.
ip link add "$BRIDGE" type bridge
ip addr add "$NODE_IP/24" dev "$BRIDGE"
ip link set "$BRIDGE" up
# Service addresses go to the bridge, not the default route: kube-proxy rewrites them to pod addresses
# after the route is chosen, and an address it has no rule for must not leave the machine.
ip route add "$SERVICE_CIDR" dev "$BRIDGE"
# Pods have no default route (their only route out of the pod network is to Services); and what the
# bridge would forward elsewhere is dropped.
iptables -I FORWARD -i "$BRIDGE" ! -o "$BRIDGE" -j DROP
sysctl -qw net.ipv4.ip_forward=1
modprobe br_netfilter 2>/dev/null || true
sysctl -qw net.bridge.bridge-nf-call-iptables=1 2>/dev/null || true

# The control plane, built first so the wait below is for it.
"$CARGO" build --quiet --package envtest
KUBEBUILDER_ASSETS=$assets start envtest "$D/envtest.log" \
    "$CARGO" run --quiet --package envtest -- up --real-node-address "$NODE_IP" --dir "$D/control-plane" \
    --keep
# envtest writes its stdout into the log too; its last lines name the kubeconfigs.
wait_for "the control plane" 120 grep -q '^export KUBECONFIG=' "$D/envtest.log"
export KUBECONFIG=$D/control-plane/admin.kubeconfig
node_kubeconfig=$D/control-plane/kubelet.kubeconfig
say "control plane up"

# containerd.
mkdir -p "$D/cni/net.d" "$D/containerd"
cat >"$D/runc" <<EOF
#!/bin/sh
# runc, with negative oomScoreAdj values in the bundle's config.json clamped to 0: this machine may not
# lower oom_score_adj, and runc then fails the container.
bundle=
prev=
for arg in "\$@"; do
    case "\$prev" in --bundle|-b) bundle=\$arg ;; esac
    case "\$arg" in --bundle=*) bundle=\${arg#--bundle=} ;; esac
    prev=\$arg
done
if [ -n "\$bundle" ] && [ -f "\$bundle/config.json" ]; then
    sed -i -E 's/"oomScoreAdj":-[0-9]+/"oomScoreAdj":0/' "\$bundle/config.json"
fi
exec $(command -v runc) "\$@"
EOF
chmod 755 "$D/runc"
cat >"$D/containerd/config.toml" <<EOF
version = 2
root = "$D/containerd/root"
state = "$D/containerd/state"
[grpc]
  address = "$D/containerd.sock"
[ttrpc]
  address = "$D/containerd.sock.ttrpc"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "registry.k8s.io/pause:3.9"
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "$D/runc"
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "$cni_bin"
    conf_dir = "$D/cni/net.d"
EOF
cat >"$D/cni/net.d/10-memcached-node.conflist" <<EOF
{
  "cniVersion": "0.4.0",
  "name": "memcached-node",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$BRIDGE",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [[{ "subnet": "$POD_CIDR", "gateway": "$NODE_IP" }]],
        "routes": [{ "dst": "$SERVICE_CIDR" }],
        "dataDir": "$D/cni/ipam"
      }
    },
    { "type": "portmap", "capabilities": { "portMappings": true } }
  ]
}
EOF
# Nothing is pulled: every registry request goes to a proxy that is a closed local port (an image that is
# not imported fails at once with ErrImagePull, and no name is even looked up).
start containerd "$D/containerd.log" env HTTP_PROXY=http://127.0.0.1:9 HTTPS_PROXY=http://127.0.0.1:9 \
    NO_PROXY= http_proxy= https_proxy= no_proxy= containerd --config "$D/containerd/config.toml"
wait_for "containerd" 30 ctr -a "$D/containerd.sock" version
say "containerd up"

# The images.
cat >"$D/pause.c" <<'EOF'
#include <signal.h>
#include <unistd.h>
static void leave(int sig) { (void)sig; _exit(0); }
int main(void) {
    signal(SIGTERM, leave);
    signal(SIGINT, leave);
    for (;;) pause();
}
EOF
gcc -static -O2 -o "$D/pause" "$D/pause.c"
operator=${OPERATOR_BINARY:-}
if [ -z "$operator" ]; then
    target_dir=$("$CARGO" metadata --format-version 1 --no-deps 2>/dev/null |
        sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
    target_dir=${target_dir:-target}
    if [ -x "$target_dir/release/memcached-operator" ]; then
        operator=$target_dir/release/memcached-operator
    else
        "$CARGO" build --quiet --bin memcached-operator
        operator=$target_dir/debug/memcached-operator
    fi
fi
python3 hack/node-images.py "$D/images" --operator "$operator" --pause "$D/pause" >"$D/images.txt"
while read -r archive name; do
    ctr -a "$D/containerd.sock" -n k8s.io images import --no-unpack "$archive" >/dev/null
    say "image $name imported"
done <"$D/images.txt"
# The operator's image under its release name too: the operator names it for the proxy's configuration
# writer unless told otherwise (--operator-image), and config/default does not tell it.
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n 1)
ctr -a "$D/containerd.sock" -n k8s.io images tag docker.io/library/controller:latest \
    "registry.example.com/memcached-operator:v$version" >/dev/null

# kube-dns on the bridge's address; it forwards nothing out (its upstream is a closed local port).
start kube-dns "$D/kube-dns.log" "$node_bin/kube-dns" --kubecfg-file="$node_kubeconfig" \
    --dns-bind-address="$NODE_IP" --dns-port=53 --domain=cluster.local. --healthz-port=0 \
    --nameservers=127.0.0.1:9

# The kubelet.
mkdir -p "$D/kubelet"
printf 'nameserver %s\n' "$NODE_IP" >"$D/resolv.conf"
cat >"$D/kubelet/config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# The API server presents no client certificate to kubelets here; the kubelet listens on the bridge's
# address only, so it may serve (logs, exec) without authentication.
authentication:
  anonymous: { enabled: true }
  webhook: { enabled: false }
authorization: { mode: AlwaysAllow }
address: $NODE_IP
port: 10250
healthzPort: 0
readOnlyPort: 0
cgroupDriver: cgroupfs
cgroupsPerQOS: false
enforceNodeAllocatable: []
failSwapOn: false
clusterDNS: ["$NODE_IP"]
clusterDomain: cluster.local
resolvConf: "$D/resolv.conf"
containerRuntimeEndpoint: "unix://$D/containerd.sock"
podCIDR: "$POD_CIDR"
hairpinMode: hairpin-veth
makeIPTablesUtilChains: false
evictionHard: { memory.available: "1Mi", nodefs.available: "1%", imagefs.available: "1%" }
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
fileCheckFrequency: 1s
syncFrequency: 10s
nodeStatusUpdateFrequency: 5s
EOF
start kubelet "$D/kubelet.log" "$node_bin/kubelet" --config="$D/kubelet/config.yaml" \
    --kubeconfig="$node_kubeconfig" --root-dir="$D/kubelet/root" --cert-dir="$D/kubelet/pki" \
    --hostname-override="$NODE_NAME" --node-ip="$NODE_IP" --pod-infra-container-image=registry.k8s.io/pause:3.9 \
    --v=1

# kube-proxy.
cat >"$D/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: { kubeconfig: "$node_kubeconfig" }
mode: iptables
hostnameOverride: $NODE_NAME
bindAddress: $NODE_IP
clusterCIDR: $POD_CIDR
healthzBindAddress: $NODE_IP:10256
metricsBindAddress: $NODE_IP:10249
conntrack: { maxPerCore: 0 }
iptables: { masqueradeAll: false, syncPeriod: 5s, minSyncPeriod: 0s }
EOF
start kube-proxy "$D/kube-proxy.log" "$node_bin/kube-proxy" --config="$D/kube-proxy.yaml"

kubectl() { command kubectl --kubeconfig "$KUBECONFIG" "$@"; }
node_ready() {
    [ "$(kubectl get node "$NODE_NAME" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}')" = True ]
}
wait_for "node $NODE_NAME Ready" 120 node_ready
# The node-lifecycle controller is off (envtest/src/control_plane/controllers.rs): nothing else lifts the
# taint the kubelet registers with.
kubectl taint node "$NODE_NAME" node.kubernetes.io/not-ready- >/dev/null 2>&1 || true
say "node $NODE_NAME Ready"

# The cluster DNS as a Service too (selector-less, its endpoint the host process), so that pods and the
# operator find it where a cluster has it.
kubectl apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Service
metadata: { name: kube-dns, namespace: kube-system }
spec:
  clusterIP: 10.0.0.10
  ports: [{ name: dns, port: 53, protocol: UDP }, { name: dns-tcp, port: 53, protocol: TCP }]
EOF
say "up: KUBECONFIG=$KUBECONFIG (node start $(elapsed)s)"
echo "$(elapsed)" >"$D/node-start-seconds"

# In the background with `wait`, so that a signal runs the cleanup at once (bash runs traps only between
# foreground commands).
if [ $# -eq 0 ]; then
    echo "export KUBECONFIG=$KUBECONFIG"
    say "running until Ctrl+C"
    set -- sleep infinity
fi
# Its own process group (setsid), so that the cleanup can stop it with everything it started.
setsid "$@" &
command_pid=$!
wait "$command_pid"
