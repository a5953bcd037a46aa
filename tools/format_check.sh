#!/usr/bin/env bash
# Fails (exit 1) if a C++ file of the tree differs from what clang-format
# makes of it (.clang-format; clang-format 14, from tools/install_deps.sh,
# so that every machine formats alike). third_party/ is not ours, and
# cmake_consumer/train.cc is docs/torch.md's example, its "// kolo" marks
# aligned by hand (docs_port_test keeps the two equal). With --fix, formats
# them in place instead.
set -uo pipefail
cd "$(dirname "$0")/.."
formatter=clang-format-14
if ! command -v "$formatter" >/dev/null; then
  echo "format_check: $formatter not found (tools/install_deps.sh installs it)"
  exit 1
fi
mapfile -t files < <(git ls-files '*.cc' '*.h' | grep -v -e '^third_party/' \
  -e '^tests/frontends/torch/cmake_consumer/train.cc$')
if [ "${1:-}" = --fix ]; then
  exec "$formatter" -i "${files[@]}"
fi
differ=()
for f in "${files[@]}"; do
  if ! "$formatter" "$f" | cmp -s - "$f"; then differ+=("$f"); fi
done
if [ ${#differ[@]} -gt 0 ]; then
  echo "format_check: ${#differ[@]} files differ from clang-format (tools/format_check.sh --fix):"
  for f in "${differ[@]}"; do
    echo "  $f"
    "$formatter" "$f" | diff -u "$f" - | head -20
  done
  exit 1
fi
echo "format_check: ${#files[@]} files as clang-format makes them"
