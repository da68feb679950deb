# syntax=docker/dockerfile:1
#
# The streaming gateway as a container image.
#
#   docker build -t llm-stream-gateway .
#   docker run --rm -p 8080:8080 --stop-timeout 45 \
#       -e GATEWAY_UPSTREAM_URL=https://api.openai.com/v1 llm-stream-gateway
#
# Two stages: the builder turns the source into a wheel and installs it with
# its dependencies into /opt/venv; the runtime stage gets that venv and
# nothing else (no pip cache, no source tree, no build tools).
#
# BASE_IMAGE is the base of both stages: an official slim Python image on Debian 13
# (trixie) by default. Any Debian-based image with the same Python (python, pip,
# venv, the C headers) builds the same image: `make image-test` builds it on a base
# made with debootstrap from Debian trixie's own python3 (3.13, as here) where no
# container registry is reachable (tests/image/).
ARG BASE_IMAGE=python:3.13.9-slim-trixie

# --------------------------------------------------------------------- builder
FROM ${BASE_IMAGE} AS builder

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1

# A C compiler for the build only: setup.py compiles the guard with mypyc (about
# half the guard's CPU per event); the runtime stage gets the compiled modules.
# Debian's compiler for this release, whatever its point version (hence no pins).
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /src
COPY pyproject.toml setup.py ./
COPY gateway ./gateway

# Build the wheel from the source, then install it (and its dependencies,
# all published as binary wheels for this platform) into a self-contained
# venv at the same path the runtime stage will use. Then check that the
# installed guard is the compiled one, with -P: `python -c` otherwise puts the
# working directory (/src, the uncompiled source) first on sys.path, and the
# check would judge that copy instead of the installed one.
RUN python -m pip wheel --no-deps --wheel-dir /wheels . \
 && python -m venv /opt/venv \
 && /opt/venv/bin/pip install /wheels/*.whl \
 && /opt/venv/bin/gateway --version \
 && /opt/venv/bin/python -P -c "import gateway, sys; sys.exit(gateway.guard_build() != 'compiled')"

# --------------------------------------------------------------------- runtime
FROM ${BASE_IMAGE} AS runtime

LABEL org.opencontainers.image.title="llm-stream-gateway" \
      org.opencontainers.image.description="LLM streaming gateway that verifies every streamed answer ended properly" \
      org.opencontainers.image.licenses="Apache-2.0"

# A fixed numeric UID/GID so that Kubernetes' runAsNonRoot can verify it.
RUN groupadd --system --gid 10001 gateway \
 && useradd --system --no-log-init --uid 10001 --gid gateway \
        --home-dir /nonexistent --no-create-home --shell /usr/sbin/nologin gateway

COPY --from=builder /opt/venv /opt/venv

ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    GATEWAY_HOST=0.0.0.0 \
    GATEWAY_PORT=8080

WORKDIR /app
USER 10001:10001
EXPOSE 8080

# /healthz answers 200 while the process is alive (it stays 200 while
# draining; /readyz is the one that turns 503). slim has no curl: use Python.
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:' + os.environ.get('GATEWAY_PORT', '8080') + '/healthz', timeout=2)"]

# The gateway drains on SIGTERM: /readyz turns 503 at once and in-flight
# streams get GATEWAY_DRAIN_TIMEOUT seconds (default 30). Give the container
# a stop timeout longer than that (docker run --stop-timeout 45, compose
# stop_grace_period, Kubernetes terminationGracePeriodSeconds).
STOPSIGNAL SIGTERM

CMD ["gateway", "serve"]
