# memcached-operator: build, test and deploy. `make help` lists the targets.

# Version of the operator: the crate version. It tags the default images and versions the OLM bundle.
VERSION ?= $(shell sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n 1)
# Repository of the operator image; the bundle image is $(IMAGE_TAG_BASE)-bundle. The release tooling's
# default image (cargo xtask install|bundle) is $(IMAGE_TAG_BASE):v<crate version> too.
IMAGE_TAG_BASE ?= registry.example.com/memcached-operator
# Image to build, push and deploy.
IMG ?= $(IMAGE_TAG_BASE):v$(VERSION)
# OLM bundle image to build and push.
BUNDLE_IMG ?= $(IMAGE_TAG_BASE)-bundle:v$(VERSION)
# OLM channels of the bundle (comma-separated), and the one subscriptions follow by default.
CHANNELS ?= alpha
DEFAULT_CHANNEL ?= alpha

KUBECTL ?= kubectl
CARGO ?= cargo
OPERATOR_SDK ?= operator-sdk
# Container tool to build and push the image with (docker or podman).
CONTAINER_TOOL ?= docker

# Extra flags for `make run`, e.g. make run ARGS="--namespace=default --log-level=debug".
ARGS ?=

# Files generated from the Rust code by `make manifests` (cargo xtask manifests; the list is
# xtask/src/generate.rs). Tests, and `cargo xtask check`, fail when a committed copy is stale.
INSTALL_FILE := dist/install.yaml
API_DOCS_FILE := docs/api.md
BUNDLE_DIR := bundle

# The release tooling: the workspace's xtask crate (`cargo xtask --help`), which renders config/ with
# $(KUBECTL) kustomize.
XTASK = KUBECTL=$(KUBECTL) $(CARGO) --quiet xtask

# $(call generate,FILE,ARGUMENTS): writes the output of `cargo xtask ARGUMENTS` to FILE, through a
# temporary file so that a failure leaves the old FILE in place.
define generate
	@mkdir -p $(dir $(1))
	$(XTASK) $(2) > $(1).tmp || { rm -f $(1).tmp; exit 1; }
	mv -f $(1).tmp $(1)
endef

# Recipes run in bash with pipefail, so a failure anywhere in a pipeline fails the target.
SHELL = /usr/bin/env bash -o pipefail
.SHELLFLAGS = -ec

.PHONY: all
all: build

##@ General

# Every target followed by a "## description" comment is listed by `make help`;
# "##@ Section" comments start a new section.

.PHONY: help
help: ## Display this help.
	@awk 'BEGIN { FS = ":.*## "; printf "\nUsage:\n  make \033[36m<target>\033[0m\n" } \
		/^##@ / { printf "\n\033[1m%s\033[0m\n", substr($$0, 5); next } \
		/^[a-zA-Z0-9_-]+:.*## / { printf "  \033[36m%-15s\033[0m %s\n", $$1, $$2 }' $(MAKEFILE_LIST)

##@ Development

# The committed dist/install.yaml and bundle/ use the binary's defaults (version and image), whatever
# VERSION and IMG say, so that `make manifests` always reproduces them; `make build-installer` and
# `make bundle` honour IMG and VERSION for a release.
.PHONY: manifests
manifests: ## Regenerate every generated file: CRD, RBAC, dist/install.yaml, docs/api.md, the OLM bundle and the Helm chart's copies.
	$(XTASK) manifests

.PHONY: check-manifests
check-manifests: ## Fail, listing them, if committed generated files differ from what `make manifests` writes.
	$(XTASK) check

.PHONY: docs
docs: ## Regenerate the API reference docs/api.md from the CRD schema.
	$(call generate,$(API_DOCS_FILE),api-docs)

.PHONY: fmt
fmt: ## Format the code with rustfmt.
	$(CARGO) fmt --all

.PHONY: clippy
clippy: ## Lint the code with clippy; warnings are errors.
	$(CARGO) clippy --workspace --all-targets -- -D warnings

.PHONY: test
test: ## Run the unit, integration and doc tests of the operator and xtask (no cluster needed).
	$(CARGO) test --workspace

.PHONY: e2e
e2e: ## Run the end-to-end tests against the cluster KUBECONFIG points at, else against a local envtest control plane.
	CARGO="$(CARGO)" hack/e2e.sh

# The real-node tier (docs/testing.md): a real kubelet, containerd and runc, CNI, kube-proxy and kube-dns
# started beside a local control plane, from $(REAL_NODE_BIN) (kubelet, kube-proxy, kube-dns),
# $(KUBEBUILDER_ASSETS) and PATH; skipped with a message when they are missing. Needs root.
# E2E_NODE_STEPS="sample proxy ..." runs only the steps named (hack/e2e-node.sh lists them).
.PHONY: e2e-node
e2e-node: ## Run the end-to-end steps against a real node started here (real kubelet, containerd, kube-proxy, kube-dns).
	CARGO="$(CARGO)" hack/e2e-node.sh

# Scale benchmark (make bench): instances created at once, the fake API server's answer time per request,
# and the length of the settled window in which writes are counted. ARGS passes more flags, e.g.
# make bench ARGS="--runs 3 --json" or ARGS="--operator-arg=--concurrency=16", or ARGS=--plain-http for a fake
# served over plain HTTP instead of TLS with HTTP/2 and HTTP/1.1 offered by ALPN (cargo run -p bench -- --help).
# ARGS=--real (or make bench-real) runs the same scenario against a real control plane from
# $(KUBEBUILDER_ASSETS) (etcd, kube-apiserver, kube-controller-manager, kube-scheduler; the envtest crate's
# stand-in kubelet), counting the operator's requests from the API server's audit log; add --restart-settled
# to also count what a restarted operator writes over the settled instances.
N ?= 300
LATENCY_MS ?= 5
SETTLE_SECONDS ?= 60

.PHONY: bench
bench: ## Run the scale benchmark: the release binary against a fake API server holding N instances.
	$(CARGO) run --quiet --release --package bench -- --instances $(N) --latency-ms $(LATENCY_MS) \
		--settle-seconds $(SETTLE_SECONDS) $(ARGS)

.PHONY: bench-handover
bench-handover: ## Measure the warm-handover copy: 1 GiB between two real memcached servers, peak RSS growth.
	$(CARGO) run --quiet --release --example handover_bench -- $(ARGS)

.PHONY: bench-warm
bench-warm: ## Measure warm handovers on a real control plane (needs KUBEBUILDER_ASSETS): keys kept by rollouts and scaling.
	$(CARGO) run --quiet --release --package bench -- --handovers $(ARGS)

# The proxy's hop (make bench-proxy; bench --proxy-hop): get latency direct to a memcached server
# ($$MEMCACHED_BINARY, else Debian's /usr/bin/memcached) and through a proxy-capable memcached
# ($$MEMCACHED_PROXY_BINARY, 1.6.23+ built with --enable-proxy) running the operator's arguments and route
# configuration, for the bench's client and pymemcache; skipped with a message without the binaries.
# ARGS="--samples 20000" or ARGS="--proxy-arg=-t --proxy-arg=2" to try a proxy setting.
# ARGS=--open-loop: offered rates instead of one waiting client (plain gets, 8 pipelined gets, 10-key
# multi-gets; plain text and TLS): the direct path's capacity, then --steps of it (default 10,50,80 %)
# to each path, p50/p99 and the proxy's added latency in µs; --connections 4, --step-seconds 1,
# --rounds 2, --json; --control measures the TLS proxy twice (an A/A path: the runs' own spread).
# ARGS=--cost: the proxy's own CPU time and round trip per request, one request in flight, the TLS proxy
# against the proxy with access control (what the access checks cost, in figures the rest of the machine
# barely moves).
.PHONY: bench-proxy
bench-proxy: ## Measure the proxy's hop: get latency direct and through the proxy (needs MEMCACHED_PROXY_BINARY).
	$(CARGO) run --quiet --release --package bench -- --proxy-hop $(ARGS)

# The operator's probes and /metrics under a flood (make bench-http; bench --http-flood): 1000 idle and
# 300 reconnecting connections to each server from 50 loopback addresses, /healthz and /metrics latencies
# and failures. ARGS="--sources 1" floods from one address, ARGS="--seconds 60" probes longer.
.PHONY: bench-http
bench-http: ## Measure /healthz and /metrics under 1000 idle and 300 reconnecting connections (loopback).
	$(CARGO) run --quiet --release --package bench -- --http-flood $(ARGS)

.PHONY: bench-caches
bench-caches: ## Compare the memory of the operator's packed caches with kube's reflector stores (300, 3000 instances).
	$(CARGO) run --quiet --release --example cache_memory -- $(ARGS)

.PHONY: bench-real
bench-real: ## Run the scale benchmark against a real control plane (needs KUBEBUILDER_ASSETS).
	$(CARGO) run --quiet --release --package bench -- --real --instances $(N) \
		--settle-seconds $(SETTLE_SECONDS) $(ARGS)

# The curve over sizes (make bench-scale; bench --real --scale): for each size of SIZES, the floor (as
# --floor: no operator, a stand-in creates each instance's four children and writes its first status) and then the operator,
# each on a fresh control plane from $(KUBEBUILDER_ASSETS), in one table: the operator's CPU converging and CPU
# per instance (with its ratio to the smallest size's), peak RSS, status writes, stats writes, requests and
# watch re-opens per instance (the last three counted apart from one another), settled writes, all Available,
# the floor's pods ready and their ratio. Each run's timeout grows with its size (half a second per instance,
# at least 600 s), so SIZES=10000 measures one large size alone. ARGS=--json prints the figures and every
# run's report as JSON. The default sizes take about half an hour on 2 cores.
SIZES ?= 300,1000,3000

.PHONY: bench-scale
bench-scale: ## Measure the cost per instance at each of SIZES instances against a fair floor on a real control plane (needs KUBEBUILDER_ASSETS).
	$(CARGO) run --quiet --release --package bench -- --real --scale $(SIZES) \
		--settle-seconds $(SETTLE_SECONDS) $(ARGS)

# The dashboard's pictures (docs/images/*.svg, shown in docs/operations.md): the bench records the operator's
# /metrics every second (--record) on a real control plane from $(KUBEBUILDER_ASSETS), first while N instances
# converge, then (--operand) while two instances of three real memcached servers (Debian's), one with warm
# handover and one without, are each read by a cache-aside client hashing with ketama over the published list
# through a rollout, a scale-down and a scale-up; `cargo xtask dashboard-pictures` then evaluates each
# pictured panel's own queries from config/grafana over those scrapes (and prints the hit ratio's lowest
# value between the run's moments). A few minutes. The
# operator is the bench's default (the release build) unless ARGS names another: ARGS="--operator
# target/debug/memcached-operator". The recordings stay in $(SAMPLES).
SAMPLES ?= target/dashboard-samples

.PHONY: dashboard-pictures
dashboard-pictures: ## Record real runs (needs KUBEBUILDER_ASSETS and memcached) and redraw docs/images/*.svg from the dashboard's queries.
	$(CARGO) run --quiet --package bench -- --real --instances $(N) --settle-seconds 30 \
		--record $(SAMPLES) $(ARGS)
	$(CARGO) run --quiet --package bench -- --operand --record $(SAMPLES) $(ARGS)
	$(XTASK) dashboard-pictures --samples $(SAMPLES)

##@ Build

.PHONY: build
build: ## Build the operator binary (target/release/memcached-operator).
	$(CARGO) build --release

.PHONY: run
run: ## Run the operator on this machine against the current kube context (run `make install` first).
	$(CARGO) run -- run $(ARGS)

.PHONY: docker-build
docker-build: ## Build the operator image IMG.
	$(CONTAINER_TOOL) build -t $(IMG) .

.PHONY: docker-push
docker-push: ## Push the operator image IMG.
	$(CONTAINER_TOOL) push $(IMG)

.PHONY: build-installer
build-installer: ## Write the one-file install dist/install.yaml for image IMG.
	$(call generate,$(INSTALL_FILE),install --image $(IMG))

##@ OLM bundle

.PHONY: bundle
bundle: ## Write the OLM bundle (bundle/, bundle.Dockerfile) for VERSION and IMG.
	$(XTASK) bundle --version $(VERSION) --image $(IMG) \
		--channels $(CHANNELS) --default-channel $(DEFAULT_CHANNEL) --output-dir $(BUNDLE_DIR)

.PHONY: bundle-build
bundle-build: ## Build the bundle image BUNDLE_IMG (run `make bundle` first).
	$(CONTAINER_TOOL) build -f bundle.Dockerfile -t $(BUNDLE_IMG) .

.PHONY: bundle-push
bundle-push: ## Push the bundle image BUNDLE_IMG.
	$(CONTAINER_TOOL) push $(BUNDLE_IMG)

.PHONY: bundle-validate
bundle-validate: ## Validate bundle/ with operator-sdk (needs operator-sdk; the tests check the offline rules).
	$(OPERATOR_SDK) bundle validate ./$(BUNDLE_DIR) --select-optional suite=operatorframework

##@ Deployment

# The CRD is applied server-side: its OpenAPI schema carries long descriptions, and a
# client-side apply would store the whole object in the last-applied-configuration
# annotation, which is limited to 256 KiB.

.PHONY: install
install: ## Install the Memcached CRD into the cluster of the current kube context.
	$(KUBECTL) apply --server-side -k config/crd

.PHONY: uninstall
uninstall: ## Remove the Memcached CRD (and with it every Memcached instance) from the cluster.
	$(KUBECTL) delete --ignore-not-found -k config/crd

# config/manager/kustomization.yaml maps the image name "controller" to controller:latest;
# the rendered image reference, and the operator's OPERATOR_IMAGE that follows it (the proxy pods run that
# image), are replaced by IMG here, so that `make deploy` leaves the committed files alone.
.PHONY: deploy
deploy: ## Deploy the operator (CRD, RBAC, Deployment) with image IMG to the cluster of the current kube context.
	$(KUBECTL) kustomize config/default \
		| sed -e 's|: controller:latest$$|: $(IMG)|' \
		| $(KUBECTL) apply --server-side -f -

# Deleting the CRD deletes every Memcached instance, and garbage collection their children: instances
# carry no finalizer, so nothing waits for the operator. Instances created by an earlier build carried
# cache.example.com/finalizer; the current operator removes it when it first reconciles them, so run it
# once before undeploying a cluster upgraded from such a build (docs/operations.md, Uninstall).
.PHONY: undeploy
undeploy: ## Remove the operator, its RBAC and the CRD from the cluster (and with the CRD every Memcached instance).
	$(KUBECTL) delete --ignore-not-found -k config/default
