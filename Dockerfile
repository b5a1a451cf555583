# syntax=docker/dockerfile:1
# glm5-serve: GLM-5-NVFP4 on SGLang (the versions: ARGs below), TP8 on 8x RTX PRO 6000 Blackwell (SM120).
# Values marked ci/render come from entrypoint/glm5.toml: change them there, then run ci/render.
# Thin on purpose: the logic lives in common/, patches/, kernels/, entrypoint/ and healthcheck/, tested on their own.

# CUDA 13.0 devel: nvcc builds FlashInfer's SM120 kernels into the image (sm_120f needs >= 12.9), and the run-time JITs
# (DeepGEMM, Triton, SGLang's own) compile the rest at first start.
# ci/build-image passes a locally made base instead, since no image registry is reachable there.
# ci/render: BASE_IMAGE={base_image}
ARG BASE_IMAGE=nvidia/cuda:13.0.1-cudnn-devel-ubuntu24.04@sha256:8b2705ea7a8653ad3451b46ab835eced92d77b44e671b9cf3ad4f95fbb2efe5e
# checkov:skip=CKV_DOCKER_7: the tag is the ARG's default above (a release tag); checkov reads ${BASE_IMAGE} as no tag
FROM ${BASE_IMAGE}

# Versions: rendered with image/requirements.in from glm5.toml's [image]; the build asserts them.
# ci/render: SGLANG_VERSION={sglang}
ARG SGLANG_VERSION=0.5.23
# ci/render: TORCH_VERSION={torch}
ARG TORCH_VERSION=2.14.1
# ci/render: FLASHINFER_VERSION={flashinfer}
ARG FLASHINFER_VERSION=0.7.2
# ci/render: SUPERVISOR_VERSION={supervisor}
ARG SUPERVISOR_VERSION=4.3.0
# ci/render: SMG_VERSION={smg}
ARG SMG_VERSION=1.13.0
# MAJOR.MINOR of the base image's nvcc; patches/verify fails the build when they differ.
# ci/render: CUDA_MAJOR_MINOR={cuda_major_minor}
ARG CUDA_MAJOR_MINOR=13.0
ARG GLM5_UID=1000
# Set by ci/build-image (the commit's time): the RUN steps' pip and compileall then write hash-based .pyc files, not
# the install time (Python's py_compile docs). Unset in a user build: the .pyc files carry their sources' mtimes.
ARG SOURCE_DATE_EPOCH

SHELL ["/bin/bash", "-euo", "pipefail", "-c"]

# noninteractive: Ubuntu 24.04's python3.12 pulls tzdata, whose debconf prompt would hang the build.
# g++: the host compiler that the run-time JITs (FlashInfer, DeepGEMM, TileLang through nvcc; Triton's launcher) need.
# The logs and caches apt, dpkg and ldconfig write differ between two builds of one tree (docs/release.md): removed.
# hadolint ignore=DL3008
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3 python3-venv python3-dev g++ patch ca-certificates \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /var/cache/ldconfig/aux-cache /var/log/apt /var/log/dpkg.log \
    /var/log/alternatives.log

ENV VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:/usr/local/cuda/bin:$PATH \
    CUDA_HOME=/usr/local/cuda \
    FLASHINFER_CUDA_VERSION=${CUDA_MAJOR_MINOR} \
    GLM5_HOME=/opt/glm5 \
    GLM5_STATE_DIR=/run/glm5 \
    HOME=/home/glm5 \
    XDG_CACHE_HOME=/cache \
    HF_HOME=/cache/huggingface \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_CERT=/etc/ssl/certs/ca-certificates.crt \
    PIP_NO_CACHE_DIR=1

# The whole Python stack from hashes (image/relock regenerates the lock), then the ARG pins asserted.
# common/ first: every tool of the kit reports through it, the build's checks too.
COPY common/ /opt/glm5/common/
COPY image/ /opt/glm5/image/
RUN python3 -m venv "$VIRTUAL_ENV" \
 && pip install --no-deps --require-hashes -r /opt/glm5/image/requirements.lock \
 && /opt/glm5/image/assert-versions "sglang==${SGLANG_VERSION}" "torch==${TORCH_VERSION}" \
      "flashinfer-python==${FLASHINFER_VERSION}" "supervisor==${SUPERVISOR_VERSION}" "smg==${SMG_VERSION}"

# Patch FlashInfer and SGLang (patches/series) and prove it took effect in this image: fails the build on drift.
COPY patches/ /opt/glm5/patches/
RUN /opt/glm5/patches/apply \
 && /opt/glm5/patches/verify \
 && cp "$(python3 -c 'import flashinfer, pathlib; print(pathlib.Path(flashinfer.__file__).parent)')/GLM5_SERVE_PATCHES.json" /opt/glm5/PATCHES-APPLIED.json

# Kernels: the FlashInfer modules the baked flags request on SM120 (kernels/sm120.toml), compiled with the base's
# nvcc into FlashInfer's prebuilt folder, which its runtime reads before any JIT cache: a first start compiles none of
# them. Their scratch build is removed in this step; the run-time JIT cache on the /cache volume is not touched.
# GLM5_KERNELS=none for a quick build (they then compile at first start), or a comma-separated part of the list.
# MAX_JOBS caps parallel nvcc jobs; by default as many as the cores and memory allow (kernels/README.md: memory per job).
# ci/render: GLM5_KERNELS={kernels}
ARG GLM5_KERNELS=all
ARG MAX_JOBS=
COPY kernels/ /opt/glm5/kernels/
RUN /opt/glm5/kernels/build \
 && /opt/glm5/kernels/verify \
 && cp "$(python3 -c 'import flashinfer, pathlib; print(pathlib.Path(flashinfer.__file__).parent)')/data/aot/GLM5_SERVE_KERNELS.json" /opt/glm5/KERNELS-PREBUILT.json

COPY configuration/ /opt/glm5/configuration/
COPY entrypoint/ /opt/glm5/entrypoint/
COPY healthcheck/ /opt/glm5/healthcheck/
COPY gateway/ /opt/glm5/gateway/
COPY monitoring/ /opt/glm5/monitoring/
COPY verify/ /opt/glm5/verify/
# The build's identity keys the JIT caches on the volume (/cache/build-ID/, entrypoint/glm5.toml [[env]]):
# what compiled kernels depend on (the base, its CUDA, the Python stack, the patches). Another build never loads them.
ARG BASE_IMAGE
RUN { printf '%s\n' "${BASE_IMAGE}" "${CUDA_MAJOR_MINOR}"; cat /opt/glm5/image/requirements.lock /opt/glm5/patches/series /opt/glm5/patches/*.patch; } \
      | sha256sum | cut -c1-16 > /opt/glm5/BUILD-ID
# Bytecode now: the image never writes it (PYTHONDONTWRITEBYTECODE), and every probe imports these modules.
RUN python3 -m compileall -q /opt/glm5/common /opt/glm5/configuration /opt/glm5/entrypoint /opt/glm5/healthcheck /opt/glm5/monitoring/exporter.py /opt/glm5/verify /opt/glm5/patches /opt/glm5/image /opt/glm5/kernels

# Non-root: SGLang needs no root; the GPUs come through the NVIDIA runtime's device files.
RUN if id -u ubuntu >/dev/null 2>&1; then userdel --remove ubuntu; fi \
 && useradd --uid "${GLM5_UID}" --gid 0 --create-home --home-dir /home/glm5 glm5 \
 && mkdir -p /cache /models/GLM-5-NVFP4 /var/log/glm5 /run/glm5 \
 && chown -R "${GLM5_UID}:0" /cache /var/log/glm5 /run/glm5 /home/glm5 \
 && chmod -R g+rwX /cache /var/log/glm5 /run/glm5 /home/glm5
USER ${GLM5_UID}
WORKDIR /home/glm5

# ci/render: {port} {exporter_port}
EXPOSE 30000 30090
VOLUME ["/cache"]
# A GLM-5 start: ~410 GB of weights plus capture of 58 prefill and 52 decode graphs (times: the README's
# Figures). startup_budget_seconds of grace before failed probes count; probes before that only
# report (compose adds start_interval; the option is left out here for builders older than Docker 25).
# ci/render: --interval={probe_interval_seconds}s --timeout={probe_command_timeout_seconds}s --start-period={startup_budget_seconds}s --retries={probe_retries} \
HEALTHCHECK --interval=30s --timeout=30s --start-period=2400s --retries=3 \
  CMD ["/opt/glm5/healthcheck/healthcheck", "--status"]
# SIGTERM drains in-flight requests for at most GLM5_DRAIN_SECONDS (supervisord then kills the server's process
# group): `docker stop` gets that plus margin (compose's stop_grace_period).
STOPSIGNAL SIGTERM
ENTRYPOINT ["/opt/glm5/entrypoint/entrypoint.sh"]
CMD ["serve"]
