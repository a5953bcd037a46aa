#!/usr/bin/env bash
# Installs the two built libraries, libkolo_core.so (the C++ API, no
# LibTorch) and libkolo.so (with the LibTorch frontend), and kolo's public
# headers under PREFIX, with a CMake package config (components core and
# torch) and one pkg-config file for each (kolo-core.pc, kolo.pc).
# tools/install.sh builds the libraries and calls this; the install test
# calls it on Bazel's outputs.
#
#   packaging/install_files.sh --lib LIBKOLO_SO --core-lib LIBKOLO_CORE_SO \
#     --torch TORCH_ENV --root DIR [--relocatable CMD] PREFIX
#
# --relocatable CMD (tools/install.sh --tarball): a tree to move to another
# machine. CMD (tools/self_contained.py tree) copies the libraries that the
# two libraries and any program already in PREFIX/bin/ need besides the
# C/C++ runtime and torch into PREFIX/lib/kolo.libs/
# under hashed names; abseil's headers come along (kolo's headers include
# them); the .pc files find the prefix from their own place, and torch by
# a variable, torch_root (pkg-config --define-variable=torch_root=DIR; CMake:
# -Dkolo_TORCH_ROOT=DIR; default: the build's), so that nothing of
# Debian's -dev packages or of the build machine is needed to link.
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
  echo "usage: $0 --lib LIBKOLO_SO --core-lib LIBKOLO_CORE_SO --torch TORCH_ENV --root DIR [--relocatable CMD] PREFIX" >&2
  exit 2
}
lib="" core_lib="" torch_env="" root="" prefix="" relocatable=""
while [ $# -gt 0 ]; do
  case "$1" in
    --relocatable) relocatable="${2:-}"; shift 2 ;;
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

# abseil, as kolo's headers use it: Debian's package (CMake's absl::
# targets, pkg-config's absl_* modules), or, relocatable, the copies in
# lib/kolo.libs with abseil's headers beside kolo's.
cmake_abseil="absl::status;absl::statusor;absl::time" pc_requires="absl_status absl_statusor absl_time"
pc_abseil="" cmake_find_abseil="find_dependency(absl)"
if [ -n "$relocatable" ]; then
  programs=()
  [ ! -d "$prefix/bin" ] || programs=("$prefix"/bin/*)
  $relocatable "$prefix/lib" "$prefix/lib/libkolo.so.$VERSION" \
    "$prefix/lib/libkolo_core.so.$VERSION" "${programs[@]}"
  cp -r /usr/include/absl "$prefix/include/absl"
  cmake_abseil="" pc_requires="" cmake_find_abseil=""
  for copy in $(cd "$prefix/lib/kolo.libs" && ls libabsl_*); do
    cmake_abseil="$cmake_abseil;\${_kolo_prefix}/lib/kolo.libs/$copy"
    pc_abseil="$pc_abseil \${libdir}/kolo.libs/$copy"
  done
  cmake_abseil=${cmake_abseil#;}
fi

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
# A CUDA wheel's torch loads the NCCL of its nvidia-nccl package and the
# CUDA runtime of its nvidia-cuda-runtime package, and libkolo.so (built
# with the system's) needs libnccl.so.2 and libcudart.so too, and torch's
# CUDA libraries. The program itself needs all of them (one --no-as-needed
# group, first, with their folders in the program's run path; CMake would
# merge two groups' flags): the loader maps a program's own dependencies
# before those of its libraries, so the one libnccl.so.2 and libcudart of
# the process are the ones torch was built with, at link time and at run
# time, and libkolo.so, which names no torch folder, finds torch's CUDA
# libraries loaded (it may be moved).
own=()
if [ -n "${TORCH_NCCL:-}" ]; then
  nvidia=$(dirname "$(dirname "$(dirname "$TORCH_NCCL")")")
  own+=("$TORCH_NCCL")
  for cudart in "$nvidia"/cu[0-9]*/lib/libcudart.so.* \
    "$nvidia"/cuda_runtime/lib/libcudart.so.*; do
    if [ -f "$cudart" ]; then own+=("$cudart"); break; fi
  done
fi
for name in torch_cuda c10_cuda; do
  [ ! -f "$TORCH_LIBDIR/lib$name.so" ] || own+=("$TORCH_LIBDIR/lib$name.so")
done
if [ ${#own[@]} -gt 0 ]; then
  group="-Wl,--push-state,--no-as-needed"
  rpaths=""
  for lib in "${own[@]}"; do
    group="$group;$lib"
    case " $rpaths " in *" -Wl,-rpath,$(dirname "$lib") "*) ;;
      *) rpaths="$rpaths -Wl,-rpath,$(dirname "$lib")" ;; esac
  done
  group="$group;-Wl,--pop-state"
  cmake_libs=";$group$cmake_libs"
  torch_libs="${rpaths# } ${group//;/ } $torch_libs"
fi
# A CUDA wheel's libtorch_cuda.so finds the nvidia-* wheels' libraries by
# run paths relative to itself ($ORIGIN/../../nvidia/.../lib); the linker
# checking a program's libraries needs them named (-rpath-link), or it
# takes another CUDA runtime of the machine, or finds none.
if [ -f "$TORCH_LIBDIR/libtorch_cuda.so" ]; then
  for dir in $(readelf -d "$TORCH_LIBDIR/libtorch_cuda.so" |
               sed -n 's/.*R\(UN\)\?PATH.*\[\(.*\)\]/\2/p' | tr ':' ' '); do
    case $dir in
      '$ORIGIN'/*) dir=$TORCH_LIBDIR/${dir#\$ORIGIN/} ;;
      *) continue ;;
    esac
    cmake_libs="$cmake_libs;-Wl,-rpath-link,$dir"
    torch_libs="$torch_libs -Wl,-rpath-link,$dir"
  done
fi
# Relocatable: torch's folders by the torch_root variable (torch's package
# folder; the nvidia-* wheels beside it), the prefix from the files' place.
cmake_torch_root="" pc_torch_root="" pc_prefix=$prefix
if [ -n "$relocatable" ]; then
  torch_root=$(dirname "$TORCH_LIBDIR")
  site=$(dirname "$torch_root")
  relocate() { sed -e "s|$torch_root|$2|g" -e "s|$site/|$2/../|g" <<<"$1"; }
  cmake_includes=$(relocate "$cmake_includes" '${kolo_TORCH_ROOT}')
  cmake_libs=$(relocate "$cmake_libs" '${kolo_TORCH_ROOT}')
  torch_cflags=$(relocate "$torch_cflags" '${torch_root}')
  torch_libs=$(relocate "$torch_libs" '${torch_root}')
  cmake_torch_root="if(NOT DEFINED kolo_TORCH_ROOT)\\n  set(kolo_TORCH_ROOT \"$torch_root\")\\nendif()"
  pc_torch_root="torch_root=$torch_root"
  pc_prefix='${pcfiledir}/../..'
fi
sed -e "s|@VERSION@|$VERSION|g" -e "s|@TORCH_VERSION@|$TORCH_VERSION|g" \
  -e "s|@TORCH_CXX_STD@|$TORCH_CXX_STD|g" \
  -e "s|@TORCH_INCLUDE_DIRS@|${cmake_includes#;}|g" \
  -e "s|@TORCH_LIBRARIES@|${cmake_libs#;}|g" \
  -e "s|@TORCH_ROOT@|$cmake_torch_root|g" \
  -e "s|@FIND_ABSEIL@|$cmake_find_abseil|g" -e "s|@ABSEIL@|$cmake_abseil|g" \
  "$root/packaging/koloConfig.cmake.in" >"$prefix/lib/cmake/kolo/koloConfig.cmake"
sed -e "s|@VERSION@|$VERSION|g" -e "s|@VERSION_MAJOR@|${VERSION%%.*}|g" \
  "$root/packaging/koloConfigVersion.cmake.in" \
  >"$prefix/lib/cmake/kolo/koloConfigVersion.cmake"
for pc in kolo kolo-core; do
  sed -e "s|@VERSION@|$VERSION|g" -e "s|@PREFIX@|$pc_prefix|g" \
    -e "s|@TORCH_LIBS@|${torch_libs# }|g" -e "s|@TORCH_CFLAGS@|$torch_cflags|g" \
    -e "s|@TORCH_ROOT@|$pc_torch_root|g" -e "s|@REQUIRES@|$pc_requires|g" \
    -e "s|@ABSEIL@|$pc_abseil|g" \
    "$root/packaging/$pc.pc.in" >"$prefix/lib/pkgconfig/$pc.pc"
done

echo "installed kolo $VERSION in $prefix (LibTorch frontend for torch $TORCH_VERSION, C++$TORCH_CXX_STD)"
