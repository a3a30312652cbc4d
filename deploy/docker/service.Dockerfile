# CPU image for the ingest and the orchestrator (same code, different command):
#   docker build -f deploy/docker/service.Dockerfile -t framerelay/service .
#   docker run framerelay/service ingest ...     |   docker run framerelay/service orchestrator
FROM python:3.11-slim

ENV PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1
WORKDIR /opt/framerelay
COPY pyproject.toml README.md ./
COPY framerelay ./framerelay
COPY gpu_worker ./gpu_worker
COPY tracker ./tracker
COPY ingest ./ingest
COPY deploy ./deploy
COPY samples/mot15/TUD-Stadtmitte/frame-000001.jpg ./samples/mot15/TUD-Stadtmitte/
RUN pip install ".[cpu]" \
    && mkdir -p /var/lib/framerelay/ca /var/lib/framerelay/worker-tls \
    && chown -R 65534:65534 /var/lib/framerelay && chmod 700 /var/lib/framerelay/ca

# The pod CA (ca.pem, ca.key) lives in a volume mounted here; keys come as secret files
# (FRAMERELAY_SIGNING_KEYS_FILE), never as image layers or build args.
ENV FRAMERELAY_INGEST_API_HOST=0.0.0.0 FRAMERELAY_ORCH_HOST=0.0.0.0 \
    FRAMERELAY_ORCH_CA_DIR=/var/lib/framerelay/ca
EXPOSE 8080 8090
USER 65534
ENTRYPOINT ["framerelay"]
CMD ["orchestrator"]
