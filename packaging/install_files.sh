#!/usr/bin/env bash
# Installs the two built libraries, libkolo_core.so (the C++ API, no
# LibTorch) and libkolo.so (with the LibTorch frontend), and kolo's public
# headers under PREFIX, with a CMake package config (components core and
# torch) and one pkg-config file for each (kolo-core.pc, kolo.pc).
# tools/install.sh builds the libraries and calls this; the install test
# calls it on Bazel's outputs.
#
#   packaging/install_files.sh --lib LIBKOLO_SO --core-lib LIBKOLO_CORE_SO \
#     --torch TORCH_ENV --root DIR PREFIX
#
# DIR is a tree with runtime/include/kolo/*.h,
# frontends/torch/include/kolo/torch/*.h and packaging/*.in (the source tree
# or a test's runfiles). TORCH_ENV is @torch//:install.env, the torch
# libkolo.so was built against (third_party/torch.bzl): its folders, its
# libraries and the C++ standard its headers need go into kolo.pc and the
# CMake config, so that a program links that torch and no other.
set -euo pipefail

VERSION=0.1.0
usage() {
  echo "usage: $0 --lib LIBKOLO_SO --core-lib LIBKOLO_CORE_SO --torch TORCH_ENV --root DIR PREFIX" >&2
  exit 2
}
lib="" core_lib="" torch_env="" root="" prefix=""
while [ $# -gt 0 ]; do
  case "$1" in
    --lib) lib="${2:-}"; shift 2 ;;
    --core-lib) core_lib="${2:-}"; shift 2 ;;
    --torch) torch_env="${2:-}"; shift 2 ;;
    --root) root="${2:-}"; shift 2 ;;
    -*) usage ;;
    *) [ -z "$prefix" ] || usage; prefix="$1"; shift ;;
  esac
done
[ -n "$lib" ] && [ -n "$core_lib" ] && [ -n "$torch_env" ] && [ -n "$root" ] &&
  [ -n "$prefix" ] || usage
for f in "$lib" "$core_lib" "$torch_env"; do
  [ -f "$f" ] || { echo "$0: no file at $f" >&2; exit 1; }
done
mkdir -p "$prefix"
prefix=$(cd "$prefix" && pwd)

# TORCH_VERSION, TORCH_CXX_STD, TORCH_INCLUDE_DIRS, TORCH_LIBDIR, TORCH_LIBS
# and TORCH_NCCL (empty without a CUDA wheel's NCCL).
# shellcheck disable=SC1090
. "$torch_env"
for v in TORCH_VERSION TORCH_CXX_STD TORCH_INCLUDE_DIRS TORCH_LIBDIR TORCH_LIBS; do
  [ -n "${!v:-}" ] || { echo "$0: $torch_env does not set $v" >&2; exit 1; }
done

install -d "$prefix/lib" "$prefix/lib/cmake/kolo" "$prefix/lib/pkgconfig" \
  "$prefix/include/kolo/torch"
for pair in "$lib:libkolo" "$core_lib:libkolo_core"; do
  from=${pair%:*} name=${pair##*:}
  install -m 0755 "$from" "$prefix/lib/$name.so.$VERSION"
  ln -sf "$name.so.$VERSION" "$prefix/lib/$name.so.0"
  ln -sf "$name.so.0" "$prefix/lib/$name.so"
done
install -m 0644 "$root"/runtime/include/kolo/*.h "$prefix/include/kolo/"
install -m 0644 "$root"/frontends/torch/include/kolo/torch/*.h \
  "$prefix/include/kolo/torch/"

# The CMake config names torch's folders and libraries by path (lists with
# ";"); pkg-config takes flags.
cmake_includes="" cmake_libs="" torch_cflags="-std=c++$TORCH_CXX_STD" torch_libs=""
for dir in $TORCH_INCLUDE_DIRS; do
  cmake_includes="$cmake_includes;$dir"
  # -isystem /usr/include would break libstdc++'s #include_next.
  [ "$dir" = /usr/include ] || torch_cflags="$torch_cflags -isystem $dir"
done
[ "$TORCH_LIBDIR" = /usr/lib/x86_64-linux-gnu ] ||
  torch_libs="-L$TORCH_LIBDIR -Wl,-rpath,$TORCH_LIBDIR"
for name in $TORCH_LIBS; do
  cmake_libs="$cmake_libs;$TORCH_LIBDIR/lib$name.so"
  torch_libs="$torch_libs -l$name"
done
# A CUDA wheel's torch loads the NCCL of its nvidia-nccl package, and
# libkolo.so (built with the system's NCCL) needs libnccl.so.2 too. The
# program itself needs torch's (kept by --no-as-needed, with its folder in
# the program's run path): the loader maps a program's own dependencies
# before those of its libraries, so the one libnccl.so.2 of the process is
# the one torch was built with, at link time and at run time.
if [ -n "${TORCH_NCCL:-}" ]; then
  nccl_link="-Wl,--push-state,--no-as-needed;$TORCH_NCCL;-Wl,--pop-state"
  cmake_libs=";$nccl_link$cmake_libs"
  torch_libs="-Wl,-rpath,$(dirname "$TORCH_NCCL") ${nccl_link//;/ } $torch_libs"
fi
sed -e "s|@VERSION@|$VERSION|g" -e "s|@TORCH_VERSION@|$TORCH_VERSION|g" \
  -e "s|@TORCH_CXX_STD@|$TORCH_CXX_STD|g" \
  -e "s|@TORCH_INCLUDE_DIRS@|${cmake_includes#;}|g" \
  -e "s|@TORCH_LIBRARIES@|${cmake_libs#;}|g" \
  "$root/packaging/koloConfig.cmake.in" >"$prefix/lib/cmake/kolo/koloConfig.cmake"
sed -e "s|@VERSION@|$VERSION|g" -e "s|@VERSION_MAJOR@|${VERSION%%.*}|g" \
  "$root/packaging/koloConfigVersion.cmake.in" \
  >"$prefix/lib/cmake/kolo/koloConfigVersion.cmake"
sed -e "s|@VERSION@|$VERSION|g" -e "s|@PREFIX@|$prefix|g" \
  -e "s|@TORCH_LIBS@|${torch_libs# }|g" -e "s|@TORCH_CFLAGS@|$torch_cflags|g" \
  "$root/packaging/kolo.pc.in" >"$prefix/lib/pkgconfig/kolo.pc"
sed -e "s|@VERSION@|$VERSION|g" -e "s|@PREFIX@|$prefix|g" \
  "$root/packaging/kolo-core.pc.in" >"$prefix/lib/pkgconfig/kolo-core.pc"

echo "installed kolo $VERSION in $prefix (LibTorch frontend for torch $TORCH_VERSION, C++$TORCH_CXX_STD)"
