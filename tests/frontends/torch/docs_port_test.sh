#!/usr/bin/env bash
# docs/torch.md's port is tests/frontends/torch/cmake_consumer/train.cc, the
# program install_test builds and runs (cwd = runfiles).
exec /usr/bin/python3 tests/frontends/torch/docs_port.py --check .
