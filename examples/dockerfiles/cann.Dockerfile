# syntax=docker/dockerfile:1
# heteroflow for Huawei Ascend NPU nodes: the image examples/profiles/ascend-*.yaml name as images.npu. The base is
# Ascend's CANN image (toolkit and kernels, Python 3.11); torch_npu must match both torch and CANN: see the version
# table in https://github.com/Ascend/pytorch (README "Ascend Auxiliary Software"). The node's driver
# (/usr/local/Ascend/driver) and devices (/dev/davinci*) are mounted by the Ascend device plugin / Ascend Docker
# runtime. Build from the repository root:
#   docker build -f examples/dockerfiles/cann.Dockerfile -t registry.example.com/heteroflow:cann8 .
# image: registry.example.com/heteroflow:cann8
ARG CANN_IMAGE=quay.io/ascend/cann:8.3.rc2-910b-ubuntu22.04-py3.11
FROM ${CANN_IMAGE}

# torch 2.6.0 + torch_npu 2.6.0.post3 run on CANN 8.3 (pairing from the torch_npu release notes; check the table
# above before changing one of the three). torch_npu registers the "npu" device and the "hccl" backend.
ARG TORCH_VERSION=2.6.0
ARG TORCH_NPU_VERSION=2.6.0.post3
ENV PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1 HETEROFLOW_HOME=/var/lib/heteroflow
USER root
RUN pip install --index-url https://download.pytorch.org/whl/cpu "torch==${TORCH_VERSION}" \
 && pip install "torch_npu==${TORCH_NPU_VERSION}" pyyaml decorator attrs psutil

COPY . /src
RUN pip install "/src[kfp,airflow,alluxio,s3]" "torch==${TORCH_VERSION}" && rm -rf /src \
 && heteroflow --help > /dev/null \
 && python -c "import heteroflow.components.distributed as d; print(d.backend_for('npu'))"

# CANN's environment (ASCEND_TOOLKIT_HOME, LD_LIBRARY_PATH, ...) comes from set_env.sh, sourced for every command.
RUN printf '#!/bin/bash\nsource /usr/local/Ascend/ascend-toolkit/set_env.sh\nexec heteroflow "$@"\n' > /usr/local/bin/heteroflow-npu \
 && chmod +x /usr/local/bin/heteroflow-npu
ENTRYPOINT ["/usr/local/bin/heteroflow-npu"]
