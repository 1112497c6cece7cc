#!/usr/bin/env bash
# Sets up, builds and runs the whole test suite: once in an optimised build and once under AddressSanitizer +
# UndefinedBehaviorSanitizer. Usage: scripts/test.sh [release|sanitize|all] (default all).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
kinds=("${1:-all}")
[ "${kinds[0]}" = all ] && kinds=(release sanitize)
for kind in "${kinds[@]}"; do
  scripts/build.sh "$kind"
  dir=build; [ "$kind" = sanitize ] && dir=build-sanitize
  echo "== tests ($kind) =="
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir "$dir" --output-on-failure -j "$(nproc)"
done
