# Quick start. `make run`: install the Debian packages, build, serve models/glm5-nano on :8888 (OpenAI API).
# `make test`: the whole suite (optimised build, then ASan + UBSan, then bounded fuzzing), as CI runs it.
.PHONY: run test build

run:
	scripts/serve-default.sh $(ARGS)

test:
	scripts/test.sh

build:
	scripts/install-deps.sh
	scripts/build.sh release
