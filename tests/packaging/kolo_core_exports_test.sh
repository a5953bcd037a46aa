#!/usr/bin/env bash
# libkolo_core.so: the runtime and its backends without the LibTorch frontend,
# for programs compiled elsewhere (tools/device_check.sh). It must
#   1. export kolo's symbols and nothing else (kolo.lds), so that the abseil,
#      protobuf and gloo code instantiated in it cannot clash with LibTorch's;
#   2. export what the frontend and torch_cuda_check call;
#   3. not depend on LibTorch, and be named libkolo_core.so.0.
#
#   kolo_core_exports_test.sh LIBKOLO_CORE_SO
set -euo pipefail
lib=$1
fail() {
  echo "FAILED: $*" >&2
  exit 1
}

exported=$(nm -D --defined-only "$lib" | awk '{print $3}' | c++filt)
foreign=$(grep -v -E '^((typeinfo( name)? for |vtable for |VTT for |(non-)?virtual thunk to )?kolo::|KOLO_0$)' \
  <<<"$exported" || true)
[ -z "$foreign" ] || fail "libkolo_core.so exports symbols that are not kolo's:
$(head -20 <<<"$foreign")"
for want in 'kolo::Runtime::Create(' 'kolo::NewInMemoryStore(' \
  'kolo::Work::Wait(' 'kolo::NewPrefixStore('; do
  grep -qF "$want" <<<"$exported" || fail "libkolo_core.so does not export $want"
done
if grep -q 'kolo::torch::' <<<"$exported"; then
  fail "libkolo_core.so holds the LibTorch frontend"
fi
echo "$(wc -l <<<"$exported") symbols, all kolo's"

dynamic=$(readelf -d "$lib")
if grep -E 'NEEDED.*\[lib(torch|c10)' <<<"$dynamic"; then
  fail "libkolo_core.so depends on LibTorch"
fi
grep -q 'SONAME.*\[libkolo_core\.so\.0\]' <<<"$dynamic" || fail "soname is not libkolo_core.so.0"
echo PASSED
