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
#
#   [KOLO_PYTHON=...] tools/install.sh --tarball FILE.tar.gz
#
# makes a relocatable tarball instead, for the PyPI torch pinned in
# tools/torch-versions.txt unless KOLO_PYTHON names another: the same tree
# under one folder (kolo-VERSION-torchX.Y-x86_64/), with kolorun and
# kolo_rank_guard in bin/, and the libraries kolo needs besides the C/C++
# runtime and torch copied into lib/kolo.libs/ under hashed names
# (tools/self_contained.py, the wheel's rule), abseil's headers in
# include/: a program links it with nothing of Debian's -dev packages,
# against the LibTorch of a pip torch wherever it is (pkg-config
# --define-variable=torch_root=SITE/torch, or cmake -Dkolo_TORCH_ROOT=...).
# KOLO_BAZEL_OUTPUT_BASE names Bazel's output base.
set -euo pipefail
usage() {
  echo "usage: $0 PREFIX | $0 --tarball FILE.tar.gz" >&2
  exit 2
}
tarball=""
if [ $# -eq 2 ] && [ "$1" = --tarball ]; then
  tarball=$2
elif [ $# -ne 1 ] || [ "${1#-}" != "$1" ]; then
  usage
fi
prefix=${1:-}
[ -z "$tarball" ] || tarball=$(cd "$(dirname "$tarball")" && pwd)/$(basename "$tarball")
cd "$(dirname "$0")/.."

bazel=(bazel) flags=()
if [ -n "$tarball" ]; then
  export KOLO_PYTHON=${KOLO_PYTHON:-$(tools/torch_env.sh)}
  [ -z "${KOLO_BAZEL_OUTPUT_BASE:-}" ] ||
    bazel+=(--output_base="$KOLO_BAZEL_OUTPUT_BASE")
  # No bazel-* links: the tree's bazel-bin stays the build it was.
  flags+=(--symlink_prefix=/)
fi
"${bazel[@]}" build "${flags[@]}" //packaging:kolo //packaging:kolo_core \
  //tools/kolorun:kolorun //tools/kolorun:kolo_rank_guard >&2
bin=$("${bazel[@]}" info bazel-bin 2>/dev/null)
torch_env="$("${bazel[@]}" info output_base 2>/dev/null)/external/torch/install.env"
args=(--lib "$bin/packaging/libkolo.so" --core-lib "$bin/packaging/libkolo_core.so"
      --torch "$torch_env" --root .)
if [ -z "$tarball" ]; then
  exec packaging/install_files.sh "${args[@]}" "$prefix"
fi

tools_bin=$(tools/wheel_tools.sh)
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
torch_minor=$(sed -n "s/^TORCH_VERSION='\([0-9]*\.[0-9]*\).*/\1/p" "$torch_env")
name=kolo-$(sed -n 's/^VERSION=//p' packaging/install_files.sh)-torch$torch_minor-x86_64
install -d "$stage/$name/bin"
install -m 0755 "$bin/tools/kolorun/kolorun" "$bin/tools/kolorun/kolo_rank_guard" \
  "$stage/$name/bin/"
# install_files.sh makes the libraries and the programs in bin/
# self-contained in one pass (self_contained.py tree).
packaging/install_files.sh "${args[@]}" --relocatable \
  "env PATH=$tools_bin:$PATH $tools_bin/python tools/self_contained.py tree" \
  "$stage/$name" >&2
tar -czf "$tarball" -C "$stage" "$name"
echo "$tarball"
