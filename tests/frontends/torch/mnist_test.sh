#!/usr/bin/env bash
# The mnist example as a user runs it: two processes through the real
# kolorun, on a small subset of the real Fashion-MNIST files. It must finish
# on both ranks, print the loss and an accuracy, and the accuracy must show
# that it learned something (10% is chance). Also: missing data files give
# a clear error, not a hang.
#
#   mnist_test.sh KOLORUN MNIST        (Bazel passes both)
set -euo pipefail
kolorun=$1
mnist=$2
data=/usr/share/datasets/fashion-mnist
fail() {
  echo "FAILED: $*" >&2
  exit 1
}
[ -f "$data/train-images-idx3-ubyte.gz" ] ||
  fail "$data is missing: install Debian's dataset-fashion-mnist (tools/install_deps.sh)"

echo "=== kolorun -np 2 mnist on 1024 training and 500 test images"
out=$("$kolorun" -np 2 "$mnist" --data-dir "$data" --epochs 1 \
  --limit-train 1024 --limit-test 500 --log-interval 4 --min-accuracy 40 2>&1) ||
  { echo "$out"; fail "the job failed"; }
echo "$out"
grep -qE '^\[0\] epoch 1/1 step 4/8 loss [0-9.]+$' <<<"$out" || fail "no loss line"
grep -qE '^\[0\] test accuracy [0-9.]+% \([0-9]+ of 500\)' <<<"$out" ||
  fail "no accuracy line"
[ "$(grep -cE '^\[[01]\] OK rank [01] of 2: test accuracy' <<<"$out")" -eq 2 ] ||
  fail "not every rank printed OK"

echo "=== missing data files"
if out=$("$kolorun" -np 2 "$mnist" --data-dir /nonexistent 2>&1); then
  echo "$out"
  fail "the job succeeded without data"
fi
echo "$out"
grep -q 'cannot read the Fashion-MNIST data: /nonexistent/train-images-idx3-ubyte.gz: No such file' \
  <<<"$out" || fail "unclear error for missing data"
echo PASSED
