#!/usr/bin/env bash
# Every test: installs what is missing, builds everything, runs `bazel test
# //...`, then the tests that run outside Bazel (the main-job command on a
# small workload). Ends with one line: "N passed, N failed[, N skipped]".
set -uo pipefail
cd "$(dirname "$0")/.."

# Where the time goes: each section's wall time, printed before the counts.
timings=()
section_start=$SECONDS
section() {  # section NAME: ends the running section, starts NAME
  [ -n "${section_name:-}" ] &&
    timings+=("$(printf '%5d s  %s' $((SECONDS - section_start)) "$section_name")")
  section_name=$1
  section_start=$SECONDS
  echo "=== $1 ==="
}

section "tools/install_deps.sh"
tools/install_deps.sh || { echo "0 passed, 1 failed"; exit 1; }

passed=0
failed=0
skipped=0
log=$(mktemp)
trap 'rm -f "$log" "$log.san" "$log.fuzz" "$log.tsa"' EXIT

# A disk cache shared by this output base and the torch 2.x one below: the
# torch-free core's actions are the same in both, so the core compiles once
# (cleared when it grows past 4 GB).
disk_cache="$HOME/.cache/kolo/bazel-disk-cache"
if [ "$(du -sm "$disk_cache" 2>/dev/null | cut -f1)" -gt 4096 ] 2>/dev/null; then
  rm -rf "$disk_cache"
fi

# The C++ files as clang-format makes them (one test).
section "tools/format_check.sh"
if tools/format_check.sh; then
  echo "PASSED tools/format_check.sh"
  passed=$((passed + 1))
else
  echo "FAILED tools/format_check.sh"
  failed=$((failed + 1))
fi

section "bazel test //... (gcc, Debian's torch)"
bazel test --disk_cache="$disk_cache" --keep_going --test_tag_filters=-gpu \
  //... 2>&1 | tee "$log"

# One line per test target in Bazel's summary.
count() { grep -cE "^//[^ ]+ +(\(cached\) )?$1" "$log" || true; }
passed=$((passed + $(count PASSED)))
failed=$((failed + $(count 'FAILED|TIMEOUT|FLAKY|INCOMPLETE|NO STATUS')))
skipped=$((skipped + $(count SKIPPED)))
if grep -q "FAILED TO BUILD\|Build did NOT complete successfully" "$log" &&
   [ "$(count 'FAILED|TIMEOUT|FLAKY|INCOMPLETE|NO STATUS')" -eq 0 ]; then
  failed=$((failed + 1))  # a build failure with no test to blame
fi

# GPU tests (tag "gpu"): without a GPU they pass by skipping their checks,
# which Bazel reports as PASSED; a test whose log says it skipped everything
# ("[  SKIPPED ]" from gtest with no test run, or a "SKIP all" line) is
# counted as skipped. tools/device_check.sh runs them on a GPU machine.
section "GPU tests (tag gpu)"
bazel test --keep_going --test_tag_filters=gpu //... 2>&1 | tee "$log"
for target in $(grep -oE "^//[^ ]+ +(\(cached\) )?PASSED" "$log" | cut -d' ' -f1); do
  testlog="bazel-testlogs/$(sed -e 's|^//||' -e 's|:|/|' <<<"$target")/test.log"
  if grep -qE "^SKIP all|^\[  SKIPPED \]" "$testlog" &&
     ! grep -qE "^\[       OK \]|^PASS " "$testlog"; then
    echo "SKIPPED $target (no GPU)"
    skipped=$((skipped + 1))
  else
    passed=$((passed + 1))
  fi
done
failed=$((failed + $(count 'FAILED|TIMEOUT|FLAKY|INCOMPLETE|NO STATUS')))
if grep -q "FAILED TO BUILD\|Build did NOT complete successfully" "$log" &&
   [ "$(count 'FAILED|TIMEOUT|FLAKY|INCOMPLETE|NO STATUS')" -eq 0 ]; then
  failed=$((failed + 1))
fi

# Sanitizers (ASan + UBSan, then TSan) over the runtime and ops tests, with
# clang in an output base of its own; each sanitized target counts as a test.
# KOLO_SKIP_SANITIZERS=1 skips them (counted as skipped).
if [ "${KOLO_SKIP_SANITIZERS:-0}" = 1 ]; then
  skipped=$((skipped + 1))
else
  for sanitizer in asan tsan; do
    section "tools/sanitize.sh $sanitizer"
    tools/sanitize.sh "$sanitizer" 2>&1 | tee "$log.san"
    s_pass=$(grep -cE "^//[^ ]+ +(\(cached\) )?PASSED" "$log.san" || true)
    s_fail=$(grep -cE "^//[^ ]+ +(\(cached\) )?(FAILED|TIMEOUT|NO STATUS)" "$log.san" || true)
    if [ "$s_pass" -eq 0 ] && [ "$s_fail" -eq 0 ]; then s_fail=1; fi  # did not build
    passed=$((passed + s_pass))
    failed=$((failed + s_fail))
    rm -f "$log.san"
  done

  # clang's thread-safety analysis over everything with a lock (one test).
  section "tools/thread_safety.sh"
  tools/thread_safety.sh > "$log.tsa" 2>&1
  tsa_status=$?
  grep -E "error:|ERROR:" "$log.tsa" | head -60
  tail -3 "$log.tsa"
  rm -f "$log.tsa"
  if [ "$tsa_status" -eq 0 ]; then
    echo "PASSED tools/thread_safety.sh"
    passed=$((passed + 1))
  else
    echo "FAILED tools/thread_safety.sh"
    failed=$((failed + 1))
  fi

  # Fuzzers: a short run of each (tools/fuzz.sh SECONDS for longer ones).
  section "tools/fuzz.sh ${KOLO_FUZZ_SECONDS:-10}"
  tools/fuzz.sh "${KOLO_FUZZ_SECONDS:-10}" 2>&1 | tee "$log.fuzz"
  f_pass=$(grep -cE "^fuzz [a-z_]+: [0-9]+ runs" "$log.fuzz" || true)
  f_fail=$(grep -cE "^fuzz [a-z_]+: FAILED" "$log.fuzz" || true)
  if [ "$f_pass" -eq 0 ] && [ "$f_fail" -eq 0 ]; then f_fail=1; fi
  passed=$((passed + f_pass))
  failed=$((failed + f_fail))
  rm -f "$log.fuzz"
fi

# The main-job command, as a user runs it, on a small workload.
section "tools/demo.sh (small workload: 2 ranks, a subset of Fashion-MNIST)"
if out=$(NP=2 timeout 600 tools/demo.sh --limit-train 1024 --limit-test 500 \
           --min-accuracy 40 2>&1) &&
   [ "$(grep -c '\] OK rank' <<<"$out")" -eq 2 ]; then
  echo "$out"
  echo "PASSED tools/demo.sh"
  passed=$((passed + 1))
else
  echo "$out"
  echo "FAILED tools/demo.sh"
  failed=$((failed + 1))
fi

# Multi-host and launcher-engine tests (root: network namespaces, sshd,
# mpirun, torchrun, Slurm-style); outside Bazel by design.
section "tests/multihost/run.sh (namespaces, sshd, mpirun, torchrun, Slurm)"
mh_log=$(mktemp)
timeout 600 tests/multihost/run.sh 2>&1 | tee "$mh_log"
mh_status=${PIPESTATUS[0]}
passed=$((passed + $(grep -c '^PASSED multihost/' "$mh_log" || true)))
failed=$((failed + $(grep -c '^FAILED multihost/' "$mh_log" || true)))
skipped=$((skipped + $(grep -c '^SKIPPED multihost/' "$mh_log" || true)))
if [ "$mh_status" -ne 0 ] && ! grep -q '^FAILED multihost/' "$mh_log"; then
  echo "FAILED tests/multihost/run.sh (exit status $mh_status)"
  failed=$((failed + 1))
fi
rm -f "$mh_log"

# The Python frontend (kolo.torch) and the torch.distributed backend: their
# pytest sessions in every rank of a kolorun job at 2 and 3 ranks (a test
# passes when it passed on every rank), then the launch tests (kolorun,
# mpirun, torchrun, the wheel in a venv, a killed rank under DDP, elastic
# jobs in Python and C++).
section "Python frontend: kolo.torch and the torch.distributed backend under kolorun (np 2, 3) and launch tests"
py_out=$(mktemp -d)
py_log=$(mktemp)
bazel build //frontends/python:site //tools/kolorun:kolorun \
  //tools/kolorun:kolo_rank_guard //tests/frontends/torch:elastic_train \
  >/dev/null 2>&1
for np in 2 3; do
  tests/frontends/python/run_ranks.sh "$np" "$py_out" 2>&1 | tee -a "$py_log"
  SUITE=distributed tests/frontends/python/run_ranks.sh "$np" \
    "$py_out/distributed" 2>&1 | tee -a "$py_log"
done
timeout 1200 /usr/bin/python3 -m pytest -p no:cacheprovider -q \
  --junitxml="$py_out/np1-rank0.xml" tests/frontends/python/launch 2>&1 |
  tail -5
/usr/bin/python3 tests/frontends/python/summarize.py "$py_out" 1 launch 2>&1 |
  tee -a "$py_log"
passed=$((passed + $(grep -c '^PASSED python/' "$py_log" || true)))
failed=$((failed + $(grep -c '^FAILED python/' "$py_log" || true)))
skipped=$((skipped + $(grep -c '^SKIPPED python/' "$py_log" || true)))
if ! grep -q '^python/np2: ' "$py_log" || ! grep -q '^python/np3: ' "$py_log" ||
   ! grep -q '^python/distributed-np2: ' "$py_log" ||
   ! grep -q '^python/distributed-np3: ' "$py_log" ||
   ! grep -q '^python/launch: ' "$py_log"; then
  echo "FAILED tests/frontends/python (a session wrote no results)"
  failed=$((failed + 1))
fi
rm -rf "$py_out" "$py_log"

# The torch-facing tests again, against the newest torch on PyPI
# (tools/torch-versions.txt) in a venv of the project's own
# (tools/torch_env.sh), built in an output base of its own so that the
# build for Debian's torch stays as it is: the C++ frontend's tests (the
# installed libkolo.so from CMake and pkg-config included), the kolo.torch
# and torch.distributed sessions at 2 and 3 ranks, the launch tests. Results
# are labelled torch<version>/.
torch_version=$(sed -n 's/^torch==//p' tools/torch-versions.txt)
label="torch$torch_version"
section "$label from PyPI: C++ frontend, kolo.torch, torch.distributed, launch tests"
t_out=$(mktemp -d)
t_log=$(mktemp)
if torch_python=$(tools/torch_env.sh); then
  t_base="${KOLO_TORCH_OUTPUT_BASE:-$HOME/.cache/kolo-torch2x-$(pwd | md5sum | cut -c1-8)}"
  t_bazel=(env KOLO_PYTHON="$torch_python" bazel --output_base="$t_base")
  t_flags=(--symlink_prefix=bazel-torch2x- --keep_going
           --disk_cache="$disk_cache")
  "${t_bazel[@]}" test "${t_flags[@]}" //tests/frontends/torch:ops_test \
    //tests/frontends/torch:optimizer_test \
    //tests/frontends/torch:broadcast_test \
    //tests/frontends/torch:mnist_test //tests/frontends/torch:install_test \
    2>&1 | tee "$t_log"
  t_pass=$(grep -cE "^//[^ ]+ +(\(cached\) )?PASSED" "$t_log" || true)
  t_fail=$(grep -cE "^//[^ ]+ +(\(cached\) )?(FAILED|TIMEOUT|NO STATUS)" "$t_log" || true)
  if [ "$t_pass" -eq 0 ] && [ "$t_fail" -eq 0 ]; then t_fail=1; fi  # did not build
  passed=$((passed + t_pass))
  failed=$((failed + t_fail))
  : > "$t_log"
  "${t_bazel[@]}" build "${t_flags[@]}" //frontends/python:site \
    //tools/kolorun:kolorun //tools/kolorun:kolo_rank_guard \
    //tests/frontends/torch:elastic_train >/dev/null 2>&1
  export KOLO_PYTHON="$torch_python" KOLO_BIN="$PWD/bazel-torch2x-bin"
  for np in 2 3; do
    TORCH_LABEL=$label tests/frontends/python/run_ranks.sh "$np" "$t_out" \
      2>&1 | tee -a "$t_log"
    TORCH_LABEL=$label SUITE=distributed tests/frontends/python/run_ranks.sh \
      "$np" "$t_out/distributed" 2>&1 | tee -a "$t_log"
  done
  timeout 1200 /usr/bin/python3 -m pytest -p no:cacheprovider -q \
    --junitxml="$t_out/np1-rank0.xml" tests/frontends/python/launch 2>&1 |
    tail -5
  # PyTorch's own backend suite (DistributedTest._DistTestBase of this
  # torch) on the kolo backend at 2 ranks, two shards side by side: one line,
  # PASSED or FAILED python/$label/torch-suite-np2.
  PYTHONPATH="$KOLO_BIN/frontends/python/site" timeout 1200 \
    "$torch_python" tests/frontends/python/torch_suite/run_suite.py \
    --world-size 2 --shards 2 --label "$label/torch-suite-np2" \
    --out "$t_out/torch-suite" 2>&1 | tail -25 | tee -a "$t_log"
  if ! grep -qE "^(PASSED|FAILED) python/$label/torch-suite-np2 " "$t_log"; then
    echo "FAILED python/$label/torch-suite-np2 (the driver wrote no result)"
    failed=$((failed + 1))
  fi
  unset KOLO_PYTHON KOLO_BIN
  /usr/bin/python3 tests/frontends/python/summarize.py "$t_out" 1 \
    "$label/launch" 2>&1 | tee -a "$t_log"
  passed=$((passed + $(grep -c '^PASSED python/' "$t_log" || true)))
  failed=$((failed + $(grep -c '^FAILED python/' "$t_log" || true)))
  skipped=$((skipped + $(grep -c '^SKIPPED python/' "$t_log" || true)))
  for session in np2 np3 distributed-np2 distributed-np3 launch; do
    if ! grep -q "^python/$label/$session: " "$t_log"; then
      echo "FAILED python/$label/$session (the session wrote no results)"
      failed=$((failed + 1))
    fi
  done
else
  echo "FAILED tools/torch_env.sh (no venv with torch $torch_version)"
  failed=$((failed + 1))
fi
rm -rf "$t_out" "$t_log"

# The self-contained wheel and C++ tarball for the pinned PyPI torch
# (tools/build_wheel.sh, tools/install.sh --tarball, from the torch 2.x
# output base above), the wheel installed with pip in a minimal
# Debian root made by debootstrap (no compiler, no -dev package, no CUDA;
# cached under ~/.cache/kolo/clean-root) and on this machine beside
# Debian's libraries: mnist.py and a DDP script at 2 ranks, and what the
# ranks mapped; docs/torch.md's program built against the tarball there
# (tests/packaging/clean_system.sh).
section "$label wheel on a clean system (debootstrap root) and beside Debian's libraries"
w_out=$(mktemp -d)
w_log=$(mktemp)
if torch_python=$(tools/torch_env.sh) &&
   KOLO_PYTHON="$torch_python" KOLO_BAZEL_OUTPUT_BASE="${t_base:-}" \
     tools/build_wheel.sh "$w_out" > "$w_log" 2>&1 &&
   KOLO_PYTHON="$torch_python" KOLO_BAZEL_OUTPUT_BASE="${t_base:-}" \
     tools/install.sh --tarball "$w_out/kolo-cpp.tar.gz" >> "$w_log" 2>&1; then
  ls -l "$w_out"
  timeout 1200 tests/packaging/clean_system.sh "$w_out"/kolo-*.whl \
    "$w_out/kolo-cpp.tar.gz" 2>&1 | tee "$w_log"
  passed=$((passed + $(grep -c '^PASSED packaging/' "$w_log" || true)))
  failed=$((failed + $(grep -c '^FAILED packaging/' "$w_log" || true)))
  if ! grep -q '^PASSED packaging/other-torch/import' "$w_log" &&
     ! grep -q '^FAILED packaging/other-torch/import' "$w_log"; then
    echo "FAILED tests/packaging/clean_system.sh (it did not finish)"
    failed=$((failed + 1))
  fi
else
  tail -30 "$w_log"
  echo "FAILED tools/build_wheel.sh or tools/install.sh --tarball (torch $torch_version)"
  failed=$((failed + 1))
fi
rm -rf "$w_out" "$w_log"

section "end"
printf '%s\n' "${timings[@]}" "$(printf '%5d s  in all' "$SECONDS")"
if [ "$skipped" -gt 0 ]; then
  echo "$passed passed, $failed failed, $skipped skipped"
else
  echo "$passed passed, $failed failed"
fi
[ "$failed" -eq 0 ]
