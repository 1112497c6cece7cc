#!/usr/bin/env bash
# Sets up, builds and serves the embedded default model (models/glm5-nano) with the OpenAI API on :8888.
# Usage: scripts/serve-default.sh [`kestrel serve` flags, e.g. --port 9000 --api-key KEY; they replace the defaults]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh release kestrel
given() {  # given FLAG ARGS...: whether the caller passed FLAG (as FLAG VALUE or FLAG=VALUE)
  local flag=$1 a
  shift
  for a in "$@"; do [[ "$a" == "$flag" || "$a" == "$flag="* ]] && return 0; done
  return 1
}
args=()
for pair in "--model models/glm5-nano" "--served-model-name glm5-nano" "--port 8888" "--max-model-len 4096" \
            "--tool-call-parser glm47" "--reasoning-parser glm45" "--enable-auto-tool-choice"; do
  read -r -a words <<< "$pair"
  given "${words[0]}" "$@" || args+=("${words[@]}")
done
exec build/kestrel serve "${args[@]}" "$@"
