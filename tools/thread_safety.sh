#!/usr/bin/env bash
# Builds the runtime, the backends, the frontends and the tools with clang's
# thread-safety analysis as errors (`--config=thread-safety` in .bazelrc:
# the ASan build, whose objects tools/sanitize.sh asan and tools/fuzz.sh
# share; Note [Annotated locks] in runtime/sync/mutex.h). Uses the clang
# output base of tools/sanitize.sh, so the gcc build is kept. Exit status
# is Bazel's.
set -uo pipefail
cd "$(dirname "$0")/.."
# First, that the analysis sees the annotations at all: the check file
# compiles as it is and fails with each deliberate violation.
check=tests/thread_safety/annotations_check.cc
flags=(-std=c++17 -fsyntax-only -Wthread-safety -Werror -I.)
if ! clang++ "${flags[@]}" "$check"; then
  echo "ERROR: $check does not compile under the analysis"
  exit 1
fi
for n in 1 2 3 4; do
  if clang++ "${flags[@]}" -DKOLO_BREAK_$n "$check" 2>/dev/null; then
    echo "ERROR: $check with KOLO_BREAK_$n compiled: the analysis missed it"
    exit 1
  fi
done
echo "thread-safety analysis: the check file compiles, its 4 violations fail"

out_base="${KOLO_CLANG_OUTPUT_BASE:-$HOME/.cache/kolo-clang-$(pwd | md5sum | cut -c1-8)}"
bazel --output_base="$out_base" build --config=thread-safety \
  --symlink_prefix=bazel-clang- --keep_going \
  //runtime/... //ops/... //frontends/... //tools/... "$@"
