#!/usr/bin/env bash
# Runs a command with exllamav3 importable, on a CUDA machine with no network: installs the exllamav3 wheel (sources
# only; its extension compiles on first import, for this GPU's architecture) and its missing Python dependencies from
# local wheels into /tmp/exl3_site, then runs the command. The compile is resumable: after an interrupted one (a
# timeout), the next run continues it with ninja where it stopped. The wheels are installed once per set of wheels:
# reinstalling would give the sources new times, and ninja would compile everything again.
#   usage: tools/with_exllamav3.sh WHEEL_DIR COMMAND...
set -euo pipefail
wheels=$1; shift
site=/tmp/exl3_site
stamp="$site/.installed-$(cat "$wheels"/*.whl | sha256sum | cut -c1-16)"
if [[ ! -f $stamp ]]; then
  rm -rf "$site"
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" "$wheels"/*.whl
  touch "$stamp"
fi
export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH}
export TORCH_EXTENSIONS_DIR=/tmp/exl3_torch_ext MAX_JOBS=${MAX_JOBS:-$(nproc)} PYTHONUNBUFFERED=1
capability='import torch; print("%d.%d" % torch.cuda.get_device_capability())'
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-$(python3 -c "$capability")}
build=$TORCH_EXTENSIONS_DIR/exllamav3_ext
if [[ -f $build/build.ninja ]]; then
  rm -f "$build/lock"   # left by an interrupted compile; torch would wait on it forever
  ninja -C "$build" -j "$MAX_JOBS"
fi
exec "$@"
