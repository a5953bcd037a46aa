#!/usr/bin/env bash
# Installs kolo for programs built outside Bazel (CMake, pkg-config):
#
#   tools/install.sh PREFIX
#
# PREFIX/lib/libkolo.so (runtime + gloo backend + LibTorch frontend;
# exports only kolo's symbols), PREFIX/include/kolo/ (the C++ API and
# kolo/torch/), PREFIX/lib/cmake/kolo/ (find_package(kolo)) and
# PREFIX/lib/pkgconfig/kolo.pc. See docs/torch.md.
set -euo pipefail
if [ $# -ne 1 ] || [ "${1#-}" != "$1" ]; then
  echo "usage: $0 PREFIX" >&2
  exit 2
fi
prefix=$1
cd "$(dirname "$0")/.."

bazel build //packaging:kolo >&2
exec packaging/install_files.sh --lib bazel-bin/packaging/libkolo.so \
  --root . "$prefix"
