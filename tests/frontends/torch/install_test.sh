#!/usr/bin/env bash
# The installed kolo works for programs built outside Bazel:
#   1. packaging/install_files.sh (what tools/install.sh runs after building)
#      installs the library, headers, CMake config and pkg-config file;
#   2. libkolo.so exports kolo's symbols and nothing else;
#   3. a LibTorch program built with CMake (find_package(kolo)) runs at -np 2
#      through kolorun;
#   4. a program built with `pkg-config --cflags --libs kolo` runs.
#
#   install_test.sh LIBKOLO_SO KOLORUN     (Bazel passes both; cwd = runfiles)
set -euo pipefail
lib=$1
kolorun=$2
tmp=${TEST_TMPDIR:-$(mktemp -d)}
prefix=$tmp/prefix
fail() {
  echo "FAILED: $*" >&2
  exit 1
}

packaging/install_files.sh --lib "$lib" --root . "$prefix"
for f in lib/libkolo.so lib/libkolo.so.0 include/kolo/runtime.h \
  include/kolo/torch/torch.h lib/cmake/kolo/koloConfig.cmake \
  lib/pkgconfig/kolo.pc; do
  [ -e "$prefix/$f" ] || fail "$f was not installed"
done

echo "=== exported symbols"
exported=$(nm -D --defined-only "$prefix/lib/libkolo.so" | awk '{print $3}' |
  c++filt)
foreign=$(grep -v -E '^((typeinfo( name)? for |vtable for |VTT for |(non-)?virtual thunk to )?kolo::|KOLO_0$)' \
  <<<"$exported" || true)
[ -z "$foreign" ] || fail "libkolo.so exports symbols that are not kolo's:
$(head -20 <<<"$foreign")"
for want in 'kolo::Runtime::Create(' 'kolo::torch::init()' \
  'kolo::torch::DistributedOptimizer::step(' 'typeinfo for kolo::torch::Error'; do
  grep -qF "$want" <<<"$exported" || fail "libkolo.so does not export $want"
done
echo "$(wc -l <<<"$exported") symbols, all kolo's"

echo "=== CMake: find_package(kolo)"
cmake -S tests/frontends/torch/cmake_consumer -B "$tmp/build" \
  -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release >"$tmp/cmake.log" 2>&1 ||
  { cat "$tmp/cmake.log"; fail "cmake configure"; }
cmake --build "$tmp/build" -j 2 >"$tmp/build.log" 2>&1 ||
  { cat "$tmp/build.log"; fail "cmake build"; }

echo "=== kolorun -np 2 consumer"
out=$("$kolorun" -np 2 "$tmp/build/consumer" 2>&1) || { echo "$out"; fail "consumer"; }
echo "$out"
[ "$(grep -c '\] OK rank [01] of 2' <<<"$out")" -eq 2 ] || fail "consumer output"

echo "=== pkg-config"
export PKG_CONFIG_PATH=$prefix/lib/pkgconfig
g++ -std=c++17 -O1 tests/frontends/torch/cmake_consumer/pkg_config_consumer.cc \
  $(pkg-config --cflags --libs kolo) -o "$tmp/pkg_config_consumer" ||
  fail "building with pkg-config"
out=$("$tmp/pkg_config_consumer" 2>&1) || { echo "$out"; fail "pkg-config consumer"; }
echo "$out"
grep -q '^OK pkg-config$' <<<"$out" || fail "pkg-config consumer output"
echo PASSED
