#!/usr/bin/env bash
# Installs the two built libraries, libkolo_core.so (the C++ API, no
# LibTorch) and libkolo.so (with the LibTorch frontend), and kolo's public
# headers under PREFIX, with a CMake package config (components core and
# torch) and one pkg-config file for each (kolo-core.pc, kolo.pc).
# tools/install.sh builds the libraries and calls this; the install test
# calls it on Bazel's outputs.
#
#   packaging/install_files.sh --lib LIBKOLO_SO --core-lib LIBKOLO_CORE_SO \
#     --root DIR PREFIX
#
# DIR is a tree with runtime/include/kolo/*.h,
# frontends/torch/include/kolo/torch/*.h and packaging/*.in (the source tree
# or a test's runfiles).
set -euo pipefail

VERSION=0.1.0
usage() {
  echo "usage: $0 --lib LIBKOLO_SO --core-lib LIBKOLO_CORE_SO --root DIR PREFIX" >&2
  exit 2
}
lib="" core_lib="" root="" prefix=""
while [ $# -gt 0 ]; do
  case "$1" in
    --lib) lib="${2:-}"; shift 2 ;;
    --core-lib) core_lib="${2:-}"; shift 2 ;;
    --root) root="${2:-}"; shift 2 ;;
    -*) usage ;;
    *) [ -z "$prefix" ] || usage; prefix="$1"; shift ;;
  esac
done
[ -n "$lib" ] && [ -n "$core_lib" ] && [ -n "$root" ] && [ -n "$prefix" ] || usage
for l in "$lib" "$core_lib"; do
  [ -f "$l" ] || { echo "$0: no library at $l" >&2; exit 1; }
done
mkdir -p "$prefix"
prefix=$(cd "$prefix" && pwd)

# LibTorch as Debian installs it; override with TORCH_INCLUDE / TORCH_LIBDIR.
torch_include=${TORCH_INCLUDE:-/usr/include}
torch_libdir=${TORCH_LIBDIR:-/usr/lib/x86_64-linux-gnu}

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

sed -e "s|@VERSION@|$VERSION|g" "$root/packaging/koloConfig.cmake.in" \
  >"$prefix/lib/cmake/kolo/koloConfig.cmake"
sed -e "s|@VERSION@|$VERSION|g" -e "s|@VERSION_MAJOR@|${VERSION%%.*}|g" \
  "$root/packaging/koloConfigVersion.cmake.in" \
  >"$prefix/lib/cmake/kolo/koloConfigVersion.cmake"
# -isystem /usr/include would break libstdc++'s #include_next.
torch_cflags="-isystem $torch_include/torch/csrc/api/include"
[ "$torch_include" = /usr/include ] || torch_cflags="-isystem $torch_include $torch_cflags"
torch_libs="-ltorch -ltorch_cpu -lc10"
[ "$torch_libdir" = /usr/lib/x86_64-linux-gnu ] || torch_libs="-L$torch_libdir $torch_libs"
sed -e "s|@VERSION@|$VERSION|g" -e "s|@PREFIX@|$prefix|g" \
  -e "s|@TORCH_LIBS@|$torch_libs|g" -e "s|@TORCH_CFLAGS@|$torch_cflags|g" \
  "$root/packaging/kolo.pc.in" >"$prefix/lib/pkgconfig/kolo.pc"
sed -e "s|@VERSION@|$VERSION|g" -e "s|@PREFIX@|$prefix|g" \
  "$root/packaging/kolo-core.pc.in" >"$prefix/lib/pkgconfig/kolo-core.pc"

echo "installed kolo $VERSION in $prefix"
