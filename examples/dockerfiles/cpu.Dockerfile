# syntax=docker/dockerfile:1
# heteroflow for CPU nodes (preprocess, plan, evaluate, CPU training): the image examples/profiles/*.yaml name as
# images.cpu. Build from the repository root (BuildKit reads cpu.Dockerfile.dockerignore beside this file):
#   docker build -f examples/dockerfiles/cpu.Dockerfile -t registry.example.com/heteroflow:cpu .
# image: registry.example.com/heteroflow:cpu
ARG PYTHON_IMAGE=python:3.11-slim-bookworm
FROM ${PYTHON_IMAGE}

# The CPU build of PyTorch (no CUDA libraries: a ~200 MB wheel instead of ~2.5 GB); the version the project pins.
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ENV PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1 HETEROFLOW_HOME=/var/lib/heteroflow
RUN pip install --index-url "${TORCH_INDEX}" "torch==${TORCH_VERSION}"

# heteroflow with every engine (KFP, Airflow's KubernetesPodOperator pods run `heteroflow step NAME`).
COPY . /src
RUN pip install "/src[kfp,airflow,alluxio,s3]" && rm -rf /src \
 && heteroflow --help > /dev/null \
 && python -c "import torch, heteroflow.components.distributed as d; print(torch.__version__, d.backend_for('cpu'))"

RUN useradd --uid 1000 --create-home heteroflow && mkdir -p /var/lib/heteroflow && chown heteroflow /var/lib/heteroflow
USER 1000
ENTRYPOINT ["heteroflow"]
