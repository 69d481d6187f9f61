# code-executor's container image, built from source:
#
#   docker build -t mcp-code-executor .
#   docker run --rm -p 8080:8080 \
#     -v /path/to/conda/env:/opt/conda/envs/target_env:ro \
#     -e CONDA_ENV_NAME=target_env \
#     mcp-code-executor
#
# Without `-e CODE_EXECUTOR_TOKEN=...` the server generates a token at start
# and prints it in its log (`docker logs`) inside a curl line ready to paste.
# A config file mounted at /etc/code-executor/config.toml is read when present.
# The image runs as uid 10001 and works under any `--user`, with a read-only
# root filesystem (`--read-only --tmpfs /tmp`).
#
# The same runtime image from a binary built on the host, with no network
# during the build: deploy/Dockerfile.prebuilt. The runtime stage below and
# the one there are kept line for line equal (a test checks it); the image's
# settings live in deploy/container/defaults.toml.

# Any image with python3 (the default environment when none is mounted).
ARG BASE=python:3.12-slim-bookworm

# ---- build ----
FROM rust:1-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY python ./python
COPY benches ./benches
RUN cargo build --release --locked --bin code-executor \
 && strip target/release/code-executor

# ---- runtime ----
FROM ${BASE} AS runtime
COPY --from=build /src/target/release/code-executor /usr/local/bin/code-executor
COPY deploy/container/defaults.toml /usr/local/share/code-executor/defaults.toml
ENV CODE_EXECUTOR_DEFAULTS=/usr/local/share/code-executor/defaults.toml
# Numeric, so that Kubernetes can check runAsNonRoot; no passwd entry is needed.
USER 10001:10001
WORKDIR /tmp
EXPOSE 8080
# In-flight runs finish on SIGTERM (shutdown_timeout_secs, 30 s): give
# `docker stop` that long (`docker stop -t 35`).
STOPSIGNAL SIGTERM
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s \
  CMD ["python3", "-c", "import os, urllib.request as r; r.urlopen('http://127.0.0.1:%s/health' % (os.environ.get('CODE_EXECUTOR_PORT') or '8080'), timeout=2)"]
ENTRYPOINT ["/usr/local/bin/code-executor"]
CMD ["serve"]
