# Services image: the ingest, the orchestrator and the recorder (same wheel, one command
# each), with ONNX Runtime (CPU) for the orchestrator's local provider (workers as child
# processes). No kubectl: the Kubernetes provider talks to the API server itself (lightkube).
#   docker build -f deploy/docker/service.Dockerfile -t framerelay/service:0.1.0 .
#   docker run framerelay/service:0.1.0 ingest ... | orchestrator | record ...
# Runs as uid 65534 on a read-only root: writable only /var/lib/framerelay (its working
# directory and a volume: the ingest's stream store, recordings, the pod CA) and /tmp.
# Keys come as secret files (FRAMERELAY_SIGNING_KEYS_FILE), never as layers or build args.
FROM python:3.11-slim-bookworm AS wheel
WORKDIR /src
COPY . .
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM python:3.11-slim-bookworm
COPY --from=wheel /wheels /wheels
RUN pip install --no-cache-dir "$(echo /wheels/framerelay-*.whl)[cpu]" && rm -rf /wheels \
    && mkdir -p /var/lib/framerelay/ca /var/lib/framerelay/worker-tls \
        /var/lib/framerelay/ingest /var/lib/framerelay/recordings \
    && chown -R 65534:65534 /var/lib/framerelay && chmod 0700 /var/lib/framerelay/ca

ENV PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 \
    FRAMERELAY_INGEST_API_HOST=0.0.0.0 \
    FRAMERELAY_INGEST_STORE_PATH=/var/lib/framerelay/ingest/streams.json \
    FRAMERELAY_ORCH_HOST=0.0.0.0 \
    FRAMERELAY_ORCH_CA_DIR=/var/lib/framerelay/ca \
    FRAMERELAY_RECORD_OUT_DIR=/var/lib/framerelay/recordings
VOLUME ["/var/lib/framerelay"]
WORKDIR /var/lib/framerelay
EXPOSE 8080 8090
USER 65534:65534
# The orchestrator's port, else the ingest's (compose and the manifests name one each;
# the recorder serves no HTTP). https first, then http.
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=3 \
    CMD python -m framerelay.healthcheck "${FRAMERELAY_ORCH_PORT:-8090}" /healthz \
        || python -m framerelay.healthcheck "${FRAMERELAY_INGEST_API_PORT:-8080}" /healthz
ENTRYPOINT ["framerelay"]
CMD ["orchestrator"]
