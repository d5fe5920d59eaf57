#!/usr/bin/env bash
# make e2e-node: the end-to-end steps against a real node (hack/real-node.sh: a real kubelet, containerd and
# runc, CNI, kube-proxy and kube-dns beside the envtest crate's control plane), started here and stopped here.
#
# Steps, each timed (the timings close the output and target/e2e-node/e2e-node-<time>.log):
#   node:     the node starts (control plane, containerd, images, kubelet Ready);
#   operator: config/default is applied; the operator runs as a pod of its locally assembled image
#             (controller:latest) and its Deployment is Available;
#   sample:   the tutorial's Memcached scaled to 3 in a namespace enforcing `restricted` (3 real memcached
#             containers Ready, reached by the Service's DNS name and ClusterIP), the StatefulSet pool's
#             per-pod DNS names, Degraded ImagePullFailed and CrashLoopBackOff, a deleted pod leaving the
#             published list and the Service before memcached stops;
#   proxy, tls, handover: the proxy tier through a scale, a renewed certificate loaded in place, pylibmc
#             ketama through a scale and a rollout (each skipped, saying so, without what it needs);
#   auth:     a refused auth file in the user's Secret, then memcached restarted in its pod: it reads the
#             last accepted file (a real kubelet re-binds a subPath mount on restart);
#   memory:   a fill across item sizes kept under the derived memory, OOM-killed under maxMemoryMB + 32Mi,
#             reported as Degraded OOMKilled without flapping writes;
#   suite:    the whole `make e2e` suite (tests/e2e, the operator as a local process), after the in-cluster
#             operator is removed (the suite needs the leader Lease to itself); it needs an exporter image.
# E2E_NODE_STEPS="auth memory" runs only the steps named (after the operator's). docs/testing.md has more.
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
node_images() { ctr -a "$REAL_NODE_DIR/containerd.sock" -n k8s.io images ls -q; }
# E2E_NODE_STEPS: the steps to run after the operator's, by name (sample proxy tls handover auth memory
# suite, space-separated); all by default.
selected() { [ -z "${E2E_NODE_STEPS:-}" ] || [[ " $E2E_NODE_STEPS " == *" $1 "* ]]; }
# restricted_namespace NAME: a namespace enforcing the `restricted` Pod Security Standard.
restricted_namespace() {
    kubectl create namespace "$1" >/dev/null
    kubectl label namespace "$1" pod-security.kubernetes.io/enforce=restricted >/dev/null
}
condition() { # condition NAMESPACE NAME TYPE FIELD: a field of one of a Memcached's conditions
    jsonpath -n "$1" memcached "$2" -o jsonpath="{.status.conditions[?(@.type==\"$3\")].$4}"
}
container_status() { # container_status NAMESPACE POD FIELD: a field of the memcached container's status
    jsonpath -n "$1" pod "$2" -o jsonpath="{.status.containerStatuses[?(@.name==\"memcached\")].$3}"
}

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


# The tutorial sample, the StatefulSet pool, two broken instances and a pod deleted under it.
run_sample() {
    step sample
    ns=e2e-node-sample
    restricted_namespace "$ns"
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
}

# The proxy tier through a scale.
run_proxy() {
    if ! grep -q 'memcached-proxy:local' <<<"$(node_images)"; then
        echo "==> e2e-node step: proxy: skipped (no memcached-proxy:local image: set MEMCACHED_PROXY_BINARY)"
        return
    fi
    step "proxy: scale 2 -> 3, every key through the proxy Service"
    pns=e2e-node-proxy
    restricted_namespace "$pns"
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
}

# A renewed TLS certificate reloaded in place.
run_tls() {
    if ! command -v openssl >/dev/null 2>&1; then
        echo "==> e2e-node step: TLS: skipped (no openssl)"
        return
    fi
    step "TLS: a renewed certificate reaches the running server through the kubelet's volume update"
    tns=e2e-node-tls
    restricted_namespace "$tns"
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
}

# Warm handover with a real client library.
run_handover() {
    if ! python3 -c 'import pylibmc' 2>/dev/null; then
        echo "==> e2e-node step: warm handover: skipped (python3 cannot import pylibmc)"
        return
    fi
    step "warm handover: pylibmc ketama through a scale 3 -> 5 and a rollout, every key"
    hns=e2e-node-handover
    restricted_namespace "$hns"
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
}

# The auth file across a container restart. A real kubelet binds a `subPath` mount to the volume's current
# file again when a container restarts; the pods load the operator's checked copy (`<name>-auth-file`), so a
# restarted memcached reads the last file the operator accepted, never a refused one.
run_auth() {
    step "auth file: a refused file in the user's Secret, then memcached restarted in its pod"
    ans=e2e-node-auth
    restricted_namespace "$ans"
    auth_secret() { # auth_secret FILE: the user's Secret, applied
        kubectl create secret generic app-auth -n "$ans" --from-literal=auth-file="$1" --dry-run=client -o yaml |
            kubectl apply -f - >/dev/null
    }
    auth_secret $'app:first-secret\n'
    kubectl apply -n "$ans" -f - >/dev/null <<'EOF'
apiVersion: cache.example.com/v1alpha1
kind: Memcached
metadata: { name: guarded }
spec:
  size: 1
  security: { auth: { secretName: app-auth } }
EOF
    guarded_ready() {
        [ "$(condition "$ans" guarded Available status)" = True ] &&
            [ "$(jsonpath -n "$ans" deployment guarded -o jsonpath='{.status.readyReplicas}/{.status.replicas}')" = 1/1 ]
    }
    wait_until "the auth instance Available" 180 guarded_ready
    apod=$(kubectl get pods -n "$ans" -l app.kubernetes.io/instance=guarded -o jsonpath='{.items[0].metadata.name}')
    aip=$(kubectl get pod -n "$ans" "$apod" -o jsonpath='{.status.podIP}')
    # authenticated USER PASSWORD: memcached's ASCII authentication, then a write, at the instance's
    # first pod.
    authenticated() {
        python3 - "$(kubectl get pods -n "$ans" -l app.kubernetes.io/instance=guarded \
            --field-selector=status.phase=Running -o jsonpath='{.items[0].status.podIP}')" "$1" "$2" <<'PY'
import socket, sys
ip, user, password = sys.argv[1:]
f = socket.create_connection((ip, 11211), 5).makefile("rwb")
token = f"{user} {password}".encode()
f.write(b"set auth 0 0 %d\r\n%s\r\nset e2e-node 0 0 2\r\nok\r\n" % (len(token), token))
f.flush()
answers = [f.readline().strip().decode(), f.readline().strip().decode()]
print(" ".join(answers))
sys.exit(0 if answers == ["STORED", "STORED"] else 1)
PY
    }
    echo "    $apod ($aip), app:first-secret: $(authenticated app first-secret)"
    auth_secret $'\n'
    refused() { [ "$(condition "$ans" guarded Degraded reason)" = SecretInvalid ]; }
    wait_until "guarded Degraded SecretInvalid" 120 refused
    echo "    the user's Secret holds a refused file: $(condition "$ans" guarded Degraded message)"
    # The kubelet brings a changed Secret into the pod's volumes at its next sync of the pod (syncFrequency
    # 10s here). Whatever Secret the pod mounts, its file on this machine is watched: with the user's Secret
    # mounted it turns refused within a few syncs; with the operator's copy it does not change.
    uid=$(kubectl get pod -n "$ans" "$apod" -o jsonpath='{.metadata.uid}')
    volume_file() { cat "$REAL_NODE_DIR"/kubelet/root/pods/"$uid"/volumes/kubernetes.io~secret/*/auth-file 2>/dev/null; }
    for _ in $(seq 30); do
        [ "$(volume_file | head -c 4)" = app: ] || break
        sleep 1
    done
    echo "    after 3 kubelet syncs the pod's volume holds: $(volume_file | sed 's/:[^:]*$/:<password>/' | tr '\n' ' ')"
    kubectl exec -n "$ans" "$apod" -c memcached -- sh -c 'kill 1'
    restarted() {
        [ "$(container_status "$ans" "$apod" restartCount)" -ge 1 ] && [ "$(container_status "$ans" "$apod" ready)" = true ]
    }
    if ! wait_until "memcached restarted and ready again in $apod" 60 restarted; then
        echo "    last state: $(container_status "$ans" "$apod" lastState) $(container_status "$ans" "$apod" state)" >&2
        kubectl logs -n "$ans" "$apod" -c memcached --previous 2>&1 | tail -n 3 >&2 || true
        exit 1
    fi
    echo "    memcached restarted in $apod (restarts $(container_status "$ans" "$apod" restartCount)), app:first-secret: $(authenticated app first-secret)"
    authenticated app first-secret >/dev/null ||
        { echo "e2e-node: FAILED: the restarted server does not take the last accepted file" >&2; exit 1; }
    auth_secret $'app:second-secret\n'
    rotated() { guarded_ready && [ "$(condition "$ans" guarded Degraded status)" = False ] && authenticated app second-secret; }
    wait_until "the rotated file served (pods rolled onto it)" 180 rotated
    echo "    rotated to app:second-secret: $(authenticated app second-secret) on $(kubectl get pods -n "$ans" -l app.kubernetes.io/instance=guarded -o jsonpath='{.items[0].metadata.name}')"
    kubectl delete namespace "$ans" --wait=false >/dev/null
}

# fill IP: values of every slab class's size (48 bytes to 512 KiB, x1.25), 2 MiB of each, twice, without
# waiting for answers; prints how many were sent before the server went away, if it did.
fill() {
    python3 - "$1" <<'PY'
import socket, sys
sizes, size = [], 48.0
while size < 600 * 1024:
    sizes.append(int(size))
    size *= 1.25
sent = 0
try:
    s = socket.create_connection((sys.argv[1], 11211), 5)
    for round_ in range(2):
        for size in sizes:
            value = b"x" * size
            for i in range(max(1, 2 * 1024 * 1024 // size)):
                s.sendall(b"set fill-%d-%d-%d 0 0 %d noreply\r\n%s\r\n" % (round_, size, i, size, value))
                sent += 1
    s.sendall(b"version\r\n")
    s.settimeout(30)
    answer = s.recv(64).decode().strip()
    print(f"{sent} values sent, then {answer}")
except OSError as error:
    print(f"{sent} values sent, then {error}")
PY
}

# Memory: memcached keeps every slab class's first page even beyond -m, and its hash table grows with the
# items; the derived limit holds a fill across every item size, a limit of maxMemoryMB + 32Mi does not.
run_memory() {
    step "memory: a fill across item sizes under the derived limit and under maxMemoryMB + 32Mi"
    mns=e2e-node-memory
    restricted_namespace "$mns"
    kubectl apply -n "$mns" -f - >/dev/null <<'EOF'
apiVersion: cache.example.com/v1alpha1
kind: Memcached
metadata: { name: roomy }
spec:
  size: 1
  memcached: { maxMemoryMB: 16 }
---
apiVersion: cache.example.com/v1alpha1
kind: Memcached
metadata: { name: tight }
spec:
  size: 1
  memcached: { maxMemoryMB: 16 }
  resources: { requests: { memory: 48Mi }, limits: { memory: 48Mi } }
EOF
    both_ready() {
        for name in roomy tight; do
            [ "$(condition "$mns" "$name" Available status)" = True ] || return 1
        done
    }
    wait_until "both instances Available" 180 both_ready
    for name in roomy tight; do
        pod=$(kubectl get pods -n "$mns" -l app.kubernetes.io/instance="$name" -o jsonpath='{.items[0].metadata.name}')
        ip=$(kubectl get pod -n "$mns" "$pod" -o jsonpath='{.status.podIP}')
        limit=$(kubectl get pod -n "$mns" "$pod" -o jsonpath='{.spec.containers[?(@.name=="memcached")].resources.limits.memory}')
        echo "    $name ($pod, limit $limit): $(fill "$ip")"
        eval "${name}_pod=$pod"
    done
    # The kubelet notices an OOM kill at its next sync of the pod and restarts the container.
    oom_killed() {
        [ "$(container_status "$mns" "$tight_pod" lastState.terminated.reason)" = OOMKilled ] &&
            [ "$(container_status "$mns" "$tight_pod" ready)" = true ]
    }
    wait_until "tight's memcached OOM-killed and restarted by the kubelet" 60 oom_killed
    reported() { [ "$(condition "$mns" tight Degraded reason)" = OOMKilled ]; }
    wait_until "tight Degraded OOMKilled" 60 reported
    echo "    tight: restarts $(container_status "$mns" "$tight_pod" restartCount), Degraded $(condition "$mns" tight Degraded reason): $(condition "$mns" tight Degraded message)"
    # No flapping: once reported, nothing is written back and forth while nothing changes. Every write of
    # tight's Memcached in 40 s is recorded and printed (what changed in its status); the Degraded
    # condition must not change, and its Deployment is not written at all.
    deployment_version=$(kubectl get -n "$mns" deployment/tight -o jsonpath='{.metadata.resourceVersion}')
    timeout 40 kubectl get -n "$mns" memcached/tight -o json --watch >"$REAL_NODE_DIR/tight-watch.json" 2>/dev/null || true
    python3 - "$REAL_NODE_DIR/tight-watch.json" <<'PY' || { echo "e2e-node: FAILED: the report flaps" >&2; exit 1; }
import json, sys
decoder, text, objects, at = json.JSONDecoder(), open(sys.argv[1]).read(), [], 0
while text[at:].strip():
    obj, end = decoder.raw_decode(text[at:].lstrip())
    at = len(text) - len(text[at:].lstrip()) + end
    objects.append(obj)
def flat(value, prefix=""):
    if isinstance(value, dict):
        for k, v in value.items():
            yield from flat(v, f"{prefix}.{k}")
    elif isinstance(value, list) and all(isinstance(v, dict) and "type" in v for v in value):
        for v in value:
            yield from flat({k: x for k, x in v.items() if k != "type"}, f"{prefix}[{v['type']}]")
    else:
        yield prefix, value
degraded = {json.dumps(next((c for c in o["status"]["conditions"] if c["type"] == "Degraded"), None)) for o in objects}
for before, after in zip(objects, objects[1:]):
    a, b = dict(flat(before["status"])), dict(flat(after["status"]))
    changed = {k: (a.get(k), b.get(k)) for k in a.keys() | b.keys() if a.get(k) != b.get(k)}
    print(f"    write {after['metadata']['resourceVersion']}: {changed}")
print(f"    {len(objects) - 1} writes of tight's Memcached in 40 s; Degraded seen as {len(degraded)} value(s)")
sys.exit(0 if len(degraded) == 1 else 1)
PY
    [ "$(kubectl get -n "$mns" deployment/tight -o jsonpath='{.metadata.resourceVersion}')" = "$deployment_version" ] ||
        { echo "e2e-node: FAILED: tight's Deployment written while nothing changed" >&2; exit 1; }
    roomy_restarts=$(container_status "$mns" "$roomy_pod" restartCount)
    echo "    roomy: restarts $roomy_restarts, Degraded $(condition "$mns" roomy Degraded status)"
    [ "$roomy_restarts" = 0 ] || { echo "e2e-node: FAILED: memcached OOM-killed under the derived limit" >&2; exit 1; }
    kubectl delete namespace "$mns" --wait=false >/dev/null
}

# Every step of `make e2e` (tests/e2e) against this node, the operator as a local process as that suite runs
# it (it needs the leader Lease to itself, so the in-cluster operator goes first).
run_suite() {
    if ! grep -q 'memcached-exporter' <<<"$(node_images)"; then
        echo "==> e2e-node step: suite: skipped (no exporter image for the production sample: put memcached_exporter on PATH or set MEMCACHED_EXPORTER_BINARY)"
        return
    fi
    step "suite (make e2e's steps)"
    kubectl delete -n "$op_ns" "deployment/$op_deploy" --wait=true >/dev/null
    wait_until "the operator's pod gone" 60 sh -c "! kubectl get pods -n $op_ns -o name | grep -q ."
    "${CARGO:-cargo}" test --test e2e -- --ignored --nocapture --test-threads=1
}

step operator
kubectl apply -k config/default >/dev/null
op_ns=memcached-operator-system
op_deploy=memcached-operator-controller-manager
wait_until "the operator's Deployment Available" 180 \
    kubectl wait -n "$op_ns" "deployment/$op_deploy" --for=condition=Available --timeout=1s
op_pod=$(kubectl get pods -n "$op_ns" -l control-plane=controller-manager -o jsonpath='{.items[0].metadata.name}')
echo "    operator pod $op_pod: image $(kubectl get pod -n "$op_ns" "$op_pod" -o jsonpath='{.status.containerStatuses[0].imageID}')"


for name in sample proxy tls handover auth memory suite; do
    if selected "$name"; then "run_$name"; fi
done
step_done
