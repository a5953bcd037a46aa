#!/usr/bin/env bash
# Runs the pytest session of kolo.torch in every rank of one kolorun job:
#
#   tests/frontends/python/run_ranks.sh NP OUTDIR [pytest args...]
#
# Each rank writes OUTDIR/np<NP>-rank<R>.xml (JUnit); then
# tests/frontends/python/summarize.py prints one line per test,
# "PASSED python/np<NP>/<test>" when it passed on every rank, "FAILED ..."
# when it failed (or is missing) on some, "SKIPPED ..." when skipped on all.
# Expects bazel-bin/frontends/python/site and bazel-bin/tools/kolorun built.
set -uo pipefail
np=${1:?usage: run_ranks.sh NP OUTDIR [pytest args]}
out=${2:?usage: run_ranks.sh NP OUTDIR [pytest args]}
shift 2
repo="$(cd "$(dirname "$0")/../../.." && pwd)"
mkdir -p "$out"
rm -f "$out"/np"$np"-rank*.xml
export PYTHONPATH="$repo/bazel-bin/frontends/python/site${PYTHONPATH:+:$PYTHONPATH}"
# Short timeouts: a test that makes ranks diverge fails in seconds.
export KOLO_OP_TIMEOUT=${KOLO_OP_TIMEOUT:-30}
cd "$repo"
timeout 900 bazel-bin/tools/kolorun/kolorun -np "$np" sh -c '
  xml="$0/np$1-rank$KOLO_RANK.xml"; shift
  exec /usr/bin/python3 -m pytest -p no:cacheprovider -q \
    --junitxml="$xml" "$@" tests/frontends/python/session' \
  "$out" "$np" "$@"
status=$?
/usr/bin/python3 "$repo/tests/frontends/python/summarize.py" "$out" "$np"
summary=$?
[ $status -eq 0 ] && [ $summary -eq 0 ]
