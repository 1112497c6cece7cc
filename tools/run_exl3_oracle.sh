#!/usr/bin/env bash
# Runs tools/exl3_oracle.py on a CUDA machine with no network: installs the exllamav3 wheel (sources only; its
# extension compiles on first import, for this GPU's architecture) and its missing pure-Python dependencies from
# local wheels, then runs the oracle command given as arguments. The compile is resumable: run it again after a
# timeout and ninja continues where it stopped.
#   usage: tools/run_exl3_oracle.sh WHEEL_DIR ORACLE_ARGS...
set -euo pipefail
wheels=$1; shift
site=/tmp/exl3_site
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" "$wheels"/*.whl
export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH}
export TORCH_EXTENSIONS_DIR=/tmp/exl3_torch_ext MAX_JOBS=${MAX_JOBS:-$(nproc)} PYTHONUNBUFFERED=1
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-$(python3 -c 'import torch; print("%d.%d" % torch.cuda.get_device_capability())')}
build=$TORCH_EXTENSIONS_DIR/exllamav3_ext
if [[ -f $build/build.ninja ]]; then
  rm -f "$build/lock"   # left by an interrupted compile; torch would wait on it forever
  ninja -C "$build"
fi
exec python3 "$(dirname "$0")/exl3_oracle.py" "$@"
