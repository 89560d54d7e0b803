# syntax=docker/dockerfile:1
# The lyra-controller image (and the lyra CLI beside it, for `kubectl exec` state work).
# Multi-stage: build on the Rust image, run on distroless as the nonroot user (65532), with
# nothing but the binaries, CA certificates and glibc. The chart runs it with a read-only root
# filesystem; /var/lib/lyra and /tmp are volumes.
#   docker build -t ghcr.io/lyra-dev/lyra-controller:0.1.0 .
# A test (e2e::chart::dockerfile_*) checks that the paths copied here exist, that the binaries
# are the workspace's, and that the entrypoint's flags are the controller's.

FROM docker.io/library/rust:1.95-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock rustfmt.toml deny.toml ./
COPY crates ./crates
COPY integration-tests ./integration-tests
COPY examples ./examples
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --profile dist --locked -p lyra-controller -p lyra-cli \
    && install -D -m 0755 target/dist/lyra-controller /out/lyra-controller \
    && install -D -m 0755 target/dist/lyra /out/lyra

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/lyra-controller /usr/local/bin/lyra-controller
COPY --from=build /out/lyra /usr/local/bin/lyra
COPY --from=build /src/examples /usr/share/lyra/examples
USER 65532:65532
WORKDIR /var/lib/lyra
EXPOSE 8080 9443
ENTRYPOINT ["/usr/local/bin/lyra-controller"]
CMD ["--log-format=json", "--health-addr=0.0.0.0:8080", "--state=/var/lib/lyra/state.db", "--workflows=/etc/lyra/workflows"]
