#!/usr/bin/env bash
# make e2e-node: the end-to-end steps against a real node (hack/real-node.sh: a real kubelet, containerd and
# runc, CNI, kube-proxy and kube-dns beside the envtest crate's control plane), started here and stopped here.
#
# Steps, each timed (the timings close the output and target/e2e-node/e2e-node-<time>.log):
#   node:     the node starts (control plane, containerd, images, kubelet Ready);
#   operator: config/default is applied; the operator runs as a pod of its locally assembled image
#             (controller:latest) and its Deployment is Available;
#   sample:   the tutorial's Memcached (config/samples/cache_v1alpha1_memcached.yaml), scaled to 3, in a
#             namespace enforcing the `restricted` Pod Security Standard: 3 real memcached containers Ready,
#             the instance Available, and a client in one of them reaching memcached through the Service's
#             name (cluster DNS) and ClusterIP (kube-proxy), and this machine through the ClusterIP too;
#   suite:    with E2E_NODE_SUITE=1, the whole `make e2e` suite (tests/e2e, the operator as a local process),
#             after the in-cluster operator is removed (the suite needs the leader Lease to itself).
# Skips (exit 0, with a message) when the node's binaries are missing; see hack/real-node.sh.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ -z "${REAL_NODE_DIR:-}" ]; then
    CARGO=${CARGO:-cargo}
    target_dir=$("$CARGO" metadata --format-version 1 --no-deps 2>/dev/null |
        sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
    log_dir=${target_dir:-target}/e2e-node
    mkdir -p "$log_dir"
    log=$log_dir/e2e-node-$(date +%Y%m%d-%H%M%S).log
    echo "e2e-node: log: $log" >&2
    exec > >(tee "$log") 2>&1
    exec hack/real-node.sh "$0" "$@"
fi

timings=()
step_started=
step() {
    step_done
    step_name=$1
    step_started=$(date +%s.%N)
    echo "==> e2e-node step: $1"
}
step_done() {
    if [ -n "$step_started" ]; then
        timings+=("$(awk -v s="$step_started" -v n="$(date +%s.%N)" 'BEGIN { printf "%6.1fs", n - s }')  $step_name")
    fi
    step_started=
}
report() {
    local status=$?
    step_done
    echo "==> e2e-node timings (status $status):"
    printf '  %6.1fs  node start\n' "$(cat "$REAL_NODE_DIR/node-start-seconds")"
    printf '  %s\n' "${timings[@]}"
}
trap report EXIT

wait_until() { # wait_until WHAT SECONDS COMMAND...
    local what=$1 seconds=$2
    shift 2
    for _ in $(seq "$seconds"); do
        if "$@" >/dev/null 2>&1; then return 0; fi
        sleep 1
    done
    echo "e2e-node: FAILED: $what not within ${seconds}s" >&2
    kubectl get pods -A -o wide >&2 || true
    kubectl get events -A --sort-by=.lastTimestamp 2>/dev/null | tail -n 20 >&2 || true
    return 1
}
jsonpath() { kubectl get "$@" 2>/dev/null; }

step operator
kubectl apply -k config/default >/dev/null
op_ns=memcached-operator-system
op_deploy=memcached-operator-controller-manager
wait_until "the operator's Deployment Available" 180 \
    kubectl wait -n "$op_ns" "deployment/$op_deploy" --for=condition=Available --timeout=1s
op_pod=$(kubectl get pods -n "$op_ns" -l control-plane=controller-manager -o jsonpath='{.items[0].metadata.name}')
echo "    operator pod $op_pod: image $(kubectl get pod -n "$op_ns" "$op_pod" -o jsonpath='{.status.containerStatuses[0].imageID}')"

step sample
ns=e2e-node-sample
kubectl create namespace "$ns" >/dev/null
kubectl label namespace "$ns" pod-security.kubernetes.io/enforce=restricted >/dev/null
kubectl apply -n "$ns" -f config/samples/cache_v1alpha1_memcached.yaml >/dev/null
kubectl patch -n "$ns" memcached memcached-sample --type=merge -p '{"spec":{"size":3}}' >/dev/null
available() {
    [ "$(jsonpath -n "$ns" memcached memcached-sample -o jsonpath='{.status.conditions[?(@.type=="Available")].status}')" = True ] &&
        [ "$(jsonpath -n "$ns" deployment memcached-sample -o jsonpath='{.status.readyReplicas}')" = 3 ]
}
wait_until "3 ready pods and the instance Available" 180 available
kubectl get pods -n "$ns" -o wide
pod=$(kubectl get pods -n "$ns" -l app.kubernetes.io/instance=memcached-sample -o jsonpath='{.items[0].metadata.name}')
cluster_ip=$(kubectl get service -n "$ns" memcached-sample -o jsonpath='{.spec.clusterIP}')
session='set e2e-node 0 0 2\r\nok\r\nget e2e-node\r\nquit\r\n'
for target in "memcached-sample.$ns.svc" "$cluster_ip"; do
    answer=$(kubectl exec -n "$ns" "$pod" -c memcached -- sh -c "printf '$session' | nc -w 5 $target 11211")
    echo "    from pod $pod to $target:11211: $(echo "$answer" | tr -d '\r' | tr '\n' ' ')"
    echo "$answer" | grep -q '^STORED' || { echo "e2e-node: FAILED: no STORED from $target" >&2; exit 1; }
done
# From this machine too (kube-proxy's OUTPUT rules); the key is on whichever pod took the set, so any answer
# of memcached's will do.
answer=$(python3 -c "import socket; s = socket.create_connection(('$cluster_ip', 11211), 5)
s.sendall(b'version\r\nquit\r\n'); print(s.makefile().read())")
echo "    from this machine to $cluster_ip:11211: $(echo "$answer" | tr -d '\r' | tr '\n' ' ')"
echo "$answer" | grep -q '^VERSION' || { echo "e2e-node: FAILED: no VERSION from $cluster_ip" >&2; exit 1; }

step "statefulset: per-pod DNS names"
kubectl apply -n "$ns" -f config/samples/cache_v1alpha1_memcached_pool_statefulset.yaml >/dev/null
pool_ready() {
    [ "$(jsonpath -n "$ns" memcached memcached-pool -o jsonpath='{.status.conditions[?(@.type=="Available")].status}')" = True ] &&
        [ "$(jsonpath -n "$ns" statefulset memcached-pool -o jsonpath='{.status.readyReplicas}')" = 3 ] &&
        [ "$(jsonpath -n "$ns" configmap memcached-pool-servers -o jsonpath='{.data.servers}' | grep -c .)" = 3 ]
}
wait_until "the StatefulSet pool's 3 servers ready and published" 240 pool_ready
for server in $(kubectl get -n "$ns" configmap memcached-pool-servers -o jsonpath='{.data.servers}'); do
    answer=$(kubectl exec -n "$ns" "$pod" -c memcached -- \
        sh -c "printf 'version\r\nquit\r\n' | nc -w 5 ${server%:*} ${server##*:}")
    echo "    from pod $pod to $server (published): $(echo "$answer" | tr -d '\r')"
    echo "$answer" | grep -q '^VERSION' || { echo "e2e-node: FAILED: no VERSION from $server" >&2; exit 1; }
done

step "degraded: an image that cannot be pulled, a configuration that exits at start"
kubectl apply -n "$ns" -f - >/dev/null <<'EOF'
apiVersion: cache.example.com/v1alpha1
kind: Memcached
metadata: { name: no-image }
spec: { size: 1, image: "memcached.invalid/memcached:1.6" }
---
apiVersion: cache.example.com/v1alpha1
kind: Memcached
metadata: { name: exits }
spec:
  size: 1
  memcached: { extraArgs: ["-o", "hot_lru_pct=100"] }
EOF
degraded() { # degraded NAME REASON
    [ "$(jsonpath -n "$ns" memcached "$1" -o jsonpath='{.status.conditions[?(@.type=="Degraded")].reason}')" = "$2" ]
}
wait_until "no-image Degraded ImagePullFailed" 120 degraded no-image ImagePullFailed
wait_until "exits Degraded CrashLoopBackOff" 180 degraded exits CrashLoopBackOff
for name in no-image exits; do
    echo "    $name: $(kubectl get -n "$ns" memcached "$name" \
        -o jsonpath='{.status.conditions[?(@.type=="Degraded")].reason}: {.status.conditions[?(@.type=="Degraded")].message}')"
done
kubectl delete namespace "$ns" --wait=false >/dev/null

if [ "${E2E_NODE_SUITE:-}" = 1 ]; then
    step "suite (make e2e's steps)"
    kubectl delete -n "$op_ns" "deployment/$op_deploy" --wait=true >/dev/null
    wait_until "the operator's pod gone" 60 sh -c "! kubectl get pods -n $op_ns -o name | grep -q ."
    "${CARGO:-cargo}" test --test e2e -- --ignored --nocapture --test-threads=1
fi
step_done
