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
RUN echo "$(uname -m)-unknown-linux-musl" > /rust-target \
    && rustup target add "$(cat /rust-target)"

WORKDIR /workspace

# Dependencies first: this layer is rebuilt only when Cargo.toml or Cargo.lock change.
# A placeholder library and binary stand in for the real sources.
COPY Cargo.toml Cargo.lock ./
RUN mkdir -p src \
    && echo '' > src/lib.rs \
    && echo 'fn main() {}' > src/main.rs \
    && cargo build --release --locked --target "$(cat /rust-target)" --bin memcached-operator \
    && rm -rf src

# Then the operator itself. build.rs embeds config/ (the install tree) in the binary, for
# `memcached-operator manifests` and `bundle`. Touching the sources makes them newer than the
# placeholder build, so cargo rebuilds the crate whatever timestamps COPY preserved.
COPY build.rs ./
COPY config ./config
COPY src ./src
RUN find src config build.rs -type f -exec touch {} + \
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
# 8080: /metrics; 8081: /healthz and /readyz.
EXPOSE 8080 8081
ENTRYPOINT ["/memcached-operator"]
CMD ["run"]
