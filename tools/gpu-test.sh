#!/usr/bin/env bash
# GPU test run, on a machine with an NVIDIA GPU: the CUDA test suite, the same suite under compute-sanitizer memcheck,
# and the CUDA linear benchmark, then a summary. Usage: tools/gpu-test.sh [build-dir] (default: build). The CUDA
# targets are built first unless the build dir already holds them (binaries built elsewhere can be run this way:
# they link the CUDA runtime statically and need only the driver).
set -uo pipefail
cd "$(dirname "$0")/.."
dir="${1:-build}"
tests="$dir/tests/kestrel_cuda_tests" bench="$dir/kestrel_cuda_bench"
if [ ! -x "$tests" ] || [ ! -x "$bench" ]; then
  scripts/build.sh release kestrel_cuda_tests kestrel_cuda_bench || exit 1
  tests=build/tests/kestrel_cuda_tests bench=build/kestrel_cuda_bench
fi
export KESTREL_TEST_DATA="${KESTREL_TEST_DATA:-$PWD/tests/data}"  # the golden fixtures, wherever the binary was built
sanitizer="$(command -v compute-sanitizer || echo "${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer")"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || exit 1

echo "== CUDA tests =="
"$tests" --gtest_brief=1; tests_rc=$?
echo "== CUDA tests under compute-sanitizer memcheck =="
"$sanitizer" --tool memcheck --leak-check full --error-exitcode 3 "$tests" --gtest_brief=1; memcheck_rc=$?
echo "== CUDA linear benchmark =="
"$bench" "${KESTREL_BENCH_ITERATIONS:-200}"; bench_rc=$?

verdict() { [ "$1" -eq 0 ] && echo pass || echo "FAIL (exit $1)"; }
echo "== summary =="
echo "tests:          $(verdict $tests_rc)"
echo "memcheck:       $(verdict $memcheck_rc)"
echo "benchmark:      $(verdict $bench_rc)"
[ $tests_rc -eq 0 ] && [ $memcheck_rc -eq 0 ] && [ $bench_rc -eq 0 ]
