#!/usr/bin/env bash
# Sets up, builds and runs Kestrel on the bundled tiny checkpoint: a greedy continuation of a token prompt.
# (Random weights: the continuation is arbitrary but deterministic. Text prompts arrive with the tokenizer.)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh release
exec build/kestrel run --model tests/data/golden/f32_hc4_kp4_shared_vision --tokens 1,2,3,4,5 --max-tokens 16 "$@"
