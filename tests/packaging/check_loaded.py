"""Says whether a process loaded anything from outside kolo's wheel, torch
and a minimal system: the files a rank mapped (with_maps.py's copies of
/proc/self/maps) against the files of a minimal Debian root (the C/C++
runtime and Python) and the folders pip installed into:

    check_loaded.py --base FILES [--allow DIR]... [--bindings LD_DEBUG_LOG]
                    MAPS...

FILES lists the minimal root's files, one path a line. Each MAPS file must
map kolo's extension and its own copies of gloo, protobuf and abseil
(kolo.libs/), and no file outside FILES and the DIRs; where a CUDA torch's
NCCL is mapped, it is the one under a DIR (the nvidia-nccl wheel beside
torch). With --bindings (the output of LD_DEBUG=bindings, LD_BIND_NOW=1),
no gloo, protobuf or abseil name that kolo's files look up may be served by
a library that is not kolo's (torch's libraries export gloo and protobuf of
their own). Prints one line per finding; exits 1 if there is any.
"""

import argparse
import re
import sys

# kolo's own libraries in the wheel: the extension and the copies.
KOLO = re.compile(r"/kolo/_C[^/]*\.so$|/kolo\.libs/")
COPIES = ("libgloo-", "libprotobuf-", "libabsl_status-")
SHARED_NAMES = re.compile(r"^_ZN(?:K)?(?:4gloo|6google8protobuf|4absl)")


def mapped(path):
    """The files a maps file names (not /dev/shm segments or memfds)."""
    files = set()
    with open(path) as f:
        for line in f:
            fields = line.split(None, 5)
            if len(fields) < 6 or not fields[5].startswith("/"):
                continue
            name = fields[5].rstrip("\n").replace(" (deleted)", "")
            if name.startswith(("/dev/shm/", "/memfd:", "/dev/zero")):
                continue
            files.add(name)
    return files


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--base", required=True)
    p.add_argument("--allow", action="append", default=[])
    p.add_argument("--bindings")
    p.add_argument("maps", nargs="+")
    args = p.parse_args()
    with open(args.base) as f:
        base = set(line.rstrip("\n") for line in f)
    allow = [d.rstrip("/") + "/" for d in args.allow]
    problems = []
    for maps in args.maps:
        files = mapped(maps)
        outside = sorted(f for f in files if f not in base and
                         not f.startswith(tuple(allow)))
        for f in outside:
            problems.append("%s: loaded from outside the wheel, torch and a "
                            "minimal system: %s" % (maps, f))
        kolo = [f for f in files if KOLO.search(f)]
        if not any("/kolo/_C" in f for f in kolo):
            problems.append("%s: kolo's extension is not mapped" % maps)
        for copy in COPIES:
            if not any("/kolo.libs/" + copy in f for f in kolo):
                problems.append("%s: kolo's own %s... is not mapped" %
                                (maps, copy))
        for f in files:
            name = f.rsplit("/", 1)[-1]
            if re.match(r"lib(gloo|protobuf|absl_)", name) and not KOLO.search(f):
                problems.append("%s: a %s that is not kolo's copy" % (maps, f))
            if name.startswith("libnccl") and not f.startswith(tuple(allow)):
                problems.append("%s: an NCCL that is not torch's: %s" %
                                (maps, f))
    if args.bindings:
        seen = 0
        pattern = re.compile(r"binding file (\S+) \[\d+\] to (\S+) \[\d+\]: "
                             r"normal symbol `([^']+)'")
        with open(args.bindings, errors="replace") as f:
            for line in f:
                m = pattern.search(line)
                if not m or not KOLO.search(m.group(1)):
                    continue
                if SHARED_NAMES.match(m.group(3)):
                    seen += 1
                    if not KOLO.search(m.group(2)):
                        problems.append("%s's %s is served by %s" % m.groups())
        if seen == 0:
            problems.append("%s: no binding of a gloo, protobuf or abseil "
                            "name by kolo's files (not LD_DEBUG=bindings "
                            "output?)" % args.bindings)
    for line in problems[:50]:
        print(line)
    if len(problems) > 50:
        print("... and %d more" % (len(problems) - 50))
    if problems:
        sys.exit(1)
    print("only the wheel's, torch's and the minimal system's files: %d maps "
          "checked" % len(args.maps))


if __name__ == "__main__":
    main()
