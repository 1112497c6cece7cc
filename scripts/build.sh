#!/usr/bin/env bash
# Configures and builds Kestrel. Usage: scripts/build.sh [release|sanitize] [target...] (default: release, everything).
#   release  -> build/         optimised
#   sanitize -> build-sanitize/ AddressSanitizer + UndefinedBehaviorSanitizer, -O1 -g
set -euo pipefail
cd "$(dirname "$0")/.."
kind="${1:-release}"
case "$kind" in
  release) dir=build; flags=(-DCMAKE_BUILD_TYPE=Release) ;;
  sanitize) dir=build-sanitize; flags=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DKESTREL_SANITIZE=ON -DKESTREL_CUDA=OFF
                                      "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g") ;;
  *) echo "usage: $0 [release|sanitize]" >&2; exit 2 ;;
esac
# The server end-to-end suites run under this interpreter (scripts/test.sh sets it to its venv).
[ -n "${KESTREL_TEST_PYTHON:-}" ] && flags+=("-DKESTREL_TEST_PYTHON=$KESTREL_TEST_PYTHON")
cmake -S . -B "$dir" -G Ninja "${flags[@]}" > /dev/null
cmake --build "$dir" -j "$(nproc)" ${2:+--target "${@:2}"}
