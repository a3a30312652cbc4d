# The two commands a newcomer needs (see README):
#   make demo    run the whole pipeline on the sample clip (no Redis, no GPU)
#   make test    install what the tests need, then lint, type-check and test
.PHONY: demo test
demo:
	@scripts/bootstrap.sh
	@.venv/bin/framerelay demo $(ARGS)

test:
	@scripts/test.sh $(ARGS)
