#!/usr/bin/env bash
# Runs tools/exl3_oracle.py on a CUDA machine with no network, with exllamav3 installed from local wheels and its
# extension compiled (resumably) by tools/with_exllamav3.sh.
#   usage: tools/run_exl3_oracle.sh WHEEL_DIR ORACLE_ARGS...
set -euo pipefail
tools=$(dirname "$0")
exec "$tools/with_exllamav3.sh" "$1" python3 "$tools/exl3_oracle.py" "${@:2}"
