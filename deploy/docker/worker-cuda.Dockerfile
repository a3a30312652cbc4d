# GPU worker image: CUDA runtime + cuDNN, onnxruntime-gpu, the model baked in.
# The worker warms the model up before it listens (/readyz turns ready after it).
#   docker build -f deploy/docker/worker.Dockerfile -t framerelay/worker .
FROM nvidia/cuda:12.4.1-cudnn-runtime-ubuntu22.04

ENV DEBIAN_FRONTEND=noninteractive PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3.11 python3.11-venv curl \
    && rm -rf /var/lib/apt/lists/* \
    && python3.11 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH

WORKDIR /opt/framerelay
COPY pyproject.toml README.md ./
COPY framerelay ./framerelay
COPY gpu_worker ./gpu_worker
COPY tracker ./tracker
COPY ingest ./ingest
COPY deploy ./deploy
RUN pip install ".[gpu]"
COPY samples/models/yolox_nano_416.onnx /opt/framerelay/models/model.onnx

ENV FRAMERELAY_WORKER_HOST=0.0.0.0 \
    FRAMERELAY_WORKER_PORT=8443 \
    FRAMERELAY_WORKER_DETECTOR__MODEL=/opt/framerelay/models/model.onnx \
    FRAMERELAY_WORKER_DETECTOR__PROVIDERS=auto
EXPOSE 8443
USER 65534
# Liveness only (no token, nothing secret): http, or https when the worker has a certificate.
HEALTHCHECK --interval=10s --timeout=3s --start-period=120s \
    CMD curl -fsS http://127.0.0.1:8443/readyz || curl -fsSk https://127.0.0.1:8443/readyz || exit 1
ENTRYPOINT ["framerelay"]
CMD ["worker"]
