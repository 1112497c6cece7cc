#!/usr/bin/env bash
# Sets up, builds and serves the embedded default model (models/glm5-nano) with the OpenAI API on :8888.
# Usage: scripts/serve-default.sh [extra `kestrel serve` flags, e.g. --port 9000 --api-key KEY]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh release
exec build/kestrel serve --model models/glm5-nano --served-model-name glm5-nano --port 8888 --max-model-len 4096 \
  --tool-call-parser glm47 --reasoning-parser glm45 --enable-auto-tool-choice "$@"
