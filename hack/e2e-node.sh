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

step "degraded: an image that cannot be pulled, a server that exits at start"
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
  image: memcached-exits:local
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

step "graceful termination: a deleted pod leaves the published list and the Service before memcached exits"
victim=$(kubectl get pods -n "$ns" -l app.kubernetes.io/instance=memcached-sample -o jsonpath='{.items[0].metadata.name}')
victim_ip=$(kubectl get pod -n "$ns" "$victim" -o jsonpath='{.status.podIP}')
answers() {
    python3 -c "import socket; s = socket.create_connection(('$victim_ip', 11211), 1)
s.sendall(b'version\r\n'); assert s.recv(64).startswith(b'VERSION')" 2>/dev/null
}
published() { jsonpath -n "$ns" configmap memcached-sample-servers -o jsonpath='{.data.servers}' | grep -q "^$victim_ip:"; }
endpoint() {
    jsonpath -n "$ns" endpointslices -l kubernetes.io/service-name=memcached-sample \
        -o jsonpath='{range .items[*].endpoints[?(@.conditions.ready==true)]}{.addresses[0]}{"\n"}{end}' | grep -qx "$victim_ip"
}
published || { echo "e2e-node: FAILED: $victim_ip is not in the published list" >&2; exit 1; }
answers || { echo "e2e-node: FAILED: memcached at $victim_ip does not answer" >&2; exit 1; }
deleted_at=$(date +%s.%N)
kubectl delete pod -n "$ns" "$victim" --wait=false >/dev/null
since() { awk -v s="$deleted_at" -v n="$(date +%s.%N)" 'BEGIN { printf "%.1f", n - s }'; }
left_list= left_service= stopped=
for _ in $(seq 300); do
    [ -n "$left_list" ] || published || left_list=$(since)
    [ -n "$left_service" ] || endpoint || left_service=$(since)
    if ! answers; then stopped=$(since); break; fi
    sleep 0.1
done
echo "    pod $victim ($victim_ip) deleted: left the published list after ${left_list:-?}s, the Service's ready endpoints after ${left_service:-?}s; memcached stopped answering after ${stopped:-?}s"
if [ -z "$left_list" ] || [ -z "$left_service" ] || [ -z "$stopped" ]; then
    echo "e2e-node: FAILED: memcached stopped before clients saw it go, or never" >&2
    exit 1
fi
kubectl delete namespace "$ns" --wait=false >/dev/null

# keys HOST PORT set|get N: sets N keys, or counts those read back with their values, over memcached's
# text protocol from this machine.
keys() {
    python3 - "$@" <<'PY'
import socket, sys
host, port, mode, n = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
f = socket.create_connection((host, port), 10).makefile("rwb")
good = 0
for i in range(n):
    key, value = b"e2e-node-%d" % i, b"value-%d" % i
    if mode == "set":
        f.write(b"set %s 0 0 %d\r\n%s\r\n" % (key, len(value), value))
        f.flush()
        good += f.readline() == b"STORED\r\n"
    else:
        f.write(b"get %s\r\n" % key)
        f.flush()
        if f.readline().startswith(b"VALUE"):
            good += f.readline() == value + b"\r\n"
            f.readline()
print(good)
PY
}

images=$(ctr -a "$REAL_NODE_DIR/containerd.sock" -n k8s.io images ls -q)
if grep -q 'memcached-proxy:local' <<<"$images"; then
    step "proxy: scale 2 -> 3, every key through the proxy Service"
    pns=e2e-node-proxy
    kubectl create namespace "$pns" >/dev/null
    kubectl label namespace "$pns" pod-security.kubernetes.io/enforce=restricted >/dev/null
    kubectl apply -n "$pns" -f - >/dev/null <<'EOF'
apiVersion: cache.example.com/v1alpha1
kind: Memcached
metadata: { name: proxied }
spec:
  size: 2
  proxy: { enabled: true, image: "memcached-proxy:local" }
EOF
    proxy_ready() { # proxy_ready SERVERS
        [ "$(jsonpath -n "$pns" memcached proxied -o jsonpath='{.status.conditions[?(@.type=="ProxyAvailable")].status}')" = True ] &&
            [ "$(jsonpath -n "$pns" memcached proxied -o jsonpath='{.status.conditions[?(@.type=="Available")].status}')" = True ] &&
            [ "$(jsonpath -n "$pns" deployment proxied -o jsonpath='{.status.readyReplicas}')" = "$1" ] &&
            [ "$(jsonpath -n "$pns" configmap proxied-proxy -o jsonpath='{.data.route\.json}' |
                python3 -c 'import json, sys; print(len(json.load(sys.stdin)["servers"]))')" = "$1" ]
    }
    wait_until "the proxy Available over 2 servers" 180 proxy_ready 2
    proxy_ip=$(kubectl get service -n "$pns" proxied-proxy -o jsonpath='{.spec.clusterIP}')
    n=2000
    stored=$(keys "$proxy_ip" 11211 set "$n")
    [ "$stored" = "$n" ] || { echo "e2e-node: FAILED: $stored of $n keys stored through the proxy" >&2; exit 1; }
    kubectl patch -n "$pns" memcached proxied --type=merge -p '{"spec":{"size":3}}' >/dev/null
    wait_until "the proxy routing to 3 servers" 180 proxy_ready 3
    read_back=$(keys "$proxy_ip" 11211 get "$n")
    echo "    $read_back of $n keys read back through Service proxied-proxy ($proxy_ip) after the scale to 3"
    kubectl get events -n "$pns" --field-selector reason=HandedOver -o jsonpath='{range .items[*]}    {.message}{"\n"}{end}'
    [ "$read_back" = "$n" ] || { echo "e2e-node: FAILED: keys lost through the scale" >&2; exit 1; }
    kubectl delete namespace "$pns" --wait=false >/dev/null
else
    echo "==> e2e-node step: proxy: skipped (no memcached-proxy:local image: set MEMCACHED_PROXY_BINARY)"
fi

if command -v openssl >/dev/null 2>&1; then
    step "TLS: a renewed certificate reaches the running server through the kubelet's volume update"
    tns=e2e-node-tls
    kubectl create namespace "$tns" >/dev/null
    kubectl label namespace "$tns" pod-security.kubernetes.io/enforce=restricted >/dev/null
    tls=$REAL_NODE_DIR/tls
    mkdir -p "$tls"
    printf 'subjectAltName=DNS:secure,DNS:secure.%s.svc\n' "$tns" >"$tls/server.ext"
    openssl req -x509 -newkey rsa:2048 -nodes -keyout "$tls/ca.key" -out "$tls/ca.crt" -days 2 \
        -subj /CN=e2e-node-ca 2>/dev/null
    leaf() { # leaf SERIAL: a new key and certificate from the CA, applied as the Secret
        openssl req -newkey rsa:2048 -nodes -keyout "$tls/tls.key" -out "$tls/tls.csr" -subj /CN=secure 2>/dev/null
        openssl x509 -req -in "$tls/tls.csr" -CA "$tls/ca.crt" -CAkey "$tls/ca.key" -set_serial "$1" -days 2 \
            -extfile "$tls/server.ext" -out "$tls/tls.crt" 2>/dev/null
        kubectl create secret generic secure-tls -n "$tns" --type=kubernetes.io/tls --from-file="$tls/tls.crt" \
            --from-file="$tls/tls.key" --from-file="$tls/ca.crt" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
    }
    leaf 1
    kubectl apply -n "$tns" -f - >/dev/null <<'EOF'
apiVersion: cache.example.com/v1alpha1
kind: Memcached
metadata: { name: secure }
spec:
  size: 1
  security: { tls: { secretName: secure-tls, clientAuth: false } }
EOF
    tls_ready() {
        [ "$(jsonpath -n "$tns" memcached secure -o jsonpath='{.status.conditions[?(@.type=="Available")].status}')" = True ]
    }
    wait_until "the TLS instance Available" 180 tls_ready
    tls_pod=$(kubectl get pods -n "$tns" -l app.kubernetes.io/instance=secure -o jsonpath='{.items[0].metadata.name}')
    tls_ip=$(kubectl get pod -n "$tns" "$tls_pod" -o jsonpath='{.status.podIP}')
    serial() {
        openssl s_client -connect "$tls_ip:11211" -servername "secure.$tns.svc" </dev/null 2>/dev/null |
            openssl x509 -noout -serial 2>/dev/null
    }
    echo "    $tls_pod ($tls_ip) serves $(serial)"
    leaf 2
    reloaded() { kubectl get events -n "$tns" --field-selector reason=CertificatesReloaded -o name | grep -q .; }
    wait_until "a CertificatesReloaded event" 180 reloaded
    wait_until "the server presenting serial 02" 60 sh -c "[ \"\$(openssl s_client -connect $tls_ip:11211 </dev/null 2>/dev/null | openssl x509 -noout -serial)\" = serial=02 ]"
    echo "    $(kubectl get events -n "$tns" --field-selector reason=CertificatesReloaded -o jsonpath='{.items[0].message}')"
    restarts=$(kubectl get pod -n "$tns" "$tls_pod" -o jsonpath='{.status.containerStatuses[0].restartCount}')
    echo "    $tls_pod serves $(serial), restarts $restarts"
    [ "$restarts" = 0 ] || { echo "e2e-node: FAILED: the TLS pod restarted" >&2; exit 1; }
    kubectl delete namespace "$tns" --wait=false >/dev/null
else
    echo "==> e2e-node step: TLS: skipped (no openssl)"
fi

if python3 -c 'import pylibmc' 2>/dev/null; then
    step "warm handover: pylibmc ketama through a scale 3 -> 5 and a rollout, every key"
    hns=e2e-node-handover
    kubectl create namespace "$hns" >/dev/null
    kubectl label namespace "$hns" pod-security.kubernetes.io/enforce=restricted >/dev/null
    warm() { # warm SIZE MEMORY_MB
        kubectl apply -n "$hns" -f - >/dev/null <<EOF
apiVersion: cache.example.com/v1alpha1
kind: Memcached
metadata: { name: warm }
spec:
  size: $1
  memcached: { maxMemoryMB: $2 }
  clients: { hashing: ketama }
EOF
    }
    settled() { # settled SIZE: every pod up to date and ready, the list published, nothing in progress
        [ "$(jsonpath -n "$hns" memcached warm -o jsonpath='{.status.conditions[?(@.type=="Available")].status}')" = True ] &&
            [ "$(jsonpath -n "$hns" memcached warm -o jsonpath='{.status.conditions[?(@.type=="Progressing")].status}')" = False ] &&
            [ "$(jsonpath -n "$hns" deployment warm -o jsonpath='{.status.replicas}/{.status.updatedReplicas}/{.status.readyReplicas}')" = "$1/$1/$1" ] &&
            [ "$(jsonpath -n "$hns" configmap warm-servers -o jsonpath='{.data.servers}' | grep -c .)" = "$1" ]
    }
    # ketama KEYS set|get: pylibmc configured as docs/clients.md says, over the published list.
    ketama() {
        kubectl get -n "$hns" configmap warm-servers -o jsonpath='{.data.servers}' | python3 -c '
import sys, pylibmc
servers = sys.stdin.read().split()
client = pylibmc.Client(servers, behaviors={"ketama_weighted": True})
n, mode = int(sys.argv[1]), sys.argv[2]
keys = {"e2e-node-%d" % i: "value-%d" % i for i in range(n)}
if mode == "set":
    print(n - len(client.set_multi(keys)))
else:
    got = client.get_multi(list(keys))
    print(sum(got.get(k) == v for k, v in keys.items()))
' "$@"
    }
    n=2000
    warm 3 64
    wait_until "3 servers settled" 180 settled 3
    [ "$(ketama "$n" set)" = "$n" ] || { echo "e2e-node: FAILED: keys not stored" >&2; exit 1; }
    warm 5 64
    wait_until "5 servers settled after the scale" 240 settled 5
    after_scale=$(ketama "$n" get)
    echo "    $after_scale of $n keys where pylibmc ketama looks for them after the scale 3 -> 5"
    warm 5 96
    wait_until "5 servers settled after the rollout" 300 settled 5
    after_rollout=$(ketama "$n" get)
    echo "    $after_rollout of $n keys where pylibmc ketama looks for them after the rollout"
    kubectl get events -n "$hns" --field-selector reason=HandedOver -o jsonpath='{range .items[*]}    {.message}{"\n"}{end}'
    [ "$after_scale" = "$n" ] && [ "$after_rollout" = "$n" ] ||
        { echo "e2e-node: FAILED: keys lost in a handover" >&2; exit 1; }
    kubectl delete namespace "$hns" --wait=false >/dev/null
else
    echo "==> e2e-node step: warm handover: skipped (python3 cannot import pylibmc)"
fi

if [ "${E2E_NODE_SUITE:-}" = 1 ]; then
    step "suite (make e2e's steps)"
    kubectl delete -n "$op_ns" "deployment/$op_deploy" --wait=true >/dev/null
    wait_until "the operator's pod gone" 60 sh -c "! kubectl get pods -n $op_ns -o name | grep -q ."
    "${CARGO:-cargo}" test --test e2e -- --ignored --nocapture --test-threads=1
fi
step_done
