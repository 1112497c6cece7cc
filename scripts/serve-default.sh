#!/usr/bin/env bash
# Sets up, builds and serves the embedded default model (models/glm5-nano) with the OpenAI API on :8888.
# Usage: scripts/serve-default.sh [`kestrel serve` flags, e.g. --port 9000 --api-key KEY; they replace the defaults]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh release kestrel
defaults=(--model models/glm5-nano --served-model-name glm5-nano --port 8888 --max-model-len 4096
          --tool-call-parser glm47 --reasoning-parser glm45)
args=()
for ((i = 0; i < ${#defaults[@]}; i += 2)); do
  flag=${defaults[i]}
  given=0
  for a in "$@"; do [[ "$a" == "$flag" || "$a" == "$flag="* ]] && given=1; done
  [ "$given" = 1 ] || args+=("$flag" "${defaults[i + 1]}")
done
given=0
for a in "$@"; do [ "$a" = --enable-auto-tool-choice ] && given=1; done
[ "$given" = 1 ] || args+=(--enable-auto-tool-choice)
exec build/kestrel serve "${args[@]}" "$@"
