#!/bin/sh
# Every public header (the files of //runtime:public_headers, i.e.
# runtime/include/kolo/*.h) compiles alone against nothing but the public
# include directory and the system's headers (Debian's abseil), as a program
# built against an installed kolo sees it: a header that includes one of
# kolo's private headers (runtime/...) or leans on what another header
# happens to include fails here. And each header has its own
# tests/api/<name>_alone.cc in header_alone_test, which compiles it alone
# in the Bazel build and uses it.
#
# Arguments: the public headers, then "--", then the *_alone.cc files.
set -u
headers=""
while [ $# -gt 0 ] && [ "$1" != "--" ]; do headers="$headers $1"; shift; done
[ $# -gt 0 ] && shift
alone=" $* "
cxx=$(command -v c++ || command -v g++) || { echo "no C++ compiler on PATH" >&2; exit 1; }
failed=0
count=0
for h in $headers; do
  count=$((count + 1))
  name=$(basename "$h" .h)
  include_dir=$(dirname "$(dirname "$h")")   # .../include for .../include/kolo/x.h
  if ! printf '#include "kolo/%s.h"\n#include "kolo/%s.h"\n' "$name" "$name" |
      "$cxx" -std=c++17 -fsyntax-only -Wall -Werror -I"$include_dir" -x c++ - \
        2>"${TEST_TMPDIR:-/tmp}/$name.err"; then
    echo "FAIL: kolo/$name.h does not compile alone (twice, to check its guard):" >&2
    cat "${TEST_TMPDIR:-/tmp}/$name.err" >&2
    failed=1
  fi
  case "$alone" in
    *"/${name}_alone.cc "*) ;;
    *) echo "FAIL: kolo/$name.h has no tests/api/${name}_alone.cc" >&2; failed=1 ;;
  esac
done
if [ "$count" -eq 0 ]; then echo "FAIL: no public headers given" >&2; exit 1; fi
[ "$failed" -eq 0 ] && echo "PASS: $count public headers compile alone"
exit "$failed"
