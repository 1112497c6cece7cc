#!/usr/bin/env bash
# Builds one set of release binaries per variant of the code, each the current commit with some of the patches in
# docs/experiments/ applied, for one GPU call that compares them (tools/compare_variants.sh runs there). The build
# happens in a worktree of HEAD (.cache/variants, configured once; each variant after the first recompiles only what
# its patches touch), and OUT/<name>/ receives kestrel, kestrel_cuda_tests and kestrel_cuda_kernel_trace, OUT/lib the
# shared libraries the GPU machine lacks, and OUT.tar.xz all of it (a few MB: carry it, then
# `tar xJf <it> -C /tmp` there).
#
#   usage: tools/build_variants.sh OUT NAME=PATCH[+PATCH...] ...      (PATCH: a file name in docs/experiments/
#                                                                      without .patch; NAME=main for none)
#   e.g.:  tools/build_variants.sh /tmp/v L=main T=mla-prefill-two-blocks S=mla-decode-staging \
#              TS=mla-prefill-two-blocks+mla-decode-staging
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 2 ] || { sed -n 2,13p "$0" >&2; exit 2; }
out=$1
shift
root=$PWD tree=$PWD/.cache/variants
rm -rf "$out" && mkdir -p "$out/lib"
if [ ! -d "$tree" ]; then
  git worktree prune
  git worktree add --detach "$tree" HEAD > /dev/null
fi
git -C "$tree" checkout --detach --force -q "$(git rev-parse HEAD)"
for variant in "$@"; do
  name=${variant%%=*} patches=${variant#*=}
  [ "$name" != "$variant" ] && [ -n "$name" ] || { echo "not NAME=PATCH[+PATCH...]: $variant" >&2; exit 2; }
  git -C "$tree" checkout -q -- .
  if [ "$patches" != main ]; then
    IFS=+ read -ra list <<< "$patches"
    for patch in "${list[@]}"; do git -C "$tree" apply "$root/docs/experiments/$patch.patch"; done
  fi
  echo "== $name: ${patches}"
  (cd "$tree" && scripts/build.sh release kestrel kestrel_cuda_tests kestrel_cuda_kernel_trace > /dev/null)
  mkdir -p "$out/$name"
  cp "$tree/build/kestrel" "$tree/build/tests/kestrel_cuda_tests" "$tree/build/kestrel_cuda_kernel_trace" "$out/$name/"
done
git -C "$tree" checkout -q -- .
for library in libfmt.so.9 libpcre2-8.so.0 libutf8proc.so.2; do
  cp -L "/lib/x86_64-linux-gnu/$library" "$out/lib/"
done
tar -C "$(dirname "$out")" -cf - "$(basename "$out")" | xz --lzma2=preset=6,dict=256MiB -T2 > "$out.tar.xz"
ls -la "$out.tar.xz"
