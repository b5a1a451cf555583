# syntax=docker/dockerfile:1
# glm5-serve: GLM-5-NVFP4 on SGLang 0.5.23, TP8 on 8x RTX PRO 6000 Blackwell (SM120).
# Thin on purpose: the logic lives in patches/, entrypoint/ and healthcheck/, tested on their own.

# CUDA 13.0 devel: FlashInfer JIT-compiles SM120 kernels with nvcc at run time (sm_120f needs >= 12.9).
# ci/build-image passes a locally made base instead, since no image registry is reachable there.
ARG BASE_IMAGE=nvidia/cuda:13.0.1-cudnn-devel-ubuntu24.04
FROM ${BASE_IMAGE}

# Versions: keep equal to image/requirements.in (tests/test_image.py checks); the build asserts them.
ARG SGLANG_VERSION=0.5.23
ARG TORCH_VERSION=2.14.1
ARG FLASHINFER_VERSION=0.7.2
ARG SUPERVISOR_VERSION=4.3.0
# MAJOR.MINOR of the base image's nvcc; patches/verify fails the build when they differ.
ARG CUDA_MAJOR_MINOR=13.0
ARG GLM5_UID=1000

SHELL ["/bin/bash", "-euo", "pipefail", "-c"]

# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv python3-dev patch ca-certificates \
 && rm -rf /var/lib/apt/lists/*

ENV VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:/usr/local/cuda/bin:$PATH \
    CUDA_HOME=/usr/local/cuda \
    FLASHINFER_CUDA_VERSION=${CUDA_MAJOR_MINOR} \
    GLM5_HOME=/opt/glm5 \
    GLM5_LOG_DIR=/var/log/glm5 \
    GLM5_STATE_DIR=/run/glm5 \
    GLM5_PORT=30000 \
    GLM5_HEALTH_TIMEOUT=5 \
    HOME=/home/glm5 \
    XDG_CACHE_HOME=/cache \
    HF_HOME=/cache/huggingface \
    FLASHINFER_WORKSPACE_BASE=/cache \
    TRITON_CACHE_DIR=/cache/triton \
    TORCHINDUCTOR_CACHE_DIR=/cache/inductor \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_CERT=/etc/ssl/certs/ca-certificates.crt \
    PIP_NO_CACHE_DIR=1

# The whole Python stack from hashes (image/relock regenerates the lock), then the ARG pins asserted.
COPY image/ /opt/glm5/image/
RUN python3 -m venv "$VIRTUAL_ENV" \
 && pip install --no-deps --require-hashes -r /opt/glm5/image/requirements.lock \
 && /opt/glm5/image/assert-versions "sglang==${SGLANG_VERSION}" "torch==${TORCH_VERSION}" \
      "flashinfer-python==${FLASHINFER_VERSION}" "supervisor==${SUPERVISOR_VERSION}"

# Patch FlashInfer and prove it took effect in this image: fails the build on drift.
COPY patches/ /opt/glm5/patches/
RUN /opt/glm5/patches/apply \
 && /opt/glm5/patches/verify \
 && cp "$(python3 -c 'import flashinfer, pathlib; print(pathlib.Path(flashinfer.__file__).parent)')/GLM5_SERVE_PATCHES.json" /opt/glm5/PATCHES-APPLIED.json

COPY entrypoint/ /opt/glm5/entrypoint/
COPY healthcheck/ /opt/glm5/healthcheck/

# Non-root: SGLang needs no root; the GPUs come through the NVIDIA runtime's device files.
RUN if id -u ubuntu >/dev/null 2>&1; then userdel --remove ubuntu; fi \
 && useradd --uid "${GLM5_UID}" --gid 0 --create-home --home-dir /home/glm5 glm5 \
 && mkdir -p /cache /models /var/log/glm5 /run/glm5 \
 && chown -R "${GLM5_UID}:0" /cache /var/log/glm5 /run/glm5 /home/glm5 \
 && chmod -R g+rwX /cache /var/log/glm5 /run/glm5 /home/glm5
USER ${GLM5_UID}
WORKDIR /home/glm5

EXPOSE 30000
VOLUME ["/cache"]
# A GLM-5 start: ~410 GB of weights (7-8 min warm, far longer cold from disk) plus capture of 58 prefill and
# 52 decode graphs (~4 min). 40 min of grace before failed probes count; probes before that only report
# (compose adds start_interval 10s; the option is left out here for builders older than Docker 25).
HEALTHCHECK --interval=30s --timeout=10s --start-period=2400s --retries=3 \
  CMD ["/opt/glm5/healthcheck/healthcheck", "--status"]
# SIGTERM drains in-flight requests for at most GLM5_DRAIN_SECONDS (120 s; supervisord then kills the
# server's process group): give `docker stop` that plus margin (compose stop_grace_period: 150s).
STOPSIGNAL SIGTERM
ENTRYPOINT ["/opt/glm5/entrypoint/entrypoint.sh"]
CMD ["serve"]
