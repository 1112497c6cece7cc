#!/usr/bin/env bash
# The SASS of one CUDA source's kernels, without a GPU: compiles the file for sm_90a with the release flags and
# disassembles it with nvdisasm (the toolkit here has no cuobjdump or nvdisasm; the NVIDIA wheel on PyPI carries one,
# fetched once into .cache/nvdisasm). Prints, per kernel whose mangled name matches the pattern, its instruction count
# and the instructions that bound our kernels (tensor-core products, global and shared loads, barriers, shuffles,
# special-function and integer-division sequences), and writes the whole listing to <out>.sass. For comparing two
# versions of a kernel's inner loop before a GPU measures them (docs/benchmarks/cuda_forward.md, twentieth session).
#
#   usage: tools/sass.sh <file.cu> <kernel-name-regex> [out-prefix] [extra nvcc flags...]
#   e.g.:  tools/sass.sh src/backend/cuda/dsa_kernels.cu 'sparse_mla_mma_kernelILi512' /tmp/attention
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 2 ] || { sed -n 2,10p "$0" >&2; exit 2; }
source_file=$1 pattern=$2 out=${3:-/tmp/kestrel_sass}
shift $(( $# >= 3 ? 3 : 2 ))
tool=.cache/nvdisasm/nvidia/cu13/bin/nvdisasm
if [ ! -x "$tool" ]; then
  mkdir -p .cache/nvdisasm
  python3 -m pip download -q --no-deps --only-binary=:all: -d .cache/nvdisasm "nvidia-cuda-nvdisasm>=13,<14"
  python3 -m zipfile -e .cache/nvdisasm/nvidia_cuda_nvdisasm-*.whl .cache/nvdisasm
  chmod +x "$tool"
fi
/usr/local/cuda/bin/nvcc -Isrc -O3 -DNDEBUG -std=c++17 -arch=sm_90a -cubin "$@" -o "$out.cubin" "$source_file"
"$tool" -c "$out.cubin" > "$out.sass"
awk -v pattern="$pattern" '
  function report() {
    if (name != "") {
      printf "%s\n  %d instructions:", name, total
      for (k in counts) printf " %s %d", k, counts[k]
      printf "\n"
    }
  }
  /^\.text\./ {
    report()
    name = ($0 ~ pattern) ? $0 : ""
    total = 0
    delete counts
    next
  }
  name != "" && /^ *\/\*[0-9a-f]+\*\/ / {
    total++
    if (match($0, /(HMMA|LDGSTS|LDG|LDS|LDSM|STS|BAR\.SYNC|SHFL|MUFU\.[A-Z0-9]+|I2F|F2I)/)) {
      counts[substr($0, RSTART, RLENGTH)]++
    }
  }
  END { report() }
' "$out.sass"
echo "listing: $out.sass"
