# syntax=docker/dockerfile:1

# Build:  make docker-build IMG=registry.example.com/memcached-operator:v0.1.0
#         (docker build -t IMAGE .)
#
# The operator is built as a static musl binary and shipped on distroless/static,
# which has no shell and no libc, and runs as the unprivileged user 65532.

ARG RUST_IMAGE=rust:1-bookworm

FROM ${RUST_IMAGE} AS builder

# musl-gcc compiles the C parts of dependencies (ring) for the musl target.
RUN apt-get update \
    && apt-get install -y --no-install-recommends musl-tools \
    && rm -rf /var/lib/apt/lists/*

# x86_64-unknown-linux-musl on amd64 builders; aarch64-unknown-linux-musl on arm64
# builders, so the binary always matches the platform of the final image.
# jemalloc (the binary's allocator) fixes its page size when it is built and refuses to start on a kernel
# with larger pages. arm64 kernels run with 4, 16 or 64 KiB pages, so the arm64 binary is built for 64 KiB,
# which works on all three; amd64 pages are always 4 KiB.
RUN echo "$(uname -m)-unknown-linux-musl" > /rust-target \
    && rustup target add "$(cat /rust-target)" \
    && if [ "$(uname -m)" = aarch64 ]; then \
         printf '[env]\nJEMALLOC_SYS_WITH_LG_PAGE = "16"\n' >> "$CARGO_HOME/config.toml"; \
       fi

WORKDIR /workspace

# Dependencies first: this layer is rebuilt only when the manifests or Cargo.lock change. Placeholder
# sources stand in for the operator's and for the other workspace members (xtask, the release tooling,
# bench, the scale benchmark, envtest, the tests' control plane, and fake-apiserver, the fake API server of
# the smoke tests and the bench), which cargo must find to read the workspace but which the image does not
# build.
COPY Cargo.toml Cargo.lock ./
COPY xtask/Cargo.toml ./xtask/
COPY bench/Cargo.toml ./bench/
COPY envtest/Cargo.toml ./envtest/
COPY fake-apiserver/Cargo.toml ./fake-apiserver/
RUN mkdir -p src xtask/src bench/src envtest/src fake-apiserver/src \
    && echo '' > src/lib.rs \
    && echo 'fn main() {}' > src/main.rs \
    && for member in xtask bench envtest fake-apiserver; do \
         echo '' > "$member/src/lib.rs" && echo 'fn main() {}' > "$member/src/main.rs"; \
       done \
    && cargo build --release --locked --target "$(cat /rust-target)" --bin memcached-operator \
    && rm -rf src

# Then the operator itself. Touching the sources makes them newer than the placeholder build, so cargo
# rebuilds the crate whatever timestamps COPY preserved.
COPY src ./src
RUN find src -type f -exec touch {} + \
    && cargo build --release --locked --target "$(cat /rust-target)" --bin memcached-operator \
    && mkdir -p /out \
    && cp "target/$(cat /rust-target)/release/memcached-operator" /out/memcached-operator

FROM gcr.io/distroless/static-debian12:nonroot
LABEL org.opencontainers.image.title="memcached-operator" \
      org.opencontainers.image.description="A Kubernetes operator that runs Memcached through a Memcached custom resource" \
      org.opencontainers.image.licenses="Apache-2.0"
WORKDIR /
COPY --from=builder /out/memcached-operator /memcached-operator
# Numeric, so that the kubelet can check runAsNonRoot.
USER 65532:65532
# 8443: /metrics (HTTPS); 8081: /healthz and /readyz.
EXPOSE 8443 8081
ENTRYPOINT ["/memcached-operator"]
CMD ["run"]
