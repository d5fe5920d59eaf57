# memcached-operator: build, test and deploy. `make help` lists the targets.

# Image to build, push and deploy.
IMG ?= controller:latest

KUBECTL ?= kubectl
CARGO ?= cargo
# Container tool to build and push the image with (docker or podman).
CONTAINER_TOOL ?= docker

# Extra flags for `make run`, e.g. make run ARGS="--namespace=default --log-level=debug".
ARGS ?=

# Files generated from the Rust code by `make manifests`.
CRD_FILE := config/crd/bases/cache.example.com_memcacheds.yaml
RBAC_FILE := config/rbac/role.yaml

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

.PHONY: manifests
manifests: ## Generate the CRD and the RBAC roles under config/ from the Rust code.
	@mkdir -p $(dir $(CRD_FILE)) $(dir $(RBAC_FILE))
	$(CARGO) run --quiet -- crd > $(CRD_FILE).tmp || { rm -f $(CRD_FILE).tmp; exit 1; }
	mv -f $(CRD_FILE).tmp $(CRD_FILE)
	$(CARGO) run --quiet -- rbac > $(RBAC_FILE).tmp || { rm -f $(RBAC_FILE).tmp; exit 1; }
	mv -f $(RBAC_FILE).tmp $(RBAC_FILE)

.PHONY: fmt
fmt: ## Format the code with rustfmt.
	$(CARGO) fmt --all

.PHONY: clippy
clippy: ## Lint the code with clippy; warnings are errors.
	$(CARGO) clippy --all-targets -- -D warnings

.PHONY: test
test: ## Run the unit, integration and doc tests (no cluster needed).
	$(CARGO) test

.PHONY: e2e
e2e: ## Run the end-to-end tests against the cluster KUBECONFIG points at.
	@if [ -z "$${KUBECONFIG:-}" ]; then \
		echo "error: KUBECONFIG is not set." >&2; \
		echo "The end-to-end tests create and delete objects in a real cluster. Point KUBECONFIG at a" >&2; \
		echo "disposable test cluster (kind, minikube, ...), e.g.: make e2e KUBECONFIG=\$$HOME/.kube/config" >&2; \
		exit 1; \
	fi
	MEMCACHED_E2E=1 $(CARGO) test --test e2e -- --nocapture --test-threads=1

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
# the rendered image reference is replaced by IMG here, so that `make deploy` leaves the
# committed files alone.
.PHONY: deploy
deploy: ## Deploy the operator (CRD, RBAC, Deployment) with image IMG to the cluster of the current kube context.
	$(KUBECTL) kustomize config/default \
		| sed -e 's|image: controller:latest$$|image: $(IMG)|' \
		| $(KUBECTL) apply --server-side -f -

# Delete the Memcached instances first (kubectl delete memcacheds --all --all-namespaces) while
# the operator still runs: each instance carries the finalizer cache.example.com/finalizer, which
# only the operator removes. Without the operator the instances, and so the CRD deletion, hang.
.PHONY: undeploy
undeploy: ## Remove the operator, its RBAC and the CRD from the cluster (delete Memcached instances first).
	$(KUBECTL) delete --ignore-not-found -k config/default
