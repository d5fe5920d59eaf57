#!/usr/bin/env bash
# make e2e: the end-to-end suite (tests/e2e) against
#   - the cluster KUBECONFIG points at, when it is set (a disposable test cluster: kind, minikube, ...);
#   - else a local control plane from $KUBEBUILDER_ASSETS (or /usr/local/kubebuilder/bin, where
#     controller-runtime's envtest looks) with the stand-in kubelet running a real memcached per pod:
#     `envtest up --memcached` from the workspace, started here and always stopped here, also when the
#     suite fails or the run is interrupted.
# Otherwise it fails, saying what is missing.
#
# The whole output is also kept in target/e2e/e2e-<time>.log (its end is the step timings).
# Environment: CARGO (cargo), ENVTEST_UP_ARGS (more `envtest up` flags), ENVTEST_KEEP=1 (keep the control
# plane's directory: its logs, audit log and the kubelet's memcached logs), and the suite's own knobs
# (E2E_KEEP, E2E_TIMEOUT_SCALE, KUBECTL; see tests/e2e/main.rs).
set -euo pipefail

cd "$(dirname "$0")/.."
CARGO=${CARGO:-cargo}
target_dir=$("$CARGO" metadata --format-version 1 --no-deps 2>/dev/null |
    sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
log_dir=${target_dir:-target}/e2e
mkdir -p "$log_dir"
log=$log_dir/e2e-$(date +%Y%m%d-%H%M%S).log

run_suite() {
    echo "e2e: running the suite against KUBECONFIG=$KUBECONFIG; log: $log" >&2
    "$CARGO" test --test e2e -- --ignored --nocapture --test-threads=1 2>&1 | tee "$log"
}

if [ -n "${KUBECONFIG:-}" ]; then
    run_suite
    exit
fi

assets=${KUBEBUILDER_ASSETS:-/usr/local/kubebuilder/bin}
for binary in etcd kube-apiserver kube-controller-manager; do
    if [ ! -x "$assets/$binary" ]; then
        {
            echo "error: KUBECONFIG is not set, and there is no control plane to start: $assets/$binary is missing."
            echo "The end-to-end tests create and delete objects in a real cluster. Point KUBECONFIG at a"
            echo "disposable test cluster (kind, minikube, ...), e.g.: make e2e KUBECONFIG=\$HOME/.kube/config,"
            echo "or set KUBEBUILDER_ASSETS to a directory holding etcd, kube-apiserver, kube-controller-manager"
            echo "and kube-scheduler (setup-envtest use -p path) to run them against a local control plane."
        } >&2
        exit 1
    fi
done

# Built first, so that the wait below is for the control plane, not for the compiler.
"$CARGO" build --quiet --package envtest
work=$(mktemp -d "${TMPDIR:-/tmp}/memcached-e2e-envtest.XXXXXX")
up_pid=
stop_envtest() {
    local status=$?
    trap - EXIT INT TERM
    if [ -n "$up_pid" ] && kill -0 "$up_pid" 2>/dev/null; then
        echo "e2e: stopping the control plane (envtest up, pid $up_pid)" >&2
        kill -TERM "$up_pid" 2>/dev/null || true
        for _ in $(seq 100); do
            kill -0 "$up_pid" 2>/dev/null || break
            sleep 0.2
        done
        if kill -0 "$up_pid" 2>/dev/null; then
            echo "e2e: envtest up ignored SIGTERM for 20s; killing it" >&2
            kill -KILL "$up_pid" 2>/dev/null || true
        fi
        wait "$up_pid" 2>/dev/null || true
    fi
    if [ "$status" -ne 0 ] && [ -s "$work/up.log" ]; then
        echo "e2e: the last lines of the control plane's log ($work/up.log):" >&2
        tail -n 20 "$work/up.log" >&2
    fi
    rm -rf "$work"
    exit "$status"
}
trap stop_envtest EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

echo "e2e: KUBECONFIG is not set; starting a local control plane from $assets (envtest up --memcached)" >&2
# `cargo run` execs the binary, so $! is envtest's own pid.
KUBEBUILDER_ASSETS=$assets "$CARGO" run --quiet --package envtest -- up --memcached \
    ${ENVTEST_UP_ARGS:-} >"$work/up.out" 2>"$work/up.log" &
up_pid=$!
for _ in $(seq 240); do
    KUBECONFIG=$(sed -n 's/^export KUBECONFIG=//p' "$work/up.out")
    [ -n "$KUBECONFIG" ] && break
    if ! kill -0 "$up_pid" 2>/dev/null; then
        echo "error: envtest up exited before the control plane was up" >&2
        up_pid=
        exit 1
    fi
    sleep 0.5
done
if [ -z "$KUBECONFIG" ]; then
    echo "error: envtest up printed no KUBECONFIG within 120s" >&2
    exit 1
fi
grep '^envtest: up in' "$work/up.log" >&2 || true
export KUBECONFIG
run_suite
