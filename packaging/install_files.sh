#!/usr/bin/env bash
# Installs a built libkolo.so and kolo's public headers under PREFIX, with a
# CMake package config and a pkg-config file. tools/install.sh builds the
# library and calls this; the install test calls it on Bazel's outputs.
#
#   packaging/install_files.sh --lib LIBKOLO_SO --root DIR PREFIX
#
# DIR is a tree with runtime/include/kolo/*.h,
# frontends/torch/include/kolo/torch/*.h and packaging/*.in (the source tree
# or a test's runfiles).
set -euo pipefail

VERSION=0.1.0
usage() {
  echo "usage: $0 --lib LIBKOLO_SO --root DIR PREFIX" >&2
  exit 2
}
lib="" root="" prefix=""
while [ $# -gt 0 ]; do
  case "$1" in
    --lib) lib="${2:-}"; shift 2 ;;
    --root) root="${2:-}"; shift 2 ;;
    -*) usage ;;
    *) [ -z "$prefix" ] || usage; prefix="$1"; shift ;;
  esac
done
[ -n "$lib" ] && [ -n "$root" ] && [ -n "$prefix" ] || usage
[ -f "$lib" ] || { echo "$0: no library at $lib" >&2; exit 1; }
mkdir -p "$prefix"
prefix=$(cd "$prefix" && pwd)

# LibTorch as Debian installs it; override with TORCH_INCLUDE / TORCH_LIBDIR.
torch_include=${TORCH_INCLUDE:-/usr/include}
torch_libdir=${TORCH_LIBDIR:-/usr/lib/x86_64-linux-gnu}

install -d "$prefix/lib" "$prefix/lib/cmake/kolo" "$prefix/lib/pkgconfig" \
  "$prefix/include/kolo/torch"
install -m 0755 "$lib" "$prefix/lib/libkolo.so.$VERSION"
ln -sf "libkolo.so.$VERSION" "$prefix/lib/libkolo.so.0"
ln -sf "libkolo.so.0" "$prefix/lib/libkolo.so"
install -m 0644 "$root"/runtime/include/kolo/*.h "$prefix/include/kolo/"
install -m 0644 "$root"/frontends/torch/include/kolo/torch/*.h \
  "$prefix/include/kolo/torch/"

sed -e "s|@VERSION@|$VERSION|g" "$root/packaging/koloConfig.cmake.in" \
  >"$prefix/lib/cmake/kolo/koloConfig.cmake"
sed -e "s|@VERSION@|$VERSION|g" "$root/packaging/koloConfigVersion.cmake.in" \
  >"$prefix/lib/cmake/kolo/koloConfigVersion.cmake"
# -isystem /usr/include would break libstdc++'s #include_next.
torch_cflags="-isystem $torch_include/torch/csrc/api/include"
[ "$torch_include" = /usr/include ] || torch_cflags="-isystem $torch_include $torch_cflags"
torch_libs="-ltorch -ltorch_cpu -lc10"
[ "$torch_libdir" = /usr/lib/x86_64-linux-gnu ] || torch_libs="-L$torch_libdir $torch_libs"
sed -e "s|@VERSION@|$VERSION|g" -e "s|@PREFIX@|$prefix|g" \
  -e "s|@TORCH_LIBS@|$torch_libs|g" -e "s|@TORCH_CFLAGS@|$torch_cflags|g" \
  "$root/packaging/kolo.pc.in" >"$prefix/lib/pkgconfig/kolo.pc"

echo "installed kolo $VERSION in $prefix"
