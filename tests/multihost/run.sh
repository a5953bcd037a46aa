#!/usr/bin/env bash
# Multi-host and launcher-engine tests (network namespaces, sshd, mpirun,
# torchrun, Slurm-style). Needs root; outside Bazel's sandbox by design.
#
#   tests/multihost/run.sh [NAME...]    # NAME: run only tests matching it
#
# Prints "PASSED|FAILED|SKIPPED multihost/<test>[: why]" per test and ends
# with "multihost: N passed, N failed, N skipped"; exit status 1 if a test
# failed. Every run cleans up its namespaces, sshd and files.
set -euo pipefail
cd "$(dirname "$0")/../.."

bazel build //tools/kolorun:kolorun //tools/kolorun:kolo_rank_guard \
  //tools/examples:allreduce_demo //tests/multihost:multihost_worker \
  //tests/frontends/torch:elastic_train //frontends/python:site >&2

# The harness itself needs only the standard library of any python3.
exec timeout --kill-after=10 280 python3 tests/multihost/run_tests.py \
  --repo "$PWD" "$@"
