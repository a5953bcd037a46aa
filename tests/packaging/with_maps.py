"""Runs a Python program as __main__ and then copies this process's
/proc/self/maps (every file the running rank has mapped: kolo's extension,
the libraries it loaded, torch's) to $KOLO_MAPS_DIR/maps.<rank>.<pid>:

    python with_maps.py PROGRAM [ARGS...]

check_loaded.py then says whether anything came from outside the wheel,
torch and the system's C/C++ runtime and Python.
"""

import os
import runpy
import sys


def main():
    program = sys.argv[1]
    sys.argv = sys.argv[1:]
    sys.path.insert(0, os.path.dirname(os.path.abspath(program)))
    try:
        runpy.run_path(program, run_name="__main__")
    finally:
        out = os.path.join(os.environ["KOLO_MAPS_DIR"], "maps.%s.%d" % (
            os.environ.get("KOLO_RANK", "x"), os.getpid()))
        with open("/proc/self/maps") as f, open(out, "w") as g:
            g.write(f.read())


if __name__ == "__main__":
    main()
