# CUDA worker: ONNX Runtime GPU with the TensorRT and CUDA providers, TensorRT's runtime
# libraries from PyPI (tensorrt-cu12-libs), the sample model baked in (package data of
# the wheel); TensorRT engines are cached on a volume, so only the first start of a
# model on a GPU type pays the engine build (minutes).
#   docker build -f deploy/docker/worker-cuda.Dockerfile -t framerelay/worker:0.1.0 .
#   docker run --gpus all -v framerelay-trt:/var/cache/framerelay/trt framerelay/worker:0.1.0
# A host or pod of N GPUs runs one worker per GPU (ids <id>-gpu<i>, ports 8443 + i):
#   docker run --gpus all ... framerelay/worker:0.1.0 worker --gpus all
# (the orchestrator's multi-GPU pods start `worker --gpus N`: docs/runpod.md).
# Runs as uid 65534 on a read-only root: writable only the engine cache and /tmp.
# Providers: auto (TensorRT, then CUDA, then CPU; `worker --providers cuda` to pin one).
FROM python:3.11-slim-bookworm AS wheel
WORKDIR /src
COPY . .
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

# CUDA 12 runtime + cuDNN 9; Ubuntu 24.04's Python 3.12. CUDA 12 runs on drivers from
# R525 on (minor-version compatibility); CUDA 13 would need R580+, which rented hosts
# often lack. onnxruntime-gpu from PyPI is built for CUDA 12 up to 1.26 and for CUDA 13
# from 1.27 (libcublas.so.13, libcudart.so.13): 1.27+ here would load no CUDA provider.
# Bump ORT_VERSION past 1.26 only together with this base image (CUDA 13), the TensorRT
# libraries (tensorrt-cu13-libs) and the gpu-cu13 extra.
FROM nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04
# onnxruntime-gpu links TensorRT 10 (libnvinfer.so.10): keep the TensorRT major that the
# pinned ONNX Runtime names in its TensorRT provider's requirements when bumping either.
ARG ORT_VERSION=1.26.0
ARG TENSORRT_SPEC="tensorrt-cu12-libs>=10.9,<11"
ENV DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
COPY --from=wheel /wheels /wheels
RUN pip install --no-cache-dir "$(echo /wheels/framerelay-*.whl)[gpu]" \
        "onnxruntime-gpu==${ORT_VERSION}" "${TENSORRT_SPEC}" \
    && rm -rf /wheels \
    && ln -s "$(python -c 'import tensorrt_libs, os; print(os.path.dirname(tensorrt_libs.__file__))')" \
        /opt/tensorrt_libs \
    && mkdir -p /var/cache/framerelay/trt && chown 65534:65534 /var/cache/framerelay/trt

# The TensorRT engine and timing caches live in the volume (the worker passes them to
# ONNX Runtime as provider options, with FP16 and a batch profile; ONNX Runtime's own
# ORT_TENSORRT_* variables are ignored when options are given).
ENV PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 \
    LD_LIBRARY_PATH=/opt/tensorrt_libs \
    FRAMERELAY_WORKER_DETECTOR__ENGINE_CACHE_DIR=/var/cache/framerelay/trt \
    FRAMERELAY_WORKER_HOST=0.0.0.0 \
    FRAMERELAY_WORKER_PORT=8443
VOLUME ["/var/cache/framerelay/trt"]
WORKDIR /opt/framerelay
EXPOSE 8443
USER 65534:65534
# https first (with or without TLS on), then http. The first TensorRT engine build can
# take minutes: a long start period; /readyz turns ready after the warm-up.
HEALTHCHECK --interval=10s --timeout=5s --start-period=600s --retries=3 \
    CMD python -m framerelay.healthcheck "${FRAMERELAY_WORKER_PORT:-8443}" /readyz
ENTRYPOINT ["framerelay"]
CMD ["worker"]
