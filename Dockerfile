# syntax=docker/dockerfile:1
#
# One image for every process of the appliance (web, inference, jobs, beat), in two builds:
#
#   docker build -t homelab-appliance .                                  # CPU llama.cpp
#   docker build -t homelab-appliance:cuda --build-arg LLAMA_CUDA=1 .    # NVIDIA GPUs (CUDA)
#
# Both builds use the same Python (3.11) in the same virtualenv path, /opt/venv: a model's path
# travels from the web process to the inference worker in each request, and the starter model
# lives inside site-packages, so the two images must agree on where site-packages is. That is
# why the CUDA build adds NVIDIA's Debian 12 packages to the Python image instead of starting
# from an nvidia/cuda (Ubuntu) image with another Python.

ARG LLAMA_CUDA=0
ARG PYTHON_IMAGE=python:3.11-slim-bookworm
ARG CUDA_PKG=12-6
ARG CUDA_HOME=/usr/local/cuda-12.6
ARG CUDA_KEYRING=https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/cuda-keyring_1.1-1_all.deb
# GPU generations to compile for; e.g. "89" (Ada) builds much faster than every major one.
ARG CUDA_ARCHITECTURES=all-major

# --- build: compile llama-cpp-python (CPU or CUDA) and install the appliance into /opt/venv -----

FROM ${PYTHON_IMAGE} AS build-0
RUN apt-get update \
    && apt-get install -y --no-install-recommends build-essential cmake git \
    && rm -rf /var/lib/apt/lists/*
ENV CMAKE_ARGS=""

FROM ${PYTHON_IMAGE} AS build-1
ARG CUDA_PKG
ARG CUDA_HOME
ARG CUDA_KEYRING
ARG CUDA_ARCHITECTURES
ADD ${CUDA_KEYRING} /tmp/cuda-keyring.deb
# nvcc, the CUDA runtime and cuBLAS headers, and the driver stub to link against: the real
# libcuda comes from the host's driver at run time (NVIDIA Container Toolkit).
RUN dpkg -i /tmp/cuda-keyring.deb \
    && apt-get update \
    && apt-get install -y --no-install-recommends build-essential cmake git \
        cuda-nvcc-${CUDA_PKG} cuda-cudart-dev-${CUDA_PKG} libcublas-dev-${CUDA_PKG} \
        cuda-driver-dev-${CUDA_PKG} \
    && rm -rf /var/lib/apt/lists/* /tmp/cuda-keyring.deb
ENV PATH=${CUDA_HOME}/bin:${PATH} \
    CUDA_HOME=${CUDA_HOME} \
    CMAKE_ARGS="-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCHITECTURES}"

FROM build-${LLAMA_CUDA} AS build
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:${PATH}
WORKDIR /src
COPY pyproject.toml ./
COPY appliance ./appliance
COPY inference ./inference
COPY dashboard ./dashboard
# llama-cpp-python is built from source here with CMAKE_ARGS; psycopg for the Postgres database
# that docker-compose.yml runs (SQLite is not safe across containers).
RUN --mount=type=cache,target=/root/.cache/pip \
    pip install --upgrade pip \
    && pip install . "psycopg[binary]>=3.2,<4"

# --- runtime images ------------------------------------------------------------------------------

FROM ${PYTHON_IMAGE} AS runtime-0
# llama.cpp's CPU backend uses OpenMP.
RUN apt-get update \
    && apt-get install -y --no-install-recommends libgomp1 \
    && rm -rf /var/lib/apt/lists/*

FROM ${PYTHON_IMAGE} AS runtime-1
ARG CUDA_PKG
ARG CUDA_HOME
ARG CUDA_KEYRING
ADD ${CUDA_KEYRING} /tmp/cuda-keyring.deb
RUN dpkg -i /tmp/cuda-keyring.deb \
    && apt-get update \
    && apt-get install -y --no-install-recommends libgomp1 \
        cuda-cudart-${CUDA_PKG} libcublas-${CUDA_PKG} \
    && rm -rf /var/lib/apt/lists/* /tmp/cuda-keyring.deb
ENV LD_LIBRARY_PATH=${CUDA_HOME}/lib64 \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility

FROM runtime-${LLAMA_CUDA} AS runtime
RUN useradd --system --create-home --home-dir /home/appliance appliance \
    && mkdir -p /data /models \
    && chown appliance:appliance /data /models
COPY --from=build /opt/venv /opt/venv
WORKDIR /app
COPY manage.py ./
COPY appliance ./appliance
COPY inference ./inference
COPY dashboard ./dashboard
COPY templates ./templates
COPY static ./static
# PYTHONPATH: Celery's workers import the project from /app too, as manage.py does.
ENV PATH=/opt/venv/bin:${PATH} \
    PYTHONPATH=/app \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    APPLIANCE_DATA_DIR=/data \
    MODELS_DIR=/models \
    HOST=0.0.0.0 \
    PORT=8000
USER appliance
EXPOSE 8000
# The web process; docker-compose.yml gives the workers their own commands.
CMD ["python", "manage.py", "serve"]
