#!/usr/bin/env bash
# Builds the libFuzzer targets with clang and runs each for SECONDS (default
# 30). Prints one line per target: "fuzz <target>: <runs> runs, <crashes>".
# Exit status: non-zero if a target crashed or did not build.
set -uo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-30}"
# One clang output base per checkout (Bazel ties an output base to a
# workspace).
out_base="${KOLO_CLANG_OUTPUT_BASE:-$HOME/.cache/kolo-clang-$(pwd | md5sum | cut -c1-8)}"
targets=(wire_fuzzer negotiation_fuzzer board_fuzzer config_fuzzer store_fuzzer)
bazel --output_base="$out_base" build --config=fuzz --symlink_prefix=bazel-clang- \
  $(printf '//tests/fuzz:%s ' "${targets[@]}") || exit 1
bin="$(bazel --output_base="$out_base" info --config=fuzz bazel-bin 2>/dev/null)"
status=0
for t in "${targets[@]}"; do
  corpus="$(mktemp -d)"
  # Seeds that reach states random bytes rarely do (tests/fuzz/corpus/<target>).
  if [ -d "tests/fuzz/corpus/$t" ]; then cp "tests/fuzz/corpus/$t"/* "$corpus"/; fi
  log="$(mktemp)"
  # UBSan only reports by default: undefined behaviour counts as a crash.
  ubsan_options="halt_on_error=1:print_stacktrace=1"
  UBSAN_OPTIONS="$ubsan_options" "$bin/tests/fuzz/$t" -max_total_time="$seconds" \
    -print_final_stats=1 -timeout=10 -artifact_prefix="$corpus/" \
    "$corpus" >"$log" 2>&1
  rc=$?
  runs=$(grep -oE 'stat::number_of_executed_units: *[0-9]+' "$log" | grep -oE '[0-9]+$')
  if [ $rc -eq 0 ]; then
    echo "fuzz $t: ${runs:-?} runs in ${seconds}s, no crash"
  else
    echo "fuzz $t: FAILED (exit $rc); the input is kept in $corpus"
    tail -40 "$log"
    status=1
  fi
  [ $rc -eq 0 ] && rm -rf "$corpus"
  rm -f "$log"
done
exit $status
