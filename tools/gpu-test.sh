#!/usr/bin/env bash
# GPU test run, on a machine with an NVIDIA GPU: the CUDA test suite, the same suite under compute-sanitizer memcheck,
# the CUDA linear benchmark, the embedded model decoding, a GPU memory leak check over 1,000 served requests, and the
# whole forward at GLM-5.3-Flash's dimensions (4 layers: decode at 1k and 128k context, prefill of 2k, 8k and 32k
# tokens, and what launching costs a one-stream decode step), then a summary. The figures in
# docs/benchmarks/cuda_linear.md and cuda_forward.md come from it.
#
#   usage: tools/gpu-test.sh [build-dir] [--quick]     (default build dir: build; --quick: tests and memcheck only)
#
# The CUDA targets are built first unless the build dir already holds them (binaries built elsewhere can be run this
# way: they link the CUDA runtime statically and need only the driver, plus libfmt, libpcre2-8 and libutf8proc on
# LD_LIBRARY_PATH; cuBLASLt, for prefill-sized linears, is opened at run time from the loader's path or
# /usr/local/cuda/lib64). The real-dimension checkpoint (8.2 GB of random weights) is written to $KESTREL_SYNTHETIC
# (default /dev/shm/kestrel_synthetic) unless it is there already.
set -uo pipefail
cd "$(dirname "$0")/.."
dir=build quick=0
for arg in "$@"; do
  case "$arg" in
    --quick) quick=1 ;;
    *) dir="$arg" ;;
  esac
done
tests="$dir/tests/kestrel_cuda_tests" bench="$dir/kestrel_cuda_bench" kestrel="$dir/kestrel"
step_bench="$dir/kestrel_cuda_decode_step_bench"
[ -x "$tests" ] || tests="$dir/kestrel_cuda_tests"  # a flat folder of carried binaries
if [ ! -x "$tests" ] || [ ! -x "$bench" ] || [ ! -x "$kestrel" ] || [ ! -x "$step_bench" ]; then
  scripts/build.sh release kestrel kestrel_cuda_tests kestrel_cuda_bench kestrel_cuda_decode_step_bench || exit 1
  tests=build/tests/kestrel_cuda_tests bench=build/kestrel_cuda_bench kestrel=build/kestrel
  step_bench=build/kestrel_cuda_decode_step_bench
fi
export KESTREL_TEST_DATA="${KESTREL_TEST_DATA:-$PWD/tests/data}"  # the golden fixtures, wherever the binary was built
sanitizer="$(command -v compute-sanitizer || echo "${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer")"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || exit 1
verdict() { [ "$1" -eq 0 ] && echo pass || echo "FAIL (exit $1)"; }

echo "== CUDA tests =="
"$tests" --gtest_brief=1; tests_rc=$?
echo "== CUDA tests under compute-sanitizer memcheck =="
"$sanitizer" --tool memcheck --leak-check full --error-exitcode 3 "$tests" --gtest_brief=1; memcheck_rc=$?
if [ "$quick" -eq 1 ]; then
  echo "== summary =="
  echo "tests:          $(verdict $tests_rc)"
  echo "memcheck:       $(verdict $memcheck_rc)"
  [ $tests_rc -eq 0 ] && [ $memcheck_rc -eq 0 ]
  exit
fi

echo "== CUDA linear benchmark =="
"$bench" "${KESTREL_BENCH_ITERATIONS:-200}"; bench_rc=$?

echo "== embedded model, one stream =="
"$kestrel" run --device cuda --model models/glm5-nano -p "count from 1 to 200" -n 800 > /dev/null; run_rc=$?

echo "== GPU memory over 1000 served requests =="
port=8899 log="$(mktemp)"
"$kestrel" serve --device cuda --model models/glm5-nano --port $port > "$log" 2>&1 &
server=$!
for _ in $(seq 1 120); do grep -q ready "$log" && break; sleep 1; done
timeout 300 python3 tools/serve_leak_check.py --url "http://127.0.0.1:$port" --requests 1000 --concurrency 16 \
  --max-tokens 16; leak_rc=$?
kill "$server"; wait "$server"
rm -f "$log"

echo "== whole forward at the real dimensions (4 layers) =="
synthetic="${KESTREL_SYNTHETIC:-/dev/shm/kestrel_synthetic}"
[ -f "$synthetic/config.json" ] || python3 tools/make_synthetic_glm5.py --out "$synthetic" --layers 4 > /dev/null
"$kestrel" bench --device cuda --model "$synthetic" --contexts 1024 --sequences 1,4,16,64 --profile; forward_rc=$?
for draw in greedy sample; do  # the step as the engine ends it: tokens drawn on the GPU and fed back
  "$kestrel" bench --device cuda --model "$synthetic" --contexts 1024 --sequences 1,4,16,64 --draw $draw || forward_rc=1
done
"$kestrel" bench --device cuda --model "$synthetic" --contexts 131072 --sequences 1 --steps 32; long_rc=$?
prefill_rc=0
for dtype in float32 bfloat16; do  # the bf16 matrices' inputs exact, then rounded (vLLM's bf16 activations)
  "$kestrel" bench --device cuda --model "$synthetic" --dtype $dtype --prefill-lengths 2048,8192,32768 \
    --prefill-chunk 8192 --contexts 1024 --sequences 1 --steps 4 --profile || prefill_rc=1
done
"$step_bench" "$synthetic" 64; step_rc=$?
trace="$(dirname "$step_bench")/kestrel_cuda_kernel_trace"
if [ -x "$trace" ]; then  # a one-stream step's kernels as they ran (CUPTI records); a diagnostic, not in the summary
  trace_csv="$(mktemp)"
  "$trace" "$synthetic" 4 > "$trace_csv" && python3 tools/kernel_trace_table.py "$trace_csv"
  rm -f "$trace_csv"
fi

echo "== summary =="
echo "tests:          $(verdict $tests_rc)"
echo "memcheck:       $(verdict $memcheck_rc)"
echo "linear bench:   $(verdict $bench_rc)"
echo "nano decode:    $(verdict $run_rc)"
echo "leak check:     $(verdict $leak_rc)"
echo "forward 1k:     $(verdict $forward_rc)"
echo "forward 128k:   $(verdict $long_rc)"
echo "prefill:        $(verdict $prefill_rc)"
echo "step launches:  $(verdict $step_rc)"
for rc in $tests_rc $memcheck_rc $bench_rc $run_rc $leak_rc $forward_rc $long_rc $prefill_rc $step_rc; do [ "$rc" -eq 0 ] || exit 1; done
