#!/usr/bin/env bash
# Runs the runtime and ops tests (not the LibTorch frontend) under a clang
# sanitizer: tools/sanitize.sh asan|tsan. Uses its own Bazel output base, so
# the gcc build is kept. Bazel's summary lines are printed; exit status is
# Bazel's.
set -uo pipefail
cd "$(dirname "$0")/.."
config="${1:?usage: tools/sanitize.sh asan|tsan}"
# One clang output base per checkout (Bazel ties an output base to a
# workspace).
out_base="${KOLO_CLANG_OUTPUT_BASE:-$HOME/.cache/kolo-clang-$(pwd | md5sum | cut -c1-8)}"
targets=(//tests/runtime/... //tests/ops/... //tests/integration/...)
# Sanitizers make everything slower: timing-bound tests are not run here.
exec bazel --output_base="$out_base" test --config="$config" --symlink_prefix=bazel-clang- \
  --test_env=TSAN_OPTIONS="suppressions=$PWD/tools/tsan.supp halt_on_error=1" \
  --test_tag_filters=-exclusive,-no-sanitizer --test_output=errors "${targets[@]}"
