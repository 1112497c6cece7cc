#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz/*_fuzz.cpp) with clang, ASan and UBSan, and runs each for a bounded time
# from its seed corpus (tests/fuzz/corpus/<target>/). Usage: scripts/fuzz.sh [seconds per target, default 60].
# Exits non-zero on the first crash, leak or sanitizer report; the reproducer is left in build-fuzz/artifacts/.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-60}"
cmake -S . -B build-fuzz -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKESTREL_CUDA=OFF \
      -DKESTREL_FUZZ=ON -DKESTREL_BUILD_TESTS=OFF > /dev/null
cmake --build build-fuzz -j "$(nproc)"
mkdir -p build-fuzz/artifacts
shopt -s nullglob
for source in tests/fuzz/*_fuzz.cpp; do
  target="$(basename "$source" .cpp)"
  corpus="tests/fuzz/corpus/${target%_fuzz}"
  work="build-fuzz/corpus/${target%_fuzz}"
  mkdir -p "$work"
  echo "== fuzz $target for ${seconds}s =="
  "build-fuzz/$target" -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=10 \
    -artifact_prefix=build-fuzz/artifacts/ -print_final_stats=1 "$work" "$corpus" 2>&1 | tail -n 12
done
