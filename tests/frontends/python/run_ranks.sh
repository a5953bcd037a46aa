#!/usr/bin/env bash
# Runs a pytest session of kolo's Python frontend in every rank of one
# kolorun job:
#
#   [SUITE=session|distributed] [TORCH_LABEL=torch2.15] \
#     tests/frontends/python/run_ranks.sh NP OUTDIR [pytest args...]
#
# SUITE: tests/frontends/python/session (kolo.torch, the default) or
# tests/frontends/python/distributed (the torch.distributed backend).
# Each rank writes OUTDIR/np<NP>-rank<R>.xml (JUnit); then
# tests/frontends/python/summarize.py prints one line per test,
# "PASSED python/<label>/<test>" (label np<NP>, or distributed-np<NP>) when it passed on every rank, "FAILED ..."
# when it failed (or is missing) on some, "SKIPPED ..." when skipped on all.
# Expects bazel-bin/frontends/python/site and bazel-bin/tools/kolorun built,
# for /usr/bin/python3 (Debian's torch). With KOLO_PYTHON and KOLO_BIN set
# (tools/test_torch.sh), the session runs in that interpreter on the build
# under KOLO_BIN (its site and kolorun), and labels start with TORCH_LABEL/.
set -uo pipefail
np=${1:?usage: run_ranks.sh NP OUTDIR [pytest args]}
out=${2:?usage: run_ranks.sh NP OUTDIR [pytest args]}
shift 2
suite=${SUITE:-session}
prefix=${TORCH_LABEL:+$TORCH_LABEL/}
case "$suite" in
  session) label=${prefix}np$np ;;
  distributed) label=${prefix}distributed-np$np ;;
  *) echo "run_ranks.sh: SUITE must be session or distributed, not $suite" >&2; exit 2 ;;
esac
repo="$(cd "$(dirname "$0")/../../.." && pwd)"
python=${KOLO_PYTHON:-/usr/bin/python3}
bin=${KOLO_BIN:-$repo/bazel-bin}
mkdir -p "$out"
rm -f "$out"/np"$np"-rank*.xml
export PYTHONPATH="$bin/frontends/python/site${PYTHONPATH:+:$PYTHONPATH}"
# Short timeouts: a test that makes ranks diverge fails in seconds.
export KOLO_OP_TIMEOUT=${KOLO_OP_TIMEOUT:-30}
cd "$repo"
timeout 900 "$bin/tools/kolorun/kolorun" -np "$np" sh -c '
  xml="$0/np$1-rank$KOLO_RANK.xml"; python=$2; shift 2
  exec "$python" -m pytest -p no:cacheprovider -q \
    --junitxml="$xml" "$@"' \
  "$out" "$np" "$python" "$@" "tests/frontends/python/$suite"
status=$?
/usr/bin/python3 "$repo/tests/frontends/python/summarize.py" "$out" "$np" "$label"
summary=$?
[ $status -eq 0 ] && [ $summary -eq 0 ]
