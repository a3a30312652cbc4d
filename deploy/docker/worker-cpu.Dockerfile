# CPU worker: the wheel with ONNX Runtime (CPU); the sample model ships in the wheel.
#   docker build -f deploy/docker/worker-cpu.Dockerfile -t framerelay/worker:0.1.0-cpu .
# Runs as uid 65534 on a read-only root: it writes nothing but /tmp (tmpfs).
# Tunnel keys come as a secret file (FRAMERELAY_WORKER_TUNNEL_KEYS_FILE), TLS as files
# or PEM env (FRAMERELAY_WORKER_TLS_CERT / _TLS_KEY); another model: mount it and pass
# `worker --model FILE` (the default providers, auto, find only the CPU here).
FROM python:3.11-slim-bookworm AS wheel
WORKDIR /src
COPY . .
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM python:3.11-slim-bookworm
COPY --from=wheel /wheels /wheels
RUN pip install --no-cache-dir "$(echo /wheels/framerelay-*.whl)[cpu]" && rm -rf /wheels

ENV PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 \
    FRAMERELAY_WORKER_HOST=0.0.0.0 \
    FRAMERELAY_WORKER_PORT=8443
WORKDIR /opt/framerelay
EXPOSE 8443
USER 65534:65534
# https first (with or without TLS on), then http; /readyz turns ready after the warm-up.
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=3 \
    CMD python -m framerelay.healthcheck "${FRAMERELAY_WORKER_PORT:-8443}" /readyz
ENTRYPOINT ["framerelay"]
CMD ["worker"]
