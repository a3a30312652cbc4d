# The two commands a newcomer needs (see README):
#   make demo    run the whole pipeline on the sample clip (no Redis, no GPU)
#   make test    install what the tests need, then lint, type-check and test
# And for operators:
#   make images  build the container images (deploy/docker/*.Dockerfile) with Docker.
#                Needs a registry to pull the base images (python:3.11-slim-bookworm,
#                nvidia/cuda) and PyPI: not possible on machines without one (the
#                project's CI and dev machines); there tests/packaging/test_containers.py
#                runs each image's commands against the wheel instead.
.PHONY: demo test images
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
DOCKER ?= docker

demo:
	@scripts/bootstrap.sh
	@.venv/bin/framerelay demo $(ARGS)

test:
	@scripts/test.sh $(ARGS)

images:
	$(DOCKER) build -f deploy/docker/worker-cuda.Dockerfile -t framerelay/worker:$(VERSION) .
	$(DOCKER) build -f deploy/docker/worker-cpu.Dockerfile -t framerelay/worker:$(VERSION)-cpu .
	$(DOCKER) build -f deploy/docker/service.Dockerfile -t framerelay/service:$(VERSION) .
