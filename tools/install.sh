#!/usr/bin/env bash
# Installs kolo for programs built outside Bazel (CMake, pkg-config):
#
#   [KOLO_PYTHON=/path/to/venv/bin/python] tools/install.sh PREFIX
#
# The LibTorch frontend is built against the torch of KOLO_PYTHON (default
# /usr/bin/python3: Debian's 1.13; a pip torch carries LibTorch too), and the
# CMake config and kolo.pc name that torch's folders, libraries and C++
# standard (third_party/torch.bzl).
# PREFIX/lib/libkolo_core.so (the runtime and its backends, no LibTorch),
# PREFIX/lib/libkolo.so (the same with the LibTorch frontend; both export
# only kolo's symbols), PREFIX/include/kolo/ (the C++ API and kolo/torch/),
# PREFIX/lib/cmake/kolo/ (find_package(kolo): components core and torch) and
# PREFIX/lib/pkgconfig/kolo-core.pc and kolo.pc. See docs/building.md,
# "Installing kolo".
set -euo pipefail
if [ $# -ne 1 ] || [ "${1#-}" != "$1" ]; then
  echo "usage: $0 PREFIX" >&2
  exit 2
fi
prefix=$1
cd "$(dirname "$0")/.."

bazel build //packaging:kolo //packaging:kolo_core >&2
exec packaging/install_files.sh --lib bazel-bin/packaging/libkolo.so \
  --core-lib bazel-bin/packaging/libkolo_core.so \
  --torch "$(bazel info output_base 2>/dev/null)/external/torch/install.env" \
  --root . "$prefix"
