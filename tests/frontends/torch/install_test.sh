#!/usr/bin/env bash
# The installed kolo works for programs built outside Bazel, in its two parts:
#   1. packaging/install_files.sh (what tools/install.sh runs after building)
#      installs both libraries, the headers, the CMake config and both
#      pkg-config files;
#   2. libkolo.so and libkolo_core.so export kolo's symbols and nothing else;
#   3. the core: a program on kolo's C++ API alone, built with CMake
#      (find_package(kolo COMPONENTS core), kolo::core) and with
#      `pkg-config kolo-core`, runs at -np 2 through kolorun and loads no
#      torch library (ldd, and the program's own /proc/self/maps);
#   4. the LibTorch frontend: docs/torch.md's port of a plain LibTorch
#      program (a helper taking torch::optim::Optimizer&, StepLR, a
#      checkpoint it resumes from), built with CMake (find_package(kolo),
#      kolo::torch) and with `pkg-config kolo`, trains at -np 2 on the real
#      Fashion-MNIST files (20 batches per epoch), resumes from its
#      checkpoint with the scheduler's lr, and ends with identical replicas.
#
#   install_test.sh LIBKOLO_SO LIBKOLO_CORE_SO KOLORUN TORCH_ENV  (cwd = runfiles)
#
# TORCH_ENV is @torch//:install.env: the test runs against whichever torch
# KOLO_PYTHON built for (tools/test.sh: Debian's 1.13, then PyPI's).
set -euo pipefail
lib=$1
core_lib=$2
kolorun=$3
torch_env=$4
tmp=${TEST_TMPDIR:-$(mktemp -d)}
prefix=$tmp/prefix
consumers=tests/frontends/torch
fail() {
  echo "FAILED: $*" >&2
  exit 1
}

packaging/install_files.sh --lib "$lib" --core-lib "$core_lib" \
  --torch "$torch_env" --root . "$prefix"
for f in lib/libkolo.so lib/libkolo.so.0 lib/libkolo_core.so \
  lib/libkolo_core.so.0 include/kolo/runtime.h include/kolo/torch/torch.h \
  lib/cmake/kolo/koloConfig.cmake lib/cmake/kolo/koloConfigVersion.cmake \
  lib/pkgconfig/kolo.pc lib/pkgconfig/kolo-core.pc; do
  [ -e "$prefix/$f" ] || fail "$f was not installed"
done

echo "=== exported symbols"
for so in libkolo.so libkolo_core.so; do
  exported=$(nm -D --defined-only "$prefix/lib/$so" | awk '{print $3}' | c++filt)
  foreign=$(grep -v -E '^((typeinfo( name)? for |vtable for |VTT for |(non-)?virtual thunk to )?kolo::|KOLO_0$)' \
    <<<"$exported" || true)
  [ -z "$foreign" ] || fail "$so exports symbols that are not kolo's:
$(head -20 <<<"$foreign")"
  wants=('kolo::Runtime::Create(' 'kolo::IsWaitTimeout(')
  [ "$so" = libkolo.so ] && wants+=('kolo::torch::init()'
    'kolo::torch::DistributedOptimizer::step(' 'typeinfo for kolo::torch::Error')
  for want in "${wants[@]}"; do
    grep -qF "$want" <<<"$exported" || fail "$so does not export $want"
  done
  echo "$so: $(wc -l <<<"$exported") symbols, all kolo's"
done
if readelf -d "$prefix/lib/libkolo_core.so" | grep -E 'NEEDED.*\[lib(torch|c10)'; then
  fail "libkolo_core.so depends on LibTorch"
fi

# A binary's dynamic dependencies must hold no torch library.
no_torch() {
  if ldd "$1" | grep -E 'lib(torch|c10)[^ ]*\.so'; then
    fail "$1 loads LibTorch"
  fi
}
# The torch kolo was built for (TORCH_ENV), whatever other torch the system
# has: each LibTorch library a program loads comes from its folder.
# shellcheck disable=SC1090
. "$torch_env"
links_the_torch() {
  local loaded want path
  loaded=$(ldd "$1" | grep -E '^\s*lib(torch|torch_cpu|c10)\.so' || true)
  [ "$(grep -c . <<<"$loaded")" -eq 3 ] ||
    fail "$1 does not load libtorch, libtorch_cpu and libc10: $loaded"
  want=$(readlink -f "$TORCH_LIBDIR")
  for path in $(awk '{print $3}' <<<"$loaded"); do
    [ "$(dirname "$(readlink -f "$path")")" = "$want" ] ||
      fail "$1 loads $path, not torch $TORCH_VERSION's (in $TORCH_LIBDIR)"
  done
  if [ -n "${TORCH_NCCL:-}" ]; then
    path=$(ldd "$1" | awk '$1 == "libnccl.so.2" {print $3}')
    [ "$(readlink -f "$path")" = "$(readlink -f "$TORCH_NCCL")" ] ||
      fail "$1 loads libnccl.so.2 from $path, not torch's $TORCH_NCCL"
  fi
  echo "$1 loads torch $TORCH_VERSION's libraries from $TORCH_LIBDIR"
}
# Runs `$@` at -np 2 under kolorun; both ranks must print `$pattern`.
run_two() {
  local pattern=$1
  shift
  out=$("$kolorun" -np 2 "$@" 2>&1) || { echo "$out"; fail "$* under kolorun"; }
  echo "$out"
  [ "$(grep -cE "$pattern" <<<"$out")" -eq 2 ] || fail "$*: output"
}

echo "=== CMake: version rules and components"
cmake -S $consumers/cmake_version_check -B "$tmp/version_check" \
  -DCMAKE_PREFIX_PATH="$prefix" >"$tmp/version.log" 2>&1 ||
  { cat "$tmp/version.log"; fail "find_package version rules"; }
grep -q 'kolo version rules: OK' "$tmp/version.log" || fail "version check output"

echo "=== core: CMake, find_package(kolo COMPONENTS core)"
cmake -S $consumers/cmake_core_consumer -B "$tmp/core_build" \
  -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release >"$tmp/core_cmake.log" 2>&1 ||
  { cat "$tmp/core_cmake.log"; fail "cmake configure (core)"; }
cmake --build "$tmp/core_build" -j 2 >"$tmp/core_build.log" 2>&1 ||
  { cat "$tmp/core_build.log"; fail "cmake build (core)"; }
no_torch "$tmp/core_build/core_consumer"
run_two '\] OK core rank [01] of 2$' "$tmp/core_build/core_consumer"

echo "=== core: pkg-config kolo-core"
export PKG_CONFIG_PATH=$prefix/lib/pkgconfig
# shellcheck disable=SC2046
g++ -std=c++17 -O1 $consumers/cmake_consumer/core_consumer.cc \
  $(pkg-config --cflags --libs kolo-core) -o "$tmp/core_pkg_config" ||
  fail "building with pkg-config kolo-core"
if pkg-config --cflags --libs kolo-core | grep -qE -- "-l(torch|c10)|torch/csrc|$TORCH_LIBDIR"; then
  fail "kolo-core.pc mentions torch: $(pkg-config --cflags --libs kolo-core)"
fi
no_torch "$tmp/core_pkg_config"
out=$("$tmp/core_pkg_config" 2>&1) || { echo "$out"; fail "pkg-config core consumer"; }
echo "$out"
grep -q '^OK core rank 0 of 1$' <<<"$out" || fail "pkg-config core consumer output"

echo "=== data: Fashion-MNIST, uncompressed (LibTorch's MNIST reads IDX files)"
data=$tmp/data
mkdir -p "$data"
for f in /usr/share/datasets/fashion-mnist/*-ubyte.gz; do
  zcat "$f" >"$data/$(basename "$f" .gz)" || fail "unpacking $f"
done

echo "=== LibTorch: CMake, find_package(kolo), the port of docs/torch.md"
cmake -S $consumers/cmake_consumer -B "$tmp/build" \
  -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release >"$tmp/cmake.log" 2>&1 ||
  { cat "$tmp/cmake.log"; fail "cmake configure"; }
cmake --build "$tmp/build" -j 2 >"$tmp/build.log" 2>&1 ||
  { cat "$tmp/build.log"; fail "cmake build"; }
links_the_torch "$tmp/build/train"
checkpoint=$tmp/checkpoint
# Epoch 1, then a second run that resumes from its checkpoint for epochs 2
# and 3.
run_two '^\[[01]\] rank [01] parameters ' "$tmp/build/train" "$data" 1 "$checkpoint" 20
grep -q '^\[0\] epoch 1 lr 0.001 loss ' <<<"$out" || fail "epoch 1"
run_two '^\[[01]\] rank [01] parameters ' "$tmp/build/train" "$data" 3 "$checkpoint" 20
grep -q '^\[0\] resumed at epoch 2$' <<<"$out" || fail "no resume"
# The scheduler, replayed on the DistributedOptimizer and stepped on, set the
# lr Adam stepped with: LibTorch's StepLR(step_size 1, gamma 0.5) halves it
# from its second step on, as in an uninterrupted run.
grep -q '^\[0\] epoch 2 lr 0.001 loss ' <<<"$out" || fail "epoch 2 lr"
grep -q '^\[0\] epoch 3 lr 0.0005 loss ' <<<"$out" || fail "epoch 3 lr"
grep -qE '^\[0\] test accuracy [0-9.]+% of 10000$' <<<"$out" || fail "accuracy"
sums=$(grep -oE 'rank [01] parameters .*' <<<"$out" | awk '{print $4}' | sort -u)
[ "$(wc -l <<<"$sums")" -eq 1 ] || fail "replicas differ: $sums"

echo "=== LibTorch: pkg-config kolo"
# shellcheck disable=SC2046
# No -std here: kolo.pc's Cflags carry the standard torch's headers need.
g++ -O1 $consumers/cmake_consumer/train.cc \
  $(pkg-config --cflags --libs kolo) -o "$tmp/train_pkg_config" ||
  fail "building with pkg-config kolo"
pkg-config --cflags kolo | grep -q -- "-std=c++$TORCH_CXX_STD" ||
  fail "kolo.pc gives no -std=c++$TORCH_CXX_STD: $(pkg-config --cflags kolo)"
links_the_torch "$tmp/train_pkg_config"
rm -rf "$checkpoint"
run_two '^\[[01]\] rank [01] parameters ' "$tmp/train_pkg_config" "$data" 1 "$checkpoint" 20
echo PASSED
