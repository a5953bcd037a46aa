#!/usr/bin/env bash
# Every test: installs what is missing, builds everything, runs `bazel test
# //...`, then the tests that run outside Bazel (the main-job command on a
# small workload). Ends with one line: "N passed, N failed[, N skipped]".
set -uo pipefail
cd "$(dirname "$0")/.."

tools/install_deps.sh || { echo "0 passed, 1 failed"; exit 1; }

passed=0
failed=0
skipped=0
log=$(mktemp)
trap 'rm -f "$log"' EXIT

bazel test --keep_going //... 2>&1 | tee "$log"

# One line per test target in Bazel's summary.
count() { grep -cE "^//[^ ]+ +(\(cached\) )?$1" "$log" || true; }
passed=$((passed + $(count PASSED)))
failed=$((failed + $(count 'FAILED|TIMEOUT|FLAKY|INCOMPLETE|NO STATUS')))
skipped=$((skipped + $(count SKIPPED)))
if grep -q "FAILED TO BUILD\|Build did NOT complete successfully" "$log" &&
   [ "$(count 'FAILED|TIMEOUT|FLAKY|INCOMPLETE|NO STATUS')" -eq 0 ]; then
  failed=$((failed + 1))  # a build failure with no test to blame
fi

# The main-job command, as a user runs it, on a small workload.
echo "=== tools/demo.sh (small workload, 2 ranks) ==="
if out=$(NP=2 timeout 300 tools/demo.sh --tensors 40 --iterations 2 2>&1) &&
   [ "$(grep -c '\] OK rank' <<<"$out")" -eq 2 ]; then
  echo "$out"
  echo "PASSED tools/demo.sh"
  passed=$((passed + 1))
else
  echo "$out"
  echo "FAILED tools/demo.sh"
  failed=$((failed + 1))
fi

if [ "$skipped" -gt 0 ]; then
  echo "$passed passed, $failed failed, $skipped skipped"
else
  echo "$passed passed, $failed failed"
fi
[ "$failed" -eq 0 ]
