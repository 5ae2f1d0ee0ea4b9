# syntax=docker/dockerfile:1
# heteroflow for NVIDIA GPU nodes: the image examples/profiles/nvidia-gfd.yaml names as images.gpu. The PyTorch CUDA
# wheels carry the CUDA runtime, cuDNN and NCCL; the node's driver (libcuda) is mounted by the NVIDIA container
# toolkit, so the base stays a plain Python image. Build from the repository root:
#   docker build -f examples/dockerfiles/cuda.Dockerfile -t registry.example.com/heteroflow:cuda12 .
# image: registry.example.com/heteroflow:cuda12
ARG PYTHON_IMAGE=python:3.11-slim-bookworm
FROM ${PYTHON_IMAGE}

# Pick the CUDA wheel index your driver supports (https://pytorch.org/get-started/locally/: cu126, cu128, ...).
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX=https://download.pytorch.org/whl/cu128
ENV PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1 HETEROFLOW_HOME=/var/lib/heteroflow \
    NVIDIA_VISIBLE_DEVICES=all NVIDIA_DRIVER_CAPABILITIES=compute,utility
RUN pip install --index-url "${TORCH_INDEX}" "torch==${TORCH_VERSION}"

COPY . /src
RUN pip install "/src[kfp,airflow,alluxio,s3]" && rm -rf /src \
 && heteroflow --help > /dev/null \
 && python -c "import torch, heteroflow.components.distributed as d; assert torch.version.cuda, 'not a CUDA build'; print(torch.__version__, torch.version.cuda, d.backend_for('cuda'))"

RUN useradd --uid 1000 --create-home heteroflow && mkdir -p /var/lib/heteroflow && chown heteroflow /var/lib/heteroflow
USER 1000
ENTRYPOINT ["heteroflow"]
