#!/usr/bin/env python3
"""Copies tests/frontends/torch/cmake_consumer/train.cc (the port the install
test builds) into docs/torch.md's code block, so that the docs show the
tested program:

  tests/frontends/torch/docs_port.py [--check] [ROOT]

--check: exit 1 if they differ (docs_port_test). ROOT: the source tree or
the test's runfiles (default: this file's tree)."""
import os
import re
import sys

args = [a for a in sys.argv[1:] if a != "--check"]
ROOT = args[0] if args else os.path.abspath(
    os.path.join(os.path.dirname(__file__), "..", "..", ".."))
code = open(ROOT + "/tests/frontends/torch/cmake_consumer/train.cc").read()
doc_path = ROOT + "/docs/torch.md"
doc = open(doc_path).read()
pattern = re.compile(r"(```cpp\n)// train\.cc: a plain.*?(```\n)", re.S)
if not pattern.search(doc):
    sys.exit("docs/torch.md has no train.cc block")
new = pattern.sub(lambda m: m.group(1) + code + m.group(2), doc, count=1)
if "--check" in sys.argv[1:]:
    if new != doc:
        sys.exit("docs/torch.md's train.cc differs from "
                 "tests/frontends/torch/cmake_consumer/train.cc: run "
                 "tests/frontends/torch/docs_port.py")
    sys.exit(0)
open(doc_path, "w").write(new)
