#!/usr/bin/env bash
# The side-by-side of issue 6 in one command, on a CUDA machine with no network: exllamav3's EXL3 kernels and
# Kestrel's on identical weights, one dense EXL3 linear and one MoE layer's routed experts, µs per call at 1, 8 and
# 64 tokens (docs/benchmarks/cuda_linear.md). Phases, each printed with its time:
#   1. the weights, routings and inputs (tools/bench_exllamav3.py write, 3.8 GB in $KESTREL_EXL3_BENCH_DIR)
#   2. exllamav3's extension compile (tools/with_exllamav3.sh), bounded so that the run ends within
#      $KESTREL_EXL3_DEADLINE seconds; unfinished, it resumes when the same command runs again on the same machine
#   3. exllamav3's timings and outputs (bench_exllamav3.py time)
#   4. Kestrel's timings and outputs, compared with exllamav3's (kestrel_cuda_bench --exl3-file ... --compare)
#   5. both tables side by side (bench_exllamav3.py summary)
# A phase already done (the weights) is skipped on a rerun. Logs and outputs stay in the bench dir and are copied to
# $OUT when it is set. Exit status: 0 when everything ran and the outputs agree, 75 when the compile must be resumed
# (rerun the command), 1 otherwise.
#
#   usage: tools/run_exl3_bench.sh [WHEEL_DIR] [BIN_DIR]
#     WHEEL_DIR  exllamav3's wheel and its missing dependencies (default .whl)
#     BIN_DIR    kestrel_cuda_bench and the libraries it links (default .carry/cuda, unpacked from
#                .carry/cuda.tar.xz when only that is there; else build)
#   environment: KESTREL_EXL3_BENCH_DIR (/dev/shm/exl3_bench), KESTREL_BENCH_ITERATIONS (200),
#                KESTREL_EXL3_DEADLINE (560: keep it under the command time limit)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
t0=$SECONDS
wheels=${1:-.whl}
bin=${2:-}
if [[ -z $bin ]]; then
  if [[ ! -x .carry/cuda/kestrel_cuda_bench && -f .carry/cuda.tar.xz ]]; then tar xJf .carry/cuda.tar.xz -C .carry; fi
  if [[ -x .carry/cuda/kestrel_cuda_bench ]]; then bin=.carry/cuda; else bin=build; fi
fi
dir=${KESTREL_EXL3_BENCH_DIR:-/dev/shm/exl3_bench}
iterations=${KESTREL_BENCH_ITERATIONS:-200}
deadline=${KESTREL_EXL3_DEADLINE:-560}
reserve=120  # what phases 3-5 take after the compile, with margin (about 40 s, 20 s and 1 s expected)
weights=$dir/weights.safetensors theirs=$dir/exllamav3_outputs.safetensors
bin_path=$(cd "$bin" 2> /dev/null && pwd)
export LD_LIBRARY_PATH=$bin_path${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} PYTHONUNBUFFERED=1

phase_start=$SECONDS
begin() { phase_start=$SECONDS; printf '\n== %s ==\n' "$1"; }
took() { printf -- '-- %s: %s (%d s; %d s since the start)\n' "$1" "$2" $((SECONDS - phase_start)) $((SECONDS - t0)); }
verdict() { case $1 in 0) echo ok ;; skipped) echo skipped ;; *) echo "FAILED (exit $1)" ;; esac; }
finish() {
  echo; echo "== status =="
  printf '%-24s %s\n' "weights" "$(verdict "$weights_rc")" "exllamav3 compile" "$compile_status" \
    "exllamav3 timing" "$(verdict "$theirs_rc")" "Kestrel timing, compare" "$(verdict "$ours_rc")"
  echo "total: $((SECONDS - t0)) s"
  if [[ -n ${OUT:-} && -d ${OUT:-} ]]; then
    cp "$dir"/*.log "$theirs" "$OUT"/ 2> /dev/null
    cp "$dir/kestrel_outputs/model.safetensors" "$OUT/kestrel_outputs.safetensors" 2> /dev/null
  fi
  exit "$1"
}
weights_rc=skipped compile_status=skipped theirs_rc=skipped ours_rc=skipped

begin "checks"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader ||
  { echo "error: no GPU (nvidia-smi failed)"; finish 1; }
ls "$wheels"/exllamav3-*.whl > /dev/null 2>&1 || { echo "error: no exllamav3 wheel in $wheels"; finish 1; }
bench=$bin/kestrel_cuda_bench
[[ -x $bench ]] || { echo "error: no $bench (build it with scripts/build.sh release kestrel_cuda_bench)"; finish 1; }
# A binary that predates the side-by-side would take the flag for an iteration count and run its default benchmark.
grep -qa -- --exl3-file "$bench" ||
  { echo "error: $bench has no --exl3-file mode (it predates the side-by-side: rebuild and carry it)"; finish 1; }
mkdir -p "$dir" || finish 1
took checks ok

begin "1. weights, routings, inputs"
if [[ -f $weights ]]; then
  weights_rc=0; took weights "already in $weights"
else
  rm -f "$dir"/*.log "$theirs"   # results of other weights
  avail_gb=$(df --output=avail -BG "$dir" | tail -1 | tr -dc 0-9)
  if [[ ${avail_gb:-0} -lt 5 ]]; then
    echo "error: $dir has ${avail_gb:-0} GB free, the weights need 4 (set KESTREL_EXL3_BENCH_DIR)"; weights_rc=1
  else
    python3 tools/bench_exllamav3.py write --out "$weights" --seed 1; weights_rc=$?
  fi
  took weights "$(verdict "$weights_rc")"
  [[ $weights_rc -eq 0 ]] || finish 1
fi

begin "2. exllamav3 extension compile"
budget=$((deadline - (SECONDS - t0) - reserve))
ext_build=/tmp/exl3_torch_ext/exllamav3_ext
if [[ $budget -lt 30 ]]; then
  compile_status="not started (no time left in the ${deadline} s deadline)"
else
  echo "budget ${budget} s, MAX_JOBS ${MAX_JOBS:-$(nproc)}; progress every 30 s as objects built"
  ( while sleep 30; do
      objects=$(find "$ext_build" -name '*.o' 2> /dev/null | wc -l)
      echo "   $objects objects built ($((SECONDS - t0)) s since the start)"
    done ) &
  monitor=$!
  timeout -k 10 "$budget" tools/with_exllamav3.sh "$wheels" python3 tools/bench_exllamav3.py build
  rc=$?
  kill "$monitor" 2> /dev/null; wait "$monitor" 2> /dev/null
  case $rc in
    0) compile_status=ok ;;
    124|137) compile_status="unfinished after ${budget} s (rerun: ninja resumes it)" ;;
    *) compile_status="FAILED (exit $rc)" ;;
  esac
fi
took "exllamav3 compile" "$compile_status"

begin "3. exllamav3 timings"
if [[ $compile_status == ok ]]; then
  tools/with_exllamav3.sh "$wheels" python3 tools/bench_exllamav3.py time --file "$weights" --out "$theirs" \
    --iterations "$iterations" 2>&1 | tee "$dir/exllamav3.log"
  theirs_rc=${PIPESTATUS[0]}
fi
took "exllamav3 timings" "$(verdict "$theirs_rc")"

begin "4. Kestrel timings"
compare=()
[[ -f $theirs ]] && compare=(--compare "$theirs")
"$bench" --exl3-file "$weights" "$iterations" --outputs "$dir/kestrel_outputs" "${compare[@]}" 2>&1 |
  tee "$dir/kestrel.log"
ours_rc=${PIPESTATUS[0]}
took "Kestrel timings" "$(verdict "$ours_rc")"

begin "5. side by side"
python3 tools/bench_exllamav3.py summary --exllamav3 "$dir/exllamav3.log" --kestrel "$dir/kestrel.log" |
  tee "$dir/summary.log"

if [[ $compile_status == unfinished* || $compile_status == "not started"* ]]; then
  echo "exllamav3's extension is not compiled yet: run the same command again on this machine while it is warm"
  finish 75
fi
[[ $compile_status == ok && $theirs_rc == 0 && $ours_rc == 0 ]] && finish 0
finish 1
