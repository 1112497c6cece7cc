#!/usr/bin/env bash
# Installs Kestrel's build and test dependencies from Debian 12 packages.
# Idempotent: packages already present are not fetched again, and nothing runs apt-get update
# unless something is missing.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config
  libfmt-dev nlohmann-json3-dev libcli11-dev libpcre2-dev libutf8proc-dev
  libgtest-dev libgmock-dev clang libclang-rt-14-dev
  libboost-dev python3-venv

)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
echo "install-deps: installing ${missing[*]}"
$sudo apt-get update -q
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
