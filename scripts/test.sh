#!/usr/bin/env bash
# Sets up, builds and runs the whole test suite: once in an optimised build and once under AddressSanitizer +
# UndefinedBehaviorSanitizer, then (for "all") bounded fuzzing with scripts/fuzz.sh. Usage: scripts/test.sh [release|sanitize|all] (default all).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
# The server suites drive `kestrel serve` with the official openai client, from an idempotent venv.
OPENAI_VERSION=2.54.0
venv=.venv-test
if [ "$("$venv/bin/python" -c 'import openai; print(openai.__version__)' 2>/dev/null)" != "$OPENAI_VERSION" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q "openai==$OPENAI_VERSION"
fi
export KESTREL_TEST_PYTHON="$PWD/$venv/bin/python"
kinds=("${1:-all}")
[ "${kinds[0]}" = all ] && kinds=(release sanitize)
for kind in "${kinds[@]}"; do
  scripts/build.sh "$kind"
  dir=build; [ "$kind" = sanitize ] && dir=build-sanitize
  echo "== tests ($kind) =="
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir "$dir" --output-on-failure -j "$(nproc)"
done
# Bounded fuzzing of the parsers that take untrusted input (tokenizer, templates), when targets exist.
if [ "${1:-all}" = all ] && compgen -G "tests/fuzz/*_fuzz.cpp" > /dev/null; then
  scripts/fuzz.sh "${KESTREL_FUZZ_SECONDS:-60}"
fi
