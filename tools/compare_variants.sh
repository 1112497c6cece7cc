#!/usr/bin/env bash
# On the GPU machine, in the repository's root: compares the binary sets tools/build_variants.sh made (DIR/<name>/)
# in one call, the first named being the baseline. For each variant other than the baseline, the CUDA suite and
# compute-sanitizer memcheck over its attention, KDA and mHC tests; then one-stream and four-stream decode at 1k
# context and the 8k prefill profile, the variants alternated (baseline, each variant, twice over) so that drift on
# the machine shows; then the baseline's kernel trace of a decode step. Everything goes under OUT (default $OUT, the
# device tool's folder that comes back), at most 8 files; a summary of the figures is printed.
#
#   usage: tools/compare_variants.sh DIR BASELINE VARIANT...     e.g. tools/compare_variants.sh /tmp/v L T S
set -uo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 2 ] || { sed -n 2,9p "$0" >&2; exit 2; }
dir=$1 baseline=$2
shift 2
out=${OUT:-/tmp/compare_out}
mkdir -p "$out"
export LD_LIBRARY_PATH="$dir/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" KESTREL_TEST_DATA="$PWD/tests/data"
start=$SECONDS
stamp() { echo "[$((SECONDS - start)) s] $*"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
model=/dev/shm/kestrel_synthetic
[ -f "$model/config.json" ] || python3 tools/make_synthetic_glm5.py --out "$model" --layers 4 > "$out/synth.log" 2>&1 &

for variant in "$@"; do
  echo "== $variant" >> "$out/tests.log"
  timeout 200 "$dir/$variant/kestrel_cuda_tests" --gtest_brief=1 >> "$out/tests.log" 2>&1
  stamp "tests $variant rc $?"
  timeout 200 compute-sanitizer --tool memcheck --error-exitcode 3 "$dir/$variant/kestrel_cuda_tests" --gtest_brief=1 \
    --gtest_filter='CudaDsa*:CudaKda*:CudaMhc*' >> "$out/memcheck.log" 2>&1
  stamp "memcheck $variant rc $?"
done
grep -E "^==|PASSED|FAILED|Failure|ERROR SUMMARY" "$out/tests.log" "$out/memcheck.log" | head -40
wait
stamp "synthetic model"

decode=(bench --device cuda --model "$model" --dtype bfloat16 --contexts 1024 --sequences 1,4 --steps 64 --draw greedy)
prefill=(bench --device cuda --model "$model" --dtype bfloat16 --prefill-lengths 8192,8192 --prefill-chunk 8192
         --contexts 1024 --sequences 1 --steps 4 --profile)
for round in 1 2; do
  for variant in "$baseline" "$@"; do
    echo "== $variant round $round" >> "$out/decode.log"
    timeout 60 "$dir/$variant/kestrel" "${decode[@]}" >> "$out/decode.log" 2>&1
    echo "== $variant round $round" >> "$out/prefill.log"
    timeout 90 "$dir/$variant/kestrel" "${prefill[@]}" >> "$out/prefill.log" 2>&1
    stamp "decode and prefill $variant round $round"
  done
done
timeout 60 "$dir/$baseline/kestrel_cuda_kernel_trace" "$model" 4 > "$out/trace.csv" 2> /dev/null &&
  python3 tools/kernel_trace_table.py "$out/trace.csv" > "$out/trace_table.txt" 2>&1
stamp "trace"

echo "== summary"
grep -E "^==|decode, [14] sequences|prefill of 8192" "$out/decode.log" "$out/prefill.log"
grep -hE "^==|mla attention|kda recurrence|routed experts" "$out/prefill.log" | head -60
